"""The explorer's server: what it computes (checked against the model itself) and every limit it enforces."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from attnlab.cli import main
from attnlab.core.errors import CheckpointError
from attnlab.training.runs import load_model_and_tokenizer
from attnlab.web import server as web_server
from attnlab.web.limits import BodyLimitMiddleware
from attnlab.web.model_adapter import GPTAdapter, load_adapter
from attnlab.web.server import (
    STATIC_DIR,
    ExplorerRefusal,
    InferenceGate,
    create_app,
    host_warning,
)
from tests.helpers import with_patterns
from tests.web_helpers import train_tiny_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("explorer"))


@pytest.fixture(scope="module")
def client(run_dir):
    with TestClient(create_app(run_dir)) as c:
        yield c


class SlowAdapter:
    """Wraps the real adapter; each call waits until ``release`` is set (or ``delay_s`` passes)."""

    def __init__(self, adapter, delay_s: float = 30.0):
        self.info, self.inner, self.delay_s = adapter.info, adapter, delay_s
        self.release = threading.Event()
        self.calls = 0

    def describe(self):
        return self.inner.describe()

    def attention_maps(self, text, mask=None):
        self.calls += 1
        self.release.wait(self.delay_s)
        return self.inner.attention_maps(text, mask)


# ---------------------------------------------------------------- what it computes


def test_attention_maps_match_the_model_and_are_causal(client, run_dir):
    text = "the fox jumps"
    data = client.post("/api/attention", json={"text": text}).json()
    model, tok = load_model_and_tokenizer(run_dir)
    assert data["tokens"] == list(text)  # a char model: one token per character
    probs = torch.tensor(data["layers"])  # (L, H, T, T)
    L, H, T = model.config.n_layer, model.config.n_head, len(text)
    assert probs.shape == (L, H, T, T) and data["layer_index"] == list(range(L))
    with torch.no_grad():
        _, maps = with_patterns(model, torch.tensor([tok.encode(text)]))
    reference = torch.stack([m[0] for m in maps])  # (L, H, T, T)
    assert torch.allclose(probs, reference, atol=1e-5)  # rounded to 5 decimals, nothing else
    assert torch.allclose(probs.sum(-1), torch.ones(L, H, T), atol=1e-4)  # each row is a distribution
    assert probs.triu(diagonal=1).abs().max() == 0  # causal: no query sees a later key
    assert not torch.allclose(probs[0, 0], probs[0, 1])  # the heads differ (the browser test relies on it)


@pytest.mark.parametrize("backend", ["eager", "tiled"])
def test_the_maps_agree_with_the_other_backends(client, run_dir, backend):
    """The run uses sdpa (the default); its maps equal those of the same weights on eager / tiled."""
    import dataclasses

    from attnlab.models.gpt import GPT

    text = "over the lazy dog"
    served = torch.tensor(client.post("/api/attention", json={"text": text}).json()["layers"])
    model, tok = load_model_and_tokenizer(run_dir)
    assert model.config.attn_backend == "sdpa"
    other = GPT(dataclasses.replace(model.config, attn_backend=backend)).eval()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        _, maps = with_patterns(other, torch.tensor([tok.encode(text)]))
    assert torch.allclose(served, torch.stack([m[0] for m in maps]), atol=1e-5)


def test_next_token_top10_is_the_softmax_of_the_last_logits(client, run_dir):
    data = client.post("/api/attention", json={"text": "the qu"}).json()
    model, tok = load_model_and_tokenizer(run_dir)
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode("the qu")])).logits[0, -1]
    top = torch.topk(torch.softmax(logits, -1), 10)
    assert [d["id"] for d in data["next_token"]] == top.indices.tolist()
    assert [d["token"] for d in data["next_token"]] == [tok.decode([i]) for i in top.indices.tolist()]
    assert [d["p"] for d in data["next_token"]] == pytest.approx(top.values.tolist(), abs=1e-5)


def test_info_and_the_page(client):
    info = client.get("/api/info").json()
    assert info["family"] == "gpt" and info["supported"] and info["n_layer"] == 2 and info["n_head"] == 2
    assert info["max_tokens"] == 32 == info["block_size"]
    assert client.post("/api/attention", json={"text": info["example"]}).status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200
    health = client.get("/api/health").json()
    assert health["status"] == "ok" and health["pending"] == 0 and health["peak_pending"] == 1


def test_the_page_loads_nothing_from_elsewhere(client):
    """No CDN, no web font, no remote URL in anything the page is made of; the browser is told so too."""
    for file in STATIC_DIR.iterdir():
        text = file.read_text(encoding="utf-8")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), file.name
        assert "@import" not in text and "url(" not in text, file.name
    csp = client.get("/").headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp


# ---------------------------------------------------------------- bounded inputs, one-line JSON errors


@pytest.mark.parametrize(("body", "message"), [
    ({"text": ""}, "the text is empty"),
    ({"text": "x" * 33}, "more than the model's context of 32"),
    ({"text": "y" * 10_000}, "the explorer takes at most 256"),
    ({"text": "the Zebra"}, "not in the tokenizer's vocabulary"),
    ({"text": 42}, "bad request: text"),
    ({}, "bad request: text"),
    ({"text": "the", "run_dir": "/etc"}, "bad request: run_dir: Extra inputs are not permitted"),
    ([1, 2], "bad request"),
])
def test_bad_model_input_is_a_one_line_400(client, body, message):
    r = client.post("/api/attention", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert message in error and "\n" not in error


def test_malformed_json_is_a_400(client):
    r = client.post("/api/attention", content=b'{"text": "the', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("bad request")


def test_a_body_over_the_limit_is_refused_with_413(run_dir):
    with TestClient(create_app(run_dir, max_body_bytes=100)) as c:
        r = c.post("/api/attention", json={"text": "t" * 200})  # declared Content-Length too large
        assert r.status_code == 413 and "at most 100 bytes" in r.json()["error"]

        def chunks():  # no Content-Length: the limit is counted while reading
            for _ in range(10):
                yield b"x" * 50

        r = c.post("/api/attention", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.post("/api/attention", json={"text": "the"}).status_code == 200  # small ones still pass


def test_a_stalled_body_gets_408():
    """The body limit's reader gives up on a client that never sends its body (slowloris)."""
    sent = []

    async def app(scope, receive, send):  # never reached
        raise AssertionError("the app must not see a request whose body never came")

    async def receive():
        await asyncio.sleep(60)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", b"application/json")]}
    asyncio.run(BodyLimitMiddleware(app, max_bytes=1000, timeout_s=0.05)(scope, receive, send))
    assert sent[0]["status"] == 408
    assert b"not received within" in sent[1]["body"]


def test_a_trickled_body_gets_408_within_its_total_deadline():
    """One byte at a time, each well inside the per-chunk wait, used to keep a connection forever: the
    deadline is for the whole body."""
    import time

    sent = []

    async def app(scope, receive, send):
        raise AssertionError("the app must not see a body that never finished")

    async def receive():  # a byte every 20 ms, never the last
        await asyncio.sleep(0.02)
        return {"type": "http.request", "body": b"x", "more_body": True}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", b"application/json")]}
    start = time.perf_counter()
    asyncio.run(BodyLimitMiddleware(app, max_bytes=10_000, timeout_s=0.3)(scope, receive, send))
    assert sent[0]["status"] == 408 and time.perf_counter() - start < 1.0


def test_no_file_outside_the_static_folder_is_served(client):
    for path in ("/static/../server.py", "/static/%2e%2e/server.py", "/static/..%2fserver.py",
                 "/static//etc/passwd", "/etc/passwd", "/static/%2e%2e/%2e%2e/models/gpt.py"):
        r = client.get(path)
        assert r.status_code == 404, path
        assert "import" not in r.text


# ---------------------------------------------------------------- serialised inference, queue, time limit


async def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_the_gate_refuses_beyond_its_queue_and_times_out():
    async def scenario():
        gate = InferenceGate(max_queue=1, timeout_s=5)
        release = threading.Event()
        order = []

        def job(name):
            release.wait(5)
            order.append((name, threading.current_thread().name))
            return name

        first = asyncio.create_task(gate.run(job, "a"))
        second = asyncio.create_task(gate.run(job, "b"))
        await asyncio.sleep(0.05)
        assert gate.pending == 2
        with pytest.raises(ExplorerRefusal) as refused:  # one running + one waiting: full
            await gate.run(job, "c")
        assert refused.value.status == 503 and "busy" in str(refused.value)
        release.set()
        assert await first == "a" and await second == "b"
        await asyncio.sleep(0.05)  # the release callbacks run on the loop
        assert gate.pending == 0
        assert [n for n, _ in order] == ["a", "b"]  # one worker thread, in order
        assert len({t for _, t in order}) == 1

        slow = InferenceGate(max_queue=0, timeout_s=0.1)
        done = threading.Event()
        with pytest.raises(ExplorerRefusal) as late:
            await slow.run(lambda: done.wait(0.4))
        assert late.value.status == 503 and "did not answer within 0.1 s" in str(late.value)
        assert slow.pending == 1  # the computation still runs: its slot stays taken
        with pytest.raises(ExplorerRefusal, match="busy"):
            await slow.run(lambda: None)
        await _until(lambda: slow.pending == 0)  # the computation ends about 0.4 s in
        assert await slow.run(lambda: 7) == 7
        gate.shutdown()
        slow.shutdown()

    asyncio.run(scenario())


def test_a_request_whose_client_left_is_dropped_from_the_queue():
    async def scenario():
        gate = InferenceGate(max_queue=2, timeout_s=5)
        release = threading.Event()
        ran = []
        first = asyncio.create_task(gate.run(lambda: ran.append("first") or release.wait(5)))
        queued = asyncio.create_task(gate.run(lambda: ran.append("queued")))
        await _until(lambda: gate.pending == 2)
        queued.cancel()  # what the server does to a request's task when its client disconnects
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        await first
        await _until(lambda: gate.pending == 0)
        gate.shutdown()
        return ran

    assert asyncio.run(scenario()) == ["first"]


def test_concurrent_requests_beyond_the_queue_get_a_clean_503(run_dir):
    """Over HTTP: with the model busy, 1 runs, 2 wait, the rest are refused at once; all waiting ones finish."""
    slow = SlowAdapter(GPTAdapter(run_dir))
    app = create_app(run_dir, max_queue=2, timeout_s=20, adapter=slow)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://explorer") as c:
            tasks = [asyncio.create_task(c.post("/api/attention", json={"text": "the"})) for _ in range(8)]
            await _until(lambda: sum(t.done() for t in tasks) == 5)  # the refusals come back at once
            health = (await c.get("/api/health")).json()  # answered while the model is busy
            slow.release.set()
            responses = await asyncio.gather(*tasks)
        return health, responses

    health, responses = asyncio.run(scenario())
    codes = sorted(r.status_code for r in responses)
    assert health == {"status": "ok", "pending": 3, "peak_pending": 3}
    assert codes == [200] * 3 + [503] * 5
    refused = [r for r in responses if r.status_code == 503]
    assert all("busy" in r.json()["error"] and r.headers["retry-after"] == "1" for r in refused)
    assert slow.calls == 3


def test_a_request_over_the_time_limit_gets_503_and_the_server_recovers(run_dir):
    slow = SlowAdapter(GPTAdapter(run_dir), delay_s=0.5)
    with TestClient(create_app(run_dir, timeout_s=0.1, adapter=slow)) as c:
        r = c.post("/api/attention", json={"text": "the"})
        assert r.status_code == 503 and "did not answer within 0.1 s" in r.json()["error"]
        deadline = time.monotonic() + 20
        while c.get("/api/health").json()["pending"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the computation ends about 0.5 s in
        assert c.get("/api/health").json()["pending"] == 0
        slow.delay_s = 0
        assert c.post("/api/attention", json={"text": "the"}).status_code == 200


# ---------------------------------------------------------------- families, run folders, host, CLI


def test_an_unsupported_family_is_a_clear_400_but_the_page_still_serves(tmp_path):
    run = tmp_path / "seq2seq-run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"family": "seq2seq", "n_layer": 2}), encoding="utf-8")
    with TestClient(create_app(run)) as c:
        info = c.get("/api/info").json()
        assert info["family"] == "seq2seq" and not info["supported"]
        for path, body in (("/api/attention", {"text": "hello"}), ("/api/image", {"image": "aGk="})):
            r = c.post(path, json=body)
            assert r.status_code == 400
            assert r.json()["error"].startswith("this run's family 'seq2seq' is not supported by the explorer")
        assert c.get("/").status_code == 200


@pytest.mark.parametrize("setup", ["missing", "no-config", "bad-json"])
def test_a_bad_run_folder_fails_at_start_up_with_one_line(tmp_path, setup):
    run = tmp_path / "run"
    if setup != "missing":
        run.mkdir()
    if setup == "bad-json":
        (run / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError) as e:
        load_adapter(run)
    assert str(e.value).count("\n") == 0 and str(run) in str(e.value)


def test_a_foreign_host_header_is_refused(run_dir):
    """DNS rebinding: a page on evil.example resolved to 127.0.0.1 sends Host: evil.example; a page
    on evil.example posting to 127.0.0.1 sends Origin: https://evil.example."""
    app = create_app(run_dir, allowed_hosts=web_server.LOOPBACK_NAMES)
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.post("/api/attention", json={"text": "the"}).status_code == 200
        for host in ("localhost:8000", "[::1]:8000", "127.0.0.1"):
            assert c.get("/api/health", headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", ""):
            r = c.get("/", headers={"host": host})
            assert r.status_code == 400 and r.json()["error"].startswith("unexpected Host header"), host
        # a page on another site posting to the explorer (the browser adds its Origin)
        r = c.post("/api/attention", json={"text": "the"}, headers={"origin": "https://evil.example"})
        assert r.status_code == 403 and "another site" in r.json()["error"]
        same = c.post("/api/attention", json={"text": "the"}, headers={"origin": "http://127.0.0.1:8000"})
        assert same.status_code == 200
        # another server on this machine (another port) is another origin
        for origin in ("http://localhost:3000", "http://127.0.0.1:3000", "http://127.0.0.1"):
            r = c.post("/api/attention", json={"text": "the"}, headers={"origin": origin})
            assert r.status_code == 403, origin


def test_only_loopback_binds_without_a_warning():
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert host_warning(host) is None, host
    for host in ("0.0.0.0", "::", "192.168.1.5", "example.org"):
        assert "reachable from other machines" in host_warning(host), host


def test_cli_explore_binds_loopback_by_default(run_dir, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr("uvicorn.Server.run", lambda self, *a, **kw: calls.append(dict(
        host=self.config.host, port=self.config.port, app=self.config.app, guard=self.config.guard)))
    assert main(["explore", str(run_dir), "--port", "8765"]) == 0
    assert calls[-1]["host"] == "127.0.0.1" and calls[-1]["port"] == 8765
    assert calls[-1]["guard"].settings.header_timeout_s == 5.0  # every connection guarded
    with TestClient(calls[-1]["app"], base_url="http://127.0.0.1:8765") as c:  # guarded against rebinding
        health = c.get("/api/health")
        assert health.status_code == 200 and health.headers["connection"] == "close"  # one request each
        assert c.get("/api/health", headers={"host": "evil.example"}).status_code == 400
    captured = capsys.readouterr()
    assert "http://127.0.0.1:8765/" in captured.out and captured.err == ""
    assert main(["explore", str(run_dir), "--host", "0.0.0.0"]) == 0
    assert calls[-1]["host"] == "0.0.0.0"
    assert "warning: binding 0.0.0.0" in capsys.readouterr().err


def test_cli_explore_errors_are_one_line(tmp_path, run_dir, capsys):
    assert main(["explore", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: run folder not found") and err.count("\n") == 1
    assert main(["explore", str(run_dir), "--port", "70000"]) == 2
    assert "--port must be between 1 and 65535" in capsys.readouterr().err


def test_static_files_ship_with_the_package():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["attnlab"]
    assert "web/static/*" in patterns
    assert {p.name for p in STATIC_DIR.iterdir()} >= {"index.html", "app.js", "style.css"}
    assert web_server.STATIC_DIR.is_relative_to(Path(web_server.__file__).parent)


def test_the_worker_thread_stops_with_the_app(run_dir):
    before = set(threading.enumerate())  # other tests' apps may still hold theirs
    app = create_app(run_dir)
    with TestClient(app) as c:
        assert c.post("/api/attention", json={"text": "the"}).status_code == 200
        workers = [t for t in set(threading.enumerate()) - before if t.name.startswith("attnlab-explore")]
        assert len(workers) == 1
    workers[0].join(timeout=5)
    assert not workers[0].is_alive()


def test_lens_endpoint_matches_the_python_api(client, run_dir):
    """/api/lens: the last layer of the lens is the model's own next-token distribution; knocking out a head
    gives what ``ablated`` gives in Python; bad heads and fields are one-line 400s."""
    from attnlab.inspect.intervene import ablated, head

    r = client.post("/api/lens", json={"text": "the quick", "ablate": [[1, 0]], "how": "zero"})
    assert r.status_code == 200, r.text
    view = r.json()
    model, tok = load_model_and_tokenizer(run_dir)
    idx = torch.tensor([tok.encode("the quick")])
    with torch.no_grad():
        plain = model.eval()(idx).logits[0, -1].softmax(-1)
        with ablated(model, [head(1, 0)]):
            knocked = model(idx).logits[0, -1].softmax(-1)
    assert view["layer_names"] == ["embed", "block 0", "block 1"] and view["heads"] == ["L1H0"]
    assert view["layers"][-1]["top"][0]["p"] == pytest.approx(plain.max().item(), abs=1e-4)
    assert view["next_token"][0]["p"] == pytest.approx(plain.max().item(), abs=1e-4)
    assert view["ablated_next_token"][0]["p"] == pytest.approx(knocked.max().item(), abs=1e-4)
    assert view["ablated_loss"] != view["loss"]
    # the grid: every position's top token at every layer, ending in the model's own next-token guess
    assert [row["token"] for row in view["grid"]] == view["tokens"]
    assert all(len(row["top"]) == 3 for row in view["grid"])
    assert view["grid"][-1]["top"][-1]["p"] == pytest.approx(plain.max().item(), abs=1e-4)
    assert view["grid"][-1]["top"][-1]["token"] == tok.decode([int(plain.argmax())])
    none = client.post("/api/lens", json={"text": "the quick"}).json()
    assert none["ablated_next_token"] is None and none["heads"] == []
    for body, message in (({"text": "the", "ablate": [[5, 0]]}, "layer < 2"),
                          ({"text": "the", "how": "half"}, "how"),
                          ({"text": "the", "ablate": [[0, 0]], "path": "/etc"}, "path")):
        bad = client.post("/api/lens", json=body)
        assert bad.status_code == 400 and message in bad.json()["error"], (body, bad.text)
