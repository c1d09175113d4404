"""The step's end inside the parts' threads (attnlab/cpu/step.py's PartsEnd, end_part_ in cpu/step.cpp), as
``PartsStep(parts)`` takes it: the same numbers as the end on one thread after the parts (``end="serial"``), bit for
bit; nothing changed where it declines; no thread left waiting when a part fails."""

import copy
import threading

import pytest
import torch
from torch import nn

from attnlab.cpu import step as cpu_step
from attnlab.training.parts_step import PartsStep


def _model(extra=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 40), nn.GELU(), nn.Linear(40, 3))
    if extra:  # a parameter no forward pass reaches: no gradient
        model.register_parameter("unused", nn.Parameter(torch.ones(5)))
    return model


def _optimizer(model):
    """Two groups as make_optimizer builds them, each with its own weight decay."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}],
                             lr=1e-2, betas=(0.9, 0.99), fused=True)


def _batch(step, rows=8):
    gen = torch.Generator().manual_seed(10 + step)
    return {"x": torch.randn(rows, 6, generator=gen), "y": torch.randint(3, (rows,), generator=gen)}


def _forward(model, scale=1.0):
    return lambda b: nn.functional.cross_entropy(model(b["x"]), b["y"]) * scale


@pytest.fixture
def spy(monkeypatch):
    """How many steps took the end inside the parts (PartsEnd applied) and how many declined it."""
    seen = {"applied": 0, "declined": 0}
    grad_norm, undo = cpu_step.PartsEnd.grad_norm, cpu_step.PartsEnd.undo

    def counted_norm(self):
        seen["applied"] += 1
        return grad_norm(self)

    def counted_undo(self):
        seen["declined"] += not self.applied
        return undo(self)

    monkeypatch.setattr(cpu_step.PartsEnd, "grad_norm", counted_norm)
    monkeypatch.setattr(cpu_step.PartsEnd, "undo", counted_undo)
    return seen


def _same(models, opts):
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(p, q)
        assert p.grad is None and q.grad is None
    a, b = opts[0].state_dict(), opts[1].state_dict()
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for i, state in a["state"].items():
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state[k], b["state"][i][k]), (i, k)


@pytest.mark.parametrize("parts", [2, 4])
def test_the_end_inside_the_parts_is_the_serial_end_bit_for_bit(spy, parts):
    """Steps with clipping on and off and the learning rate changing: weights, moments, step counters and norms as
    the end on one thread after the parts (end="serial": cpu_step.AdamWEnd) leaves them, to the bit."""
    models = [_model(), _model()]
    opts = [_optimizer(m) for m in models]
    for step in range(6):
        clip = 0.05 if step % 2 else 10.0
        lr = 1e-2 * (1 + step)
        a = PartsStep(parts)(models[0], opts[0], [_batch(step)], _forward(models[0]), lr=lr, grad_clip=clip)
        b = PartsStep(parts, end="serial")(models[1], opts[1], [_batch(step)], _forward(models[1]), lr=lr,
                                           grad_clip=clip)
        assert a.applied and b.applied
        assert torch.equal(a.grad_norm, b.grad_norm) and a.grad_norm.dtype == torch.float32
        assert torch.equal(a.loss, b.loss)
    assert spy == {"applied": 6, "declined": 0}
    _same(models, opts)
    assert all(s["step"].item() == 6 for s in opts[0].state.values())


def test_without_clipping(spy):
    models = [_model(), _model()]
    opts = [_optimizer(m) for m in models]
    for step in range(3):
        PartsStep(2)(models[0], opts[0], [_batch(step)], _forward(models[0]))
        PartsStep(2, end="serial")(models[1], opts[1], [_batch(step)], _forward(models[1]))
    assert spy["applied"] == 3
    _same(models, opts)


def test_a_non_finite_step_changes_nothing_and_leaves_no_state(spy):
    model = _model()
    before = copy.deepcopy(model.state_dict())
    opt = _optimizer(model)
    out = PartsStep(2)(model, opt, [_batch(0)], _forward(model, float("inf")), grad_clip=1.0)
    assert not out.applied and spy["applied"] == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not opt.state and all(p.grad is None for p in model.parameters())
    out = PartsStep(2)(model, opt, [_batch(1)], _forward(model), grad_clip=1.0)  # then a finite one
    assert out.applied and all(s["step"].item() == 1 for s in opt.state.values())


def test_a_missing_gradient_declines_and_the_serial_path_runs(spy):
    """A parameter without a gradient: the end declines, changing nothing, and torch's path (which skips that
    parameter and makes no state for it) runs instead, as with end="serial"."""
    models = [_model(extra=True), _model(extra=True)]
    opts = [_optimizer(m) for m in models]
    for step in range(2):
        assert PartsStep(2)(models[0], opts[0], [_batch(step)], _forward(models[0]), grad_clip=1.0).applied
        PartsStep(2, end="serial")(models[1], opts[1], [_batch(step)], _forward(models[1]), grad_clip=1.0)
    assert spy == {"applied": 0, "declined": 2}
    assert models[0].unused not in opts[0].state
    _same(models, opts)


def test_micro_batches_and_gradients_already_there_take_the_serial_end(spy):
    model = _model()
    opt = _optimizer(model)
    PartsStep(2)(model, opt, [_batch(0), _batch(1)], _forward(model))  # accumulation: two micro-batches
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    assert cpu_step.plan_parts(opt, list(model.parameters()), 2, 1.0) is None
    assert spy == {"applied": 0, "declined": 0}


@pytest.mark.parametrize("failing", ["part 0 (the caller's thread)", "part 1 (a pool thread)"])
def test_a_part_that_fails_leaves_no_thread_waiting(failing):
    """The error reaches the caller and nothing is left waiting at the end's barrier (the step runs in a thread
    of its own here, so that a hang fails the test instead of the suite)."""
    model = _model()
    opt = _optimizer(model)
    before = copy.deepcopy(model.state_dict())
    fail_in_caller = failing.startswith("part 0")

    def forward(b):
        if (threading.current_thread() is runner) == fail_in_caller:
            raise RuntimeError("this part failed")
        return _forward(model)(b)

    errors = []
    runner = threading.Thread(target=lambda: _step_catching(model, opt, forward, errors), daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive(), "a thread was left waiting"
    assert len(errors) == 1 and "this part failed" in str(errors[0])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and not opt.state
    # and the next step runs normally
    assert PartsStep(2)(model, opt, [_batch(1)], _forward(model), grad_clip=1.0).applied


def _step_catching(model, opt, forward, errors):
    torch.set_num_threads(2)
    try:
        PartsStep(2)(model, opt, [_batch(0)], forward, grad_clip=1.0)
    except RuntimeError as e:
        errors.append(e)


def test_end_part_declines_together_and_abort_releases_the_waiting():
    """The op itself: one part's gradients of another size make every part return False with nothing changed;
    abort_ releases a part waiting for one that will not come."""
    kernel = cpu_step.ops()
    params = [torch.ones(20), torch.ones(3, 4)]
    state = ([torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params],
             [torch.zeros(()) for _ in params], [1e-2] * 2, [0.9] * 2, [0.99] * 2, [0.0] * 2, [1e-8] * 2, 1.0)
    sync = torch.zeros(5 + 2 + 2 + 4, dtype=torch.int64)
    results = {}

    def part(p, grads):
        results[p] = kernel.end_part_(sync, p, 2, params, grads, *state, 0.5)

    grads = [[torch.ones(20), torch.ones(3, 4)], [torch.ones(20), torch.ones(13)]]  # part 1's second: 13 elements
    threads = [threading.Thread(target=part, args=(p, g), daemon=True) for p, g in enumerate(grads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == {0: False, 1: False}
    assert all(torch.equal(p, torch.ones_like(p)) for p in params) and all(s.item() == 0 for s in state[2])

    sync.zero_()
    waiting = threading.Thread(target=part, args=(0, grads[0]), daemon=True)
    waiting.start()
    waiting.join(timeout=0.2)
    assert waiting.is_alive()  # part 1 never comes
    kernel.abort_(sync)
    waiting.join(timeout=30)
    assert not waiting.is_alive() and results[0] is False
    with pytest.raises(RuntimeError, match="sync must be a zeroed int64 tensor"):
        kernel.end_part_(torch.zeros(3, dtype=torch.int64), 0, 2, params, grads[0], *state, 0.5)


def test_the_trainer_ends_its_steps_inside_the_parts(tmp_path, spy):
    """A run with batch_threads=2 (one process, one micro-batch a step) takes the end inside the parts."""
    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config, write_corpus

    corpus = write_corpus(tmp_path / "corpus.txt")
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="two", device="cpu", batch_threads=2, threads=2,
                                  max_iters=3))
    trainer.train()
    assert spy == {"applied": 3, "declined": 0}
