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


def save_figure(fig, path: str | Path, **options) -> Path:
    """``fig.savefig(path, **options)`` atomically (a kill leaves the old file or the new one, never a truncated
    image); the format is the suffix's (png if none). Returns ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", **options)
    return path
