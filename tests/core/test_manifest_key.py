"""The keyed manifest: with ATTNLAB_MANIFEST_KEY set, recomputed hashes, a deleted manifest, a stripped or a
foreign signature are refused; without it a signed manifest is checked as a plain one, and an unkeyed list of
hashes is (as documented) no defence against a writer who recomputes them."""

from __future__ import annotations

import json

import pytest

from attnlab.core.errors import CheckpointError
from attnlab.core.manifest import KEY_ENV, MANIFEST_NAME, sha256, verify_manifest, write_manifest


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "config.json").write_text('{"family": "gpt"}')
    (tmp_path / "attnlab_model.safetensors").write_bytes(b"\x00" * 64)
    return tmp_path


def _tamper(folder):
    """An attacker with write access: change the config, then recompute its hash in the manifest."""
    (folder / "config.json").write_text('{"family": "bert"}')
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["files"]["config.json"] = sha256(folder / "config.json")
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    return manifest


def test_without_a_key_recomputed_hashes_pass_which_is_the_documented_limit(folder, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    write_manifest(folder, step=3)
    _tamper(folder)
    assert verify_manifest(folder) == 3


def test_with_a_key_a_signed_folder_loads_and_every_tampering_is_refused(folder, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "a secret")
    write_manifest(folder, step=3)
    assert "hmac" in json.loads((folder / MANIFEST_NAME).read_text())
    assert verify_manifest(folder) == 3
    manifest = _tamper(folder)
    with pytest.raises(CheckpointError, match="signed with another key"):
        verify_manifest(folder)
    manifest.pop("hmac")
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="unsigned"):
        verify_manifest(folder)
    (folder / MANIFEST_NAME).unlink()
    with pytest.raises(CheckpointError, match="cannot be authenticated"):
        verify_manifest(folder)


def test_a_folder_signed_with_another_key_is_refused_and_without_a_key_still_loads(folder, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "one key")
    write_manifest(folder, step=1)
    monkeypatch.setenv(KEY_ENV, "another key")
    with pytest.raises(CheckpointError, match="signed with another key"):
        verify_manifest(folder)
    monkeypatch.delenv(KEY_ENV)
    assert verify_manifest(folder) == 1
