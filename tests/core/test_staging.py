"""core/staging.py: a staged folder replaces an earlier one whole, and a kill at any of its windows is resolved by
the next staged write (old whole or new whole, never a mix, nothing left beside)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from attnlab.core.staging import STAGING_MARK, recover, staged_folder


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def _beside(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "out")


def test_replace_puts_the_new_folder_whole_in_place_of_the_old(tmp_path):
    out = tmp_path / "out"
    with staged_folder(out) as staging:
        (staging / "a.txt").write_text("old a")
        (staging / "gone.txt").write_text("only in the old")
    with staged_folder(out, replace=True) as staging:
        (staging / "a.txt").write_text("new a")
        (staging / "sub").mkdir()
        (staging / "sub" / "b.txt").write_text("new b")
        assert _tree(out) == {"a.txt": "old a", "gone.txt": "only in the old"}  # untouched until the end
    assert _tree(out) == {"a.txt": "new a", "sub/b.txt": "new b"}
    assert _beside(tmp_path) == [".out.lock"]


def test_without_replace_a_full_folder_is_refused_and_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    with pytest.raises(OSError, match="cannot put the finished folder"), staged_folder(out) as staging:
        (staging / "a.txt").write_text("a")
    assert _tree(out) == {"mine.txt": "mine"} and _beside(tmp_path) == [".out.lock"]


def test_a_failure_while_writing_leaves_the_old_folder_as_it_was(tmp_path):
    out = tmp_path / "out"
    with staged_folder(out) as staging:
        (staging / "a.txt").write_text("old")
    with pytest.raises(RuntimeError), staged_folder(out, replace=True) as staging:
        (staging / "a.txt").write_text("new")
        raise RuntimeError("halfway")
    assert _tree(out) == {"a.txt": "old"} and _beside(tmp_path) == [".out.lock"]


def test_replacing_a_file_with_a_folder_is_refused_in_one_line(tmp_path):
    out = tmp_path / "out"
    out.write_text("a file")
    with pytest.raises(ValueError, match="it is not a folder"), staged_folder(out, ValueError, replace=True) as s:
        (s / "a.txt").write_text("new")
    assert out.read_text() == "a file"


WRITER = textwrap.dedent("""
    import sys
    from attnlab.core.staging import staged_folder
    with staged_folder(sys.argv[1], replace=True) as staging:
        (staging / "a.txt").write_text("new a")
        (staging / "b.txt").write_text("new b")
""")


@pytest.mark.parametrize("window, whole", [("staging.filled", "old"), ("staging.swapping", "old"),
                                           ("staging.swapped", "new")])
def test_a_kill_at_each_window_is_resolved_to_one_whole_folder(tmp_path, window, whole):
    """Killed (SIGKILL) at each window of a replacement: the folder then reads as the old one whole (the command
    did not happen) or the new one whole (it had finished), once ``recover`` (run by the next staged write) has
    resolved what was left; nothing is left beside it."""
    out = tmp_path / "out"
    with staged_folder(out) as staging:
        (staging / "a.txt").write_text("old a")
        (staging / "c.txt").write_text("old c")
    env = {**os.environ, "ATTNLAB_KILL_AT": window}
    done = subprocess.run([sys.executable, "-c", WRITER, str(out)], env=env, capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert len(_beside(tmp_path)) > 1  # something was left to resolve
    recover(out)
    expected = {"old": {"a.txt": "old a", "c.txt": "old c"}, "new": {"a.txt": "new a", "b.txt": "new b"}}[whole]
    assert _tree(out) == expected and not (out / STAGING_MARK).exists()
    assert _beside(tmp_path) == [".out.lock"]
    with staged_folder(out, replace=True) as staging:  # and the next write goes through
        (staging / "d.txt").write_text("d")
    assert _tree(out) == {"d.txt": "d"}


def test_recover_leaves_folders_that_are_not_its_own(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    lookalike = tmp_path / ".out.staging-mine"  # no mark: someone else's
    lookalike.mkdir()
    recover(out)
    assert lookalike.is_dir() and out.is_dir()
