"""The folder lock: one writer at a time, the second refused at once naming the holder, released however the
holder ends (kill -9 included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from attnlab.core.errors import AttnlabError
from attnlab.core.locks import FolderBusy, folder_lock, held_by_other, lock_file

HOLD = """
import sys, time
from attnlab.core.locks import folder_lock
with folder_lock(sys.argv[1], beside=sys.argv[2] == "beside"):
    print("held", flush=True)
    time.sleep(60)
"""


def _holder(folder, beside: bool) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), "beside" if beside else "inside"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_open_is_refused_in_one_line_and_the_lock_returns_after(tmp_path):
    with folder_lock(tmp_path, what="run folder") as path:
        assert path == tmp_path / ".lock" and path.read_text().strip() == str(os.getpid())
        with pytest.raises(FolderBusy) as err, folder_lock(tmp_path):
            pass
        assert isinstance(err.value, AttnlabError) and "\n" not in str(err.value)
        assert f"process {os.getpid()}" in str(err.value)
    with folder_lock(tmp_path):  # released on leaving the block
        pass


@pytest.mark.parametrize("beside", [False, True])
def test_another_process_holding_it_is_named_and_kill_9_releases_it(tmp_path, beside):
    folder = tmp_path / "out"
    if not beside:
        folder.mkdir()
    proc = _holder(folder, beside)
    try:
        assert held_by_other(folder, beside)
        with pytest.raises(FolderBusy, match=f"being written by process {proc.pid}"), folder_lock(folder, beside):
            pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while held_by_other(folder, beside) and time.monotonic() < deadline:
        time.sleep(0.05)
    with folder_lock(folder, beside):  # the kernel dropped the dead holder's lock: nothing stale to clean
        pass
    assert not folder.exists() if beside else lock_file(folder, beside).exists()


def test_a_lock_beside_a_folder_leaves_the_folder_itself_alone(tmp_path):
    with folder_lock(tmp_path / "new", beside=True) as path:
        assert path == tmp_path / ".new.lock" and not (tmp_path / "new").exists()
