"""What one request may be: a bounded body that arrives in time, within a budget for all bodies at
once; a Host and an Origin that name this machine. ASGI middlewares, outermost in the explorer app.

* ``BodyLimitMiddleware``: a body over ``max_bytes`` is refused with 413 (a declared Content-Length
  before a byte is read), one that has not arrived in whole within ``timeout_s`` with 408, however it
  trickles. All bodies being read or handled at once hold at most ``BodyBudget.limit`` bytes: a request
  that does not fit is read away (not kept) and answered 503 "busy", so 260 simultaneous 2 MiB uploads
  cost the budget, not 260 x 2 MiB.
* ``return_large_frees``: large buffers (bodies, decoded images) are mapped and unmapped on their own,
  so resident memory goes back down after a burst instead of staying fragmented in the heap.
* ``HostGuard``: the Host header must name this machine (no DNS rebinding) and a browser's Origin this
  host AND port.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse


def error_response(status: int, message: str, retry_after_s: int | None = None) -> JSONResponse:
    """Every error the explorer gives: JSON ``{"error": "one line"}``."""
    headers = {"retry-after": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def return_large_frees(threshold: int = 128 * 1024) -> bool:
    """glibc only: allocations of ``threshold`` bytes or more get their own mapping, returned to the OS
    when freed. glibc starts at 128 KiB but raises the threshold each time such a block is freed (up to
    32 MiB), after which 2 MiB upload buffers come from the heap and stay resident, fragmented: the
    explorer grew ~25% over 10 rounds of 260 uploads. Fixing the threshold stops that. False elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, threshold))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt): nothing to tune
        return False


class BodyBudget:
    """Bytes of request bodies held at once (``limit`` None: no limit). Used on the event loop only."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.held = limit, 0

    def reserve(self, n: int) -> bool:
        """Reserve ``n`` bytes for a request body; False when the budget is spent."""
        if self.limit is not None and self.held + n > self.limit:
            return False
        self.held += n
        return True

    def release(self, n: int) -> None:
        """Give back ``n`` reserved bytes."""
        self.held -= n


class BodyLimitMiddleware:
    """Reads a request body up to ``max_bytes`` (413 beyond it; 408 unless all of it arrives within
    ``timeout_s``, however it trickles), then replays it.

    A declared Content-Length over the limit is refused before one byte of the body is read.
    """

    def __init__(self, app: Any, max_bytes: int, timeout_s: float, budget: BodyBudget | None = None) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s
        self.budget = budget or BodyBudget(None)
        self.too_large = f"request body too large: the explorer accepts at most {max_bytes} bytes"

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                return await error_response(400, "invalid Content-Length header")(scope, receive, send)
            if int(declared) > self.max_bytes:
                return await error_response(413, self.too_large)(scope, receive, send)
        need = int(declared) if declared is not None else self.max_bytes
        if not self.budget.reserve(need):  # read the body away (not kept), so the client reads the answer
            drained = await self._read(receive, keep=False)
            if not isinstance(drained, bytes):  # 408, 413, or the client left
                return await drained(scope, receive, send) if drained is not None else None
            return await error_response(503, f"busy: {self.budget.held} bytes of request bodies are already "
                                        "being handled; retry shortly", retry_after_s=1)(scope, receive, send)
        try:
            body = await self._read(receive, keep=True)
            if isinstance(body, bytes):
                return await self.app(scope, self._replay(body, receive), send)
            if body is not None:
                return await body(scope, receive, send)
        finally:
            self.budget.release(need)
        return None

    async def _read(self, receive: Callable, keep: bool) -> bytes | JSONResponse | None:
        """The whole body (``keep``), or an error response (408, 413), or None if the client left."""
        chunks, size, more = [], 0, True
        deadline = asyncio.get_running_loop().time() + self.timeout_s  # for the WHOLE body, not each chunk
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                return error_response(408, f"request body not received within {self.timeout_s:g} s")
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return error_response(413, self.too_large)
            if keep:
                chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    @staticmethod
    def _replay(body: bytes, receive: Callable) -> Callable:
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect as usual

        return replay


class HostGuard:
    """Answers only requests whose Host header names this machine (blocks DNS rebinding: a web page
    elsewhere cannot point its own domain at 127.0.0.1 and script the explorer through the browser)."""

    def __init__(self, app: Any, allowed_hosts: set[str]) -> None:
        self.app, self.allowed_hosts = app, allowed_hosts

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            host = headers.get(b"host", b"").decode("latin-1")
            if self._name(host) not in self.allowed_hosts:
                return await error_response(400, f"unexpected Host header '{host[:100]}': open the explorer at "
                                         "the address it printed")(scope, receive, send)
            origin = headers.get(b"origin", b"").decode("latin-1")  # sent by browsers with every POST
            if origin and origin.split("://", 1)[-1].rstrip("/").lower() != host.lower():  # host AND port
                return await error_response(403, f"requests from another site ('{origin[:100]}') are refused")(
                    scope, receive, send)
        return await self.app(scope, receive, send)

    @staticmethod
    def _name(host: str) -> str:
        """'127.0.0.1:8000' -> '127.0.0.1', '[::1]:8000' -> '[::1]' (lower case)."""
        host = host.lower().rstrip("/")
        return host if host.endswith("]") or ":" not in host else host.rsplit(":", 1)[0]
