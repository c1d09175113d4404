"""attn_backend=cpu-fused (nn/attention/cpu_fused.py): attnlab's C++ kernel for causal float32 attention on CPUs,
built on first use. Against float64 attention, as close as PyTorch's own float32 kernel; in a GPT, eager and
compiled, the same losses and gradients as sdpa; every call it does not cover goes through sdpa; what it can
never serve is refused before training."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import default_cache_dir
from attnlab.models import GPTConfig, build_model
from attnlab.nn.attention import cpu_fused
from attnlab.training.trainer import Trainer
from tests.helpers import tiny_config, write_corpus

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel is built with g++")

D = 32  # one head size for the whole file: each size is a build of its own (~15 s)


def _heads(B: int, T: int, H: int, dtype=torch.float32, seed: int = 0):
    """q, k, v (B, H, T, D) as the strided views of one fused QKV projection (B, T, 3, H, D), and dO as the
    transposed view of a (B, T, H, D) gradient, the layouts the kernel meets in a model."""
    torch.manual_seed(seed)
    qkv = torch.randn(B, T, 3, H, D, dtype=dtype, requires_grad=True)
    grad = torch.randn(B, T, H, D, dtype=dtype).transpose(1, 2)
    return qkv, grad


def _attention(fn, qkv, grad):
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    out = fn(q, k, v)
    (dqkv,) = torch.autograd.grad(out, qkv, grad)
    return out.detach().double(), dqkv.double()


@pytest.mark.parametrize("B,T,H", [(2, 64, 4), (2, 37, 3), (1, 1, 2), (2, 100, 2), (3, 16, 1)])
def test_as_close_to_float64_as_pytorchs_kernel(B, T, H):
    qkv, grad = _heads(B, T, H)
    exact = _attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                       qkv.detach().double().requires_grad_(), grad.double())
    torch_out = _attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), qkv, grad)
    fused = _attention(lambda q, k, v: cpu_fused.cpu_fused_attention(q, k, v, D ** -0.5), qkv, grad)
    for ours, theirs, ref in zip(fused, torch_out, exact):
        err, bound = (ours - ref).abs().max().item(), max(2 * (theirs - ref).abs().max().item(), 1e-6)
        assert err <= bound, (err, bound)


def test_two_threads_give_the_same_numbers():
    """The suite runs one torch thread; here two, so the (batch, head) pairs are split between threads, each
    with scratch buffers of its own."""
    qkv, grad = _heads(4, 200, 4)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 2, 2):  # the first call after the switch may still run on one thread
            torch.set_num_threads(threads)
            results.append(_attention(lambda q, k, v: cpu_fused.cpu_fused_attention(q, k, v, D ** -0.5), qkv, grad))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for other in results[1:] for a, b in zip(results[0], other))


def test_other_scale_and_fake_tensors():
    """The scale is the caller's; the op's fake (meta) implementation passes torch's own checks, which
    torch.compile relies on (its autograd is ``cpu_fused._Attention``'s, compared with torch's above)."""
    qkv, grad = _heads(2, 20, 2)
    ref = _attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5), qkv, grad)
    ours = _attention(lambda q, k, v: cpu_fused.cpu_fused_attention(q, k, v, 0.5), qkv, grad)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ours, ref))
    op = getattr(torch.ops, cpu_fused.load(D)).attn.default
    q, k, v = qkv.detach().permute(2, 0, 3, 1, 4).unbind(0)
    result = torch.library.opcheck(op, (q, k, v, D ** -0.5))
    assert set(result.values()) == {"SUCCESS"}, result


def test_second_derivatives_are_refused():
    """P is kept as a constant, so a gradient of a gradient would be wrong: it is an error instead."""
    qkv, _ = _heads(1, 8, 2)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    with pytest.raises(RuntimeError, match="first derivatives only; use attn_backend=sdpa"):
        torch.autograd.grad(cpu_fused.cpu_fused_attention(q, k, v, 0.5).sum(), qkv, create_graph=True)
    (first,) = torch.autograd.grad(cpu_fused.cpu_fused_attention(q, k, v, 0.5).sum(), qkv)
    assert first.shape == qkv.shape


def _pair(**extra):
    cfg = dict(vocab_size=50, block_size=32, n_layer=2, n_head=2, d_model=2 * D, dropout=0.0, bias=False, **extra)
    torch.manual_seed(0)
    sdpa = build_model(GPTConfig(**cfg, attn_backend="sdpa"))
    fused = build_model(GPTConfig(**cfg, attn_backend="cpu-fused"))
    fused.load_state_dict(sdpa.state_dict())
    return sdpa, fused


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_gpt_trains_the_same_eager_and_compiled(positions):
    from attnlab.training.compiling import compile_forward

    sdpa, fused = _pair(positions=positions)
    x, y = torch.randint(0, 50, (3, 32)), torch.randint(0, 50, (3, 32))
    forwards = [sdpa, fused] + ([compile_forward(fused, "cpu")] if positions == "learned" else [])
    results = []
    for forward in forwards:
        loss = forward(idx=x, targets=y).loss
        results.append((loss.item(), torch.autograd.grad(loss, list(sdpa.parameters() if forward is sdpa
                                                                        else fused.parameters()))))
    for loss, grads in results[1:]:
        assert abs(loss - results[0][0]) < 1e-6
        assert max((a - b).abs().max().item() for a, b in zip(grads, results[0][1])) < 1e-5


def test_calls_it_does_not_cover_go_through_sdpa():
    """Sampling with a KV cache (one query against many keys) and a padding mask: the same as sdpa."""
    from attnlab.generation.sampling import SamplingConfig, generate

    sdpa, fused = _pair(positions="learned")
    prompt = torch.randint(0, 50, (2, 5))
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
    assert torch.equal(generate(sdpa.eval(), prompt, greedy), generate(fused.eval(), prompt, greedy))
    q, k, v = torch.randn(3, 1, 2, 6, D).unbind(0)
    assert not cpu_fused.supports(q, k, v, torch.ones(6, 6, dtype=torch.bool), None, True, 0.0)
    assert not cpu_fused.supports(q.double(), k.double(), v.double(), None, None, True, 0.0)
    assert not cpu_fused.supports(q, k, v, None, None, False, 0.0)
    assert cpu_fused.supports(q, k, v, None, None, True, 0.0)


@pytest.mark.parametrize("extra,said", [
    (dict(dropout=0.1), "with no dropout"),
    (dict(n_kv_head=1), "as many key/value heads as heads"),
    (dict(positions="alibi"), r"no bias in the scores \(positions=alibi\)"),
    (dict(d_model=48), "a head dimension that is a multiple of 16, got 24"),
])
def test_configs_it_could_never_serve_are_refused(extra, said):
    cfg = dict(vocab_size=50, block_size=32, n_layer=1, n_head=2, d_model=2 * D, attn_backend="cpu-fused") | extra
    with pytest.raises(ConfigError, match=said):
        GPTConfig(**cfg).validate()


def test_a_bidirectional_family_is_refused():
    from attnlab.models.config import ModelConfig

    with pytest.raises(ConfigError, match="a causal decoder, and family=bert attends both ways"):
        ModelConfig.from_mapping(dict(family="bert", vocab_size=50, n_head=2, d_model=2 * D,
                                      attn_backend="cpu-fused")).validate()


@pytest.mark.parametrize("option", ["attn_backend", "act_backend", "linear_backend"])  # attention, GELU, linear layers
def test_a_bfloat16_run_is_refused_before_training(tmp_path, option):
    corpus = write_corpus(tmp_path / "corpus.txt")
    with pytest.raises(ConfigError, match=f"{option}=cpu-fused is a float32 CPU kernel; this run is bfloat16 on cpu"):
        Trainer(tiny_config(corpus, tmp_path / "runs", name="x", device="cpu", dtype="bfloat16",
                            **{option: "cpu-fused"}))
    assert not (tmp_path / "runs" / "x" / "checkpoints").exists()


def test_no_compiler_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(cpu_fused.KernelUnavailable, match="needs a C\\+\\+ compiler: '/nonexistent/g\\+\\+'"):
        cpu_fused.load(48)  # a size not built in this process
    assert issubclass(cpu_fused.KernelUnavailable, ConfigError)  # the CLI says it in one line, exit 2


def test_the_build_is_kept_and_reused(monkeypatch):
    """A second process finds the library in the cache folder instead of building it again."""
    namespace = cpu_fused.load(D)
    library = default_cache_dir() / "kernels" / f"{namespace}.so"
    assert library.is_file()
    built = library.stat().st_mtime_ns
    monkeypatch.setattr(cpu_fused, "_LOADED", {})
    monkeypatch.setattr(torch.ops, "load_library", lambda path: None)  # already loaded in this process
    monkeypatch.setattr(cpu_fused, "_register", lambda namespace: None)
    assert cpu_fused.load(D) == namespace and library.stat().st_mtime_ns == built
