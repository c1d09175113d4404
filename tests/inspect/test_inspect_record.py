"""attnlab.inspect.record: recorded attention equals the eager backend's on every backend and
leaves the model's outputs bit-identical."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect.record import attention_from_qk, block_index, record
from attnlab.models import GPTConfig
from attnlab.nn.attention import KVCache, MultiHeadAttention
from attnlab.nn.hooks import capture
from tests.helpers import with_patterns
from tests.inspect_models import Encoder, EncoderDecoder, tiny_gpt, with_backend

BACKENDS = ("eager", "sdpa", "tiled")


def eager_probs_gpt(model, idx) -> dict[str, torch.Tensor]:
    """The probabilities of the same weights on the eager backend, by attention module name."""
    eager = with_backend(model, "eager")
    with capture(eager, "*hook_pattern") as seen:
        eager(idx)
    return {name.removesuffix(".hook_pattern"): probs for name, probs in seen.items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("positions,n_kv_head", [("learned", None), ("rope", 2), ("alibi", 1)])
def test_gpt_probs_match_eager_and_logits_unchanged(backend, positions, n_kv_head):
    model = tiny_gpt(backend, positions, n_kv_head)
    idx = torch.randint(0, 17, (2, 11), generator=torch.Generator().manual_seed(1))
    plain = model(idx).logits
    with record(model, what=("probs", "scores")) as rec:
        recorded = model(idx).logits
    assert torch.equal(plain, recorded)  # bit-identical
    reference = eager_probs_gpt(model, idx)
    assert rec.names == list(reference)
    for name, ref in reference.items():
        assert rec.probs[name].shape == (2, 4, 11, 11)
        torch.testing.assert_close(rec.probs[name], ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(rec.probs[name].sum(-1), torch.ones(2, 4, 11))
        assert rec.kind[name] == "self"
        # causal: the scores above the diagonal are -inf, and softmax(scores) are the probs
        assert torch.isneginf(rec.scores[name][..., 0, 1:]).all()
        torch.testing.assert_close(torch.softmax(rec.scores[name], -1), rec.probs[name])
    # hooks are gone after the context
    assert not any(m.__dict__.get("_scores_hooks") for m in model.modules())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_kv_head", [None, 2])
def test_encoder_padding_mask(backend, n_kv_head):
    torch.manual_seed(0)
    eager = Encoder("eager", n_kv_head=n_kv_head).eval()
    model = with_backend(eager, backend)
    idx = torch.randint(0, 13, (3, 9))
    lengths = torch.tensor([9, 5, 1])
    plain = model(idx, lengths)
    with record(model) as rec:
        assert torch.equal(model(idx, lengths), plain)
    with record(eager) as ref:
        eager(idx, lengths)
    for name in ("blocks.0.mixer", "blocks.1.mixer"):
        torch.testing.assert_close(rec.probs[name], ref.probs[name], atol=1e-5, rtol=0)
        # padded keys get no attention; every row sums to 1
        assert rec.probs[name][1, :, :, 5:].abs().max() == 0
        assert rec.probs[name][2, :, :, 1:].abs().max() == 0
        torch.testing.assert_close(rec.probs[name].sum(-1), torch.ones(3, 4, 9))


@pytest.mark.parametrize("backend", BACKENDS)
def test_encoder_decoder_cross_attention(backend):
    torch.manual_seed(0)
    eager = EncoderDecoder("eager", n_kv_head=2).eval()
    model = with_backend(eager, backend)
    src, tgt = torch.randint(0, 13, (2, 7)), torch.randint(0, 13, (2, 5))
    lengths = torch.tensor([7, 4])
    plain = model(src, lengths, tgt)
    with record(model, what=("probs", "residual", "sublayers")) as rec:
        assert torch.equal(model(src, lengths, tgt), plain)
    assert rec.select("cross") == ["blocks.0.cross_attn", "blocks.1.cross_attn"]
    assert rec.select("self", "encoder.") == ["encoder.blocks.0.mixer", "encoder.blocks.1.mixer"]
    cross = rec.probs["blocks.1.cross_attn"]
    assert cross.shape == (2, 4, 5, 7)  # target x source
    assert cross[1, :, :, 4:].abs().max() == 0
    # cross-attention probabilities by hand from the block's own projections
    block = eager.blocks[1]
    h = block.norm_cross(rec.residual_in["blocks.1"] + rec.sublayers["blocks.1.mixer"])
    memory = rec.residual["encoder.blocks.1"]
    q = block.cross_attn.q_proj(h).view(2, 5, 4, 8).transpose(1, 2)
    k, _ = block.cross_attn.kv_proj(memory).view(2, 7, 4, 8).transpose(1, 2).split(2, dim=1)
    k = k.repeat_interleave(2, dim=1)
    s = (q @ k.transpose(-2, -1)) / 8**0.5
    s = s.masked_fill(~(torch.arange(7) < lengths[:, None])[:, None, None, :], float("-inf"))
    torch.testing.assert_close(cross, torch.softmax(s, -1), atol=1e-5, rtol=0)
    # decoder self-attention is causal
    assert rec.probs["blocks.0.mixer"].triu(1).abs().max() == 0


def test_select_layers_and_heads_keeps_only_those():
    model = tiny_gpt("sdpa", n_layer=3)
    idx = torch.randint(0, 17, (1, 6))
    with record(model, layers=[2], heads=[3, 1]) as rec:
        model(idx)
    assert rec.names == ["blocks.2.mixer"] and rec.heads["blocks.2.mixer"] == [3, 1]
    ref = eager_probs_gpt(model, idx)["blocks.2.mixer"]
    torch.testing.assert_close(rec.probs["blocks.2.mixer"], ref[:, [3, 1]], atol=1e-5, rtol=0)
    with record(model, modules="blocks.1.*") as rec:
        model(idx)
    assert rec.names == ["blocks.1.mixer"]


def test_kv_cache_decoding_records_the_last_step():
    model = tiny_gpt("sdpa", positions="rope", n_kv_head=2)
    idx = torch.randint(0, 17, (1, 8))
    cache = model.new_cache(1)
    model(idx[:, :7], cache=cache)
    with record(model, layers=0) as rec:
        model(idx[:, 7:], cache=cache)
    full = eager_probs_gpt(model, idx)["blocks.0.mixer"]
    torch.testing.assert_close(rec.probs["blocks.0.mixer"], full[:, :, 7:], atol=1e-5, rtol=0)


def test_static_cross_cache():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, cross=True)
    x, memory = torch.randn(1, 1, 16), torch.randn(1, 6, 16)
    cache = KVCache(1, 2, 6, 8)
    mha(x, memory=memory, cache=cache)
    wrapper = torch.nn.ModuleDict({"layers": torch.nn.ModuleList([mha])})
    with record(wrapper) as rec:
        mha(x, cache=cache)  # reads the memory's keys from the cache
    _, (ref,) = with_patterns(mha, x, memory=memory)
    torch.testing.assert_close(rec.probs["layers.0"], ref, atol=1e-6, rtol=0)


def test_attention_from_qk_matches_reference_by_hand():
    q = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]]]])  # the lecture's A, B, C, D
    scores, probs = attention_from_qk(q, q)
    torch.testing.assert_close(scores[0, 0, 0], torch.tensor([1.0, 0.0, 1.0, 1.0]) / 2**0.5)
    torch.testing.assert_close(probs[0, 0, 0].sum(), torch.tensor(1.0))


def test_bad_arguments():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="unknown record item"), record(model, what=("attn",)):
        pass
    with pytest.raises(ValueError, match="out of range"), record(model, heads=[4]):
        pass
    with pytest.raises(ValueError, match="nothing to record"), record(model, layers=[7]):
        pass
    assert block_index("decoder.layers.12.cross_attn") == 12 and block_index("pool.attn") == 0


def test_training_step_unchanged_by_recording():
    model = tiny_gpt("tiled", positions="rope")
    idx = torch.randint(0, 17, (2, 9), generator=torch.Generator().manual_seed(3))
    model(idx, targets=idx).loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with record(model, what=("probs", "residual", "sublayers")):
        model(idx, targets=idx).loss.backward()
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


@pytest.mark.parametrize("backend", ("eager", "sdpa"))
def test_latent_attention_plain_absorbed_and_decoding(backend):
    from attnlab.models.gpt import GPT

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=17, block_size=32, n_layer=1, n_head=4, d_model=32, mixer="latent",
                      positions="none", attn_backend=backend, init_std=0.2)
    model = GPT(cfg).eval()  # multi-head latent attention: its own decoupled RoPE
    names = [n for n, m in model.named_modules() if hasattr(m, "register_scores_hook")]
    assert names == ["blocks.0.mixer"]
    idx = torch.randint(0, 17, (2, 9))
    plain = model(idx).logits
    with record(model) as rec:
        assert torch.equal(model(idx).logits, plain)
    ref = eager_probs_gpt(model, idx)["blocks.0.mixer"]
    torch.testing.assert_close(rec.probs[names[0]], ref, atol=1e-5, rtol=0)
    mla = model.get_submodule(names[0])
    mla.absorb = True  # attend in latent space: same probabilities
    with record(model) as rec:
        model(idx)
    torch.testing.assert_close(rec.probs[names[0]], ref, atol=1e-5, rtol=0)
    mla.absorb = False
    cache = model.new_cache(2)
    model(idx[:, :8], cache=cache)
    with record(model) as rec:
        model(idx[:, 8:], cache=cache)  # one token against a filled cache: absorbed by default
    torch.testing.assert_close(rec.probs[names[0]], ref[:, :, 8:], atol=1e-5, rtol=0)


def test_autocast_bf16_records_float32_probabilities():
    model = tiny_gpt("sdpa")
    idx = torch.randint(0, 17, (1, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16), record(model, dtype=None) as rec:
        model(idx)
    probs = rec.probs["blocks.0.mixer"]
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, eager_probs_gpt(model, idx)["blocks.0.mixer"], atol=0.05, rtol=0)
