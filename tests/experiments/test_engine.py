"""The study engine under attack: ``attnlab experiment sqrt-dk --quick`` through embedded Ray with the driver killed
and the study resumed, and through a second Ray cluster started here with ``ray start --head`` (loopback only) with
one of its workers killed in the middle of a run. Every run seeds itself and runs on one torch thread whichever
engine runs it, so each must end with the results of an undisturbed run in this process (``--in-process``; run
times aside, see ``_differences``)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

ATTNLAB = [sys.executable, "-m", "attnlab.cli"]
TIMING = {"seconds", "wall_time_s", "provenance"}
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _numbers(node: Any) -> Any:
    """``node`` without its run times (they differ between any two runs)."""
    if isinstance(node, dict):
        return {k: _numbers(v) for k, v in node.items() if k not in TIMING}
    if isinstance(node, list):
        return [_numbers(v) for v in node]
    return node


def _differences(a: Any, b: Any, at: str = "") -> list[str]:
    """Where two records differ (paths), for a failure message that says which numbers moved.

    Every number is compared exactly, except part 1's statistics (``.results.statistics``): the driver computes
    them itself in float64, outside the engine, and two processes on one CI host once gave 1.3760102424022789
    and 1.3760102424022902 for one mean entropy (8e-15 relative; not reproduced elsewhere), so those are
    compared to 1e-12 relative. The runs the engine carries (part 2, the verdicts) must match bit for bit."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{at}[{i}]")]
    if at.startswith(".results.statistics.") and isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-12) else [f"{at}: {a!r} != {b!r}"]
    return [] if a == b else [f"{at}: {a!r} != {b!r}"[:200]]


def _experiment(out: Path, *extra: str, env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen([*ATTNLAB, "experiment", "sqrt-dk", "--quick", "--out", str(out), *extra],
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        try:
            found.append((p, (Path("/proc") / str(p) / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except OSError:
            continue
        todo += children.get(p, [])
    return found


@pytest.fixture(scope="session")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """sqrt-dk --quick, every run in one process, one after another: the reference every Ray run must equal (as
    ``_differences`` compares them). Made once per test session: the first worker to ask makes it, under a file
    lock, and the others read its results.json."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "sqrt-dk-in-process"
    with FileLock(str(shared / "sqrt-dk-in-process.lock")):
        if not (out / "results.json").is_file():
            log = _finish(_experiment(out, "--in-process"))
            assert "every run in this process" in log
    record = json.loads((out / "results.json").read_text())
    assert record["provenance"]["engine"] == "in-process"
    return record


def _check_provenance(record: dict[str, Any]) -> None:
    p = record["provenance"]
    assert p["engine"].startswith("ray ") and p["device"] == "cpu" and p["data_sha256"] is None
    assert set(p) == {"commit", "dirty", "data_sha256", "device", "engine", "rule_commit"}
    assert record["verdict"] in ("held", "not held", "not decidable")


def _kill_a_busy_worker(proc: subprocess.Popen, below: int) -> int:
    """SIGKILL the first Ray worker seen running a task (``ray::timed``) among the processes under pid ``below``,
    while ``proc`` (the study's driver) runs; returns the killed worker's pid."""
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        busy = [pid for pid, cmd in _descendants(below) if cmd.startswith("ray::timed")]
        if busy:
            os.kill(busy[0], signal.SIGKILL)
            return busy[0]
        time.sleep(0.05)
    pytest.fail("no Ray worker was seen running a task")


def test_a_killed_driver_resumes_without_redoing_a_finished_run(undisturbed, tmp_path, capsys):
    """Embedded Ray (no address), its driver killed once four runs are kept; the resume reads them back."""
    from attnlab.cli import main

    out = tmp_path / "resumed"
    proc = _experiment(out, start_new_session=True)
    deadline, exposed = time.monotonic() + 300, None
    while len(list(out.glob(".runs/*/*.pt"))) < 4 and time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be cut off"
        below = _descendants(proc.pid)
        if exposed is None and any(cmd.startswith("ray::timed") for _, cmd in below):  # embedded Ray, up and busy
            exposed = _exposed({proc.pid, *(pid for pid, _ in below)})
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started
    assert exposed == [], exposed  # every socket the embedded cluster listened on was on loopback
    proc.wait()
    import torch

    kept = {f.stem: torch.load(f, weights_only=True)["seconds"] for f in out.glob(".runs/*/*.pt")}
    assert len(kept) >= 4
    capsys.readouterr()
    assert main(["experiment", "sqrt-dk", "--quick", "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err  # a fresh run would throw the kept runs away
    assert "embedded on this machine" in _finish(_experiment(out, "--resume"))
    record = json.loads((out / "results.json").read_text())
    _check_provenance(record)
    for name, seconds in kept.items():  # a kept run is read back, not run again: its own run time is in the record
        arm, lr, seed = name.rsplit("_", 2)
        by_lr = record["results"]["training"]["arms"][arm]
        at = by_lr["by_lr"][lr]["seconds"]["values"] if lr in by_lr["by_lr"] else []
        held_out = by_lr["confirmation"]["seconds"]["values"] if int(seed) == 3 else []
        assert seconds in at + held_out, name
    moved = _differences(_numbers(record), _numbers(undisturbed))
    assert not moved, moved[:8]
    assert not (out / ".runs").exists()  # forgotten once every run is in results.json


def _exposed(pids: set[int]) -> list[str]:
    """The listening TCP sockets of ``pids`` that are not on a loopback address (``ss``)."""
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in listening if any(f"pid={p}," in line for p in pids)
            and not line.split()[3].startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:"))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_second_ray_cluster_given_by_address_survives_a_worker_killed_mid_run(undisturbed, tmp_path):
    """The study joins a cluster started here with ``ray start --head``; one of that cluster's workers is killed
    in the middle of a run: Ray runs the task again, and the results equal the undisturbed run's."""
    port = _free_port()
    ray = Path(sys.executable).with_name("ray")
    head = subprocess.Popen([str(ray), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats", "--block"],
                            env={**os.environ, **LOOPBACK}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the head is up when its GCS port answers
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        time.sleep(2)
        out = tmp_path / "cluster"
        proc = _experiment(out, "--address", address)  # attnlab keeps its own side on loopback
        _kill_a_busy_worker(proc, head.pid)
        log = _finish(proc)
        assert f"at {address}" in log
        record = json.loads((out / "results.json").read_text())
        _check_provenance(record)
        moved = _differences(_numbers(record), _numbers(undisturbed))
        assert not moved, moved[:8]
        assert not (exposed := _exposed({head.pid, *(pid for pid, _ in _descendants(head.pid))})), exposed
    finally:  # `ray start --block` can take a minute over SIGTERM; its own session holds the whole cluster
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


@pytest.mark.parametrize(("argv", "says"), [
    (["hand-trace", "--device", "cuda"], "trains nothing"),
    (["sqrt-dk", "--quick", "--gpus-per-run", "0.5"], "--gpus-per-run applies to --device cuda"),
    (["sqrt-dk", "--quick", "--cpus-per-run", "0"], "--cpus-per-run must be at least 1, got 0"),
    (["sqrt-dk", "--quick", "--address", "ray://somewhere"], "give the Ray cluster's HOST:PORT"),
    (["sqrt-dk", "--quick", "--address", f"127.0.0.1:{_free_port()}"], "nothing answers there"),
    (["sqrt-dk", "--quick", "--device", "cuda"], "this machine has no GPU"),
    (["sqrt-dk", "--quick", "--device", "cuda", "--in-process"], "this machine has no GPU"),
    (["sqrt-dk", "--quick", "--in-process", "--workers", "2"], "--workers spread runs over Ray"),
])
def test_bad_engine_options_are_one_line_before_any_work(argv, says, tmp_path, capsys, monkeypatch):
    from attnlab.cli import main
    from attnlab.experiments import load

    def ran(out, quick=False, device="cpu"):
        pytest.fail("the experiment ran")

    if argv[0] != "hand-trace":  # it trains nothing: its own run has no device to pass
        monkeypatch.setattr(load(argv[0]), "run", ran)
    else:
        monkeypatch.setattr(load(argv[0]), "run", lambda out, quick=False: pytest.fail("the experiment ran"))
    if "cuda" in argv and "sqrt-dk" in argv:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    assert main(["experiment", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "out").exists()
