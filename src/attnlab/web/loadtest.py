"""A bounded local load test of a running explorer: N simultaneous requests, each answered or refused.

``fire(base_url, n)`` opens ``n`` connections at once (one asyncio task each, no client-side pooling
limit), posts the same text to ``/api/attention`` from all of them, and returns per request the HTTP
status (or the client-side error), the latency, and the server's one-line error. Used by the load
test in tests/ and by ``benchmarks/explorer_load.py``; it only ever talks to the URL it is given.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Outcome:
    """One request of a load test: its status (or error) and latency."""
    status: int | None  # None: no HTTP answer (connection error or client timeout)
    latency_s: float
    error: str = ""  # the server's {"error": ...} line, or the client-side exception


async def _fire(base_url: str, n: int, text: str, timeout_s: float) -> list[Outcome]:
    import httpx

    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    start = asyncio.Event()

    async def one(client: httpx.AsyncClient) -> Outcome:
        await start.wait()  # all tasks leave together
        t0 = time.perf_counter()
        try:
            r = await client.post("/api/attention", json={"text": text})
        except httpx.HTTPError as e:
            return Outcome(None, time.perf_counter() - t0, f"{type(e).__name__}: {e}")
        error = ""
        if r.status_code != 200:
            try:
                error = r.json().get("error", "")
            except ValueError:
                error = r.text[:200]
        return Outcome(r.status_code, time.perf_counter() - t0, error)

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout_s) as client:
        tasks = [asyncio.create_task(one(client)) for _ in range(n)]
        await asyncio.sleep(0)
        start.set()
        return await asyncio.gather(*tasks)


def fire(base_url: str, n: int = 200, text: str = "the quick brown fox", timeout_s: float = 60.0) -> list[Outcome]:
    """``n`` concurrent POSTs to ``base_url``/api/attention; one Outcome per request, in order."""
    return asyncio.run(_fire(base_url, n, text, timeout_s))


def summarise(outcomes: list[Outcome], wall_s: float) -> dict[str, Any]:
    """Counts by status and latency quantiles (ms) of the answered and the refused requests."""

    def quantiles(xs: list[float]) -> dict[str, float] | None:
        if not xs:
            return None
        xs = sorted(xs)
        pick = lambda q: xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]  # noqa: E731
        return {"p50_ms": round(1000 * statistics.median(xs), 1), "p95_ms": round(1000 * pick(0.95), 1),
                "max_ms": round(1000 * xs[-1], 1)}

    by_status: dict[str, int] = {}
    for o in outcomes:
        key = str(o.status) if o.status is not None else "no answer"
        by_status[key] = by_status.get(key, 0) + 1
    return {
        "requests": len(outcomes), "by_status": by_status, "wall_s": round(wall_s, 3),
        "answered": quantiles([o.latency_s for o in outcomes if o.status == 200]),
        "refused": quantiles([o.latency_s for o in outcomes if o.status in (429, 503)]),
        "refusal_messages": sorted({o.error.split(":")[0] for o in outcomes if o.status in (429, 503)}),
    }
