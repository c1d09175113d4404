"""What this machine can still give: free memory and free disk space, and a check that refuses work which
cannot fit in one line *before* it starts (instead of a MemoryError after minutes, the kernel's OOM killer,
or a disk filled half way).

    available_memory()        MemAvailable on Linux (physical memory elsewhere), None if unknown
    free_disk(path)           bytes free on the file system that holds path (or its nearest existing parent)
    check_room(what, memory=, disk=, where=, advice=, error=)   one-line refusal when either need exceeds what
                                                                 is free; the needs are lower bounds
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from attnlab.core.errors import ConfigError


def available_memory() -> int | None:
    """Memory the system can still give (MemAvailable on Linux; physical memory elsewhere), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def free_disk(path: str | Path) -> int | None:
    """Free bytes on the file system of ``path`` (its nearest existing parent if it does not exist yet)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def gib(n: float) -> str:
    """Bytes as GiB with one decimal (and thousands separated: 537,109.4 GiB)."""
    return f"{n / 2**30:,.1f} GiB"


def check_room(what: str, memory: int = 0, disk: int = 0, where: str | Path | None = None, advice: str = "",
               error: type[Exception] = ConfigError) -> None:
    """Raise ``error`` in one line when ``what`` needs more ``memory`` than is available, or more ``disk``
    than is free under ``where``."""
    tail = f"; {advice}" if advice else ""
    free = available_memory()
    if memory and free is not None and memory > free:
        raise error(f"{what} would take about {gib(memory)} of memory, and this machine has {gib(free)} "
                    f"available{tail}")
    space = free_disk(where) if disk and where is not None else None
    if space is not None and disk > space:
        raise error(f"{what} would take about {gib(disk)} of disk, and {where} has {gib(space)} free{tail}")
