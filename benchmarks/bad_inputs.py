"""Bad inputs, every subcommand, each in its own process (issue 21; round two: issue 69): the Reliability figures.

Builds the cases of ``tests/bad_inputs.py`` (a tiny trained run, FIFOs, binary and Latin-1 files, broken
images, malformed labels, absurd sizes, non-finite numbers for every float option, bad integers for
every count, wrong families, ...), runs ``python -m attnlab.cli ARGV`` for each with a time limit, and
counts what the promise forbids:

    not exit 2 | not exactly one stderr line "attnlab: error: ..." | a traceback | a hang (> --timeout s)
    | an exit-0 answer | a partial run folder | a peak resident memory above --max-rss-mb

Round two (``tests/bad_inputs_round2.py``: YAML bombs, huge integers, audio and image headers that promise
gigabytes, absurd sizes, malformed CSV and labels, output paths the file system refuses, a held port, broken
Hugging Face folders, bad resumes) adds cases that must work (exit 0 and a check of what they wrote, e.g. every
row predicted), cases run under ``ulimit -f`` and a port this script holds; a child above --kill-rss-mb is killed
(an unbounded allocation must not take the machine) and counted as over the memory cap.

Round three (``tests/bad_inputs_round3.py``) takes the same kinds of case to the commands the first two touched least:
inspect, heads, experiment, export, eval, sample, predict, embed, lens, data, explore, completion, bench, resume.

    python benchmarks/bad_inputs.py [--round 1|2|3|all] [--timeout 60] [--jobs 2] [--max-rss-mb 1500] [--limit N]
                                    [--out FILE.json]

Prints one line per failing case and a summary table per round; writes ``benchmarks/results/bad_inputs.json`` (or
--out: each round's counts and results; a round not run keeps its entry from the file's last run).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import signal
import socket
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


def _rss_mb(pid: int) -> float:
    """The resident memory of a running process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return 0.0


def run_case(argv: list[str], timeout: float, cwd: Path, fsize: int | None = None,
             kill_rss_mb: float | None = None, unprivileged: bool = False) -> dict:
    """One subprocess: exit status, stderr, wall time, peak RSS (os.wait4), killed on timeout. ``fsize``: its
    RLIMIT_FSIZE in bytes (``ulimit -f``); ``kill_rss_mb``: killed once its resident memory passes this;
    ``unprivileged``: run where file permissions bind it (root without its override, ``as_unprivileged``)."""
    from tests.helpers import as_unprivileged

    command = [sys.executable, "-m", "attnlab.cli", *argv]
    if unprivileged:
        command = as_unprivileged(command)
        if command is None:
            raise SystemExit("a permission case needs setpriv when run as root (util-linux)")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    limit = None if fsize is None else (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize)))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True, preexec_fn=limit)
        hung = over = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            over = kill_rss_mb is not None and _rss_mb(proc.pid) > kill_rss_mb
            if over or time.perf_counter() - start > timeout:
                hung = not over
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return {"rc": proc.returncode, "stderr": err.read().decode("utf-8", "replace"), "hung": hung,
                "seconds": time.perf_counter() - start, "max_rss_mb": usage.ru_maxrss / 1024,
                **({"killed_over_rss": True} if over else {})}


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


def judge_round2(case: dict, expect: str, max_rss_mb: float, runs_dir: Path) -> list[str]:
    """Round two's verdict on one case: ``expect`` as tests/bad_inputs_round2.py defines it ("refused[:TEXT]":
    round one's judge, and the line holds TEXT and is at most 1,000 characters; "stopped": the same, a run folder
    may stay; "works:CHECK": exit 0, no traceback, and the check finds nothing wrong; "either": refused, or exit 0
    without a traceback)."""
    from tests.bad_inputs_round3 import check  # round two's checks, and round three's

    kind, _, detail = expect.partition(":")
    if kind == "either" and (case["hung"] or case["rc"] != 0):
        kind = "refused"
    if kind in ("works", "either"):
        problems = ["hang"] if case["hung"] else [] if case["rc"] == 0 else [f"exit {case['rc']}"]
        if "Traceback" in case["stderr"]:
            problems.append("traceback")
        if case["max_rss_mb"] > max_rss_mb:
            problems.append(f"peak RSS {case['max_rss_mb']:.0f} MB")
        if not problems and kind == "works" and (wrong := check(expect, case["argv"])):
            problems.append(f"wrong output: {wrong}")
        return problems
    problems = judge(case, max_rss_mb, runs_dir)
    # a folder lock beside an output (.NAME.lock, core/locks.py) stays by design once taken: not a partial output
    only_locks = runs_dir.is_dir() and all(p.name.startswith(".") and p.name.endswith(".lock") and p.is_file()
                                           for p in runs_dir.iterdir())
    if kind == "stopped" or only_locks:
        problems = [p for p in problems if p != "partial run folder"]
    line = next((x for x in case["stderr"].splitlines() if x.startswith("attnlab: error:")), "")
    if len(line) > 1000:
        problems.append(f"a {len(line):,}-character error line")
    if detail and line and detail not in line:
        problems.append(f"the line does not say {detail!r}")
    return problems


ROUND2_KINDS = ("hang", "exit 0", "another exit status", "traceback", "stderr lines", "peak RSS",
                "partial run folder", "wrong output", "error line too long", "line lacks the expected text")


def _category(problem: str) -> str:
    """Which of ROUND2_KINDS a problem of ``judge_round2`` is."""
    if problem.startswith("exit"):
        return "exit 0" if problem == "exit 0" else "another exit status"
    if problem.endswith("character error line"):
        return "error line too long"
    if problem.startswith("the line does not say"):
        return "line lacks the expected text"
    return next((k for k in ROUND2_KINDS if k in problem), problem)


def list_cases(round_: int, root: Path) -> list[dict]:
    """A round's cases ({name, argv, expect}), built in a child process: this process never imports torch, so the
    children it forks start small and their peak RSS (os.wait4) is their own."""
    module = {1: "tests.bad_inputs", 2: "tests.bad_inputs_round2", 3: "tests.bad_inputs_round3"}[round_]
    listing = subprocess.run([sys.executable, "-c", "import json, sys; from pathlib import Path; "
                              f"from {module} import build_cases; "
                              "print(json.dumps(build_cases(Path(sys.argv[1]))))", str(root)],
                             cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"})
    cases = json.loads(listing.stdout.strip().splitlines()[-1])
    return [{"name": c[0], "argv": c[1], "expect": c[2] if len(c) > 2 else "refused"} for c in cases]


def run_round(round_: int, args) -> dict:
    """Build, run and judge one round; print its failures and table; its record for the JSON."""
    from tests.bad_inputs_round3 import FSIZE_LIMITS, HELD_PORT, UNPRIVILEGED

    root = Path(tempfile.mkdtemp(prefix=f"attnlab-bad{round_}-"))
    cases = list_cases(round_, root)[: args.limit]
    run_dir, shared = str(root / "trained" / "runs" / "r"), str(root / "runs")
    started = time.perf_counter()

    def one(item: tuple[int, dict]) -> dict:
        i, c = item
        own = root / "runs" / f"case-{i:03d}"  # each case's own out_dir: what it leaves is its own
        argv = [run_dir if a == "RUN" and round_ == 1 else a.replace(shared, str(own)) for a in c["argv"]]
        if round_ == 1:
            return {"name": c["name"], "argv": argv, "out_dir": str(own), **run_case(argv, args.timeout, ROOT)}
        own.mkdir(parents=True)  # there, empty, as the folder of an --out file must be
        with socket.socket() as held:  # a port in use, for the explorer's cases
            held.bind(("127.0.0.1", 0))
            held.listen()
            argv = [str(held.getsockname()[1]) if a == HELD_PORT else a for a in argv]
            result = run_case(argv, args.timeout, ROOT, FSIZE_LIMITS.get(c["name"]), args.kill_rss_mb,
                              unprivileged=UNPRIVILEGED in c["name"])
        return {"name": c["name"], "argv": argv, "expect": c["expect"], "out_dir": str(own), **result}

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, enumerate(cases)))
    failures = 0
    print(f"\nround {round_}")
    for r in results:
        r["problems"] = (judge(r, args.max_rss_mb, Path(r["out_dir"])) if round_ == 1 else
                         judge_round2(r, r["expect"], args.max_rss_mb, Path(r["out_dir"])))
        if r["problems"]:
            failures += 1
            print(f"FAIL {r['name']}: {', '.join(r['problems'])}: {r['stderr'].strip()[-300:]!r}")
    kinds = ("hang", "exit 0", "traceback", "stderr lines", "peak RSS", "partial run folder")
    counts = {k: sum(k in " ".join(r["problems"]) for r in results) for k in kinds}
    if round_ >= 2:  # the same, and what round two adds: other exit statuses, wrong output, the line itself
        counts = {k: sum(k in {_category(p) for p in r["problems"]} for r in results) for k in ROUND2_KINDS}
    passed = sum(not r["problems"] for r in results)
    print(f"\n{len(results)} bad inputs over {len({r['argv'][0] if r['argv'] else '' for r in results})} "
          f"subcommands in {time.perf_counter() - started:.0f} s ({args.jobs} at a time)")
    print(f"{'one line, exit 2, nothing left behind' if round_ == 1 else 'as expected':>40}: {passed}")
    if round_ >= 2:
        works = [r for r in results if r["expect"].startswith("works")]
        print(f"{'of which must work (exit 0, checked)':>40}: {sum(not r['problems'] for r in works)} "
              f"of {len(works)}")
    for k, v in counts.items():
        print(f"{k:>40}: {v}")
    rss = sorted(r["max_rss_mb"] for r in results)
    print(f"{'peak RSS, median / max (MB)':>40}: {rss[len(rss) // 2]:.0f} / {rss[-1]:.0f}")
    return {"cases": len(results), "passed": passed, "failed": failures, "counts": counts, "max_rss_mb": rss[-1],
            "results": results}


def main() -> int:
    p = OneLineParser(description=__doc__.split("\n")[0])
    p.add_argument("--round", choices=("1", "2", "3", "all"), default="all",
                   help="which cases: round one, two, three or all")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--jobs", type=at_least(1), default=2)
    p.add_argument("--max-rss-mb", type=float, default=1500.0, help="what no bad input may allocate")
    p.add_argument("--kill-rss-mb", type=float, default=4000.0, help="round two: a child past this is killed")
    p.add_argument("--limit", type=at_least(1), default=None, help="only the first N cases of each round")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bad_inputs.json")
    args = p.parse_args()
    rounds = [1, 2, 3] if args.round == "all" else [int(args.round)]
    out = args.out
    try:
        kept = json.loads(out.read_text()).get("rounds", {})
    except (OSError, ValueError, AttributeError):
        kept = {}
    records = {**kept, **{str(n): run_round(n, args) for n in rounds}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.machine(), "rounds": records,
                               "counts": {n: {"cases": r["cases"], "passed": r["passed"], **r["counts"]}
                                          for n, r in records.items()}}, indent=1))
    print(f"wrote {out}")
    return 1 if any(records[str(n)]["failed"] for n in rounds) else 0


if __name__ == "__main__":
    run_script(main, "bad_inputs")
