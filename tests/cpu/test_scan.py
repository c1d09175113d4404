"""kernels=scan (attnlab/cpu/scan.py): the selective scan as one C++ loop per pass with a recomputing backward,
``CPUSelectiveSSM`` in place of ``SelectiveSSM``. Against the Python loop of the specification in float64 (outputs,
final state and every gradient, over several checkpoint segments); gradcheck; torch's own op checks (the fake
tensors torch.compile uses); the Mamba layer and a GPT with it equal to the chunked form; a GPU run with it, or a
model without an SSM, refused before training."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from attnlab.core.errors import ConfigError
from attnlab.cpu import accelerate, check_device
from attnlab.cpu import scan as scan_cpu
from attnlab.cpu.scan import CPUSelectiveSSM
from attnlab.models import GPTConfig, build_model
from attnlab.nn.selective_scan import selective_scan_reference
from attnlab.nn.ssm import SelectiveSSM
from attnlab.training.config import check_kernels

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel is built with g++")


def _inputs(batch: int, T: int, d: int, N: int, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(batch, T, d, generator=g, dtype=dtype)
    delta = F.softplus(torch.randn(batch, T, d, generator=g, dtype=dtype) * 2)  # some steps large (fast forgetting)
    A = -torch.rand(d, N, generator=g, dtype=dtype) * 4 - 0.01
    B, C = (torch.randn(batch, T, N, generator=g, dtype=dtype) for _ in range(2))
    h0 = torch.randn(batch, d, N, generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (u, delta, A, B, C, h0)]


@pytest.mark.parametrize("T", [1, 5, 64, 65, 150])  # within one segment, exactly one, across three
@pytest.mark.parametrize("with_h0", [True, False])
@pytest.mark.parametrize("N", [7, 16])  # a state size read at run time; one compiled for (the kernel's NC)
def test_outputs_state_and_every_gradient_equal_the_specification(T, with_h0, N):
    u, delta, A, B, C, h0 = _inputs(2, T, 5, N)
    h0_arg = h0 if with_h0 else None
    y_ref, h_ref = selective_scan_reference(u, delta, A, B, C, initial_state=h0_arg, return_final_state=True)
    y, h = scan_cpu.fused_scan(u, delta, A, B, C, h0_arg)
    assert torch.allclose(y, y_ref, rtol=1e-12, atol=1e-12) and torch.allclose(h, h_ref, rtol=1e-12, atol=1e-12)
    g = torch.Generator().manual_seed(1)
    gy, gh = torch.randn(y.shape, generator=g, dtype=y.dtype), torch.randn(h.shape, generator=g, dtype=h.dtype)
    inputs = (u, delta, A, B, C, h0) if with_h0 else (u, delta, A, B, C)
    ref = torch.autograd.grad((y_ref * gy).sum() + (h_ref * gh).sum(), inputs)
    ours = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), inputs)
    for name, a, b in zip(["u", "delta", "A", "B", "C", "h0"], ours, ref):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10), (name, (a - b).abs().max().item())


@pytest.mark.parametrize("N", [7, 16])
def test_two_threads_split_the_channels_and_give_the_same_numbers(N):
    """The suite runs one torch thread; here two, so the channels are split between threads and dB, dC are
    summed over the threads' own buffers."""
    args = _inputs(3, 130, 9, N)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 2, 2):  # the first call after the switch may still run on one thread
            torch.set_num_threads(threads)
            y, h = scan_cpu.fused_scan(*args)
            results.append((y, h, *torch.autograd.grad(y.square().sum() + h.sum(), args)))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(results[0], other))


def test_gradcheck_and_only_the_output_used():
    """Finite differences agree; a loss of y alone (the final state unused: its gradient is None) works."""
    args = _inputs(1, 70, 2, 3)
    assert torch.autograd.gradcheck(lambda *a: scan_cpu.fused_scan(*a), args)
    y, _ = scan_cpu.fused_scan(*args[:5])
    y.sum().backward()
    assert args[0].grad is not None and args[5].grad is None


@pytest.mark.parametrize("N", [12, 16])  # std::exp at a run-time size; the vectorised polynomial at 16
def test_float32_close_to_float64_and_torch_op_checks(N):
    """Outputs, final state and gradients in float32 within 1e-5 of the largest float64 value (float32 rounding
    over 100 steps is ~1e-7 here; a wrong exp is off by far more)."""
    args64 = _inputs(2, 100, 4, N)
    args32 = [a.detach().float().requires_grad_() for a in args64]
    results = []
    for args in (args64, args32):
        y, h = scan_cpu.fused_scan(*args)
        g = torch.Generator().manual_seed(1)
        gy, gh = (torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype) for t in (y, h))
        results.append((y, h, *torch.autograd.grad((y * gy).sum() + (h * gh).sum(), args)))
    for name, a32, a64 in zip(["y", "hT", "u", "delta", "A", "B", "C", "h0"], results[1], results[0]):
        assert (a32.double() - a64).abs().max() <= 1e-5 * a64.abs().max(), name
    op = getattr(torch.ops, scan_cpu.load()).scan.default
    result = torch.library.opcheck(op, tuple(args32))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_the_mamba_layer_equals_its_chunked_form_with_and_without_state():
    torch.manual_seed(0)
    chunked = SelectiveSSM(24, d_state=8)
    fused = SelectiveSSM(24, d_state=8)
    fused.load_state_dict(chunked.state_dict())
    fused = CPUSelectiveSSM.adopt(fused)
    assert fused.state_dict().keys() == chunked.state_dict().keys()
    x = torch.randn(3, 80, 24, requires_grad=True)
    y_c = chunked(x)
    (gx_c,) = torch.autograd.grad(y_c.sum(), x)
    y_f = fused(x)
    (gx_f,) = torch.autograd.grad(y_f.sum(), x)
    assert torch.allclose(y_f, y_c, atol=1e-5) and torch.allclose(gx_f, gx_c, atol=1e-5)
    with torch.no_grad():  # a prompt prefilled through the kernel, then generation steps: the state carries on
        states = [m.new_state(3) for m in (chunked, fused)]
        outs = [torch.cat([m(x[:, :50], state=s), *(m(x[:, t:t + 1], state=s) for t in range(50, 53))], 1)
                for m, s in zip((chunked, fused), states)]
        assert torch.allclose(outs[0], outs[1], atol=1e-5)
        assert torch.allclose(states[0].ssm_state, states[1].ssm_state, atol=1e-5)


def test_a_gpt_trains_the_same_with_either_scan_and_compiles():
    cfg = dict(vocab_size=11, block_size=32, n_layer=2, n_head=2, d_model=16, mixer="ssm", positions="none")
    torch.manual_seed(0)
    a = build_model(GPTConfig(**cfg))
    b = build_model(GPTConfig(**cfg))
    b.load_state_dict(a.state_dict())
    assert accelerate(b, ("scan",)) == {"scan": 2}
    assert all(isinstance(block.mixer, CPUSelectiveSSM) for block in b.blocks)
    idx = torch.randint(0, 11, (4, 32), generator=torch.Generator().manual_seed(0))
    losses = []
    for model in (a, b, torch.compile(b, backend="aot_eager")):  # dynamo + AOTAutograd
        loss = model(idx, targets=idx).loss
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-5) and losses[1] == pytest.approx(losses[2], abs=1e-5)


def test_misuse_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="kernels=scan: the kernel computes on the CPU, and this run is float32 on "
                                          "cuda; leave scan out of kernels"):
        check_device(("scan",), "cuda", "float32")
    check_device(("scan",), "cpu", "bfloat16")  # fine: the scan runs in float32 anyway
    check_device(("scan",), "cpu", "float32")
    check_kernels(("scan",), GPTConfig(mixer="ssm", positions="none"))
    check_kernels(("scan",), GPTConfig(mixer="hybrid"))
    with pytest.raises(ConfigError, match=r"kernels=scan computes the selective scan of an SSM, and this model has "
                                          r"none \(model\.mixer=attention\); leave it out"):
        check_kernels(("scan",), GPTConfig())  # an attention model has no scan to compute
