"""Where the explorer listens: the Host and Origin guards on every address (0.0.0.0 used to switch them off, and
127.0.0.2 answered 400 to everything), a port in use or a host that is not this machine's as one line before the
model loads, and one real start on 127.0.0.2 (loopback only: no test binds another address)."""

from __future__ import annotations

import errno
import http.client
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from fastapi.testclient import TestClient

from attnlab.cli import main
from attnlab.web import binding
from attnlab.web.server import create_app
from tests.web_helpers import train_tiny_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("explore-bind"))


def test_the_allowed_hosts_of_each_address():
    assert binding.allowed_hosts("127.0.0.1") == binding.LOOPBACK_NAMES
    assert binding.allowed_hosts("127.0.0.2") == binding.LOOPBACK_NAMES | {"127.0.0.2"}
    assert binding.allowed_hosts("::1") == binding.LOOPBACK_NAMES
    wide = binding.allowed_hosts("0.0.0.0")
    assert binding.LOOPBACK_NAMES | {"0.0.0.0", socket.gethostname().lower()} <= wide
    assert "[::]" in binding.allowed_hosts("::")
    assert not any("evil" in name for name in wide)


def test_guards_hold_beyond_loopback(run_dir):
    """Bound on 0.0.0.0, a page on evil.example (its name pointed at this machine, or posting from its own origin)
    is refused; a request addressed to this machine by name, or from the explorer's own page, is answered."""
    app = create_app(run_dir, allowed_hosts=binding.allowed_hosts("0.0.0.0"))
    me = f"{socket.gethostname()}:8000"
    with TestClient(app, base_url=f"http://{me}") as c:
        assert c.get("/api/health").status_code == 200
        assert c.get("/api/health", headers={"host": "127.0.0.1:8000"}).status_code == 200
        assert c.get("/", headers={"host": "evil.example:8000"}).status_code == 400
        r = c.post("/api/attention", json={"text": "the"}, headers={"origin": "https://evil.example"})
        assert r.status_code == 403
        r = c.post("/api/attention", json={"text": "the"}, headers={"origin": f"http://{me}"})
        assert r.status_code == 200


def test_a_port_in_use_is_one_line(run_dir, capsys, monkeypatch):
    monkeypatch.setattr("uvicorn.Server.run", lambda *a, **k: pytest.fail("the server started"))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["explore", str(run_dir), "--port", str(port)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"attnlab: error: port {port} on 127.0.0.1 is in use; pick another with --port\n"
    assert "explorer for" not in captured.out  # refused before the model was loaded and served


def test_a_host_that_is_not_this_machines_is_one_line(run_dir, capsys, monkeypatch):
    monkeypatch.setattr("uvicorn.Server.run", lambda *a, **k: pytest.fail("the server started"))
    assert main(["explore", str(run_dir), "--host", "no-such-host.invalid"]) == 2  # .invalid never resolves
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--host no-such-host.invalid is not an address of this machine" in err
    assert main(["explore", str(run_dir), "--host", ""]) == 2  # `--host $HOST` unset: not every address at once
    assert "--host is empty" in capsys.readouterr().err
    assert "" not in binding.allowed_hosts("")
    # a bind the system refuses for an address it does not have (told, not tried: no test binds beyond loopback)
    assert "is not an address of this machine" in binding._refusal(OSError(errno.EADDRNOTAVAIL, "x"), "192.0.2.1", 80)
    assert "needs privileges" in binding._refusal(OSError(errno.EACCES, "x"), "127.0.0.1", 80)


def test_a_wide_bind_warns_and_names_the_hosts_it_answers(run_dir, capsys, monkeypatch):
    monkeypatch.setattr(binding, "check_bindable", lambda host, port: None)  # never bound beyond loopback here
    started = []
    monkeypatch.setattr("uvicorn.Server.run", lambda self, *a, **k: started.append(self.config.host))
    assert main(["explore", str(run_dir), "--host", "0.0.0.0", "--port", "8123"]) == 0
    err = capsys.readouterr().err
    assert started == ["0.0.0.0"] and err.count("\n") == 1
    assert "reachable from other machines" in err and "127.0.0.1" in err and socket.gethostname().lower() in err


def test_a_real_start_on_127_0_0_2(run_dir, monkeypatch, capsys):
    import uvicorn

    with socket.socket() as probe:  # a free port on 127.0.0.2
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    servers, run = [], uvicorn.Server.run
    monkeypatch.setattr("uvicorn.Server.run", lambda self, *a, **k: (servers.append(self), run(self, *a, **k))[1])
    codes = []
    thread = threading.Thread(target=lambda: codes.append(main(["explore", str(run_dir), "--host", "127.0.0.2",
                                                                 "--port", str(port)])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (servers and servers[0].started):
        assert time.monotonic() < deadline and thread.is_alive(), capsys.readouterr().err
        time.sleep(0.05)
    try:
        for host, status in ((f"127.0.0.2:{port}", 200), ("127.0.0.2", 200), ("evil.example", 400)):
            conn = http.client.HTTPConnection("127.0.0.2", port, timeout=10)
            conn.request("GET", "/api/health", headers={"Host": host})
            assert conn.getresponse().status == status, host
            conn.close()
    finally:
        servers[0].should_exit = True
        thread.join(timeout=15)
    assert codes == [0]
    assert capsys.readouterr().err == ""  # a loopback address: no warning
