"""One writer per folder: an OS file lock that every command which writes a run or an output folder holds.

    with folder_lock(out, beside=True): # .OUT.lock beside a folder that is staged and renamed into place
        ...
    lock = hold(run_dir, beside=True)   # held for a run's life (the Trainer), then lock.release()

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a small file that records the holder's pid. The kernel drops it
when the holder exits, however it exits (kill -9 included), so a lock is never stale; the file itself is
left in place (removing it would let a third process lock a fresh file while a second still holds the old
one). A second writer is refused at once, in one line that names the holder, and never waits.

Limits: ``flock`` is advisory (a process that does not take it is not stopped) and, on some network file
systems, local to one machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from attnlab.core.errors import AttnlabError

LOCK_NAME = ".lock"
_HELD: set[Path] = set()  # the lock files this process holds now (``held_here``)


class FolderBusy(AttnlabError):
    """Another process (or another open of the same lock in this one) holds the folder's lock."""


def lock_file(folder: Path, beside: bool) -> Path:
    """Where ``folder``'s lock lives: ``folder/.lock``, or ``.NAME.lock`` in its parent (``beside``)."""
    return folder.parent / f".{folder.name}.lock" if beside else folder / LOCK_NAME


def _holder(path: Path) -> str:
    try:
        pid = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        pid = ""
    return f"process {pid}" if pid.isdigit() else "another process"


class FolderLock:
    """A held folder lock (``hold``): released by ``release()``, by garbage collection, or by the process's end."""

    def __init__(self, folder: Path, path: Path, fd: int) -> None:
        self.folder, self.path, self._fd, self._key = folder, path, fd, path.resolve()
        self._held = _HELD  # kept: release may run from __del__ as the interpreter ends
        self._held.add(self._key)

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases it); a second call does nothing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._held.discard(self._key)

    __del__ = release


def hold(folder: str | Path, beside: bool = False, what: str = "folder") -> FolderLock:
    """Take ``folder``'s lock until ``release()`` (the folder itself must exist unless ``beside``).

    Raises FolderBusy ("... is being written by process N ...") if another process holds it."""
    folder = Path(folder)
    path = lock_file(folder, beside)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FolderBusy(f"{what} {folder} is being written by {_holder(path)}; wait for it to finish, "
                         "or write elsewhere") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    return FolderLock(folder, path, fd)


@contextlib.contextmanager
def folder_lock(folder: str | Path, beside: bool = False, what: str = "folder") -> Iterator[Path]:
    """Hold ``folder``'s lock for the ``with`` body (``hold``), and yield the lock file's path."""
    lock = hold(folder, beside, what)
    try:
        yield lock.path
    finally:
        lock.release()


def held_here(folder: str | Path, beside: bool = False) -> bool:
    """Whether this process holds ``folder``'s lock now (so that a writer called under it does not take it again)."""
    return lock_file(Path(folder), beside).resolve() in _HELD


def held_by_other(folder: str | Path, beside: bool = False) -> bool:
    """Whether another process holds ``folder``'s lock now (a probe: takes and drops it at once)."""
    path = lock_file(Path(folder), beside)
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
