"""kernels=gelu (attnlab/cpu/gelu.py): the exact GELU and its derivative in one C++ pass for float32 CPU tensors,
``CPUGELU`` in place of an FFN's ``Activation("gelu")``. Against float64 GELU, as close as PyTorch's float32 kernel,
forward and backward; in a GPT (dense and MoE FFN), eager and compiled, the losses and gradients of torch's GELU;
every call it does not cover goes through F.gelu; what it can never serve is refused before training (a bfloat16
run: tests/cpu/test_attention.py, beside attention's); a model saved with it is the model saved without."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from attnlab.core.errors import ConfigError
from attnlab.cpu import accelerate
from attnlab.cpu import build as cpp_build
from attnlab.cpu import gelu as gelu_cpu
from attnlab.cpu.gelu import CPUGELU
from attnlab.models import GPTConfig, build_model
from attnlab.nn.activations import Activation
from attnlab.training.config import check_kernels
from tests.helpers import assert_trains_the_same

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel is built with g++")


def _value_and_grad(fn, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_()
    y = fn(x)
    (dx,) = torch.autograd.grad(y, x, grad)
    return y.detach().double(), dx.double()


@pytest.mark.parametrize("shape", [(384, 512), (37,), (3, 5, 7), (1,), (16,), (2, 0, 4)])
def test_as_close_to_float64_as_pytorchs_kernel(shape):
    """Sizes that fill whole vectors of 16 and sizes that end in a partial one; values out to 6 sd, where Phi
    saturates."""
    torch.manual_seed(0)
    x, grad = torch.randn(shape) * 3, torch.randn(shape)
    exact = _value_and_grad(F.gelu, x.double(), grad.double())
    theirs = _value_and_grad(F.gelu, x, grad)
    ours = _value_and_grad(gelu_cpu.gelu, x, grad)
    for mine, torchs, ref in zip(ours, theirs, exact):
        assert mine.shape == ref.shape
        if ref.numel():
            err, bound = (mine - ref).abs().max().item(), max(2 * (torchs - ref).abs().max().item(), 1e-6)
            assert err <= bound, (err, bound)


def test_special_values():
    """0 and -0 keep their sign, tiny values give x/2 and slope 1/2, large ones x (slope 1) and 0 (slope 0), NaN
    stays NaN; +inf gives inf (torch's kernel gives NaN there)."""
    x = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 12.0, -12.0, float("nan"), float("inf")])
    y, dx = _value_and_grad(gelu_cpu.gelu, x, torch.ones_like(x))
    ref, ref_dx = _value_and_grad(F.gelu, x.double(), torch.ones_like(x, dtype=torch.float64))
    finite = torch.isfinite(ref) & torch.isfinite(ref_dx)
    assert torch.allclose(y[finite], ref[finite], rtol=1e-6, atol=1e-30)
    assert torch.allclose(dx[finite], ref_dx[finite], rtol=1e-6, atol=1e-30)
    assert torch.equal(torch.signbit(y[:2]), torch.tensor([False, True]))
    assert y[8].isnan() and dx[8].isnan() and y[9] == float("inf")


def test_any_layout_and_threads_give_the_same_numbers():
    """A transposed (non-contiguous) input gives what its contiguous copy gives, element by element; so does a
    tensor split between two threads, and an element's result does not depend on its place in the tensor."""
    torch.manual_seed(1)
    x = torch.randn(300, 700)
    ns = gelu_cpu.load()
    base = gelu_cpu.gelu(x, ns)
    assert torch.equal(gelu_cpu.gelu(x.t(), ns), base.t())
    assert torch.equal(gelu_cpu.gelu(x.flatten()[5:], ns), base.flatten()[5:])  # shifted against the vectors
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert all(torch.equal(gelu_cpu.gelu(x, ns), base) for _ in range(3))
    finally:
        torch.set_num_threads(before)


def test_fake_tensors_and_autograd_pass_torchs_checks():
    op = getattr(torch.ops, gelu_cpu.load()).gelu.default
    result = torch.library.opcheck(op, (torch.randn(5, 33, requires_grad=True),))
    assert set(result.values()) == {"SUCCESS"}, result


def test_second_derivatives_are_refused():
    """The slope is kept as a constant, so a gradient of a gradient would be wrong: it is an error instead, never a
    silent zero."""
    x = torch.randn(10, requires_grad=True)
    (dx,) = torch.autograd.grad(gelu_cpu.gelu(x).sum(), x)  # first derivatives: fine
    assert torch.allclose(dx, torch.func.grad(lambda t: F.gelu(t).sum())(x.detach()), atol=1e-6)
    with pytest.raises(RuntimeError, match="first derivatives only"):  # a gradient to be differentiated again
        torch.autograd.grad(gelu_cpu.gelu(x).sum(), x, create_graph=True)
    w = torch.randn(10, requires_grad=True)  # a gradient that itself depends on parameters (a gradient penalty)
    with pytest.raises(RuntimeError, match="first derivatives only"):
        torch.autograd.grad((gelu_cpu.gelu(x) * w).sum(), x, create_graph=True)


def _pair(**extra):
    """A GPT with torch's GELU and the same GPT (its state dict loaded) with the kernel's."""
    cfg = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, d_model=32, dropout=0.0, bias=False, **extra)
    torch.manual_seed(0)
    stock = build_model(cfg)
    fused = build_model(cfg)
    fused.load_state_dict(stock.state_dict())
    assert accelerate(fused, ("gelu",)) == {"gelu": 2}
    return stock, fused


@pytest.mark.parametrize("extra", [{}, {"moe_experts": 2, "moe_top_k": 1}], ids=["dense", "moe"])
def test_gpt_trains_the_same_eager_and_compiled(extra):
    """Compiled: dynamo and AOTAutograd (aot_eager); inductor's C++ graphs are tests/cpu/test_compiled.py's."""
    stock, fused = _pair(**extra)
    assert isinstance(fused.blocks[0].ffn.act, CPUGELU) and type(stock.blocks[0].ffn.act) is Activation
    x, y = torch.randint(0, 50, (3, 32)), torch.randint(0, 50, (3, 32))
    compiled = [(torch.compile(fused, backend="aot_eager"), fused)] if not extra else []
    forwards = [(stock, stock), (fused, fused), *compiled]
    assert_trains_the_same(forwards, x, y, loss_tol=1e-6, grad_tol=1e-5)


def test_calls_it_does_not_cover_go_through_torch():
    """float64 and bfloat16 tensors (a model cast or under autocast): F.gelu's numbers exactly."""
    layer = CPUGELU.adopt(Activation("gelu"))
    for dtype in (torch.float64, torch.bfloat16):
        h = torch.randn(4, 40).to(dtype)
        assert not gelu_cpu.supports(h)
        assert torch.equal(layer(h), F.gelu(h))
    stock, fused = _pair()
    x = torch.randint(0, 50, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(stock(idx=x).logits, fused(idx=x).logits)


@pytest.mark.parametrize("activation", ["relu", "gelu_tanh", "swiglu"])
def test_other_activations_are_refused(activation):
    """Refused in a run's config; on a built model, ``accelerate`` leaves such layers as they are."""
    cfg = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, d_model=32, activation=activation)
    with pytest.raises(ConfigError, match=f"kernels=gelu computes the exact GELU, and model.activation={activation}; "
                                          "leave it out"):
        check_kernels(("gelu",), cfg)
    model = build_model(cfg)
    assert accelerate(model, ("gelu",)) == {"gelu": 0}
    assert not any(isinstance(m, CPUGELU) for m in model.modules())


def test_a_changed_header_is_a_new_build(tmp_path):
    """The build's key covers the headers a source includes by quotes (cpu/vec.h), not the source alone."""
    header = tmp_path / "inc" / "part.h"
    header.parent.mkdir()
    header.write_text('#include "more.h"\n')
    (header.parent / "more.h").write_text("// more\n")
    source = tmp_path / "k.cpp"
    source.write_text('#include <vector>\n#include "inc/part.h"\n#include "absent.h"\n')
    assert cpp_build.local_headers(source) == [header.resolve(), (header.parent / "more.h").resolve()]
    here = cpp_build.local_headers(gelu_cpu.SOURCE)
    assert [p.name for p in here] == ["vec.h"] and all(p.is_file() for p in here)


def test_a_model_saved_with_kernels_is_the_model_saved_without(tmp_path, monkeypatch):
    """A model with the C++ kernels on (GELU's and attention's) saves the config.json and weights a model without
    them saves, and loads (building nothing: here without a compiler) as the plain model, the same outputs."""
    from attnlab.cpu import attention as cpu_fused
    from attnlab.models.base import CONFIG_NAME, WEIGHTS_NAME
    from attnlab.models.registry import from_pretrained

    # heads of 32, the size tests/cpu/test_attention.py builds the attention kernel for (a size is a build of its own)
    cfg = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, d_model=64, bias=False)
    torch.manual_seed(0)
    plain = build_model(cfg).eval()
    model = build_model(cfg).eval()
    model.load_state_dict(plain.state_dict())
    assert accelerate(model, ("attention", "gelu")) == {"attention": 2, "gelu": 2}
    assert model.config == cfg
    model.save_pretrained(tmp_path / "with")
    plain.save_pretrained(tmp_path / "without")
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        assert (tmp_path / "with" / name).read_bytes() == (tmp_path / "without" / name).read_bytes(), name
    x = torch.randint(0, 50, (2, 32))
    with torch.no_grad():
        expected = model(idx=x).logits
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    monkeypatch.setattr(gelu_cpu, "_LOADED", [])
    monkeypatch.setattr(cpu_fused, "_LOADED", {})
    loaded = from_pretrained(tmp_path / "with")
    assert loaded.config == cfg
    assert not any(isinstance(m, CPUGELU) for m in loaded.modules())
    assert [b.mixer.backend for b in loaded.blocks] == ["sdpa", "sdpa"]
    with torch.no_grad():
        assert (loaded(idx=x).logits - expected).abs().max().item() < 1e-5
