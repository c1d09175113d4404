"""The step's end in C++ (attnlab/cpu/step.py): the parts' gradient sum, its norm and AdamW with the clipping
folded in, against torch's foreach sum, clip_grad_norm_ and torch.optim.AdamW; the batch-parts step
(training/parts_step.py) taking it, and torch's end where it does not apply."""

import pytest
import torch
from torch import nn

from attnlab.cpu import step as cpu_step
from attnlab.training.parts_step import PartsStep

SHAPES = [(65, 24), (24,), (40, 24), (7,), (3, 5, 2)]  # sizes that are and are not multiples of 16


def _params(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(0.1 * torch.randn(s, generator=gen, dtype=dtype)) for s in SHAPES]


def _adamw(params, **kw):
    """Two groups as make_optimizer builds them: weight decay on matrices only."""
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=1e-3, betas=(0.9, 0.99), fused=True, **kw)


def _grads(step, scale=1.0):
    gen = torch.Generator().manual_seed(100 + step)
    return [scale * torch.randn(s, generator=gen) for s in SHAPES]


def test_ten_steps_agree_with_torch_adamw_clipping_included():
    """Clipping active on some steps and not on others, the learning rate changed between steps (a schedule):
    weights, moments and step counters as torch.optim.AdamW's after clip_grad_norm_, to float32 rounding."""
    ref, ours = _params(), _params()
    opt_ref, opt_ours = _adamw(ref), _adamw(ours)
    for step in range(10):
        grads = _grads(step, scale=0.05 if step % 3 else 3.0)
        for group in opt_ref.param_groups + opt_ours.param_groups:
            group["lr"] = 1e-3 * (1 + step)
        for p, g in zip(ref, grads):
            p.grad = g.clone()
        for p, g in zip(ours, grads):
            p.grad = g.clone()
        norm_ref = nn.utils.clip_grad_norm_(ref, 1.0)
        opt_ref.step()
        end = cpu_step.plan(opt_ours, ours)
        assert end is not None
        norm = end.grad_norm()
        torch.testing.assert_close(norm, norm_ref, rtol=1e-6, atol=0)
        end.step(cpu_step.clip_factor(float(norm), 1.0))
        end.zero_grad()
        assert all(p.grad is None for p in ours)
    for a, b, start in zip(ref, ours, _params()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
        assert (b - start).abs().max() > 1e-3  # the weights moved
    ref_state, our_state = opt_ref.state_dict(), opt_ours.state_dict()
    assert ref_state["param_groups"] == our_state["param_groups"]
    for i, s in ref_state["state"].items():
        assert our_state["state"][i].keys() == s.keys()
        assert our_state["state"][i]["step"].item() == s["step"].item() == 10
        assert our_state["state"][i]["step"].dtype == s["step"].dtype
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(our_state["state"][i][k], s[k], rtol=1e-5, atol=1e-9)


def test_a_checkpoint_moves_either_way_between_the_kernel_and_torch():
    """The state is AdamW's own: 3 steps in C++, then torch continues from its state dict, and the other way
    round, land where 6 torch steps land."""
    params = [_params() for _ in range(3)]
    opts = [_adamw(p) for p in params]

    def torch_step(ps, opt, step):
        for p, g in zip(ps, _grads(step)):
            p.grad = g
        opt.step()
        opt.zero_grad()

    def our_step(ps, opt, step):
        for p, g in zip(ps, _grads(step)):
            p.grad = g
        end = cpu_step.plan(opt, ps)
        end.step(1.0)
        end.zero_grad()

    for step in range(6):
        torch_step(params[0], opts[0], step)
        (our_step if step < 3 else torch_step)(params[1], opts[1], step)
        (torch_step if step < 3 else our_step)(params[2], opts[2], step)
        if step == 2:  # through a state dict, as a resumed run gets it
            for i in (1, 2):
                fresh = _adamw(params[i])
                fresh.load_state_dict(opts[i].state_dict())
                opts[i] = fresh
    for other in params[1:]:
        for a, b in zip(params[0], other):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_the_sum_is_torchs_bit_for_bit():
    dst, src = _grads(0), _grads(1)
    expected = [d.clone() for d in dst]
    torch._foreach_add_(expected, src)
    assert cpu_step.add_into(dst, src)
    assert all(torch.equal(a, b) for a, b in zip(dst, expected))
    assert not cpu_step.add_into([torch.zeros(4, dtype=torch.float64)], [torch.zeros(4, dtype=torch.float64)])
    assert not cpu_step.add_into([torch.zeros(4, 4).t()], [torch.zeros(4, 4)])  # not contiguous
    assert not cpu_step.add_into([torch.zeros(4)], [torch.zeros(5)])


def test_clip_factor():
    assert cpu_step.clip_factor(10.0, None) == cpu_step.clip_factor(10.0, 0.0) == 1.0  # no clipping
    assert cpu_step.clip_factor(0.5, 1.0) == 1.0
    assert cpu_step.clip_factor(4.0, 1.0) == pytest.approx(1 / (4.0 + 1e-6), rel=1e-12)


def _refused(optimizer_or_change):
    params = _params()
    for p, g in zip(params, _grads(0)):
        p.grad = g
    opt = _adamw(params)
    opt = optimizer_or_change(params, opt) or opt
    return cpu_step.plan(opt, params) is None


@pytest.mark.parametrize("change", [
    lambda ps, opt: torch.optim.SGD(ps, 0.1),
    lambda ps, opt: torch.optim.Adam(ps, 0.1),
    lambda ps, opt: torch.optim.AdamW(ps, 0.1, amsgrad=True),
    lambda ps, opt: torch.optim.AdamW(ps, 0.1, maximize=True),
    lambda ps, opt: setattr(ps[2], "grad", None),
    lambda ps, opt: setattr(ps[0], "grad", torch.randn(24, 65).t()),  # a gradient of another layout
    lambda ps, opt: opt.register_step_pre_hook(lambda *a: None) and None,
    lambda ps, opt: torch.optim.AdamW(ps[:-1], 0.1),  # not every trained parameter
], ids=["sgd", "adam", "amsgrad", "maximize", "a-gradient-missing", "strided-gradient", "step-hook",
        "other-parameters"])
def test_what_keeps_torchs_path(change):
    assert not _refused(lambda ps, opt: None)
    assert _refused(change)


def test_float64_keeps_torchs_path():
    params = _params(dtype=torch.float64)
    for p in params:
        p.grad = torch.ones_like(p)
    assert cpu_step.plan(_adamw(params), params) is None
    assert not _refused(lambda ps, opt: None)


def _tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.GELU(), nn.Linear(32, 3))


def _batches():
    gen = torch.Generator().manual_seed(1)
    return [{"x": torch.randn(8, 6, generator=gen), "y": torch.randint(3, (8,), generator=gen)} for _ in range(2)]


def _forward(model):
    return lambda b: nn.functional.cross_entropy(model(b["x"]), b["y"])


def test_the_parts_step_ends_in_cpp_as_torch_does(monkeypatch):
    """PartsStep(2) with micro-batches: the C++ end is used, and lands where torch's end (end="torch", which never
    plans one) lands."""
    used = []
    plan = cpu_step.plan
    monkeypatch.setattr(cpu_step, "plan", lambda *a: used.append(plan(*a)) or used[-1])
    models = [_tiny_model(), _tiny_model()]
    opts = [_adamw_plain(m) for m in models]
    for step in range(4):
        a = PartsStep(2)(models[0], opts[0], _batches(), _forward(models[0]), lr=1e-2, grad_clip=0.5)
        assert len(used) == step + 1
        b = PartsStep(2, end="torch")(models[1], opts[1], _batches(), _forward(models[1]), lr=1e-2, grad_clip=0.5)
        assert len(used) == step + 1
        assert a.applied and b.applied
        torch.testing.assert_close(a.grad_norm, b.grad_norm, rtol=1e-5, atol=0)
    assert len(used) == 4 and all(e is not None for e in used)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert p.grad is None and q.grad is None
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _adamw_plain(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)


def test_a_non_finite_step_is_skipped_and_leaves_no_state():
    model = _tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = _adamw_plain(model)
    out = PartsStep(2)(model, opt, _batches()[:1], lambda b: _forward(model)(b) * float("inf"), grad_clip=1.0)
    assert not out.applied and not torch.isfinite(out.grad_norm)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters()) and not opt.state


def test_no_compiler_keeps_torchs_path(monkeypatch, capsys):
    """Where the kernel cannot be built, one line on stderr, once, and the steps go on through torch."""
    from attnlab.cpu import KernelUnavailable

    def unavailable(*a, **k):
        raise KernelUnavailable("no compiler here")

    monkeypatch.setattr(cpu_step, "build_and_load", unavailable)
    monkeypatch.setattr(cpu_step, "_LOADED", {})
    model = _tiny_model()
    opt = _adamw_plain(model)
    for _ in range(2):
        assert PartsStep(2)(model, opt, _batches(), _forward(model), grad_clip=1.0).applied
    assert capsys.readouterr().err.count("no compiler here; the step's end runs through torch instead") == 1
    assert len(opt.state) == 4


def test_a_cache_that_cannot_be_written_keeps_torchs_path(monkeypatch, capsys):
    def unwritable(*a, **k):
        raise PermissionError(13, "Permission denied", "/cache/kernels")

    monkeypatch.setattr(cpu_step, "build_and_load", unwritable)
    monkeypatch.setattr(cpu_step, "_LOADED", {})
    assert cpu_step.ops() is None and cpu_step.ops() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PermissionError" in err[0] and "runs through torch instead" in err[0]


def test_the_trainer_builds_the_kernel_before_training(tmp_path, monkeypatch):
    """With batch_threads the first build (~10 s) happens while the run is set up, not inside its first step; the
    run's step is then the batch-parts step."""
    from attnlab.training.loop import train_step
    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config, write_corpus

    calls = []
    monkeypatch.setattr(cpu_step, "ops", lambda: calls.append(1))
    corpus = write_corpus(tmp_path / "corpus.txt")
    one = Trainer(tiny_config(corpus, tmp_path / "runs", name="one", device="cpu"))
    assert calls == [] and one.train_step is train_step
    two = Trainer(tiny_config(corpus, tmp_path / "runs", name="two", device="cpu", batch_threads=2, threads=2))
    assert calls == [1]
    assert isinstance(two.train_step, PartsStep) and (two.train_step.parts, two.train_step.end) == (2, "parts")


@pytest.mark.parametrize("parts, end", [(1, "parts"), (2, "cpp")])
def test_a_parts_step_needs_parts_and_a_known_end(parts, end):
    with pytest.raises(ValueError, match="PartsStep needs parts >= 2 and end in"):
        PartsStep(parts, end)
