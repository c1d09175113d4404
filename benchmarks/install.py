"""``pip install .`` as a user meets it: time and size of the base install, the torch already in the venv
kept, and no web server, Captum, SciPy or scikit-learn pulled in.

Two fresh venvs under a temporary folder:

1. **real torch**: ``pip install torch==2.13.0`` (the CPU wheel, from pip's cache), then ``pip install .``
   (a regular, non-editable install). Measured: the seconds ``pip install .`` took and the venv's size
   after it; checked: torch is still 2.13.0 from the same files, ``attnlab --help`` runs, and
   ``import fastapi / captum / scipy / sklearn`` all fail (the base install has none of them).
2. **another torch**: a stand-in distribution ``torch 2.5.1`` (metadata and a module giving
   ``__version__``; no real torch is downloaded), then ``pip install .``: pip must keep it (the metadata
   asks for ``torch>=2.5,<3``, not an exact version).

    python benchmarks/install.py        # about 2 minutes; needs the package registry

Writes ``benchmarks/results/install.json``; exit 1 if a check fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnlab.cli.errors import OneLineParser, run_script

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("fastapi", "uvicorn", "captum", "scipy", "sklearn", "sacrebleu")


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


def venv(where: Path) -> Path:
    run(sys.executable, "-m", "venv", str(where))
    return where / "bin" / "python"


def stand_in_torch(python: Path, version: str) -> None:
    """A minimal installed distribution named torch (what pip sees), without the real library."""
    site = Path(run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    info = site / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def main() -> int:
    OneLineParser(description=__doc__.splitlines()[0]).parse_args()  # --help, and nothing else is accepted
    results: dict = {"checks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        py = venv(Path(tmp) / "real")
        run(str(py), "-m", "pip", "install", "--quiet", "torch==2.13.0")
        torch_file = run(str(py), "-c", "import torch; print(torch.__file__, torch.__version__)").stdout.strip()
        before = size_mb(Path(tmp) / "real")
        t0 = time.perf_counter()
        run(str(py), "-m", "pip", "install", "--quiet", str(ROOT))
        seconds = time.perf_counter() - t0
        after = size_mb(Path(tmp) / "real")
        results.update(install_seconds=round(seconds, 1), venv_mb_with_torch=round(after),
                       attnlab_and_deps_mb=round(after - before))
        results["checks"]["torch kept (2.13.0)"] = run(
            str(py), "-c", "import torch; print(torch.__file__, torch.__version__)").stdout.strip() == torch_file
        results["checks"]["attnlab --help runs"] = run(str(Path(tmp) / "real" / "bin" / "attnlab"), "--help",
                                                       check=False).returncode == 0
        for name in HEAVY:
            found = run(str(py), "-c", f"import {name}", check=False).returncode == 0
            results["checks"][f"no {name} in the base install"] = not found

        py2 = venv(Path(tmp) / "other")
        stand_in_torch(py2, "2.5.1")
        run(str(py2), "-m", "pip", "install", "--quiet", str(ROOT))
        kept = run(str(py2), "-m", "pip", "show", "torch").stdout
        results["checks"]["another torch 2.x (2.5.1) kept"] = "Version: 2.5.1" in kept
    print(f"pip install . : {results['install_seconds']} s, attnlab + dependencies {results['attnlab_and_deps_mb']} MB "
          f"(venv with the CPU torch {results['venv_mb_with_torch']} MB)")
    for name, ok in results["checks"].items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    out = ROOT / "benchmarks" / "results" / "install.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(results["checks"].values()) else 1


if __name__ == "__main__":
    run_script(main, "install")
