"""Shared by the explorer's tests: a tiny trained char GPT, and the real server on a free loopback port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from attnlab.training.trainer import Trainer
from attnlab.web.connections import uvicorn_config

from .helpers import tiny_config, write_corpus


def train_tiny_run(root: Path, **extra) -> Path:
    """A 2-layer, 2-head char GPT trained for 10 steps (about 1 s on one thread); returns its run folder."""
    corpus = write_corpus(root / "corpus.txt")
    settings = dict(max_iters=10, block_size=32, eval_interval=10) | extra
    Trainer(tiny_config(corpus, root / "runs", name="tiny", **settings)).train()
    return root / "runs" / "tiny"


@contextlib.contextmanager
def running_server(app, settings=None) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free 127.0.0.1 port, its connections guarded as
    ``attnlab explore`` guards them (``settings``: GuardSettings, default the explorer's); yields the URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn_config(app, settings=settings, log_level="warning")  # guarded as `attnlab explore` serves
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the explorer server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def client_errors(outcomes) -> dict[str, int]:
    """The client-side errors of a load test's unanswered requests, counted by kind (for assertion messages)."""
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.status is None:
            kind = o.error.split(":", 1)[0]
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def chromium_path() -> str | None:
    """The system Chromium (Debian's ``chromium``), or $ATTNLAB_CHROMIUM; None when there is none."""
    import os
    import shutil

    if os.environ.get("ATTNLAB_CHROMIUM"):
        return os.environ["ATTNLAB_CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@contextlib.contextmanager
def headless_chromium():
    """Playwright driving the system Chromium headless (no downloaded browser build)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def offline_page(browser, base_url: str, viewport=(1300, 900)):
    """A fresh page that may reach ``base_url`` and nothing else.

    Yields (page, blocked, errors): ``blocked`` lists every request to anywhere else (each is aborted,
    so the page sees the network as down), ``errors`` every JavaScript error and console error.
    """
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, accept_downloads=True)
    blocked: list[str] = []
    errors: list[str] = []

    def route(r):
        if r.request.url.startswith((base_url + "/", "data:", "blob:")):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort("internetdisconnected")

    try:
        context.route("**/*", route)
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
        yield page, blocked, errors
    finally:
        context.close()


def train_tiny_bert(root: Path) -> Path:
    """A 2-layer, 2-head BERT with a WordPiece vocabulary, masked-LM trained for 10 steps; its run folder."""
    from attnlab.cli import main

    corpus = write_corpus(root / "corpus.txt")
    settings = dict(data=corpus, out_dir=root / "runs", name="bert", max_iters=10, eval_interval=10, eval_iters=1,
                    batch_size=8, log_interval=5, warmup_iters=2, progress="false", bpe_vocab_size=120,
                    block_size=32, n_layer=2, n_head=2, d_model=32, mfu="false", sample_tokens=0)
    assert main(["train", "configs/bert-mlm.yaml", *[f"{k}={v}" for k, v in settings.items()]]) == 0
    return root / "runs" / "bert"


def train_tiny_vit(root: Path) -> Path:
    """A 2-layer, 2-head ViT on the 8x8 digits (4x4 patches: a 2x2 grid), trained for 10 steps; its run folder."""
    from attnlab.cli import main

    settings = dict(out_dir=root / "runs", name="vit", max_iters=10, eval_interval=10, eval_iters=1, batch_size=16,
                    log_interval=5, warmup_iters=2, progress="false", n_layer=2, n_head=2, d_model=16, d_ff=32)
    assert main(["train", "configs/vit-digits.yaml", *[f"{k}={v}" for k, v in settings.items()]]) == 0
    return root / "runs" / "vit"


def skip_module_without_browser() -> None:
    """Skip the calling test module, with the reason, unless Playwright and a Chromium executable are there."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("playwright") is None:
        pytest.skip("playwright is not installed (pip install playwright; it is in the dev extras)",
                    allow_module_level=True)
    if chromium_path() is None:
        pytest.skip("no Chromium executable (apt-get install chromium, or set ATTNLAB_CHROMIUM)",
                    allow_module_level=True)


def open_page(browser, run_dir, body):
    """Serve ``run_dir``, open the page offline, run ``body(page, url)``; no network, no JS error."""
    from attnlab.web.server import LOOPBACK_NAMES, create_app

    with (running_server(create_app(run_dir, allowed_hosts=LOOPBACK_NAMES)) as url,
          offline_page(browser, url) as (page, blocked, errors)):
        page.goto(url + "/")
        page.wait_for_selector('body[data-ready="1"]', timeout=20_000)
        body(page, url)
        assert blocked == [], f"the page tried to reach the network: {blocked}"
        assert [e for e in errors if "status of 400" not in e] == []
