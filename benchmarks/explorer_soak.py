"""Explorer against slow and greedy clients: deadlines, health under 300 slow connections, memory soak.

Starts the real command (``python -m attnlab.cli explore RUN --port P``, its defaults) on a tiny ViT run
in a subprocess, on a loopback port, and attacks it in three phases:

1. **slow clients**: ``--slow`` connections at once (half send their headers one byte a second and never
   finish; half send whole headers and then trickle the body a byte a second), re-opened whenever the
   server closes them, for ``--slow-seconds``. Meanwhile ``/api/health`` is polled every 0.2 s: every
   answer's latency is recorded (the target: each within 1 s). For each slow connection the seconds
   until the server closed it are recorded (the target: within its deadline: header deadline for the
   head, the explorer's request limit for the body, plus 1 s).
2. **memory soak**: ``--rounds`` rounds of ``--uploads`` simultaneous image uploads (a noise PNG near
   the 2 MiB upload limit, resized by the server). The server's resident memory (VmRSS) is read after
   each round, once it is idle. The target: the last round within 20% of the first.
3. the server must still answer ``/api/health`` and a real upload at the end.

    python benchmarks/explorer_soak.py                    # ~3 minutes on 2 cores
    python benchmarks/explorer_soak.py --slow 300 --slow-seconds 30 --rounds 10 --uploads 260

Writes ``benchmarks/results/explorer_soak.json``; exit 1 if a target is missed.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from benchmarks.explorer_load import start_explorer  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def noise_png_b64(limit: int, seed: int = 0) -> str:
    """The largest square noise PNG (RGB) under ``limit`` bytes, base64."""
    rng = np.random.default_rng(seed)
    side = int((limit / 3) ** 0.5)
    while True:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "PNG", compress_level=1)
        if buf.tell() <= limit:
            return base64.b64encode(buf.getvalue()).decode("ascii")
        side -= 8


async def slow_client(host: str, port: int, kind: str, stop: float, closes: list[float]) -> None:
    """Open a connection and trickle it (``head``: headers never finished; ``body``: whole headers, then
    the body a byte a second); when the server closes it, note after how long and open another."""
    while time.monotonic() < stop:
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.2)
            continue
        head = f"POST /api/image HTTP/1.1\r\nHost: {host}:{port}\r\ncontent-type: application/json\r\n"
        try:
            if kind == "head":
                writer.write(head.encode())
            else:
                writer.write((head + "content-length: 100000\r\n\r\n").encode())
            while time.monotonic() < stop:
                writer.write(b"x")
                await writer.drain()
                try:
                    data = await asyncio.wait_for(reader.read(65536), 1.0)
                except TimeoutError:
                    continue
                if not data or data.startswith(b"HTTP/"):  # closed, or answered (408) and about to be closed
                    closes.append(time.monotonic() - t0)
                    break
        except (ConnectionError, OSError):
            closes.append(time.monotonic() - t0)
        finally:
            writer.close()


async def poll_health(url: str, stop: float, latencies: list[float], failures: list[str]) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                r = await client.get(f"{url}/api/health", headers={"connection": "close"})
                if r.status_code != 200:
                    failures.append(f"{r.status_code}: {r.text[:100]}")
            except httpx.HTTPError as e:
                failures.append(f"{type(e).__name__}: {e}")
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.2)


async def slow_phase(url: str, port: int, n: int, seconds: float) -> dict:
    stop = time.monotonic() + seconds
    head_closes: list[float] = []
    body_closes: list[float] = []
    latencies: list[float] = []
    failures: list[str] = []
    tasks = [slow_client("127.0.0.1", port, "head" if i % 2 == 0 else "body", stop,
                         head_closes if i % 2 == 0 else body_closes) for i in range(n)]
    await asyncio.gather(poll_health(url, stop, latencies, failures), *tasks)
    return {"slow_connections": n, "seconds": seconds, "health_polls": len(latencies),
            "health_failures": len(failures), "health_failure_examples": failures[:3],
            "health_max_s": round(max(latencies), 3) if latencies else None,
            "health_median_s": round(statistics.median(latencies), 4) if latencies else None,
            "head_closed": len(head_closes), "head_closed_max_s": round(max(head_closes), 2) if head_closes else None,
            "body_closed": len(body_closes), "body_closed_max_s": round(max(body_closes), 2) if body_closes else None}


async def upload_round(url: str, n: int, image: str) -> dict:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        async def one() -> str:
            try:
                r = await client.post("/api/image", json={"image": image, "resize": True})
                return str(r.status_code)
            except httpx.HTTPError as e:
                return type(e).__name__
        outcomes = await asyncio.gather(*[one() for _ in range(n)])
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o] = counts.get(o, 0) + 1
    return counts


def settle(url: str, timeout_s: float = 60) -> None:
    """Wait until the server has nothing pending."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if httpx.get(f"{url}/api/health", timeout=5).json()["pending"] == 0:
            return
        time.sleep(0.2)


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", type=at_least(1), default=300)
    ap.add_argument("--slow-seconds", type=float, default=30)
    ap.add_argument("--rounds", type=at_least(1), default=10)
    ap.add_argument("--uploads", type=at_least(1), default=260)
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/explorer_soak.json")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        from tests.web_helpers import train_tiny_vit

        cwd = os.getcwd()
        os.chdir(ROOT)  # the vit preset path is relative to the repository
        try:
            run_dir = train_tiny_vit(Path(tmp))
        finally:
            os.chdir(cwd)
        from attnlab.web.model_adapter import MAX_UPLOAD_BYTES

        image = noise_png_b64(MAX_UPLOAD_BYTES - 4096)
        proc, url, port = start_explorer(run_dir)
        try:
            baseline = rss_mb(proc.pid)
            print(f"server up, RSS {baseline:.0f} MB; {args.slow} slow connections for {args.slow_seconds:g} s ...")
            slow = asyncio.run(slow_phase(url, port, args.slow, args.slow_seconds))
            print(json.dumps(slow))
            settle(url)
            rounds = []
            for r in range(args.rounds):
                t0 = time.perf_counter()
                counts = asyncio.run(upload_round(url, args.uploads, image))
                settle(url)
                time.sleep(1.0)
                rounds.append({"round": r + 1, "by_status": counts, "wall_s": round(time.perf_counter() - t0, 2),
                               "rss_mb": round(rss_mb(proc.pid), 1)})
                print(f"round {r + 1:2d}: {counts}  RSS {rounds[-1]['rss_mb']:.0f} MB  ({rounds[-1]['wall_s']} s)")
            health = httpx.get(f"{url}/api/health", timeout=5)
            final = httpx.post(f"{url}/api/image", json={"image": image, "resize": True}, timeout=30)
            alive = proc.poll() is None and health.status_code == 200 and final.status_code == 200
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=20)

    from attnlab.web.connections import GuardSettings
    from attnlab.web.server import DEFAULT_TIMEOUT_S

    settings = GuardSettings()
    ratio = rounds[-1]["rss_mb"] / rounds[0]["rss_mb"]
    answered = all(set(r["by_status"]) <= {"200", "503"} and r["by_status"].get("200", 0) > 0 for r in rounds)
    checks = {
        "health within 1 s throughout": slow["health_failures"] == 0 and (slow["health_max_s"] or 9) < 1.0,
        "partial headers closed within their deadline": slow["head_closed"] > 0
        and slow["head_closed_max_s"] <= settings.header_timeout_s + 1,
        "trickled bodies closed within their deadline": slow["body_closed"] > 0
        and slow["body_closed_max_s"] <= settings.header_timeout_s + DEFAULT_TIMEOUT_S + 1,
        "every upload answered 200 or refused 503": answered,
        "memory after the last round within 20% of the first": ratio <= 1.2,
        "server healthy and computing at the end": alive,
    }
    print(f"\n{'check':55s} result")
    for name, ok in checks.items():
        print(f"{name:55s} {'PASS' if ok else 'FAIL'}")
    print(f"RSS: idle {baseline:.0f} MB, after round 1 {rounds[0]['rss_mb']:.0f} MB, after round {len(rounds)} "
          f"{rounds[-1]['rss_mb']:.0f} MB (ratio {ratio:.3f}); health max {slow['health_max_s']} s over "
          f"{slow['health_polls']} polls")
    record = {"benchmark": "explorer_soak", "args": vars(args), "guard": vars(settings),
              "request_timeout_s": DEFAULT_TIMEOUT_S, "idle_rss_mb": round(baseline, 1), "slow": slow,
              "rounds": rounds, "rss_ratio_last_first": round(ratio, 4), "checks": checks,
              "pass": all(checks.values()), "server_stderr_tail": err[-2000:],
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(f"wrote {out}")
    sys.exit(0 if record["pass"] else 1)


if __name__ == "__main__":
    run_script(main, "explorer_soak")
