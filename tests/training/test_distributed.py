"""Data-parallel training launched by torchrun (2 CPU processes, gloo): rank 0 alone writes, an
N-process run resumes exactly with N processes, and checkpoints move between 1 and N processes.
device=cpu throughout, so a machine with one GPU runs these too (two processes cannot share one GPU)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.models.registry import from_pretrained
from attnlab.training.checkpoint import list_checkpoints, load_trainer_state
from attnlab.training.runs import read_metrics
from attnlab.training.trainer import Trainer
from tests.helpers import tiny_config, tiny_overrides, write_corpus

TORCHRUN = Path(sys.executable).parent / "torchrun"
pytestmark = pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed")


def _torchrun(preset: Path, overrides: list[str], cwd: Path) -> subprocess.CompletedProcess:
    argv = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "attnlab.cli", "train", str(preset),
            *overrides]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return from_pretrained(run).state_dict()


def test_two_processes_train_resume_exactly_and_move_to_one_process(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", n_chars=40_000)
    preset = tmp_path / "defaults.yaml"
    preset.write_text("{}\n")
    out = tmp_path / "runs"
    extra = dict(max_iters=20, dropout=0.1, threads=1, device="cpu", grad_accum=2)

    full = _torchrun(preset, tiny_overrides(corpus, out, name="full", **extra), tmp_path)
    assert full.stdout.count("done: step 20") == 1  # only rank 0 reports
    state = load_trainer_state(list_checkpoints(out / "full")[-1])
    assert state["world_size"] == 2 and len(state["batch_rng_per_rank"]) == 2
    # one global-batch generator, the same state on every rank (each reads its own rows)
    assert torch.equal(state["batch_rng_per_rank"][0], state["batch_rng_per_rank"][1])
    assert not torch.equal(state["torch_rng_per_rank"][0], state["torch_rng_per_rank"][1])  # own dropout
    records = read_metrics(out / "full")
    assert [r["step"] for r in records if "val_loss" in r] == [10, 20]
    train_records = [r["step"] for r in records if "val_loss" not in r]
    assert train_records == [5, 10, 15, 20]  # written once, by rank 0

    # 2 -> 2: cut after step 10 (a copy of the run without its last checkpoint), resume with two processes:
    # bit-identical to the uninterrupted run
    shutil.copytree(out / "full", out / "cut")
    shutil.rmtree(out / "cut" / "checkpoints" / "step-0000020")
    for weights in (out / "cut").glob("*.safetensors"):
        weights.unlink()  # what _weights reads must come from the resumed run
    resumed = _torchrun(preset, tiny_overrides(corpus, out, name="cut", resume=True, **extra), tmp_path)
    assert "resumed" in resumed.stdout and resumed.stdout.count("done: step 20") == 1
    a, b = _weights(out / "cut"), _weights(out / "full")
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)

    # 2 -> 1: the two-process checkpoint continues in one process
    one = Trainer(tiny_config(corpus, out, name="full", resume=True, **{**extra, "max_iters": 30}))
    assert one.step == 20
    torch.testing.assert_close(one.model.state_dict()["tok_emb.weight"], b["tok_emb.weight"])
    one.train()
    assert load_trainer_state(list_checkpoints(out / "full")[-1])["world_size"] == 1
    # 1 -> 2: and back to two processes
    more = _torchrun(preset, tiny_overrides(corpus, out, name="full", resume=True, **{**extra, "max_iters": 40}),
                     tmp_path)
    assert "resumed" in more.stdout and "done: step 40" in more.stdout
    assert load_trainer_state(list_checkpoints(out / "full")[-1])["world_size"] == 2


def test_two_processes_take_the_steps_of_one_process_with_the_global_batch(tmp_path):
    """2 processes x batch 4 (DDP, gloo) == 1 process x batch 8 after k steps, to 1e-5: every rank
    reads its rows of the same global batch and the all-reduce averages the gradients."""
    corpus = write_corpus(tmp_path / "corpus.txt", n_chars=40_000)
    preset = tmp_path / "defaults.yaml"
    preset.write_text("{}\n")
    out = tmp_path / "runs"
    extra = dict(max_iters=12, dropout=0.0, threads=1, device="cpu", eval_interval=12)
    _torchrun(preset, tiny_overrides(corpus, out, name="two", batch_size=4, **extra), tmp_path)
    trainer = Trainer(tiny_config(corpus, out, name="one", batch_size=8, **extra))
    init = {k: v.clone() for k, v in trainer.model.state_dict().items()}  # the weights both runs start from
    trainer.train()
    two, one = _weights(out / "two"), _weights(out / "one")
    worst = max((two[k] - one[k]).abs().max().item() for k in one)
    assert worst < 1e-5, worst
    assert max((one[k] - init[k]).abs().max().item() for k in one) > 1e-3  # and training did move them


def test_fsdp_matches_one_process_resumes_exactly_and_moves_to_one_process(tmp_path):
    """parallel=fsdp (FSDP2, gloo): each rank holds half of every parameter and moment, yet the
    steps equal one process's with the global batch (to 1e-5); a 2-process FSDP run cut and
    resumed is bit-identical to the uninterrupted one; its checkpoint continues in one process."""
    corpus = write_corpus(tmp_path / "corpus.txt", n_chars=40_000)
    preset = tmp_path / "defaults.yaml"
    preset.write_text("{}\n")
    out = tmp_path / "runs"
    extra = dict(max_iters=12, dropout=0.0, threads=1, device="cpu", eval_interval=6, grad_accum=2, sample_tokens=5)
    full = _torchrun(preset, tiny_overrides(corpus, out, name="fsdp", batch_size=4, parallel="fsdp", **extra),
                     tmp_path)
    assert full.stdout.count("done: step 12") == 1 and (out / "fsdp" / "samples.txt").is_file()
    Trainer(tiny_config(corpus, out, name="one", batch_size=8, **extra)).train()
    sharded, one = _weights(out / "fsdp"), _weights(out / "one")
    assert max((sharded[k] - one[k]).abs().max().item() for k in one) < 1e-5

    shutil.copytree(out / "fsdp", out / "cut")
    shutil.rmtree(out / "cut" / "checkpoints" / "step-0000012")
    _torchrun(preset, tiny_overrides(corpus, out, name="cut", batch_size=4, parallel="fsdp", resume=True, **extra),
              tmp_path)
    a = _weights(out / "cut")
    assert all(torch.equal(a[k], sharded[k]) for k in a)

    single = Trainer(tiny_config(corpus, out, name="fsdp", batch_size=8, resume=True, **{**extra, "max_iters": 16}))
    assert single.step == 12
    assert single.optimizer.state_dict()["state"][0]["exp_avg"].abs().sum() > 0  # the moments came along
    assert single.train().step == 16
