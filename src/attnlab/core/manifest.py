"""Manifests: every folder attnlab writes a model into says what it holds, so every load can check it.

    manifest.json = {"format": 1, "step": n | null, "files": {name: SHA-256 of the file, ...}}

written last (atomically) after the files it lists. ``verify_manifest`` recomputes every hash and
refuses, in one line naming the file, a folder whose files changed (a flipped sign in the weights, an
edited ``config.json``, a permuted vocabulary), whose manifest lacks an entry for a file that must be
there (``config.json``, the weights), or whose format is newer than this attnlab. A folder
written by an earlier attnlab has no manifest: it loads with a one-line warning.

What it protects against: damage (a bad disk, a half copy, an edit by mistake). An unkeyed list of hashes
is no defence against someone who can write the folder: they can recompute the hashes, or delete the
manifest. For authenticity set ``ATTNLAB_MANIFEST_KEY``: every manifest written then carries

    "hmac": HMAC-SHA256(key, canonical JSON of {"format", "step", "best", "files"})

and every load with the key set refuses a folder whose manifest is missing, unsigned, or signed with
another key (in one line); without the key, signed manifests are checked as plain ones.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
from pathlib import Path

from attnlab.core.errors import CheckpointError
from attnlab.core.fileio import atomic_write_text

MANIFEST_NAME = "manifest.json"
KEY_ENV = "ATTNLAB_MANIFEST_KEY"
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
    manifest = {"format": FORMAT, "step": step, **extra, "files": files}
    key = manifest_key()
    if key is not None:
        manifest["hmac"] = signature(manifest, key)
    atomic_write_text(path, json.dumps(manifest, indent=2))
    return path


def manifest_key() -> bytes | None:
    """The user's manifest key (``$ATTNLAB_MANIFEST_KEY``, UTF-8), or None when unset or empty."""
    key = os.environ.get(KEY_ENV, "")
    return key.encode("utf-8") if key else None


def signature(manifest: dict, key: bytes) -> str:
    """HMAC-SHA256 of the manifest's content (every field but ``hmac``), as canonical JSON (sorted keys)."""
    body = json.dumps({k: v for k, v in manifest.items() if k != "hmac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()


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
    version = manifest.get("format", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{path} is unreadable: 'format' must be a version number (1, 2, ...), got "
                              f"{str(version)[:40]!r}")
    if version > FORMAT:
        raise CheckpointError(f"{path} has format {version}, newer than this attnlab reads ({FORMAT}); "
                              "upgrade attnlab")
    return manifest


def verify_manifest(folder: Path, required: tuple[str, ...] = REQUIRED, warn: bool = True) -> int | None:
    """Check ``folder`` against its manifest; return the manifest's step. Without a manifest: a one-line
    warning on stderr (``warn``) and None."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    key = manifest_key()
    if key is not None:
        if manifest is None:
            raise CheckpointError(f"{folder} has no {MANIFEST_NAME}, and {KEY_ENV} is set: its files cannot be "
                                  "authenticated")
        given = manifest.get("hmac")
        if not isinstance(given, str) or not hmac.compare_digest(given, signature(manifest, key)):
            raise CheckpointError(f"{folder / MANIFEST_NAME} is {'signed with another key' if given else 'unsigned'}"
                                  f" ({KEY_ENV} is set): the folder is not authenticated")
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
