"""Building attnlab's C++ kernels on first use, and keeping them: one shared library per source, defines,
torch version, compiler and CPU.

    namespace = build_and_load(source, "attnlab_cpu_fused", "cpu-fused attention", {"CK_HD": 64})
    torch.ops.<namespace>.<op>(...)

g++ (``$CXX``) with ``-O3 -march=native`` against torch's headers and libraries; the library is kept in
``<cache>/kernels`` (``core.fileio.default_cache_dir``) under a key of all of the above (the source's text with
that of the headers it includes by ``#include "..."``), written atomically,
and loaded with ``torch.ops.load_library``. The source defines its ops in ``TORCH_LIBRARY(CK_NS, m)``;
``CK_NS`` is set to the namespace returned. No compiler, or a failed build, raises ``KernelUnavailable`` with
the reason in one line. Processes that need the same library at once (the ranks of one run) build it once: the
others wait on a lock beside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_path, default_cache_dir


class KernelUnavailable(ConfigError):
    """A kernel cannot be built or loaded here (no compiler, a failed build, an unsupported size); the message
    says why in one line."""


def compiler(what: str, instead: str) -> str:
    """The C++ compiler's path; ``what`` and ``instead`` (the option to use without one) go into the error."""
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise KernelUnavailable(f"{what} is compiled on first use and needs a C++ compiler: "
                                f"{cxx!r} was not found (install g++ or set $CXX), or use {instead}")
    return path


def cpu_flags() -> str:
    """The CPU's feature flags (part of the cache key: ``-march=native`` code runs only on a CPU like this)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line for line in lines if line.startswith(("flags", "Features"))), platform.processor())


def local_headers(source: Path) -> list[Path]:
    """The headers ``source`` includes by ``#include "path"`` (relative to the including file's folder), and the
    headers those include, in the order met; one that is not there is left to the compiler to report."""
    found: list[Path] = []
    todo = [source]
    while todo:
        including = todo.pop(0)
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', including.read_text(), flags=re.M):
            header = (including.parent / name).resolve()
            if header.is_file() and header not in found:
                found.append(header)
                todo.append(header)
    return found


def command(cxx: str, source: Path, defines: dict[str, object], out: Path) -> list[str]:
    """The compiler's command line for ``source`` with ``-D`` ``defines`` into the library ``out``."""
    from torch.utils.cpp_extension import include_paths, library_paths

    march = "-mcpu=native" if platform.machine() in ("aarch64", "arm64") else "-march=native"
    return [cxx, "-std=c++17", "-O3", march, "-fno-math-errno", "-fopenmp", "-shared", "-fPIC",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-D{k}={v}" for k, v in defines.items()), *(f"-I{p}" for p in include_paths()),
            str(source), *(f"-L{p}" for p in library_paths()), "-lc10", "-ltorch_cpu", "-o", str(out)]


def build_and_load(source: Path, prefix: str, what: str, instead: str, defines: dict[str, object] | None = None,
                   seconds: int = 20) -> str:
    """Build ``source`` (once per key; cached on disk) and load it; returns the op namespace (``prefix`` and a
    hash of the key) under which its ``TORCH_LIBRARY(CK_NS, ...)`` ops are now registered with torch.
    ``what`` names the kernel in messages, ``instead`` the option to use where it cannot be built, ``seconds``
    the build's usual time."""
    defines = dict(defines or {})
    cxx = compiler(what, instead)
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    flags = " ".join(command("cxx", source, {**defines, "CK_NS": "ns"}, Path("out")))
    texts = [path.read_text() for path in (source, *local_headers(source))]
    key = hashlib.sha256("\0".join([*texts, torch.__version__, version, cpu_flags(), flags]).encode())
    namespace = f"{prefix}_{key.hexdigest()[:16]}"
    library = default_cache_dir() / "kernels" / f"{namespace}.so"
    if not library.is_file():
        with one_builder(library, what):  # another process building it (a rank of the same run): its build is used
            if not library.is_file():
                print(f"building {what} (once, ~{seconds} s): {library}", file=sys.stderr)
                with atomic_path(library) as tmp:
                    built = subprocess.run(command(cxx, source, {**defines, "CK_NS": namespace}, tmp),
                                           capture_output=True, text=True)
                    if built.returncode != 0:
                        first = next((line for line in built.stderr.splitlines() if "error" in line),
                                     built.stderr.strip()[-300:])
                        raise KernelUnavailable(f"{what}: the build failed ({first.strip()})")
    torch.ops.load_library(str(library))
    return namespace


@contextlib.contextmanager
def one_builder(library: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<library>.lock`` while the body runs, so that processes needing the same
    library build it once: the first builds, the others wait (saying so) and then find it built. Without
    ``fcntl`` (Windows) nothing is locked and each process may build its own copy (the rename is atomic)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    library.parent.mkdir(parents=True, exist_ok=True)
    with open(library.with_suffix(".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process building {what}: {library}", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
