"""attnlab/cpu/build.py: processes (here threads, each with its own lock file handle) that need the same library at
once build it once; the others wait for that build and load it."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from attnlab.cpu.build import build_and_load

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the libraries are built with g++")


def test_a_library_needed_twice_at_once_is_built_once(tmp_path, monkeypatch, capfd):
    log = tmp_path / "builds.log"
    slow = tmp_path / "slow-g++"  # g++, a second slower per build, counting the builds
    slow.write_text(f'#!/bin/sh\ncase " $* " in *" -shared "*) echo build >> {log}; sleep 1;; esac\n'
                    f'exec {shutil.which("g++")} "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setenv("CXX", str(slow))
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "tiny.cpp"
    source.write_text("int attnlab_lock_test = 1;\n")
    names: list[str] = []

    def build() -> None:
        names.append(build_and_load(source, "attnlab_lock_test", "a test library", "nothing"))

    first = threading.Thread(target=build)
    first.start()
    deadline = time.monotonic() + 60
    while not log.exists() and time.monotonic() < deadline:  # the first is compiling, holding the lock
        time.sleep(0.01)
    second = threading.Thread(target=build)
    second.start()
    first.join(120), second.join(120)
    assert log.read_text().splitlines() == ["build"] and len(names) == 2 and names[0] == names[1]
    err = capfd.readouterr().err
    assert err.count("building a test library (once") == 1 and err.count("waiting for another process building") == 1
