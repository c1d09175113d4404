"""kernels=linear (attnlab/cpu/linear.py): a linear layer's three float32 products in attnlab's C++ kernel, as
``CPULinear`` in place of the attention and FFN layers' ``nn.Linear`` (and with gelu too, ``CPUFeedForward``: x W_1
and its GELU in one pass). Against float64 products, as close as torch's float32 products, for every tile shape the
kernel has (rows not a multiple of its 6-row tiles, widths of 16-48 past its 64-column panels, one row, none); the
same numbers on one thread and two; gradients of gradients right; every call it does not cover goes through
F.linear; in a GPT, eager and compiled (aot_eager; inductor's graphs in test_compiled.py), the losses and gradients
of torch's products, with the kernel's ops called from the compiled graphs; what it can never serve is refused
before training; a run trained with it saves the model a run without it saves."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.core.errors import ConfigError
from attnlab.cpu import KernelUnavailable, accelerate, check_device
from attnlab.cpu import gelu as gelu_cpu
from attnlab.cpu import linear as linear_cpu
from attnlab.models import GPTConfig, build_model
from attnlab.nn.ffn import FeedForward
from attnlab.training.config import check_kernels
from tests.helpers import assert_trains_the_same, tiny_config, write_corpus

AOT = "aot_eager"  # dynamo and AOTAutograd without inductor's C++ build (that is tests/cpu/test_compiled.py's)


def _products(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, layer) -> tuple[torch.Tensor, ...]:
    """y = layer(x, w), and dx, dW for the upstream gradient g."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = layer(x, w)
    y.backward(g)
    return y.detach(), x.grad, w.grad


def _error(ours: torch.Tensor, exact: torch.Tensor) -> float:
    return ((ours.double() - exact).abs().max() / exact.abs().max()).item()


@pytest.mark.parametrize("shape", [(384, 128, 384), (384, 512, 128), (100, 128, 112), (7, 16, 48), (1, 32, 16),
                                   (13, 80, 208), (6, 64, 64)], ids=str)
def test_products_are_as_close_to_float64_as_torchs(shape):
    """(M, K, N): forward x W^T, dx = dy W and dW = dy^T x within 4x of torch's own float32 error, and 1e-5."""
    M, K, N = shape
    torch.manual_seed(M + K + N)
    x, w, g = torch.randn(M, K, dtype=torch.float64), torch.randn(N, K, dtype=torch.float64), \
        torch.randn(M, N, dtype=torch.float64)
    exact = _products(x, w, g, F.linear)
    stock = _products(x.float(), w.float(), g.float(), F.linear)
    ours = _products(x.float(), w.float(), g.float(), linear_cpu.linear)
    for o, s, e in zip(ours, stock, exact):
        assert _error(o, e) <= max(4 * _error(s, e), 1e-6) and _error(o, e) < 1e-5


def test_no_rows_and_leading_dimensions_and_strided_inputs():
    w = torch.randn(32, 48, requires_grad=True)
    y = linear_cpu.linear(torch.zeros(0, 48), w)
    y.sum().backward()
    assert y.shape == (0, 32) and torch.equal(w.grad, torch.zeros(32, 48))
    x = torch.randn(2, 48, 5).transpose(1, 2)  # (2, 5, 48), not contiguous
    b = torch.randn(32)
    assert torch.allclose(linear_cpu.linear(x, w, b), F.linear(x, w, b), atol=1e-5)


def test_one_thread_and_two_give_the_same_numbers():
    """The kernel splits C into tasks; each output is summed by one task in the same order whatever the threads."""
    torch.manual_seed(0)
    x, w, g = torch.randn(300, 128), torch.randn(192, 128), torch.randn(300, 192)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(_products(x, w, g, linear_cpu.linear))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_gradients_of_gradients_are_torchs():
    """create_graph=True (a gradient penalty): the backward pass goes through torch's products, so the second
    derivatives are right, not a constant's."""
    torch.manual_seed(0)
    x, w = torch.randn(10, 32, requires_grad=True), torch.randn(16, 32, requires_grad=True)
    results = []
    for layer in (F.linear, linear_cpu.linear):
        (dx,) = torch.autograd.grad(torch.tanh(layer(x, w)).sum(), x, create_graph=True)
        results.append(torch.autograd.grad(dx.pow(2).sum(), w))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-5)


def test_only_the_gradients_asked_for():
    """A frozen weight gets no gradient, an input that needs none gets none (ctx.needs_input_grad)."""
    layer = linear_cpu.CPULinear.adopt(nn.Linear(32, 16, bias=False)).requires_grad_(False)
    x = torch.randn(4, 32, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad is None and torch.allclose(x.grad, layer.weight.sum(0).expand(4, 32), atol=1e-6)
    layer.requires_grad_(True)
    layer(torch.randn(4, 32)).sum().backward()
    assert layer.weight.grad is not None


def test_calls_it_does_not_cover_go_through_torch():
    """Widths not multiples of 16, float64, bfloat16 autocast: F.linear's numbers exactly."""
    torch.manual_seed(0)
    adopt = linear_cpu.CPULinear.adopt
    for layer, x in [(adopt(nn.Linear(32, 65)), torch.randn(3, 32)),
                     (adopt(nn.Linear(40, 16)), torch.randn(3, 40)),
                     (adopt(nn.Linear(32, 16)).double(), torch.randn(3, 32, dtype=torch.float64))]:
        assert not linear_cpu.supports(x, layer.weight)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    layer, x = adopt(nn.Linear(32, 16)), torch.randn(3, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not linear_cpu.supports(x, layer.weight)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_the_ops_refuse_widths_they_cannot_compute_and_their_fakes_pass_torchs_checks():
    ops = getattr(torch.ops, linear_cpu.load())
    with pytest.raises(RuntimeError, match=r"out_features \(40\) must be a multiple of 16"):
        ops.linear(torch.randn(3, 32), torch.randn(40, 32))
    with pytest.raises(RuntimeError, match="must be a 2-D float32 CPU tensor"):
        ops.linear(torch.randn(3, 32, dtype=torch.float64), torch.randn(16, 32))
    x, w, g = torch.randn(5, 32), torch.randn(16, 32), torch.randn(5, 16)
    for op, args in [(ops.linear, (x, w)), (ops.linear_grad_input, (g, w)), (ops.linear_grad_weight, (g, x))]:
        assert set(torch.library.opcheck(op.default, args).values()) <= {"SUCCESS", "SKIP"}


def _pair(kernels=("linear",), **extra):
    """A GPT with torch's layers and the same GPT (its state dict loaded) with ``kernels`` put on."""
    cfg = GPTConfig(**{**dict(vocab_size=50, block_size=32, n_layer=2, n_head=2, d_model=64, dropout=0.0,
                              bias=False), **extra})
    torch.manual_seed(0)
    stock = build_model(cfg)
    fused = build_model(cfg)
    fused.load_state_dict(stock.state_dict())  # the same parameters under the same names
    took = accelerate(fused, kernels)
    assert took["linear"] == 8  # qkv_proj, out_proj, fc_in, fc_out in each of 2 blocks; lm_head stays
    return stock, fused


@pytest.mark.parametrize("extra", [{}, {"bias": True, "kernels": ("attention", "gelu", "linear")}],
                         ids=["plain", "bias-and-the-other-kernels"])
def test_gpt_trains_the_same_eager_and_compiled(extra):
    stock, fused = _pair(**extra)
    assert isinstance(fused.blocks[0].mixer.qkv_proj, linear_cpu.CPULinear)
    assert type(stock.blocks[0].mixer.qkv_proj) is nn.Linear and type(fused.lm_head) is nn.Linear
    assert stock.state_dict().keys() == fused.state_dict().keys()
    x, y = torch.randint(0, 50, (3, 32)), torch.randint(0, 50, (3, 32))
    forwards = [(stock, stock), (fused, fused), (torch.compile(fused, backend=AOT), fused)]
    assert_trains_the_same(forwards, x, y, loss_tol=1e-5, grad_tol=1e-5)


def test_a_compiled_step_calls_the_kernel_in_both_passes():
    """Inside the compiled graphs the products are the kernel's ops (forward, grad input, grad weight): none of
    the model's block products is left to aten::mm (inductor's graphs: tests/cpu/test_compiled.py)."""
    from torch.profiler import ProfilerActivity, profile

    _, fused = _pair()
    forward = torch.compile(fused, backend=AOT)
    x, y = torch.randint(0, 50, (3, 32)), torch.randint(0, 50, (3, 32))
    forward(idx=x, targets=y).loss.backward()  # compiled outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward(idx=x, targets=y).loss.backward()
    names = [e.name for e in prof.events()]
    ns = linear_cpu.load()
    counts = {op: names.count(f"{ns}::{op}") for op in ("linear", "linear_grad_input", "linear_grad_weight")}
    assert counts == {"linear": 8, "linear_grad_input": 8, "linear_grad_weight": 8}  # 4 products x 2 blocks


def test_what_it_cannot_serve_is_refused_before_training():
    with pytest.raises(ConfigError, match=r"kernels=linear computes widths that are multiples of 16, and "
                                          r"model\.d_model=40; leave it out"):
        check_kernels(("linear",), GPTConfig(vocab_size=50, d_model=40, n_head=2))
    check_kernels(("linear",), GPTConfig(vocab_size=50, d_model=64, n_head=2))
    with pytest.raises(ConfigError, match="kernels=linear: the kernel computes float32 on the CPU, and this run is "
                                          "bfloat16 on cpu; leave linear out of kernels"):
        check_device(("linear",), "cpu", "bfloat16")
    check_device(("linear",), "cpu", "float32")


@pytest.mark.parametrize("module, kernel", [(linear_cpu, "linear"), (gelu_cpu, "gelu")], ids=["linear", "gelu"])
def test_no_compiler_is_one_clear_error(monkeypatch, module, kernel):
    """This kernel's, and GELU's: one line naming the compiler and the setting that computes without it."""
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    monkeypatch.setattr(module, "_LOADED", [])
    with pytest.raises(KernelUnavailable, match=r"needs a C\+\+ compiler: '/nonexistent/g\+\+'.*"
                       f"or use kernels without {kernel}"):
        module.load()


def test_a_run_trains_with_it_and_saves_the_model_a_run_without_it_saves(tmp_path):
    """``attnlab train ... kernels=linear batch_threads=2``: the Trainer puts the kernel's layers on, trains on both
    threads, and the run's model (its config naming no kernel) reloads as the plain model, computing the same
    numbers, and with the kernel put on again, the same numbers bit for bit."""
    from attnlab.models.registry import from_pretrained
    from attnlab.training.trainer import Trainer

    corpus = write_corpus(tmp_path / "corpus.txt")
    cfg = tiny_config(corpus, tmp_path / "runs", name="lin", max_iters=6, eval_interval=6, batch_threads=2,
                      threads=2, kernels="linear")
    trainer = Trainer(cfg)
    assert isinstance(trainer.model.blocks[0].ffn.fc_in, linear_cpu.CPULinear)
    result = trainer.train()
    assert result.step == 6 and result.val_loss is not None and math.isfinite(result.val_loss)
    loaded = from_pretrained(result.run_dir)
    assert loaded.config == cfg.model == trainer.model.config
    assert type(loaded.blocks[0].mixer.qkv_proj) is nn.Linear
    x = torch.randint(0, loaded.config.vocab_size, (2, 16))
    with torch.no_grad():
        trained = trainer.plain_model().eval()(idx=x).logits
        assert (loaded.eval()(idx=x).logits - trained).abs().max().item() < 1e-5
        accelerate(loaded, ("linear",))
        assert isinstance(loaded.blocks[0].mixer.qkv_proj, linear_cpu.CPULinear)
        assert torch.equal(loaded(idx=x).logits, trained)


@pytest.mark.parametrize("shape", [(384, 128, 512), (7, 32, 48), (13, 64, 80)], ids=str)
def test_linear_gelu_is_gelu_of_the_linear_layer(shape):
    """One pass (GELU applied to each tile in registers): against float64 GELU(x W^T), forward and backward, as
    close as the products alone; and the same numbers, bit for bit, as the kernel's product followed by GELU's."""
    M, K, N = shape
    torch.manual_seed(M)
    x, w, g = torch.randn(M, K, dtype=torch.float64), torch.randn(N, K, dtype=torch.float64) * 0.1, \
        torch.randn(M, N, dtype=torch.float64)
    exact = _products(x, w, g, lambda a, b: F.gelu(F.linear(a, b)))
    ours = _products(x.float(), w.float(), g.float(), linear_cpu.linear_gelu)
    assert all(_error(o, e) < 2e-6 for o, e in zip(ours, exact))
    two_passes = _products(x.float(), w.float(), g.float(), lambda a, b: gelu_cpu.gelu(linear_cpu.linear(a, b)))
    assert all(torch.equal(a, b) for a, b in zip(ours, two_passes))
    with pytest.raises(RuntimeError, match="first derivatives only"):
        xg = x.float().requires_grad_()
        torch.autograd.grad(linear_cpu.linear_gelu(xg, w.float()).sum(), xg, create_graph=True)


def test_the_ffn_fuses_only_where_nothing_is_skipped(monkeypatch):
    """With both kernels an FFN computes x W_1 and GELU in one pass; with a bias, or a hook on fc_in, on the GELU
    or on the hook points between them (which the fused pass would not call), it computes them one after the other:
    the same outputs every way."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)
    stock = FeedForward(32, 64, bias=False)
    fused = FeedForward(32, 64, bias=False)
    fused.load_state_dict(stock.state_dict())
    assert accelerate(fused, ("gelu", "linear")) == {"gelu": 1, "linear": 2}
    assert isinstance(fused, linear_cpu.CPUFeedForward) and fused.fuses()
    calls = []
    original = linear_cpu.linear_gelu
    monkeypatch.setattr(linear_cpu, "linear_gelu", lambda *a, **k: calls.append(1) or original(*a, **k))
    assert torch.allclose(fused(x), stock(x), atol=1e-5) and len(calls) == 1
    seen = []
    for layer in (fused.fc_in, fused.act, fused.hook_pre, fused.hook_post):  # the hook points between them too
        seen.clear()
        handle = layer.register_forward_hook(lambda m, i, o: seen.append(o.shape))
        assert torch.allclose(fused(x), stock(x), atol=1e-5) and len(calls) == 1 and seen == [(2, 5, 64)]
        handle.remove()
    biased = FeedForward(32, 64, bias=True)
    accelerate(biased, ("gelu", "linear"))
    assert isinstance(biased, linear_cpu.CPUFeedForward) and not biased.fuses()
    biased(x)
    assert len(calls) == 1
    alone = FeedForward(32, 64, bias=False)  # one kernel alone: no fused pass to take
    accelerate(alone, ("linear",))
    assert type(alone) is FeedForward and isinstance(alone.fc_in, linear_cpu.CPULinear)


def test_a_compiled_ffn_calls_the_fused_op():
    from torch.profiler import ProfilerActivity, profile

    stock, fused = _pair(kernels=("gelu", "linear"))
    forward = torch.compile(fused, backend=AOT)
    x, y = torch.randint(0, 50, (3, 32)), torch.randint(0, 50, (3, 32))
    expected = stock(idx=x, targets=y).loss
    forward(idx=x, targets=y).loss.backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = forward(idx=x, targets=y).loss
        loss.backward()
    assert abs(loss.item() - expected.item()) < 1e-5
    names = [e.name for e in prof.events()]
    ns = linear_cpu.load()
    counts = {op: names.count(f"{ns}::{op}") for op in ("linear", "linear_gelu", "linear_grad_input",
                                                         "linear_grad_weight")}
    assert counts == {"linear": 6, "linear_gelu": 2, "linear_grad_input": 8, "linear_grad_weight": 8}
