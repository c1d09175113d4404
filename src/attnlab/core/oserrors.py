"""The operating system's refusals a user can cause, as one line each: which path, what went wrong, what to do.

A name too long, a folder without permission, a full disk, a file-size limit (``ulimit -f``), a read-only
file system, a file where a folder was expected, a loop of symbolic links: each reaches the command line
as an ``OSError`` with an ``errno`` (or, from a library written in Rust, a message ending "(os error N)":
``as_os_error``). ``describe`` says it for a user; ``is_user_error`` tells which errors those are (the
command line exits 2 for them, as for any other bad input).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

# errno -> (what happened, what to do)
ADVICE: dict[int, tuple[str, str]] = {
    errno.ENAMETOOLONG: ("a name in the path is too long (at most 255 bytes a name, 4096 the whole path)",
                         "choose a shorter name"),
    errno.EACCES: ("permission denied", "choose a folder you can write in, or change its permissions"),
    errno.EPERM: ("operation not permitted", "choose a folder you own, or change its permissions"),
    errno.ENOSPC: ("no space left on the device", "free some space, or choose a folder on another disk"),
    errno.EDQUOT: ("the disk quota is exceeded", "free some space, or choose a folder on another disk"),
    errno.EFBIG: ("the file is larger than this process may write (ulimit -f) or the file system holds",
                  "raise the limit (ulimit -f unlimited), or choose a folder on another file system"),
    errno.EROFS: ("the file system is read-only", "choose a folder on a writable file system"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "check the path"),
    errno.EISDIR: ("it is a folder, not a file", "give a file"),
    errno.ELOOP: ("too many symbolic links (a loop?)", "check the links along the path"),
    errno.ENOENT: ("no such file or folder", "check the path"),
    errno.EEXIST: ("it already exists", "choose another name, or remove it"),
    errno.EMFILE: ("this process has too many files open", "raise the limit (ulimit -n)"),
    errno.ENFILE: ("the system has too many files open", "close some programs and try again"),
    errno.EXDEV: ("the paths are on different file systems", "keep them on one file system"),
}

PATH_CHARS = 200  # a path in the message is cut to this many characters


def _shown(path: str | bytes | int) -> str:
    """A path for a message: bytes decoded as the file system does, at most ``PATH_CHARS`` characters."""
    raw = os.fsencode(path) if isinstance(path, bytes | str) else str(path).encode()
    text = raw.decode("utf-8", "backslashreplace")  # bytes that are not UTF-8 as \\xNN
    return text if len(text) <= PATH_CHARS else f"{text[:PATH_CHARS]}... ({len(text)} characters)"


RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how a library written in Rust (safetensors) reports one


def as_os_error(err: BaseException, path: str | Path | None = None) -> OSError | None:
    """``err`` as an OSError: itself; for an error of a library written in Rust (safetensors, tokenizers), whose I/O
    errors are messages ending "(os error N)", an OSError of that errno about ``path``; else None."""
    if isinstance(err, OSError):
        return err
    match = RUST_OS_ERROR.search(str(err))
    if match is None:
        return None
    code = int(match.group(1))
    return OSError(code, os.strerror(code), *([str(path)] if path is not None else []))


def is_user_error(err: BaseException | None) -> bool:
    """Whether ``err`` is an OSError a user causes (by a path, a permission, a full disk, a limit) and
    ``describe`` explains."""
    return isinstance(err, OSError) and err.errno in ADVICE


def describe(err: OSError) -> str:
    """One line for ``err``: "PATH: what happened; what to do" (both paths of a rename or a link)."""
    what, todo = ADVICE.get(err.errno, (err.strerror or type(err).__name__, "check the path"))
    paths = [p for p in (err.filename, err.filename2) if p is not None]
    where = " -> ".join(_shown(p) for p in paths)
    return f"{where}: {what}; {todo}" if where else f"{what}; {todo}"
