"""The explorer's web server: one offline page plus a small JSON API, with every input bounded.

    GET  /                 the page (static/index.html; script and style from /static, no CDN)
    GET  /api/health       {"status": "ok", "pending": n, "peak_pending": m}: liveness; inferences running or
                           queued now, and the most there have ever been at once
    GET  /api/info         the run's family, layers, heads and input limits
    POST /api/attention    {"text": "...", "mask": [positions]} -> tokens, attention maps (layer, head, query,
                           key), and a gpt's top-10 next tokens or a bert's top-10 guesses at each [MASK]
    POST /api/image        {"image": "<base64 or data: URL>", "resize": false} (vit) -> top-5 classes,
                           [CLS] -> patch attention per layer/head and rollout on the patch grid
    POST /api/lens         {"text": "...", "ablate": [[layer, head], ...], "how": "zero" | "mean"} (gpt) ->
                           the logit lens after the text, and the next token plain and with the heads ablated

Limits (issue 9, item 5):

* binds 127.0.0.1 unless ``host`` says otherwise (a warning is printed when it does);
* every connection is guarded (web/connections.py): its request head must arrive within 5 s, it carries
  one request; over 64 connections of one client still sending their requests, or 512 open in all,
  the oldest stalled one (still sending after 1 s) is closed to make room: slow clients cannot starve
  the rest;
* a request body larger than ``max_body_bytes`` is refused with 413 before the app sees it, a body
  that does not arrive in whole within ``timeout_s`` with 408, and bodies beyond a budget for all of
  them at once (room for what the queue can take, and two more) with 503 (web/limits.py);
* model input is bounded by the adapter (characters, then tokens <= the model's context): 400;
  an image upload by its file size (413 beyond ``MAX_UPLOAD_BYTES``) and pixel dimensions (400), and
  it must be the model's size unless the user asks to resize it (400 naming the size expected);
* inference runs on ONE worker thread (the model is used by one request at a time); at most
  ``max_queue`` requests wait behind it, any more are refused at once with 503 "busy, retry";
* a request whose inference has not finished within ``timeout_s`` gets 503 (the slot stays taken
  until the computation really ends, so a slow model cannot pile up work);
* the run folder is fixed at start-up: no request names a file, unknown JSON fields are refused;
* on any address it answers only Host headers naming this machine (no DNS rebinding: the loopback names,
  the bound address, and beyond loopback this machine's name and addresses; web/binding.py) and no
  browser request sent from another origin's page (the Origin header must name this host and port);
* a port in use, or a host that is not this machine's, is one line before the model is loaded;
* every error is JSON ``{"error": "one line"}``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnlab.core.errors import AttnlabError, ConfigError
from attnlab.web import binding
from attnlab.web.binding import LOOPBACK_NAMES as LOOPBACK_NAMES  # kept here: create_app(allowed_hosts=...)
from attnlab.web.binding import host_warning as host_warning
from attnlab.web.connections import GuardSettings, uvicorn_config
from attnlab.web.limits import BodyBudget, BodyLimitMiddleware, HostGuard, error_response, return_large_frees
from attnlab.web.model_adapter import MAX_UPLOAD_BYTES, ExplorerAdapter, load_adapter

STATIC_DIR = Path(__file__).parent / "static"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_BODY_BYTES = 16 * 1024  # the longest text the explorer takes is a few KB
#: a vit run takes a base64 image of up to MAX_UPLOAD_BYTES (4 characters per 3 bytes) plus a data: prefix
IMAGE_MAX_BODY_BYTES = 4 * (MAX_UPLOAD_BYTES // 3 + 1) + 1024
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_QUEUE = 8

# The page loads nothing from elsewhere; the browser is told so, and enforces it.
SECURITY_HEADERS = {
    "content-security-policy": ("default-src 'self'; img-src 'self' data: blob:; style-src 'self'; "
                                "script-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
                                "frame-ancestors 'none'"),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class ExplorerRefusal(Exception):
    """A request the server declines (busy, timed out, too large): an HTTP status and one line."""

    def __init__(self, status: int, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class InferenceGate:
    """Serialises model calls on one worker thread behind a bounded queue, with a time limit.

    ``pending`` counts calls submitted and not yet finished (running or queued); it is only touched
    on the event loop thread. A call that times out keeps its slot until its computation ends.
    """

    def __init__(self, max_queue: int, timeout_s: float) -> None:
        if max_queue < 0 or timeout_s <= 0:
            raise ValueError("max_queue must be >= 0 and timeout_s > 0")
        self.capacity = 1 + max_queue  # one running + the waiting ones
        self.timeout_s = timeout_s
        self.pending = 0
        self.peak_pending = 0  # the most ever running + waiting at once (never above capacity)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnlab-explore")

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the model's one worker thread, or raise Busy when the queue is full."""
        if self.pending >= self.capacity:
            raise ExplorerRefusal(503, f"busy: {self.pending} requests are already running or waiting; retry shortly",
                                  retry_after_s=1)
        loop = asyncio.get_running_loop()
        self.pending += 1
        self.peak_pending = max(self.peak_pending, self.pending)
        job = self._executor.submit(fn, *args)
        job.add_done_callback(lambda _: self._release_from(loop))
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job)), self.timeout_s)
        except asyncio.CancelledError:  # the client went away: drop its job if it has not started
            job.cancel()
            raise
        except TimeoutError:
            job.cancel()  # drops it if still queued; a running computation ends on its own
            raise ExplorerRefusal(503, f"the model did not answer within {self.timeout_s:g} s; retry with a "
                                       "shorter text or later", retry_after_s=1) from None

    def _release_from(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called on the worker thread (or at shutdown) when a job ends: count it off on the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nothing left to count
            loop.call_soon_threadsafe(self._release)

    def _release(self) -> None:
        self.pending -= 1

    def shutdown(self) -> None:
        """Stop the worker thread."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class TextRequest(BaseModel):
    """The only input the model endpoint takes: text. Unknown fields (a path, a model name) are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: str
    mask: list[int] = []  # bert: token positions ([CLS] = 0) to replace by [MASK]


class LensRequest(BaseModel):
    """The lens tab: a text and the heads to knock out (zero, or their mean over the text's positions)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: str
    ablate: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = Field(default=[], max_length=4096)
    how: Literal["zero", "mean"] = "zero"


class ImageRequest(BaseModel):
    """An image for a vit run: the file's bytes in base64 (optionally as a data: URL), never a path."""

    model_config = ConfigDict(extra="forbid", strict=True)
    image: str
    resize: bool = False


def decode_upload(image: str) -> bytes:
    """base64 (or ``data:image/...;base64,...``) -> bytes; 413 beyond MAX_UPLOAD_BYTES, 400 if not base64."""
    if image.startswith("data:"):
        header, _, image = image.partition(",")
        if not header.endswith(";base64"):
            raise ConfigError("the image must be sent base64-encoded (a data:...;base64, URL)")
    if len(image) > 4 * (MAX_UPLOAD_BYTES // 3 + 1):
        raise ExplorerRefusal(413, f"the image file is larger than the explorer's limit of {MAX_UPLOAD_BYTES} bytes")
    try:
        data = base64.b64decode(image, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError("the image is not valid base64") from None
    if len(data) > MAX_UPLOAD_BYTES:
        raise ExplorerRefusal(413, f"the image file is {len(data)} bytes, more than the explorer's limit of "
                                   f"{MAX_UPLOAD_BYTES}")
    return data


def create_app(
    run_dir: str | Path,
    *,
    max_body_bytes: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_queue: int = DEFAULT_MAX_QUEUE,
    adapter: ExplorerAdapter | None = None,
    allowed_hosts: set[str] | None = None,
) -> FastAPI:
    """The explorer app for one run folder (loaded now; a bad folder raises a one-line AttnlabError).

    ``allowed_hosts``: the Host header names it answers to (None: any; ``serve`` passes
    ``binding.allowed_hosts`` of the address it binds). ``max_body_bytes`` None: 16 KiB for text, room for a 2 MiB
    image in base64 for a vit run.
    """
    adapter = adapter or load_adapter(run_dir)
    if max_body_bytes is None:
        max_body_bytes = IMAGE_MAX_BODY_BYTES if adapter.info.input == "image" else DEFAULT_MAX_BODY_BYTES
    gate = InferenceGate(max_queue=max_queue, timeout_s=timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        gate.shutdown()  # the worker thread ends with the server

    app = FastAPI(title="attnlab explorer", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.adapter = adapter
    app.state.gate = gate

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable) -> Any:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.exception_handler(AttnlabError)
    async def user_error(request: Request, e: AttnlabError) -> JSONResponse:
        return error_response(400, str(e).splitlines()[0] if str(e) else type(e).__name__)

    @app.exception_handler(ExplorerRefusal)
    async def refusal(request: Request, e: ExplorerRefusal) -> JSONResponse:
        return error_response(e.status, str(e), e.retry_after_s)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return error_response(400, f"bad request: {where}: {first.get('msg', 'invalid')}"[:300])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(e).__name__}")

    @app.get("/api/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "pending": gate.pending, "peak_pending": gate.peak_pending}

    @app.get("/api/info")
    async def info() -> dict[str, Any]:
        return {**adapter.describe(), "max_body_bytes": max_body_bytes, "timeout_s": timeout_s}

    @app.post("/api/attention")
    async def attention(req: TextRequest) -> dict[str, Any]:
        if not adapter.info.supported:  # answer at once: no need to queue for a refusal
            raise ConfigError(adapter.info.message)
        if adapter.info.input != "text":
            raise ConfigError(f"this {adapter.info.family} run takes an image: POST it to /api/image")
        return await gate.run(app.state.adapter.attention_maps, req.text, req.mask)

    @app.post("/api/lens")
    async def lens(req: LensRequest) -> dict[str, Any]:
        if not adapter.info.supported or adapter.info.family != "gpt":
            raise ConfigError(adapter.info.message or f"the lens tab reads a gpt run; this one is "
                              f"{adapter.info.family}")
        return await gate.run(app.state.adapter.lens, req.text, req.ablate, req.how)

    @app.post("/api/image")
    async def image(req: ImageRequest) -> dict[str, Any]:
        if not adapter.info.supported:
            raise ConfigError(adapter.info.message)
        if adapter.info.input != "image":
            raise ConfigError(f"this {adapter.info.family} run takes text, not an image: use /api/attention")
        data = decode_upload(req.image)
        return await gate.run(app.state.adapter.image_maps, data, req.resize)

    @app.get("/")
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    # outermost: the body limit runs before routing, validation or any handler
    app.state.budget = BodyBudget((gate.capacity + 2) * max_body_bytes)  # what the gate can take, and two more
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes, timeout_s=timeout_s, budget=app.state.budget)
    if allowed_hosts is not None:
        app.add_middleware(HostGuard, allowed_hosts={h.lower() for h in allowed_hosts})
    return app


def serve(
    run_dir: str | Path,
    host: str = DEFAULT_HOST,
    port: int = 8000,
    *,
    max_body_bytes: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_queue: int = DEFAULT_MAX_QUEUE,
) -> None:
    """Load the run and serve the explorer until Ctrl-C."""
    import uvicorn

    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    binding.check_bindable(host, port)  # a port in use, another machine's address: one line, before the model loads
    allowed = binding.allowed_hosts(host)  # on every address: no page elsewhere drives the explorer via a browser
    app = create_app(run_dir, max_body_bytes=max_body_bytes, timeout_s=timeout_s, max_queue=max_queue,
                     allowed_hosts=allowed)
    warning = binding.host_warning(host)
    if warning:
        print(f"{warning} It answers requests addressed to {', '.join(sorted(allowed))}.", file=sys.stderr)
    shown = f"[{host}]" if ":" in host else host
    print(f"attnlab explorer for {Path(run_dir).resolve()} on http://{shown}:{port}/  (Ctrl-C to stop)")
    return_large_frees()  # memory returns to its level after a burst of uploads
    # every connection guarded: a head deadline, one request each, a limit per client (web/connections.py)
    uvicorn.Server(uvicorn_config(app, host, port, GuardSettings(), log_level="warning")).run()
