"""Staged folders: a command's output folder appears whole, or not at all, whatever moment it is killed at.

    with staged_folder(out, DataError) as staging:                 # out absent or empty
        ...write every file into staging...
    with staged_folder(out, ConfigError, replace=True) as staging:  # out may hold an earlier output: replaced whole

Everything happens under ``out``'s lock (``.OUT.lock`` beside it, ``core.locks``):

1. a new folder ``.OUT.staging-*`` is made beside ``out``, holding the mark file ``STAGING_MARK``;
2. the body writes there; on an exception the folder is removed and ``out`` left as it was;
3. every file is fsynced, then
   - ``out`` absent or empty: the mark is removed and the folder renamed onto ``out`` (one rename);
   - ``replace`` and ``out`` full: ``out`` is renamed to ``.OUT.replaced-*`` and the new folder onto ``out``; then
     its mark and the old folder are removed.

A kill leaves one of four states, and the next ``staged_folder`` for ``out`` (``recover``) resolves each before
it writes anything: ``out`` as it was beside a marked leftover (the leftover is removed); no ``out``, the old
folder aside and the new one marked (the old one is renamed back: a killed command did not happen); the new
``out`` still marked with the old one aside (the mark and the old one are removed: the command had finished);
or the finished state. Only folders of these names that hold the mark, or ``.OUT.replaced-*`` folders, are ever
removed; nothing else beside ``out`` is touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from attnlab.core.fileio import CREATED_MODE

STAGING_MARK = ".attnlab-staging"  # inside every folder staged_folder makes: what marks a leftover as ours
CREATED_FOLDER_MODE = 0o777 & ~(0o666 & ~CREATED_MODE)  # the mode mkdir gives a new folder (the umask's)


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder`` (links are not followed), the folder itself last."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in [*files, *dirs]:
            if not os.path.islink(os.path.join(root, name)):
                _fsync(os.path.join(root, name))
    _fsync(folder)


def _beside(out: Path, kind: str) -> list[Path]:
    """The real folders named ``.OUT.KIND-*`` beside ``out`` (never a link)."""
    prefix = f".{out.name}.{kind}-"
    return [p for p in out.parent.iterdir() if p.name.startswith(prefix) and not p.is_symlink() and p.is_dir()]


def recover(out: Path) -> None:
    """Resolve what a killed ``staged_folder`` left beside ``out`` (the caller holds ``out``'s lock): the old folder
    of a replacement cut off before the new one arrived is renamed back; once ``out`` is in place, a mark left in
    it, old folders aside and marked leftovers are removed."""
    replaced = _beside(out, "replaced")
    if replaced and not out.exists():
        os.rename(replaced.pop(), out)  # the new folder never arrived: the command did not happen
    if (out / STAGING_MARK).is_file() and not out.is_symlink():
        (out / STAGING_MARK).unlink()  # it had: only its mark was left to remove
    for old in replaced:
        shutil.rmtree(old, ignore_errors=True)
    for leftover in _beside(out, "staging"):
        if (leftover / STAGING_MARK).is_file():
            shutil.rmtree(leftover, ignore_errors=True)


def _is_empty_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


@contextlib.contextmanager
def staged_folder(out: str | Path, error: type[Exception] = OSError, replace: bool = False) -> Iterator[Path]:
    """Yield a new folder beside ``out`` to write into; on success it takes ``out``'s place whole (the module's
    protocol). ``out`` must be absent or an empty folder unless ``replace``; the caller checks beforehand that a
    folder it replaces is its own (no one else's files). ``out``'s lock is taken unless this process holds it
    already (``attnlab experiment`` does, for a whole study). ``error`` is raised, in one line, when the finished
    folder cannot take ``out``'s place (``out`` was filled meanwhile, or is not a folder)."""
    from attnlab.core.killpoints import kill_point
    from attnlab.core.locks import folder_lock, held_here

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = contextlib.nullcontext() if held_here(out, beside=True) else folder_lock(out, beside=True, what="--out")
    with lock:
        recover(out)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
        try:
            (staging / STAGING_MARK).touch()
            yield staging
            kill_point("staging.filled")
            swap = replace and out.exists() and not _is_empty_folder(out)
            if not swap:
                (staging / STAGING_MARK).unlink()
            _fsync_tree(staging)
            try:
                os.chmod(staging, stat.S_IMODE(os.stat(out).st_mode))
            except FileNotFoundError:
                os.chmod(staging, CREATED_FOLDER_MODE)  # mkdtemp's is 0700
            if swap:
                _swap(staging, out, error)
                return
            try:
                os.rename(staging, out)  # replaces an empty folder, refuses a full one
            except OSError as e:
                raise error(f"cannot put the finished folder at {out} ({e.strerror or e}); nothing was written "
                            "there") from None
            _fsync(out.parent)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


def _swap(staging: Path, out: Path, error: type[Exception]) -> None:
    """Put the finished, still marked ``staging`` at ``out`` in place of the folder there (two renames, each
    fsynced; a kill between them is undone by ``recover``), then remove the mark and the old folder."""
    from attnlab.core.killpoints import kill_point

    if out.is_symlink() or not out.is_dir():
        raise error(f"cannot put the finished folder at {out}: it is not a folder; nothing was written there")
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.replaced-", dir=out.parent))
    try:
        os.rename(out, old)  # onto the empty folder just made: a name no one else takes
    except OSError as e:
        old.rmdir()
        raise error(f"cannot move {out} aside to replace it ({e.strerror or e}); it was left as it was") from None
    _fsync(out.parent)
    kill_point("staging.swapping")
    os.rename(staging, out)
    _fsync(out.parent)
    kill_point("staging.swapped")
    (out / STAGING_MARK).unlink()
    shutil.rmtree(old, ignore_errors=True)


def check_own_folder(out: str | Path, owns: Callable[[str], bool], what: str, error: type[Exception]) -> None:
    """``error`` in one line unless ``out`` is absent, an empty folder, or a folder holding only files whose
    names ``owns`` accepts: an earlier output of the same command, which ``staged_folder(..., replace=True)``
    replaces whole. A user's own files there are never removed."""
    out = Path(out)
    if not out.exists():
        return
    if out.is_symlink() or not out.is_dir():
        raise error(f"{what} {out} is not a folder")
    foreign = sorted(p.name for p in out.iterdir() if p.name != STAGING_MARK
                     and (p.is_symlink() or not p.is_file() or not owns(p.name)))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise error(f"{what} {out} holds files this command does not write ({shown}); it replaces the folder "
                    "whole: choose a new or empty folder")
