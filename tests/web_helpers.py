"""Shared by the explorer's tests: a tiny trained char GPT, and the real server on a free loopback port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from attnlab.training.trainer import Trainer

from .helpers import tiny_config, write_corpus


def train_tiny_run(root: Path, **extra) -> Path:
    """A 2-layer, 2-head char GPT trained for 30 steps (about 2 s on one thread); returns its run folder."""
    corpus = write_corpus(root / "corpus.txt")
    settings = dict(max_iters=30, block_size=32, eval_interval=30) | extra
    Trainer(tiny_config(corpus, root / "runs", name="tiny", **settings)).train()
    return root / "runs" / "tiny"


@contextlib.contextmanager
def running_server(app) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free 127.0.0.1 port; yields the base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", limit_concurrency=256, timeout_keep_alive=5)
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
