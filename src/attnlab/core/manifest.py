"""Manifests: every folder attnlab writes a model into says what it holds, so every load can check it.

    manifest.json = {"format": 1, "step": n | null, "files": {name: SHA-256 of the file, ...}}

written last (atomically) after the files it lists. ``verify_manifest`` recomputes every hash and
refuses, in one line naming the file, a folder whose files changed (a flipped sign in the weights, an
edited ``config.json``, a permuted vocabulary), whose manifest lacks an entry for a file that must be
there (``config.json``, the weights), or whose format is newer than this attnlab. A folder
written by an earlier attnlab has no manifest: it loads with a one-line warning.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from attnlab.core.errors import CheckpointError
from attnlab.core.fileio import atomic_write_text

MANIFEST_NAME = "manifest.json"
FORMAT = 1
REQUIRED = ("config.json", "attnlab_model.safetensors", "model.safetensors")  # model.: older folders


def sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB chunks (hex digest)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path, step: int | None = None, names: tuple[str, ...] | None = None,
                   best: bool | None = None) -> Path:
    """List the files ``names`` of ``folder`` (default: every regular file but dotfiles and the manifest)
    with their hashes; ``best``: a checkpoint's record that it was the best so far when written."""
    folder = Path(folder)
    if names is None:
        names = tuple(p.name for p in sorted(folder.iterdir())
                      if p.is_file() and not p.name.startswith(".") and p.name != MANIFEST_NAME)
    files = {name: sha256(folder / name) for name in names}
    path = folder / MANIFEST_NAME
    extra = {"best": best} if best is not None else {}
    atomic_write_text(path, json.dumps({"format": FORMAT, "step": step, **extra, "files": files}, indent=2))
    return path


def read_manifest(folder: Path) -> dict | None:
    """The parsed manifest of ``folder``, None when it has none; CheckpointError when it is unreadable."""
    path = Path(folder) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files, step = manifest["files"], manifest.get("step")
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise TypeError("'files' must map names to hashes")
        if step is not None and (not isinstance(step, int) or step < 0):
            raise TypeError(f"'step' must be a count of steps, got {step!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} is unreadable: {e}") from None
    if int(manifest.get("format", 1)) > FORMAT:
        raise CheckpointError(f"{path} has format {manifest['format']}, newer than this attnlab reads ({FORMAT}); "
                              "upgrade attnlab")
    return manifest


def verify_manifest(folder: Path, required: tuple[str, ...] = REQUIRED, warn: bool = True) -> int | None:
    """Check ``folder`` against its manifest; return the manifest's step. Without a manifest: a one-line
    warning on stderr (``warn``) and None."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        if warn:
            print(f"warning: {folder} has no {MANIFEST_NAME} (written by an earlier attnlab?): its files are "
                  "loaded unverified", file=sys.stderr)
        return None
    files = manifest["files"]
    missing = [name for name in required if name not in files and (folder / name).exists()]
    if missing:
        raise CheckpointError(f"{folder / MANIFEST_NAME} does not list {missing[0]}; the folder was altered")
    for name, digest in files.items():
        file = folder / name
        if Path(name).name != name or not file.is_file() or file.is_symlink() or sha256(file) != digest:
            raise CheckpointError(f"{file} is missing or does not match its manifest hash")
    return manifest["step"]
