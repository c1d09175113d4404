"""Finite or not saved, and no dead ends (issue 21, items 1 and 5): a non-finite number is refused at the
config edge; a state the update left non-finite (weights, optimiser moments) or a non-finite evaluation
stops the run before it is evaluated, saved or called best, naming the last checkpoint that is truly
good; metrics.jsonl is strict JSON; a kill in the first checkpoint write or inside the best/ swap leaves
a run that resumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.training.checkpoint import best_checkpoint, list_checkpoints
from attnlab.training.runs import strict_record
from attnlab.training.trainer import Trainer, TrainingDiverged
from tests.helpers import tiny_config, tiny_overrides, write_corpus


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.txt")


@pytest.mark.parametrize("override", [
    "weight_decay=nan", "lr=inf", "grad_clip=-inf", "min_lr=nan", "model.norm_eps=nan", "model.rope_theta=inf",
    "weight_decay=1e999", "seed=1180591620717411303424",
])
def test_non_finite_and_out_of_range_numbers_are_refused_before_any_work(corpus, tmp_path, capsys, override):
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path / "runs"), override]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("finite number" in err or "64-bit integer" in err), err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _all_finite(folder: Path) -> bool:
    return all(torch.isfinite(t).all() for t in load_file(folder / "attnlab_model.safetensors").values())


def _poison_weights_after(trainer: Trainer, monkeypatch, step: int) -> None:
    """After optimisation step ``step`` (1-based) one weight becomes NaN: the loss of that step was
    finite, so only a check of the state itself can see it (what a NaN weight decay did)."""
    real = trainer.optimizer.step

    def step_fn(*args, **kwargs):
        out = real(*args, **kwargs)
        if trainer.step + 1 == step:
            with torch.no_grad():
                next(trainer.model.parameters()).view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(trainer.optimizer, "step", step_fn)


@pytest.mark.parametrize("bad_step", [10, 13])  # on a checkpoint step, and between two
def test_a_non_finite_state_is_never_saved_or_called_best(corpus, tmp_path, monkeypatch, bad_step):
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="poison", max_iters=20, eval_interval=5))
    _poison_weights_after(trainer, monkeypatch, bad_step)
    with pytest.raises(TrainingDiverged) as e:
        trainer.train()
    message = str(e.value)
    last_good = f"step-{(bad_step - 1) // 5 * 5:07d}"
    assert "not finite" in message and last_good in message and "\n" not in message
    saved = list_checkpoints(trainer.run_dir)
    assert saved and saved[-1].name == last_good and all(_all_finite(c) for c in saved)
    assert _all_finite(best_checkpoint(trainer.run_dir)) and _all_finite(trainer.run_dir)  # best/ and the top level


def test_a_non_finite_evaluation_stops_the_run(corpus, tmp_path, monkeypatch):
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="evalnan", max_iters=20, eval_interval=5))
    real = trainer.evaluate
    monkeypatch.setattr(trainer, "evaluate", lambda *a: {k: (float("nan") if trainer.step == 15 else v)
                                                           for k, v in real(*a).items()})
    with pytest.raises(TrainingDiverged, match=r"evaluation after step 15 is not finite.*step-0000010"):
        trainer.train()
    assert [c.name for c in list_checkpoints(trainer.run_dir)][-1] == "step-0000010"


def test_with_nothing_good_yet_the_message_says_so(corpus, tmp_path, monkeypatch):
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="early", max_iters=8, eval_interval=5))
    _poison_weights_after(trainer, monkeypatch, 2)
    with pytest.raises(TrainingDiverged, match="no checkpoint had been written yet"):
        trainer.train()
    assert list_checkpoints(trainer.run_dir) == []


def test_a_short_diverging_run_fails_through_the_cli(corpus, tmp_path, capsys):
    """The reported case: a run too short for the skip limit used to exit 0 with "val loss nan"."""
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path / "runs", name="lr"),
            "max_iters=8", "eval_interval=4", "lr=1e30", "warmup_iters=0"]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "training stopped" in err
    run = tmp_path / "runs" / "lr"
    assert all(_all_finite(c) for c in list_checkpoints(run))


def test_metrics_are_strict_json(corpus, tmp_path, monkeypatch):
    assert strict_record({"step": 3, "loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-3}) == {
        "step": 3, "loss": None, "grad_norm": None, "lr": 1e-3, "nonfinite": {"loss": "nan", "grad_norm": "inf"}}
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="strict"))
    real = trainer.forward

    def forward(**batch):  # one NaN loss at step 7: skipped and recorded
        out = real(**batch)
        if trainer.step + 1 == 7 and trainer.model.training:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(trainer, "forward", forward)
    trainer.train()

    def refuse(constant):
        raise ValueError(f"non-strict JSON constant {constant}")

    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=refuse) for line in lines]
    skipped = [r for r in records if "skipped" in r]
    assert skipped and skipped[0]["loss"] is None and skipped[0]["nonfinite"]["loss"] == "nan"


# ------------------------------------------------------------------------------ no dead ends (issue 21, item 5)


def test_a_run_killed_in_its_first_checkpoint_write_resumes_to_the_same_run(corpus, tmp_path, monkeypatch, capsys):
    """The first checkpoint's folder is written but never renamed into place (the process dies there):
    `attnlab resume` used to find "no valid checkpoint" and `train` "already holds a run". Now resume
    trains it again from step 0 and ends bit-identical to a run that was never interrupted."""
    from attnlab.training import checkpoint as ckpt

    real_replace = ckpt.os.replace

    def die(src, dst):
        if ".tmp-step-" in str(src):
            raise SystemExit("killed")  # what a kill -9 leaves: the .tmp folder, nothing renamed
        return real_replace(src, dst)

    overrides = tiny_overrides(corpus, tmp_path / "runs", name="first", max_iters=10, eval_interval=5)
    monkeypatch.setattr(ckpt.os, "replace", die)
    with pytest.raises(SystemExit):
        main(["train", "configs/shakespeare-char.yaml", *overrides])
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    run = tmp_path / "runs" / "first"
    assert list(run.glob("checkpoints/.tmp-step-*")) and list_checkpoints(run) == []
    assert main(["train", "configs/shakespeare-char.yaml", *overrides]) == 2  # no silent overwrite
    capsys.readouterr()
    assert main(["resume", str(run)]) == 0
    assert "training it from step 0" in capsys.readouterr().out
    assert main(["train", "configs/shakespeare-char.yaml",
                 *tiny_overrides(corpus, tmp_path / "runs", name="whole", max_iters=10, eval_interval=5)]) == 0
    whole = tmp_path / "runs" / "whole"
    a, b = load_file(run / "attnlab_model.safetensors"), load_file(whole / "attnlab_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert steps == sorted(steps)  # the lost attempt's records were cut before the restart


def test_resume_still_refuses_a_folder_whose_checkpoints_are_all_damaged(corpus, tmp_path, capsys):
    overrides = tiny_overrides(corpus, tmp_path / "runs", name="bad", max_iters=5, eval_interval=5)
    assert main(["train", "configs/shakespeare-char.yaml", *overrides]) == 0
    run = tmp_path / "runs" / "bad"
    for c in [*list_checkpoints(run), run / "checkpoints" / "best"]:
        (c / "attnlab_model.safetensors").write_bytes(b"damaged")
    capsys.readouterr()
    assert main(["resume", str(run)]) == 2
    assert "no valid checkpoint" in capsys.readouterr().err


@pytest.fixture(scope="module")
def swap_run(tmp_path_factory, _session_cache) -> Path:
    """A 10-step run with a checkpoint every 5 and its best/, trained once for the module."""
    root = tmp_path_factory.mktemp("swap")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLAB_CACHE_DIR", str(_session_cache))
        cfg = tiny_config(write_corpus(root / "corpus.txt"), root / "runs", name="swap", max_iters=10, eval_interval=5)
        return Trainer(cfg).train().run_dir


@pytest.mark.parametrize("left", ["old", "tmp", "both"])
def test_a_kill_inside_the_best_swap_loses_nothing(swap_run, tmp_path, left):
    """best/ is swapped in by two renames (best -> .old-best, .tmp-best -> best); killed between them, the
    next resume used to delete both complete copies. Now it puts one back (each case on a copy of one run)."""
    from attnlab.training.checkpoint import best_checkpoint, remove_stale_temporaries

    run = Path(shutil.copytree(swap_run, tmp_path / "swap"))
    root = run / "checkpoints"
    best = root / "best"
    if left in ("tmp", "both"):
        shutil.copytree(best, root / ".tmp-best-999")
    if left in ("old", "both"):
        best.rename(root / ".old-best-999")
    else:
        shutil.rmtree(best)
    remove_stale_temporaries(run)
    assert best_checkpoint(run) == best and not list(root.glob(".*"))


def test_links_and_occupied_folders_are_refused(corpus, tmp_path, capsys):
    """A metrics.jsonl or checkpoints/ that is a symbolic link would make training write (or prune) outside
    the run; import-hf --out into a folder that holds anything would overwrite it."""
    overrides = tiny_overrides(corpus, tmp_path / "runs", name="links", max_iters=5, eval_interval=5)
    assert main(["train", "configs/shakespeare-char.yaml", *overrides]) == 0
    run = tmp_path / "runs" / "links"
    outside = tmp_path / "outside.jsonl"
    outside.write_text("")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(outside)
    capsys.readouterr()
    assert main(["resume", str(run), "max_iters=10"]) == 2
    assert "symbolic link" in capsys.readouterr().err and outside.read_text() == ""
    (run / "metrics.jsonl").unlink()
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "checkpoints", elsewhere)
    (run / "checkpoints").symlink_to(elsewhere)
    assert main(["resume", str(run), "max_iters=10"]) == 2
    assert "symbolic link" in capsys.readouterr().err and any(elsewhere.iterdir())
    assert main(["import-hf", str(tmp_path), "--out", str(elsewhere)]) == 2
    err = capsys.readouterr().err
    assert "not found" in err or "not an empty folder" in err


@pytest.mark.parametrize("name", ["null", "true", "1.50", "#x", "it's"])
def test_resume_finds_a_run_whatever_its_folder_is_called(corpus, tmp_path, capsys, name):
    """Folder names that YAML reads as something else used to send resume to the wrong place."""
    overrides = tiny_overrides(corpus, tmp_path / "runs", max_iters=5, eval_interval=5)
    overrides = [o for o in overrides if not o.startswith("name=")]
    quoted = "'" + name.replace("'", "''") + "'"
    assert main(["train", "configs/shakespeare-char.yaml", *overrides, f"name={quoted}"]) == 0
    run = tmp_path / "runs" / name
    assert run.is_dir()
    capsys.readouterr()
    assert main(["resume", str(run), "max_iters=10"]) == 0
    assert f"resumed {run} from step 5" in capsys.readouterr().out


def test_a_full_disk_while_mirroring_names_the_right_checkpoint_and_mixes_nothing(corpus, tmp_path, monkeypatch):
    """The checkpoint itself was complete when the disk filled during the copy to the run's top level: the
    message used to name it as lost, and the top level held config.json and weights of different steps.
    Now the copies are staged, so the top level stays one consistent (older) model that still verifies."""
    from attnlab.core.manifest import read_manifest, verify_manifest
    from attnlab.training import checkpoint as ckpt

    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="mirror", max_iters=20, eval_interval=10))
    real_copy, copies = ckpt.shutil.copyfile, []

    def copy_that_fills_the_disk(src, dst, *a, **k):
        copies.append(dst)
        if "step-0000020" in str(src) and str(dst).endswith("attnlab_model.safetensors.mirror.tmp"):
            raise OSError(28, "No space left on device")
        return real_copy(src, dst, *a, **k)

    monkeypatch.setattr(ckpt.shutil, "copyfile", copy_that_fills_the_disk)
    with pytest.raises(Exception, match=r"step-0000020 is complete, but the copy at the top.*resume from"):
        trainer.train()
    run = trainer.run_dir
    assert list_checkpoints(run)[-1].name == "step-0000020"
    assert read_manifest(run)["step"] == 10 and verify_manifest(run) == 10  # the top level: step 10, whole
    assert not list(run.glob(".*.tmp"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_gpu_run_checks_its_state_across_devices_and_evaluates(corpus, tmp_path, optimizer):
    # Muon's AdamW part keeps its float `step` counters on the CPU beside moments on the GPU: the finiteness
    # check before every evaluation once failed there ("Expected all tensors to be on the same device")
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="gpu", max_iters=6, eval_interval=3,
                                  device="cuda", optimizer=optimizer))
    result = trainer.train()
    assert trainer.device.type == "cuda" and result.step == 6
    if optimizer == "muon":  # the mix the check has to handle
        assert any(v.device.type == "cpu" for st in trainer.optimizer.state.values() for v in st.values()
                   if torch.is_tensor(v) and v.is_floating_point())
