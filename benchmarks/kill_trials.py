"""30 kill -9 trials through the command line: every named window at several passes, and random moments.

Each trial runs ``attnlab train`` (a tiny char GPT, 12 steps, a checkpoint every step, an evaluation
every 4) in a subprocess and kills it with SIGKILL, either exactly at a named window
(``ATTNLAB_KILL_AT=window:pass``, core/killpoints.py) or at a random moment of the run (a delay after
its config.yaml appears, uniform over 2-98% of the uninterrupted run's time from that file to its last);
then ``attnlab resume`` once. (A kill before config.yaml exists leaves nothing to resume: ``resume`` says
so in one line and the same ``train`` command starts the run afresh.) The verdict rule, fixed before the run:
every trial is killed, resumes with exit 0 (no dead end), ends bit-identical to the uninterrupted run
(the top-level model and every logged loss), and its best/ verifies and holds the reference's best
weights. Prints a table; writes ``benchmarks/results/kill_trials.json``; exit 1 if any trial fails.

    python benchmarks/kill_trials.py            # ~5 minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import tempfile
from pathlib import Path

from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file
from attnlab.cli.errors import seed as any_seed

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.helpers import write_corpus  # noqa: E402
from tests.kill_trials import SETTINGS, reference, run_seconds, trial  # noqa: E402

from attnlab.core.killpoints import KILL_POINTS  # noqa: E402

# the passes each window is killed at (a 12-step run passes each about 12 times; mirror.renaming once
# per file mirrored; best.swap only when a later evaluation improves on an earlier one)
PASSES = {"checkpoint.writing": [1, 5, 12], "checkpoint.renamed": [1, 6, 12], "best.swap": [1, 2],
          "mirror.staged": [1, 8, 12], "mirror.renaming": [1, 17, 35], "mirror.manifest": [1, 9, 12],
          "prune": [1, 5, 10]}


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=at_least(1), default=30, help="named-window trials first, random moments after")
    ap.add_argument("--seed", type=any_seed, default=0)
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/kill_trials.json")
    args = ap.parse_args()
    assert set(PASSES) == set(KILL_POINTS)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus, preset, out = write_corpus(root / "corpus.txt"), root / "defaults.yaml", root / "runs"
        preset.write_text("{}\n")
        ref = reference(corpus, out, preset)
        duration = run_seconds(ref)  # from the run's config.yaml to its last file
        plan: list[dict] = [{"kill_at": f"{w}:{n}"} for w, ns in PASSES.items() for n in ns]
        plan = plan[:args.trials]
        plan += [{"kill_after_s": round(rng.uniform(0.02, 0.98) * duration, 2)}
                 for _ in range(args.trials - len(plan))]
        results = []
        print(f"uninterrupted run: {duration:.1f} s from its config.yaml to its last file; {len(plan)} trials")
        print(f"{'#':>3} {'killed at':24s} {'killed':>6} {'resume':>6} {'identical':>9} {'best kept':>9}")
        for i, spec in enumerate(plan):
            r = trial(corpus, out, preset, ref, name=f"t{i:02d}", **spec)
            results.append(r)
            where = spec.get("kill_at") or f"after {spec['kill_after_s']} s"
            print(f"{i:3d} {where:24s} {r['killed']!s:>6} {r['resume_rc']:>6} {r['identical']!s:>9} "
                  f"{r['best_kept']!s:>9}", flush=True)
    counts = {k: sum(bool(r[k]) for r in results) for k in ("killed", "identical", "best_kept", "dead_end")}
    ok = (counts["killed"] == counts["identical"] == counts["best_kept"] == len(results)
          and counts["dead_end"] == 0)
    print(f"\n{len(results)} trials: {counts['killed']} killed, {counts['identical']} resumed bit-identically, "
          f"{counts['dead_end']} dead ends, best/ kept in {counts['best_kept']}: {'PASS' if ok else 'FAIL'}")
    record = {"benchmark": "kill_trials", "settings": SETTINGS, "passes": PASSES, "seed": args.seed,
              "uninterrupted_s": round(duration, 2), "counts": counts, "trials": results, "pass": ok,
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(f"wrote {path}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run_script(main, "kill_trials")
