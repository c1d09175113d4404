"""Bad inputs, every subcommand, each in its own process (issue 21): the README's Reliability figures.

Builds the cases of ``tests/bad_inputs.py`` (a tiny trained run, FIFOs, binary and Latin-1 files, broken
images, malformed labels, absurd sizes, non-finite numbers for every float option, bad integers for
every count, wrong families, ...), runs ``python -m attnlab.cli ARGV`` for each with a time limit, and
counts what the promise forbids:

    not exit 2 | not exactly one stderr line "attnlab: error: ..." | a traceback | a hang (> --timeout s)
    | an exit-0 answer | a partial run folder | a peak resident memory above --max-rss-mb

    python benchmarks/bad_inputs.py [--timeout 60] [--jobs 2] [--max-rss-mb 1500] [--limit N]

Prints one line per failing case and a summary table; writes ``benchmarks/results/bad_inputs.json``.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from attnlab.cli.errors import OneLineParser, at_least, run_script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))


def run_case(argv: list[str], timeout: float, cwd: Path) -> dict:
    """One subprocess: exit status, stderr, wall time, peak RSS (os.wait4), killed on timeout."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli", *argv], cwd=cwd, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        hung = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                hung = True
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return {"rc": proc.returncode, "stderr": err.read().decode("utf-8", "replace"), "hung": hung,
                "seconds": time.perf_counter() - start, "max_rss_mb": usage.ru_maxrss / 1024}


def judge(case: dict, max_rss_mb: float, runs_dir: Path) -> list[str]:
    lines = [line for line in case["stderr"].strip().splitlines() if not line.startswith("warning:")]
    problems = []
    if case["hung"]:
        problems.append("hang")
    elif case["rc"] == 0:
        problems.append("exit 0")
    elif case["rc"] != 2:
        problems.append(f"exit {case['rc']}")
    if "Traceback" in case["stderr"]:
        problems.append("traceback")
    if not case["hung"] and (len(lines) != 1 or not lines[0].startswith("attnlab: error:")):
        problems.append(f"{len(lines)} stderr lines")
    if case["max_rss_mb"] > max_rss_mb:
        problems.append(f"peak RSS {case['max_rss_mb']:.0f} MB")
    if runs_dir.exists() and any(runs_dir.iterdir()):
        problems.append("partial run folder")
    if case["max_rss_mb"] <= 0:
        problems.append("no memory measurement")
    return problems


def main() -> int:
    p = OneLineParser(description=__doc__.split("\n")[0])
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--jobs", type=at_least(1), default=2)
    p.add_argument("--max-rss-mb", type=float, default=1500.0, help="what no bad input may allocate")
    p.add_argument("--limit", type=at_least(1), default=None, help="only the first N cases")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="attnlab-bad-"))
    # the cases (and the tiny run they need) are built in a child process: this process never imports
    # torch, so the children it forks start small and their peak RSS (os.wait4) is their own
    listing = subprocess.run([sys.executable, "-c", "import json, sys; from pathlib import Path; "
                              "from tests.bad_inputs import build_cases; "
                              "print(json.dumps(build_cases(Path(sys.argv[1]))))", str(root)],
                             cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"})
    cases = json.loads(listing.stdout.strip().splitlines()[-1])[: args.limit]
    run_dir, shared = str(root / "trained" / "runs" / "r"), str(root / "runs")
    started = time.perf_counter()

    def one(item: tuple[int, list]) -> dict:
        i, (name, argv) = item
        own = root / "runs" / f"case-{i:03d}"  # each case's own out_dir: what it leaves is its own
        argv = [run_dir if a == "RUN" else a.replace(shared, str(own)) for a in argv]
        result = run_case(argv, args.timeout, ROOT)
        return {"name": name, "argv": argv, "out_dir": str(own), **result}

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, enumerate(cases)))
    failures = 0
    for r in results:
        r["problems"] = judge(r, args.max_rss_mb, Path(r["out_dir"]))
        if r["problems"]:
            failures += 1
            print(f"FAIL {r['name']}: {', '.join(r['problems'])}: {r['stderr'].strip()[-300:]!r}")
    counts = {k: sum(k in " ".join(r["problems"]) for r in results)
              for k in ("hang", "exit 0", "traceback", "stderr lines", "peak RSS", "partial run folder")}
    one_line = sum(not r["problems"] for r in results)
    print(f"\n{len(results)} bad inputs over {len({r['argv'][0] if r['argv'] else '' for r in results})} "
          f"subcommands in {time.perf_counter() - started:.0f} s ({args.jobs} at a time)")
    print(f"{'one line, exit 2, nothing left behind':>40}: {one_line}")
    for k, v in counts.items():
        print(f"{k:>40}: {v}")
    rss = sorted(r["max_rss_mb"] for r in results)
    print(f"{'peak RSS, median / max (MB)':>40}: {rss[len(rss) // 2]:.0f} / {rss[-1]:.0f}")
    out = ROOT / "benchmarks" / "results" / "bad_inputs.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.machine(), "cases": len(results), "passed": one_line,
                               "counts": counts, "max_rss_mb": rss[-1], "results": results}, indent=1))
    print(f"wrote {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    run_script(main, "bad_inputs")
