"""batch_threads (training/threaded.py): each batch split into parts whose passes run at once on CPU threads."""

import threading

import pytest
import torch
from torch import nn

from attnlab.cli import main
from attnlab.core.errors import ConfigError
from attnlab.training import threaded
from attnlab.training.loop import train_step
from attnlab.training.parts_step import PartsStep
from attnlab.training.runs import load_train_config, read_metrics
from attnlab.training.trainer import Trainer
from tests.helpers import tiny_config, tiny_overrides, write_corpus


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.txt")


def _pair(corpus, tmp_path, **extra):
    """Two trainers with the same weights: one plain, one with batch_threads=2."""
    one = Trainer(tiny_config(corpus, tmp_path / "runs", name="one", device="cpu", **extra))
    two = Trainer(tiny_config(corpus, tmp_path / "runs", name="two", device="cpu", batch_threads=2, threads=2,
                              **extra))
    two.model.load_state_dict(one.model.state_dict())
    return one, two


def test_two_parts_step_as_the_whole_batch_does(corpus, tmp_path):
    """One step on 2 parts of 4 rows equals one step on the batch of 8 (an LM loss: the mean over equal parts),
    with micro-batches too: same loss, gradient norm (the clip active) and update. SGD, whose update is the
    clipped gradient itself: Adam would turn last-bit differences of near-zero gradients (the parts are summed in
    another order than one backward pass sums the rows) into differences of a whole step for those weights."""
    one, two = _pair(corpus, tmp_path, batch_size=8, grad_clip=0.5)
    gen = torch.Generator().manual_seed(0)
    batches = [dict(zip(("idx", "targets"), one.task.data.get_batch("train", 8, 16, gen))) for _ in range(2)]
    a = train_step(one.model, torch.optim.SGD(one.model.parameters(), 1.0), batches, lr=1e-1, grad_clip=0.5)
    b = PartsStep(2)(two.model, torch.optim.SGD(two.model.parameters(), 1.0), batches, lr=1e-1, grad_clip=0.5)
    assert a.applied and b.applied and a.grad_norm > 0.5
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(b.objective, a.objective, rtol=1e-5, atol=0)
    torch.testing.assert_close(b.grad_norm, a.grad_norm, rtol=1e-4, atol=0)
    fresh = Trainer(tiny_config(corpus, tmp_path / "runs", name="fresh", device="cpu", batch_size=8)).model
    for (n, p), q in zip(one.model.named_parameters(), two.model.parameters(), strict=True):
        assert p.grad is None and q.grad is None  # the step leaves no gradients behind
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7, msg=n)
    assert max((p - r).abs().max().item() for p, r in zip(two.model.parameters(), fresh.parameters())) > 1e-3


def test_the_parts_run_at_once_on_threads_of_one_intra_op_thread_each():
    seen = []
    barrier = threading.Barrier(2, timeout=30)  # both parts must be inside the forward pass at the same time
    model = nn.Linear(3, 1)

    def forward(batch):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        barrier.wait()
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    before = torch.get_num_threads()
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    outs = threaded.part_gradients(forward, {"x": x, "y": y}, list(model.parameters()), 2, 0.5)
    assert len(outs) == 2 and len({ident for ident, _ in seen}) == 2 and {n for _, n in seen} == {1}
    assert torch.get_num_threads() == before
    whole = torch.autograd.grad(((model(x) - y) ** 2).mean(), list(model.parameters()))
    for p, g in zip(model.parameters(), whole):
        torch.testing.assert_close(p.grad, g)


def test_the_whole_step_runs_at_one_intra_op_thread_and_the_count_comes_back():
    """Clipping and the update run at one intra-op thread too (step_threads): a caller left at 2 threads kept an
    OpenMP worker spinning on the core part 1 needed (36-39 against 30-33 ms per step on nanoGPT's model)."""
    model = nn.Linear(3, 1)
    seen = {}

    class Recording(torch.optim.SGD):
        def step(self, closure=None):
            seen["update"] = torch.get_num_threads()
            return super().step(closure)

    def forward(batch):
        seen.setdefault("parts", set()).add(torch.get_num_threads())
        return model(batch["x"]).sum()

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        PartsStep(2)(model, Recording(model.parameters(), 0.1), [{"x": torch.randn(4, 3)}], forward, grad_clip=1.0)
        assert seen == {"parts": {1}, "update": 1}
        assert torch.get_num_threads() == 2
        train_step(model, Recording(model.parameters(), 0.1), [{"x": torch.randn(4, 3)}], forward)
        assert seen["update"] == 2  # without parts the step keeps the caller's threads
    finally:
        torch.set_num_threads(before)


def test_a_failing_part_fails_the_step_and_restores_the_thread_count():
    model = nn.Linear(3, 1)

    def forward(batch):
        if batch["x"][0, 0] > 100:
            raise RuntimeError("part 1 broke")
        return model(batch["x"]).sum()

    before = torch.get_num_threads()
    x = torch.zeros(4, 3)
    x[2:] = 1000.0
    with pytest.raises(RuntimeError, match="part 1 broke"):
        threaded.part_gradients(forward, {"x": x}, list(model.parameters()), 2, 0.5)
    assert torch.get_num_threads() == before


def test_a_parameter_no_part_reached_keeps_no_gradient():
    used, unused = nn.Linear(3, 1), nn.Linear(3, 1)
    params = [*used.parameters(), *unused.parameters()]
    threaded.part_gradients(lambda b: used(b["x"]).sum(), {"x": torch.randn(4, 3)}, params, 2, 1.0)
    assert all(p.grad is not None for p in used.parameters()) and all(p.grad is None for p in unused.parameters())


def test_split_batch_splits_rows_and_shares_the_rest():
    parts = threaded.split_batch({"x": torch.arange(6).view(6, 1), "n": torch.tensor(3), "tag": "a"}, 3)
    assert [p["x"].flatten().tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert all(p["n"].item() == 3 and p["tag"] == "a" for p in parts)
    with pytest.raises(ValueError, match="does not split into 4 equal parts"):
        threaded.split_batch({"x": torch.zeros(6, 1)}, 4)
    with pytest.raises(ValueError, match="does not split"):
        threaded.split_batch({"x": torch.zeros(6, 1), "y": torch.zeros(4)}, 2)


def test_a_threaded_run_resumes_bit_for_bit(corpus, tmp_path):
    """Stop after step 10, resume: the same losses and bit-identical weights as the uninterrupted run, so the
    parts' sum does not depend on which thread finishes first."""
    extra = dict(max_iters=20, batch_threads=2, threads=2, device="cpu")
    Trainer(tiny_config(corpus, tmp_path / "runs", name="full", **extra)).train()
    Trainer(tiny_config(corpus, tmp_path / "runs", name="cut", **extra)).train()
    import shutil

    shutil.rmtree(tmp_path / "runs" / "cut" / "checkpoints" / "step-0000020")
    resumed = Trainer(tiny_config(corpus, tmp_path / "runs", name="cut", resume=True, **extra))
    assert resumed.step == 10
    resumed.train()
    full, cut = (Trainer(tiny_config(corpus, tmp_path / "runs", name=n, resume=True, **extra)) for n in ("full", "cut"))
    assert [r.get("train_loss") for r in read_metrics(cut.run_dir)] == [
        r.get("train_loss") for r in read_metrics(full.run_dir)]
    assert all(torch.equal(a, b) for a, b in zip(full.model.state_dict().values(), cut.model.state_dict().values()))


@pytest.mark.parametrize("extra, said", [
    (dict(batch_threads=0), "'batch_threads' must be >= 1"),
    (dict(batch_threads=3), "must split into batch_threads=3 equal parts"),
    (dict(batch_threads=2, threads=1), "batch_threads=2 needs as many intra-op threads; the run has 1: set threads=2"),
    (dict(batch_threads=2, threads=2, dropout=0.1), "draws random numbers in its forward pass"),
])
def test_what_cannot_run_or_repeat_is_refused_before_training(corpus, tmp_path, extra, said):
    with pytest.raises(ConfigError, match=said):
        Trainer(tiny_config(corpus, tmp_path / "runs", name="x", device="cpu", **extra)).train()
    assert not (tmp_path / "runs" / "x" / "checkpoints").exists()
    if "dropout" in extra:  # the probe's forward pass left torch's generator where the trainer had seeded it
        after = torch.random.get_rng_state()
        torch.manual_seed(1337)
        assert torch.equal(after, torch.random.get_rng_state())


def test_more_parts_than_cores_is_refused_with_the_most_that_can_run(monkeypatch):
    """batch_threads=3 on 2 cores used to advise threads=3, which the run then refuses as more than the cores."""
    import attnlab.core.runtime as runtime

    monkeypatch.setattr(runtime, "usable_cores", lambda: 2)
    with pytest.raises(ConfigError, match=r"batch_threads=4 is more than the 2 CPU cores .*at most batch_threads=2"):
        threaded.check(4, torch.device("cpu"), 1, nn.Linear(3, 1), lambda: {"input": torch.zeros(2, 3)})


def test_a_gpu_or_several_processes_are_refused():
    model = nn.Linear(3, 1)
    with pytest.raises(ConfigError, match="on cuda the kernels are parallel already"):
        threaded.check(2, torch.device("cuda"), 1, model, lambda: {"input": torch.zeros(2, 3)})
    with pytest.raises(ConfigError, match="with 2 processes"):
        threaded.check(2, torch.device("cpu"), 2, model, lambda: {"input": torch.zeros(2, 3)})


def test_the_side_effect_probe_finds_random_draws_and_buffer_writes_and_undoes_them():
    probe = lambda: {"input": torch.randn(4, 3)}  # noqa: E731
    dropping, norm, plain = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)), nn.BatchNorm1d(3).eval(), nn.Linear(3, 3)
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    assert "draws random numbers" in threaded.side_effect(dropping, probe)
    assert torch.equal(torch.random.get_rng_state(), state)
    said = threaded.side_effect(norm, probe)
    assert "buffers in its forward pass (running_mean, running_var, num_batches_tracked" in said
    assert torch.equal(norm.running_mean, torch.zeros(3)) and int(norm.num_batches_tracked) == 0
    assert not norm.training and torch.equal(torch.random.get_rng_state(), state)
    assert threaded.side_effect(plain, probe) is None


def test_a_batch_norm_cnn_is_refused_and_a_group_norm_one_trains(tmp_path):
    """Batch norm's running statistics would be updated by both threads at once."""
    out = tmp_path / "runs"
    common = ["out_dir=" + str(out), "max_iters=2", "eval_interval=2", "eval_iters=1", "progress=false",
              "batch_threads=2", "threads=2", "mfu=false", "sample_tokens=0"]
    with pytest.raises(ConfigError, match="writes to its buffers"):
        Trainer(load_train_config("cnn-digits", [*common, "name=bn"]))
    Trainer(load_train_config("cnn-digits", [*common, "name=gn", "model.cnn_norm=group"])).train()
    assert (out / "gn" / "metrics.jsonl").exists()


def test_the_cli_refuses_a_batch_that_does_not_split_in_one_line(corpus, tmp_path, capsys):
    args = tiny_overrides(corpus, tmp_path / "runs", batch_size=5, batch_threads=2)
    assert main(["train", "shakespeare-char", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "batch_threads=2" in err[0]
    assert not (tmp_path / "runs").exists()


def test_the_parts_are_summed_in_their_order_whichever_finishes_first():
    """Four parts finishing last to first: the gradient is ((g0 + g1) + g2) + g3 bit for bit, the sum a serial
    loop over the parts makes (with three or more terms another order would round differently)."""
    import time

    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    x = torch.randn(8, 16) * torch.logspace(-3, 3, 8).view(8, 1)  # rows of very different sizes: order matters

    def forward(batch):
        time.sleep(0.05 * (3 - int(batch["i"][0])))  # part 3 finishes first, part 0 last
        return model(batch["x"]).pow(2).sum()

    params = list(model.parameters())
    threaded.part_gradients(forward, {"x": x, "i": torch.arange(4).repeat_interleave(2)}, params, 4, 1.0)
    parts = [torch.autograd.grad(model(x[2 * i:2 * i + 2]).pow(2).sum(), params) for i in range(4)]
    serial, reverse = list(parts[0]), list(parts[3])
    for i in range(1, 4):
        serial = [s + t for s, t in zip(serial, parts[i])]
        reverse = [s + t for s, t in zip(reverse, parts[3 - i])]
    assert not all(torch.equal(a, b) for a, b in zip(serial, reverse))  # the order shows in the last bits
    assert all(torch.equal(p.grad, s) for p, s in zip(params, serial))


def test_every_part_runs_under_the_steps_autocast():
    """autocast is a per-thread setting: each part's thread must enter it, not only the caller's."""
    model, seen = nn.Linear(4, 4), []

    def forward(batch):
        seen.append(torch.is_autocast_enabled("cpu"))
        return model(batch["x"]).float().sum()

    threaded.part_gradients(forward, {"x": torch.randn(4, 4)}, list(model.parameters()), 2, 1.0,
                            lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert seen == [True, True]
