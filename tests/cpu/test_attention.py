"""kernels=attention (attnlab/cpu/attention.py): attnlab's C++ kernel for causal float32 attention on CPUs, the
route ``cpu-fused`` that ``accelerate`` gives self-attention layers asking for sdpa, built on first use. Against
float64 attention, as close as PyTorch's own float32 kernel; in a GPT, eager and compiled, the same losses and
gradients as sdpa; every call it does not cover goes through sdpa; what it can never serve is refused before
training."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import default_cache_dir
from attnlab.cpu import KernelUnavailable, accelerate
from attnlab.cpu import attention as cpu_fused
from attnlab.models import GPTConfig, build_model
from attnlab.training.config import check_kernels
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
    with pytest.raises(RuntimeError, match="first derivatives only; leave attention out of kernels"):
        torch.autograd.grad(cpu_fused.cpu_fused_attention(q, k, v, 0.5).sum(), qkv, create_graph=True)
    (first,) = torch.autograd.grad(cpu_fused.cpu_fused_attention(q, k, v, 0.5).sum(), qkv)
    assert first.shape == qkv.shape


def _pair(**extra):
    """A GPT on sdpa and the same GPT (its state dict loaded) with the attention kernel put on."""
    cfg = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, d_model=2 * D, dropout=0.0, bias=False,
                    **extra)
    torch.manual_seed(0)
    sdpa = build_model(cfg)
    fused = build_model(cfg)
    fused.load_state_dict(sdpa.state_dict())
    assert accelerate(fused, ("attention",)) == {"attention": 2}
    assert [b.mixer.backend for b in fused.blocks] == ["cpu-fused"] * 2
    assert [b.mixer.backend for b in sdpa.blocks] == ["sdpa"] * 2
    return sdpa, fused


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_gpt_trains_the_same_eager_and_compiled(positions):
    """Compiled: dynamo and AOTAutograd (aot_eager); inductor's C++ graphs are tests/cpu/test_compiled.py's."""
    sdpa, fused = _pair(positions=positions)
    x, y = torch.randint(0, 50, (3, 32)), torch.randint(0, 50, (3, 32))
    forwards = [sdpa, fused] + ([torch.compile(fused, backend="aot_eager")] if positions == "learned" else [])
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
    (dict(dropout=0.1), r"does not compute dropout on the probabilities \(model.dropout=0.1\)"),
    (dict(n_kv_head=1), r"does not compute fewer key/value heads than heads \(model.n_kv_head=1\)"),
    (dict(positions="alibi"), r"does not compute additive score terms .* \(positions=alibi\)"),
    (dict(d_model=48), "does not compute a head dimension of 24: it computes multiples of 16"),
    (dict(attn_backend="eager"), "kernels=attention stands in for attn_backend=sdpa, and model.attn_backend=eager"),
    (dict(mixer="ssm", positions="none"), "kernels=attention: mixer=ssm has no attention"),
])
def test_configs_it_could_never_serve_are_refused(extra, said):
    cfg = GPTConfig(**(dict(vocab_size=50, block_size=32, n_layer=1, n_head=2, d_model=2 * D) | extra))
    cfg.validate()  # a model of its own: only the kernel is refused
    with pytest.raises(ConfigError, match=said):
        check_kernels(("attention",), cfg)
    check_kernels(("attention",), GPTConfig(vocab_size=50, block_size=32, n_layer=1, n_head=2, d_model=2 * D))


def test_a_bidirectional_family_is_refused():
    from attnlab.models.config import ModelConfig

    cfg = ModelConfig.from_mapping(dict(family="bert", vocab_size=50, n_head=2, d_model=2 * D))
    with pytest.raises(ConfigError, match=r"kernels=attention: .* attention both ways \(an encoder\) \(family=bert\)"):
        check_kernels(("attention",), cfg)


def test_a_run_config_is_refused_before_any_data_is_read(tmp_path):
    """TrainConfig.validate makes the same check (``kernels=attention`` with a model it cannot serve)."""
    with pytest.raises(ConfigError, match="kernels=attention stands in for attn_backend=sdpa"):
        tiny_config(tmp_path / "absent.txt", tmp_path / "runs", kernels="attention", attn_backend="tiled")


@pytest.mark.parametrize("kernel", ["attention", "gelu", "linear"])
def test_a_bfloat16_run_is_refused_before_training(tmp_path, kernel):
    corpus = write_corpus(tmp_path / "corpus.txt")
    with pytest.raises(ConfigError, match=f"kernels={kernel}: the kernel computes float32 on the CPU, and this run "
                                          f"is bfloat16 on cpu; leave {kernel} out of kernels"):
        Trainer(tiny_config(corpus, tmp_path / "runs", name="x", device="cpu", dtype="bfloat16", kernels=kernel))
    assert not (tmp_path / "runs" / "x" / "checkpoints").exists()


def test_no_compiler_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(KernelUnavailable, match=r"needs a C\+\+ compiler: '/nonexistent/g\+\+'.*or use "
                                                r"kernels without attention"):
        cpu_fused.load(48)  # a size not built in this process
    assert issubclass(KernelUnavailable, ConfigError)  # the CLI says it in one line, exit 2


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
