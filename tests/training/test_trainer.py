import functools
import itertools
import json
import math
import os
import signal

import pytest
import torch

from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.models.registry import from_pretrained
from attnlab.training.checkpoint import latest_checkpoint, list_checkpoints, load_trainer_state
from attnlab.training.loop import train_step
from attnlab.training.runs import read_metrics
from attnlab.training.schedule import lr_at
from attnlab.training.trainer import Trainer, TrainingInterrupted, make_optimizer
from tests.helpers import EXACT, tiny_config, tiny_overrides, write_corpus


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.txt")


def _losses(run_dir):
    return [(r["step"], r.get("train_loss", r.get("train_eval_loss")), r.get("val_loss"))
            for r in read_metrics(run_dir)]


def _weights(run_dir):
    return from_pretrained(run_dir).state_dict()


def test_lr_schedule_warmup_then_cosine():
    assert lr_at(0, 1.0, 0.1, 10, 100) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 0.1, 10, 100) == pytest.approx(1.0)
    assert lr_at(55, 1.0, 0.1, 10, 100) == pytest.approx(0.1 + 0.5 * 0.9)  # halfway: cos = 0
    assert lr_at(100, 1.0, 0.1, 10, 100) == pytest.approx(0.1)
    assert lr_at(500, 1.0, 0.1, 10, 100) == pytest.approx(0.1)
    values = [lr_at(t, 1.0, 0.1, 10, 100) for t in range(10, 100)]
    assert all(a >= b for a, b in itertools.pairwise(values))  # monotone decay


def test_lr_schedule_warmup_stable_then_linear_cooldown():
    wsd = functools.partial(lr_at, lr=1.0, min_lr=0.0, warmup=10, decay_iters=100, schedule="wsd",
                            cooldown_fraction=0.2)
    assert wsd(0) == pytest.approx(0.1) and wsd(9) == pytest.approx(1.0)
    assert all(wsd(t) == 1.0 for t in range(10, 80))  # stable until the last 20 of 100 steps
    assert wsd(90) == pytest.approx(0.5) and wsd(99) == pytest.approx(0.05)  # linear to 0 at step 100
    assert wsd(100) == 0.0 and wsd(300) == 0.0
    # a cooldown longer than what follows the warmup starts right after it
    assert lr_at(10, 1.0, 0.0, 10, 20, "wsd", 0.9) == pytest.approx(1.0)
    assert lr_at(15, 1.0, 0.0, 10, 20, "wsd", 0.9) == pytest.approx(0.5)


def test_cooldown_fraction_is_checked_and_belongs_to_wsd(corpus, tmp_path):
    for bad, match in (({"lr_schedule": "wsd", "cooldown_fraction": 0.0}, "cooldown_fraction"),
                       ({"lr_schedule": "wsd", "cooldown_fraction": 1.5}, "cooldown_fraction"),
                       ({"cooldown_fraction": 0.5}, "only with lr_schedule=wsd")):
        with pytest.raises(ConfigError, match=match):
            tiny_config(corpus, tmp_path / "runs", **bad)


def test_a_wsd_run_logs_its_schedule(corpus, tmp_path):
    cfg = tiny_config(corpus, tmp_path / "runs", name="wsd", max_iters=20, warmup_iters=2, lr_schedule="wsd",
                      cooldown_fraction=0.5, log_interval=1, min_lr=0.0)
    Trainer(cfg).train()
    lrs = [r["lr"] for r in read_metrics(tmp_path / "runs" / "wsd") if "val_loss" not in r]
    assert lrs == pytest.approx([lr_at(t, cfg.lr, 0.0, 2, 20, "wsd", 0.5) for t in range(20)])


def test_eval_train_false_scores_val_alone_on_the_same_batches(corpus, tmp_path):
    both = Trainer(tiny_config(corpus, tmp_path / "runs", name="both")).train()
    alone = Trainer(tiny_config(corpus, tmp_path / "runs", name="alone", eval_train=False)).train()
    evals = [[r for r in read_metrics(run.run_dir) if "val_loss" in r] for run in (both, alone)]
    assert [r["val_loss"] for r in evals[0]] == [r["val_loss"] for r in evals[1]]  # bit for bit
    assert all("train_eval_loss" in r for r in evals[0]) and not any("train_eval_loss" in r for r in evals[1])


def test_eval_batch_size_sets_the_evaluation_batches(corpus, tmp_path):
    from attnlab.training.loop import evaluate_model

    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="eb", batch_size=4, eval_batch_size=7))
    expected = evaluate_model(trainer.model, trainer.task, trainer.task.splits, 7, trainer.cfg.eval_iters,
                              trainer.cfg.seed, trainer.device)
    assert trainer.evaluate() == expected
    with pytest.raises(ConfigError, match="eval_batch_size"):
        tiny_config(corpus, tmp_path / "runs", eval_batch_size=0)


@pytest.mark.parametrize("native", [True, False])
def test_dtype_auto_is_bfloat16_only_where_the_device_computes_it_natively(corpus, tmp_path, monkeypatch, native):
    from attnlab.core import runtime

    monkeypatch.setattr(runtime, "native_bfloat16", lambda device_type: native)
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="auto", dtype="auto", optimizer="muon"))
    assert trainer.dtype == ("bfloat16" if native else "float32")
    assert trainer.optimizer.ns_dtype == (torch.bfloat16 if native else torch.float32)  # Muon's Newton-Schulz
    with trainer.autocast():
        assert torch.is_autocast_enabled(trainer.device.type) == native


def test_weight_decay_only_on_matrices(corpus, tmp_path):
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="wd"))
    opt = make_optimizer(trainer.model, trainer.cfg)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    for name, p in trainer.model.named_parameters():
        assert (id(p) in decayed) == (p.dim() >= 2), name


def test_run_folder_contents_and_metrics(corpus, tmp_path):
    cfg = tiny_config(corpus, tmp_path / "runs", name="r", sample_tokens=20)
    result = Trainer(cfg).train()
    run = tmp_path / "runs" / "r"
    for f in ("config.yaml", "metrics.jsonl", "config.json", "attnlab_model.safetensors", "tokenizer.json",
              "loss.png", "samples.txt"):
        assert (run / f).is_file(), f
    records = read_metrics(run)
    assert [r["step"] for r in records if "val_loss" not in r] == [5, 10, 15, 20]
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [10, 20]
    for r in records:  # one naming scheme: train_loss is the batches' mean, train_eval_loss the evaluation's
        loss = "train_eval_loss" if "val_loss" in r else "train_loss"
        assert {"step", loss, "lr", "tokens_per_s"} <= set(r) and "train" not in r
        assert math.isfinite(r[loss])
    assert result.val_loss == evals[-1]["val_loss"]
    assert evals[-1]["val_loss"] < math.log(cfg.model.vocab_size)  # it learned something
    assert len(result.sample) > 20


def test_runs_that_take_the_same_default_name_get_a_folder_each(corpus, tmp_path, monkeypatch):
    """Two runs started in the same second take one default name; each is set up before either trains (as two
    processes racing), and still each keeps its own folder, config, metrics and weights."""
    from attnlab.training import runs

    monkeypatch.setattr(runs, "default_run_name", lambda preset: "same-second")
    first = Trainer(tiny_config(corpus, tmp_path / "runs", seed=1))
    second = Trainer(tiny_config(corpus, tmp_path / "runs", seed=2))
    assert (first.run_dir.name, second.run_dir.name) == ("same-second", "same-second-2")
    a, b = first.train(), second.train()
    assert (a.run_dir, b.run_dir) == (first.run_dir, second.run_dir)
    for run, seed in ((a.run_dir, 1), (b.run_dir, 2)):
        assert [r["step"] for r in read_metrics(run) if "val_loss" not in r] == [5, 10, 15, 20]
        assert runs.load_run_config(run).seed == seed
    assert not torch.equal(_weights(a.run_dir)["lm_head.weight"], _weights(b.run_dir)["lm_head.weight"])


def test_a_new_folder_is_claimed_past_every_taken_one(tmp_path):
    from attnlab.training.runs import claim_new_folder

    (tmp_path / "r").mkdir()
    (tmp_path / "r-2").write_text("a file takes the name too")
    assert claim_new_folder(tmp_path / "r") == tmp_path / "r-3" and (tmp_path / "r-3").is_dir()
    assert claim_new_folder(tmp_path / "new" / "s") == tmp_path / "new" / "s"


def test_resume_after_crash_reproduces_the_uninterrupted_run(corpus, tmp_path):
    """Stop at step 10 (lose everything after it), resume: same losses, bit-identical weights."""
    extra = dict(max_iters=20, dropout=0.1, grad_accum=2, **EXACT)  # dropout: the RNG state must resume too
    Trainer(tiny_config(corpus, tmp_path / "runs", name="full", **extra)).train()
    Trainer(tiny_config(corpus, tmp_path / "runs", name="cut", **extra)).train()
    cut = tmp_path / "runs" / "cut"
    import shutil

    shutil.rmtree(cut / "checkpoints" / "step-0000020")  # as if the run died after step 10
    resumed = Trainer(tiny_config(corpus, tmp_path / "runs", name="cut", resume=True, **extra))
    assert resumed.step == 10
    resumed.train()
    assert _losses(cut) == _losses(tmp_path / "runs" / "full")
    a, b = _weights(cut), _weights(tmp_path / "runs" / "full")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_interrupt_saves_checkpoint_and_resume_is_exact(corpus, tmp_path, monkeypatch):
    Trainer(tiny_config(corpus, tmp_path / "runs", name="full")).train()
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="int"))
    real_step, calls = trainer.optimizer.step, []

    def step_then_interrupt(*a, **k):
        calls.append(1)
        if len(calls) == 12:  # Ctrl-C arrives during step 12: the step finishes, then it stops
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(*a, **k)

    monkeypatch.setattr(trainer.optimizer, "step", step_then_interrupt)
    with pytest.raises(TrainingInterrupted) as e:
        trainer.train()
    assert e.value.step == 12
    assert list_checkpoints(tmp_path / "runs" / "int")[-1].name == "step-0000012"
    Trainer(tiny_config(corpus, tmp_path / "runs", name="int", resume=True)).train()
    a, b = _weights(tmp_path / "runs" / "int"), _weights(tmp_path / "runs" / "full")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(tmp_path / "runs" / "int") == _losses(tmp_path / "runs" / "full")


def test_checkpoints_are_pruned_and_verified(corpus, tmp_path):
    cfg = tiny_config(corpus, tmp_path / "runs", name="k", max_iters=30, keep_checkpoints=2)
    Trainer(cfg).train()
    run = tmp_path / "runs" / "k"
    assert [p.name for p in list_checkpoints(run)] == ["step-0000020", "step-0000030"]
    state = load_trainer_state(list_checkpoints(run)[-1])
    assert state["step"] == 30 and "optimizer" in state
    # corrupt the newest: the previous one is used instead
    weights = list_checkpoints(run)[-1] / "attnlab_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert latest_checkpoint(run).name == "step-0000020"
    manifest = json.loads((list_checkpoints(run)[0] / "manifest.json").read_text())
    assert manifest["step"] == 20 and "attnlab_model.safetensors" in manifest["files"]


def test_an_out_dir_that_cannot_be_written_is_refused_before_the_data(tmp_path):
    (tmp_path / "a-file").write_text("x")
    missing = tmp_path / "no-such-corpus.txt"  # the data would fail next: the folder is checked first
    with pytest.raises(ConfigError, match="cannot write in out_dir"):
        Trainer(tiny_config(missing, tmp_path / "a-file" / "runs", name="x"))
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        Trainer(tiny_config(missing, tmp_path, name="a-file"))


def test_more_threads_than_cores_is_refused_before_the_data(tmp_path):
    from attnlab.core.runtime import usable_cores

    before = torch.get_num_threads()
    missing = tmp_path / "no-such-corpus.txt"  # the data would fail next: the thread count is checked first
    with pytest.raises(ConfigError, match=f"'threads' is {usable_cores() + 1}, more than the {usable_cores()} CPU"):
        Trainer(tiny_config(missing, tmp_path / "runs", name="x", threads=usable_cores() + 1))
    assert torch.get_num_threads() == before and not (tmp_path / "runs").exists()


def test_existing_run_needs_resume_and_resume_needs_a_checkpoint(corpus, tmp_path):
    Trainer(tiny_config(corpus, tmp_path / "runs", name="x", max_iters=10)).train()
    with pytest.raises(ConfigError, match="already holds a run"):
        Trainer(tiny_config(corpus, tmp_path / "runs", name="x"))
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        Trainer(tiny_config(corpus, tmp_path / "runs", name="fresh", resume=True))


def test_bf16_autocast_and_bpe_tokenizer_train(corpus, tmp_path):
    # mfu=false: measuring the bf16 matmul peak takes minutes on a CPU without bf16 units (AVX2)
    cfg = tiny_config(corpus, tmp_path / "runs", name="bf", dtype="bfloat16", tokenizer="bpe",
                      bpe_vocab_size=300, max_iters=10, mfu=False)
    trainer = Trainer(cfg)
    dtypes: list[torch.dtype] = []
    trainer.model.lm_head.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    result = trainer.train()
    # the model's vocabulary is the trained BPE's: 256 byte symbols + the end-of-text token + merges
    assert 257 < cfg.model.vocab_size == trainer.tokenizer.vocab_size <= 300
    assert dtypes[: cfg.max_iters] == [torch.bfloat16] * cfg.max_iters  # every training forward under autocast
    assert math.isfinite(result.val_loss) and result.val_loss < math.log(cfg.model.vocab_size)


def test_gradient_accumulation_matches_a_bigger_batch(corpus, tmp_path):
    """One step of the Trainer's loop (training.loop.train_step) on A=2 micro-batches of 4 rows equals
    one step on the batch of 8 rows (same data, no dropout): same loss, gradient norm and update. On the CPU:
    a GPU sums in another order, and Adam turns those last-bit differences of near-zero gradients into
    differences of a whole step for those weights (seen on an H100), which says nothing about accumulation."""
    big = Trainer(tiny_config(corpus, tmp_path / "runs", name="big", batch_size=8, grad_clip=0.5, device="cpu"))
    acc = Trainer(tiny_config(corpus, tmp_path / "runs", name="acc", batch_size=4, grad_accum=2, grad_clip=0.5,
                              device="cpu"))
    acc.model.load_state_dict(big.model.state_dict())
    gen = torch.Generator().manual_seed(0)
    x, y = (t.to(big.device) for t in acc.task.data.get_batch("train", 8, 16, gen))
    one = train_step(big.model, big.optimizer, [dict(idx=x, targets=y)], lr=1e-2, grad_clip=0.5)
    halves = [dict(idx=x[4 * i : 4 * i + 4], targets=y[4 * i : 4 * i + 4]) for i in range(2)]
    two = train_step(acc.model, acc.optimizer, iter(halves), accum=2, lr=1e-2, grad_clip=0.5)
    assert one.applied and two.applied
    torch.testing.assert_close(two.loss, one.loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(two.grad_norm, one.grad_norm, rtol=1e-4, atol=0)
    assert one.grad_norm > 0.5  # the clip was active, so the clipped gradients were compared too
    for (n, p), q in zip(big.model.named_parameters(), acc.model.parameters(), strict=True):
        assert p.grad is None and q.grad is None  # the step leaves no gradients behind
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=n)
    fresh = Trainer(tiny_config(corpus, tmp_path / "runs", name="fresh", batch_size=8, device="cpu")).model
    moved = max((p - q).abs().max().item() for p, q in zip(big.model.parameters(), fresh.parameters(), strict=True))
    assert moved > 1e-3  # and the update was a real one


def test_device_option_is_resolved_or_refused_in_one_line(corpus, tmp_path, monkeypatch):
    from attnlab.training.distributed import resolve_device

    with pytest.raises(ConfigError, match="'device' must be"):
        tiny_config(corpus, tmp_path / "runs", name="x", device="gpu")
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        resolve_device("cuda")
    # a node with one GPU: auto/cuda = this process's GPU; more processes than GPUs are refused
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert resolve_device("auto") == torch.device("cuda:0") == resolve_device("cuda")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="2 processes on this node but it has 1 GPU"):
        resolve_device("auto")
    with pytest.raises(ConfigError, match="would put every process of this node on one GPU"):
        resolve_device("cuda:0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="cuda:3 does not exist"):
        resolve_device("cuda:3")


def test_deterministic_run_saves_every_random_state(corpus, tmp_path):
    """deterministic=true switches torch to deterministic kernels; the checkpoint holds the CPU, batch and
    (on a GPU) CUDA generator states of every process, so a resumed GPU run draws the same dropout masks."""
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="det", deterministic=True, max_iters=10))
    assert torch.are_deterministic_algorithms_enabled()  # conftest switches it off again after the test
    trainer.train()
    state = load_trainer_state(latest_checkpoint(tmp_path / "runs" / "det"))
    assert len(state["cuda_rng_per_rank"]) == 1
    assert (state["cuda_rng_per_rank"][0] is None) == (trainer.device.type == "cpu")


def test_fit_stops_where_the_step_callback_returns_true():
    from attnlab.training.loop import fit

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    def after(step, _result):
        seen.append(step)
        return True if step == 3 else None  # anything but True (None, a value) goes on

    result = fit(model, opt, lambda step: torch.ones(4, 2), lambda x: model(x).pow(2).mean(), 10, after_step=after)
    assert seen == [0, 1, 2, 3] and len(result.losses) == 4


def test_compile_true_trains_as_the_eager_model_does(corpus, tmp_path, monkeypatch):
    """compile=true puts the forward under torch.compile (and, through AOTAutograd, the backward): the same run's
    losses and final weights agree with the eager run's, and the saved model is the plain one. Traced here with
    the aot_eager backend (the graphs, not inductor's C++ build of each: tests/cpu/test_compiled.py trains a GPT
    through inductor's graphs against eager)."""
    import attnlab.training.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "compile_forward", lambda net, device: torch.compile(net, backend="aot_eager"))
    runs = {c: Trainer(tiny_config(corpus, tmp_path / "runs", name=f"compile-{c}", compile=c, max_iters=6,
                                   log_interval=1, device="cpu")) for c in (False, True)}
    assert hasattr(runs[True].forward, "_orig_mod") and not hasattr(runs[False].forward, "_orig_mod")
    done = {c: t.train() for c, t in runs.items()}
    eager, compiled = (_losses(done[c].run_dir) for c in (False, True))
    assert len(eager) == len(compiled) >= 6
    for (s0, a0, v0), (s1, a1, v1) in zip(eager, compiled, strict=True):
        assert s0 == s1 and a0 == pytest.approx(a1, rel=1e-4) and (v0 is None) == (v1 is None)
        assert v0 is None or v0 == pytest.approx(v1, rel=1e-4)
    for (n, p), q in zip(_weights(done[False].run_dir).items(), _weights(done[True].run_dir).values(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-5, msg=n)


def test_a_second_writer_of_a_named_run_is_refused_while_the_first_lives(corpus, tmp_path, capsys):
    """Two `train name=same` at once once both exited 0 into one folder (steps logged twice, one model
    overwritten): the run folder's lock refuses the second, in one line naming the holder, before any work."""
    import os

    from attnlab.cli import main

    first = Trainer(tiny_config(corpus, tmp_path / "runs", name="same", max_iters=2))
    overrides = tiny_overrides(corpus, tmp_path / "runs", name="same", max_iters=2)
    assert main(["train", "configs/shakespeare-char.yaml", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"being written by process {os.getpid()}" in err, err
    first.train()
    assert main(["resume", str(tmp_path / "runs" / "same")]) == 0  # train() released it
