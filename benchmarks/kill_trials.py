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

With ``--command finetune`` the trials are of ``attnlab finetune`` (a 2-layer BERT pre-trained for 2 steps, then
fine-tuned for 6 on 90 labelled rows, a checkpoint every step, an evaluation every 2), whose windows include
``finetune.report`` (trained, finetune.json not yet written); a trial passes when, besides the above, the resumed
run's finetune.json holds the uninterrupted run's held-out scores. Writes
``benchmarks/results/kill_trials_finetune.json``.

With ``--command folders`` the trials are of the commands that write a folder whole (import-hf, data micrographs,
data spoken-words, export, inspect --text, heads, experiment; tests/kill_trials_folders.py): each killed at every
window it passes (``staging.filled``; for those that replace an earlier output of their own also
``staging.swapping`` and ``staging.swapped``) and at random moments of its run, over its earlier output where it
replaces one. A trial passes when OUT right after the kill is absent, the earlier output whole or the new one whole,
and the same command run again exits 0 with the new output whole and nothing left beside it. Writes
``benchmarks/results/kill_trials_folders.json``.

    python benchmarks/kill_trials.py                      # ~5 minutes on 2 cores
    python benchmarks/kill_trials.py --command finetune   # ~3 minutes on 2 cores
    python benchmarks/kill_trials.py --command folders    # ~6 minutes on 2 cores
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
from tests.kill_trials import (  # noqa: E402
    FINETUNE_SETTINGS,
    SETTINGS,
    counted_passes,
    finetune_inputs,
    finetune_reference,
    finetune_trial,
    launch_finetune,
    reference,
    run_seconds,
    trial,
)

from attnlab.core.killpoints import KILL_POINTS  # noqa: E402

# the passes each window is killed at (a 12-step run passes each about 12 times; mirror.renaming once
# per file mirrored; best.swap only when a later evaluation improves on an earlier one)
PASSES = {"checkpoint.writing": [1, 5, 12], "checkpoint.renamed": [1, 6, 12], "best.swap": [1, 2],
          "mirror.staged": [1, 8, 12], "mirror.renaming": [1, 17, 35], "mirror.manifest": [1, 9, 12],
          "prune": [1, 5, 10]}
# a 6-step fine-tuning: 6 checkpoints, 4 files mirrored at each, best/ swapped in at steps 4 and 6, a prune from
# the third checkpoint on, one report
FINETUNE_PASSES = {"checkpoint.writing": [1, 3, 6], "checkpoint.renamed": [1, 4, 6], "best.swap": [1, 2],
                   "mirror.staged": [1, 3, 6], "mirror.renaming": [1, 10, 24], "mirror.manifest": [1, 3, 6],
                   "prune": [1, 2, 4], "finetune.report": [1]}
CHECKS = ("killed", "identical", "best_kept")


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--command", choices=("train", "finetune", "folders"), default="train",
                    help="the command killed (folders: the seven that write a folder whole)")
    ap.add_argument("--trials", type=at_least(1), default=None, help="named-window trials first, random moments "
                    "after (default 30; with folders: per command, default its windows and 2 random moments)")
    ap.add_argument("--seed", type=any_seed, default=0)
    ap.add_argument("--out", type=writable_file, default=None,
                    help="default: benchmarks/results/kill_trials.json (kill_trials_finetune.json with finetune)")
    args = ap.parse_args()
    if args.command == "folders":
        return folders(args)
    args.trials = args.trials or 30
    finetune = args.command == "finetune"
    passes = FINETUNE_PASSES if finetune else PASSES
    checks = (*CHECKS, "report") if finetune else CHECKS
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = root / "runs"
        if finetune:
            pretrained, data = finetune_inputs(root)
            ref, windows = finetune_reference(pretrained, data, out)
            timed = out / "timed"  # timed as the trials run: in a process of its own
            assert launch_finetune(pretrained, data, out, timed.name, None).wait() == 0

            def one(name: str, **spec) -> dict:
                return finetune_trial(pretrained, data, out, ref, name=name, **spec)
        else:
            corpus, preset = write_corpus(root / "corpus.txt"), root / "defaults.yaml"
            preset.write_text("{}\n")
            with counted_passes() as windows:  # the windows it has
                reference(corpus, root / "counted", preset, in_process=True)
            ref = timed = reference(corpus, out, preset)  # timed as the trials run: in a process of its own

            def one(name: str, **spec) -> dict:
                return trial(corpus, out, preset, ref, name=name, **spec)
        # every window the uninterrupted run has is tried, each at passes it reaches
        assert set(passes) == set(windows) <= set(KILL_POINTS), windows
        assert all(max(ns) <= windows[w] for w, ns in passes.items()), windows
        duration = run_seconds(timed)  # from the run's config.yaml to its last file
        plan: list[dict] = [{"kill_at": f"{w}:{n}"} for w, ns in passes.items() for n in ns]
        plan = plan[:args.trials]
        plan += [{"kill_after_s": round(rng.uniform(0.02, 0.98) * duration, 2)}
                 for _ in range(args.trials - len(plan))]
        results = []
        print(f"uninterrupted {args.command}: {duration:.1f} s from its config.yaml to its last file; "
              f"{len(plan)} trials")
        print(f"{'#':>3} {'killed at':24s} " + " ".join(f"{c.replace('_', ' '):>9}" for c in ("killed", "resume",
                                                                                          *checks[1:])))
        for i, spec in enumerate(plan):
            r = one(f"t{i:02d}", **spec)
            results.append(r)
            where = spec.get("kill_at") or f"after {spec['kill_after_s']} s"
            print(f"{i:3d} {where:24s} {r['killed']!s:>9} {r['resume_rc']:>9} "
                  + " ".join(f"{r[c]!s:>9}" for c in checks[1:]), flush=True)
    counts = {k: sum(bool(r[k]) for r in results) for k in (*checks, "dead_end")}
    ok = all(counts[k] == len(results) for k in checks) and counts["dead_end"] == 0
    reported = f", finetune.json the same in {counts['report']}" if finetune else ""
    print(f"\n{len(results)} trials: {counts['killed']} killed, {counts['identical']} resumed bit-identically, "
          f"{counts['dead_end']} dead ends, best/ kept in {counts['best_kept']}{reported}: {'PASS' if ok else 'FAIL'}")
    record = {"benchmark": "kill_trials", "command": args.command,
              "settings": FINETUNE_SETTINGS if finetune else SETTINGS, "passes": passes, "seed": args.seed,
              "uninterrupted_s": round(duration, 2), "counts": counts, "trials": results, "pass": ok,
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}
    path = Path(args.out or f"benchmarks/results/kill_trials{'_finetune' if finetune else ''}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(f"wrote {path}")
    sys.exit(0 if ok else 1)


def folders(args) -> None:
    """The trials of the folder writers (``--command folders``)."""
    from tests.kill_trials_folders import CHECKS as FOLDER_CHECKS
    from tests.kill_trials_folders import reference as folder_reference
    from tests.kill_trials_folders import trial as folder_trial
    from tests.kill_trials_folders import writers

    rng = random.Random(args.seed)
    results, timings = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"{'command':18s} {'killed at':24s} " + " ".join(f"{c:>9}" for c in (*FOLDER_CHECKS, "found", "rerun")))
        for writer in writers(root / "inputs"):
            ref = folder_reference(writer, root)
            timings[writer.name] = round(ref["seconds"], 2)
            plan = [{"kill_at": w} for w in writer.windows]
            n = args.trials or len(plan) + 2
            plan = plan[:n] + [{"kill_after_s": round(rng.uniform(0.05, 0.95) * ref["seconds"], 2)}
                               for _ in range(n - len(plan[:n]))]
            for i, spec in enumerate(plan):
                r = folder_trial(writer, ref, root / "trials" / f"{writer.name.replace(' ', '-')}-{i}", **spec)
                results.append(r)
                where = spec.get("kill_at") or f"after {spec['kill_after_s']} s"
                print(f"{writer.name:18s} {where:24s} " + " ".join(f"{r[c]!s:>9}" for c in FOLDER_CHECKS)
                      + f" {r['found']:>9} {r['rerun_rc']:>9}", flush=True)
    named = [r for r in results if r["kill_at"]]
    counts = {k: sum(bool(r[k]) for r in results) for k in (*FOLDER_CHECKS, "dead_end")}
    # a random moment may fall after the command ended (not killed): it must still leave the new output whole
    ok = (all(r["killed"] for r in named) and counts["dead_end"] == 0
          and all(counts[k] == len(results) for k in ("whole", "identical", "clean")))
    print(f"\n{len(results)} trials ({len(named)} at named windows): {counts['killed']} killed, {counts['whole']} "
          f"left a whole folder, {counts['dead_end']} dead ends, {counts['identical']} ran again to the uninterrupted "
          f"output, {counts['clean']} left nothing beside it: {'PASS' if ok else 'FAIL'}")
    record = {"benchmark": "kill_trials", "command": "folders", "seed": args.seed, "uninterrupted_s": timings,
              "counts": counts, "trials": results, "pass": ok,
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}
    path = Path(args.out or "benchmarks/results/kill_trials_folders.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(f"wrote {path}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run_script(main, "kill_trials")
