"""core/fileio.py: an atomic write gives a file the mode a plain ``open(path, "w")`` would, not mkstemp's 0600
(every results.json, report and model folder attnlab wrote was readable by its owner alone)."""

from __future__ import annotations

import os
import stat

from attnlab.core.fileio import CREATED_MODE, atomic_path, atomic_write_text


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_gets_the_mode_open_gives_and_an_old_one_keeps_its_own(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what open() gives under this process's umask
    assert _mode(plain) == CREATED_MODE
    atomic_write_text(tmp_path / "new.json", "{}")
    assert _mode(tmp_path / "new.json") == _mode(plain) and (tmp_path / "new.json").read_text() == "{}"
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    os.chmod(kept, 0o640)
    atomic_write_text(kept, "new")
    assert _mode(kept) == 0o640 and kept.read_text() == "new"
    with atomic_path(tmp_path / "w.bin") as tmp:
        tmp.write_bytes(b"\0")
    assert _mode(tmp_path / "w.bin") == CREATED_MODE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "new.json", "plain.txt", "w.bin"]  # no temp
