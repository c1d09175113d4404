"""Atomic file writes: write to a temporary file in the same folder, fsync, then rename.

A reader (or a crash) never sees a half-written file: either the old one or the new one.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

CACHE_DIR_ENV = "ATTNLAB_CACHE_DIR"


def _created_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0o666 less the process's umask (read once, at import,
    since reading it means setting it for an instant)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


CREATED_MODE = _created_mode()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed onto ``path``, with the
    mode the file had, or for a new file the mode ``open`` would give it (``mkstemp``'s 0600 would make every
    result, report and model readable by its owner alone)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            mode = CREATED_MODE
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: a temporary file beside it, then a rename."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def default_cache_dir() -> Path:
    """``$ATTNLAB_CACHE_DIR`` if set, else ``~/.cache/attnlab``."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "attnlab"


def check_regular_file(path: Path, what: str, error: type[Exception]) -> None:
    """Raise ``error`` in one line unless ``path`` is a regular file (reading a FIFO blocks forever; a
    device such as /dev/zero never ends)."""
    if not path.exists():
        raise error(f"{what} not found: {path}")
    if path.is_dir():
        raise error(f"{what} is a directory, not a file: {path}")
    if not path.is_file():
        raise error(f"{what} is not a regular file (a FIFO, device or socket): {path}")


def check_writable_folder(path: Path, what: str, error: type[Exception], create: bool = True) -> None:
    """Raise ``error`` in one line unless ``path`` is a folder this process can write in or, with ``create``,
    one it can make (its nearest existing ancestor is a folder it can write in). Checked before any work, so
    that a command never computes for minutes or hours and then fails to save; nothing is created here."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise error(f"{what} {path} exists and is not a folder")
    if not create and not path.is_dir():
        raise error(f"{what} {path} does not exist")
    base = path.absolute()
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise error(f"cannot write in {what} {path} ({base} is a file)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise error(f"cannot write in {what} {path} ({err.strerror or err})") from None


def check_writable_file(path: Path, what: str, error: type[Exception], create: bool = False) -> None:
    """Raise ``error`` in one line unless a file ``path`` can be written: not a folder, and its folder one this
    process can write in (or, with ``create``, one it can make)."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path} is a folder, not a file")
    check_writable_folder(path.parent, f"the folder of {what}", error, create=create)



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


@contextlib.contextmanager
def staged_folder(out: str | Path, error: type[Exception] = OSError) -> Iterator[Path]:
    """Yield a new folder beside ``out`` to write into; on success its files are fsynced and it is renamed onto
    ``out`` (which must be absent or an empty folder), so a crash or kill leaves either no ``out`` or the whole
    of it, never part. On an exception the staged folder is removed and ``out`` left as it was.

    Held under ``out``'s lock (``core.locks.folder_lock(out, beside=True)``), so that a folder staged for
    ``out`` and left by a killed process (``.NAME.staging-*`` holding the ``STAGING_MARK`` file) is known to be
    a leftover, and removed; nothing else beside ``out`` is touched. ``error`` is raised, in one line, when the
    finished folder cannot take ``out``'s place (``out`` was filled meanwhile)."""
    import shutil

    from attnlab.core.killpoints import kill_point
    from attnlab.core.locks import folder_lock

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{out.name}.staging-"
    with folder_lock(out, beside=True, what="--out"):
        for leftover in out.parent.iterdir():
            if (leftover.name.startswith(prefix) and not leftover.is_symlink() and leftover.is_dir()
                    and (leftover / STAGING_MARK).is_file()):
                shutil.rmtree(leftover, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
        try:
            (staging / STAGING_MARK).touch()
            yield staging
            kill_point("staging.filled")
            (staging / STAGING_MARK).unlink()
            _fsync_tree(staging)
            try:
                os.chmod(staging, stat.S_IMODE(os.stat(out).st_mode))
            except FileNotFoundError:
                os.chmod(staging, CREATED_FOLDER_MODE)  # mkdtemp's is 0700
            try:
                os.rename(staging, out)  # replaces an empty folder, refuses a full one
            except OSError as e:
                raise error(f"cannot put the finished folder at {out} ({e.strerror or e}); nothing was written "
                            "there") from None
            _fsync(out.parent)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
