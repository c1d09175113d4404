"""Explorer under load: N simultaneous inference requests against `attnlab explore` on a loopback port.

Starts the real command (``python -m attnlab.cli explore RUN --port P``, its defaults: one inference
thread, a queue of 8, a 10 s limit per request) in a subprocess, waits for /api/health, then fires
``--requests`` POSTs to /api/attention at once, ``--rounds`` times. Every request must be answered
(200) or refused cleanly (503 "busy", with Retry-After), none may hang or fail at the connection, and
the server must answer its health check afterwards. Prints counts by status and latency quantiles.

    python benchmarks/explorer_load.py                       # trains a tiny char GPT first (~5 s)
    python benchmarks/explorer_load.py --run-dir runs/shakespeare-char --requests 200 --rounds 3

Writes ``benchmarks/results/explorer_load.json``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attnlab.web.loadtest import fire, summarise  # noqa: E402


def tiny_run(folder: Path) -> Path:
    """A 2-layer char GPT trained for 30 steps on a synthetic corpus."""
    sys.path.insert(0, str(ROOT))
    from tests.web_helpers import train_tiny_run

    return train_tiny_run(folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:  # its own one-line reason, and its status (2: the run was refused)
            why = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
            print(f"explorer_load: the explorer exited early: {why[-1] if why else f'status {proc.returncode}'}",
                  file=sys.stderr)
            sys.exit(2 if proc.returncode == 2 else 1)
        try:
            if httpx.get(f"{url}/api/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the explorer did not become healthy in time")


def start_explorer(run_dir: Path) -> tuple[subprocess.Popen, str, int]:
    """``attnlab explore RUN`` (its defaults) on a free loopback port, healthy; (process, URL, port)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli", "explore", str(run_dir), "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_healthy(url, proc)
    return proc, url, port


def main() -> int | None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", default=None, help="a trained GPT run (default: train a tiny one in a temp dir)")
    ap.add_argument("--requests", type=at_least(1), default=200)
    ap.add_argument("--rounds", type=at_least(1), default=3)
    ap.add_argument("--text", default=None, help="default: the run's example text")
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/explorer_load.json")
    args = ap.parse_args()
    if args.run_dir is not None and not Path(args.run_dir).is_dir():
        print(f"explorer_load: --run-dir {args.run_dir}: run folder not found", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else tiny_run(Path(tmp))
        proc, url, _ = start_explorer(run_dir)
        try:
            info = httpx.get(f"{url}/api/info", timeout=5).json()
            text = args.text or info["example"]
            rounds = []
            for r in range(args.rounds):
                t0 = time.perf_counter()
                outcomes = fire(url, n=args.requests, text=text)
                stats = summarise(outcomes, time.perf_counter() - t0)
                health = httpx.get(f"{url}/api/health", timeout=10)
                stats["healthy_after"] = health.status_code == 200 and health.json()["status"] == "ok"
                stats["clean"] = all(o.status in (200, 429, 503) for o in outcomes) and stats["healthy_after"]
                rounds.append(stats)
                print(f"round {r + 1}: {stats['by_status']} in {stats['wall_s']:.2f} s; answered {stats['answered']}; "
                      f"refused {stats['refused']}; healthy after: {stats['healthy_after']}")
            alive = proc.poll() is None
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=20)
    ok = all(r["clean"] for r in rounds) and alive
    print(f"{'PASS' if ok else 'FAIL'}: {args.rounds} rounds of {args.requests} concurrent requests to a "
          f"{info['n_layer']}-layer {info['family']} ({len(text)}-character text); every request answered or "
          f"refused cleanly: {all(r['clean'] for r in rounds)}; server up at the end: {alive}")
    record = {
        "benchmark": "explorer_load", "run_dir": str(args.run_dir or "tiny (temporary)"), "text": text,
        "model": {k: info[k] for k in ("family", "n_layer", "n_head", "block_size")},
        "server_defaults": {"max_queue": 8, "timeout_s": info["timeout_s"], "workers": 1},
        "rounds": rounds, "server_alive_at_end": alive, "pass": ok,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "server_stderr_tail": err[-2000:],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(f"wrote {out}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run_script(main, "explorer_load")
