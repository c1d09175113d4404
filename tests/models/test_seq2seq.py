"""Tests for the encoder-decoder model (models/seq2seq.py) and its decoding (greedy, beam search)."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F

from attnlab.core.errors import ConfigError
from attnlab.core.schema import from_dict
from attnlab.generation import beam_search, greedy_decode, length_penalty
from attnlab.models import ModelConfig, build_model
from attnlab.models.registry import from_pretrained

VOCAB, BOS, EOS = 23, 1, 2


def make_model(seed: int = 0, **overrides):
    cfg = dict(family="seq2seq", vocab_size=VOCAB, block_size=16, n_layer=2, n_head=4, d_model=32, init_std=0.2,
               attn_backend="eager")
    cfg.update(overrides)
    config = from_dict(ModelConfig, cfg)
    config.validate()
    torch.manual_seed(seed)
    return build_model(config).eval()


def batch(B: int = 3, S: int = 7, T: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (B, S), generator=g)
    lengths = torch.tensor([S, S - 2, S - 4][:B])
    mask = torch.arange(S)[None, :] < lengths[:, None]  # (B, S) True at real tokens
    src = src.masked_fill(~mask, 0)
    tgt = torch.randint(3, VOCAB, (B, T), generator=g)
    return src, mask, tgt


def test_forward_shapes_and_loss_ignores_padding():
    model = make_model()
    src, mask, tgt = batch()
    labels = tgt.clone()
    labels[1, 3:] = -100  # a shorter target
    out = model(src, tgt, src_mask=mask, labels=labels)
    assert out.logits.shape == (3, 5, VOCAB)
    keep = labels != -100
    expected = F.cross_entropy(out.logits[keep], labels[keep])
    torch.testing.assert_close(out.loss, expected)


def test_source_padding_does_not_change_the_output():
    """Extra padding on the source (masked) leaves every logit unchanged."""
    model = make_model()
    src, mask, tgt = batch()
    ref = model(src, tgt, src_mask=mask).logits
    src_pad = torch.cat([src, torch.full((3, 4), 5)], dim=1)  # junk ids in the padded tail
    mask_pad = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    torch.testing.assert_close(model(src_pad, tgt, src_mask=mask_pad).logits, ref, atol=1e-5, rtol=0)


def test_decoder_is_causal():
    model = make_model()
    src, mask, tgt = batch()
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % VOCAB
    a, b = model(src, tgt, src_mask=mask).logits, model(src, changed, src_mask=mask).logits
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope", "none"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_cached_decode_steps_equal_the_full_decoder(positions, backend):
    """decode_step through the self- and static cross-attention caches == the teacher-forced logits."""
    model = make_model(positions=positions, attn_backend=backend, n_kv_head=2, n_decoder_layer=3)
    src, mask, tgt = batch()
    full = model(src, tgt, src_mask=mask).logits  # (B, T, V)
    memory = model.encode(src, mask)
    state = model.start_decoding(memory, mask, max_len=tgt.size(1))
    steps = [model.decode_step(tgt[:, t : t + 1], state) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=0)
    # the encoder keys/values were projected once, on the first step, and kept
    assert all(c.length == src.size(1) for c in state.cross_caches)


def test_post_norm_untied_unshared_variant_trains_a_step():
    model = make_model(norm_position="post", tie_embeddings=False, share_embeddings=False).train()
    assert model.tgt_emb is not model.src_emb and model.lm_head.weight is not model.tgt_emb.weight
    src, mask, tgt = batch()
    out = model(src, tgt, src_mask=mask, labels=tgt)
    out.loss.backward()
    assert model.src_emb.weight.grad is not None and model.tgt_emb.weight.grad is not None


def test_shared_and_tied_embeddings_are_one_tensor():
    model = make_model()
    assert model.src_emb is model.tgt_emb and model.lm_head.weight is model.tgt_emb.weight


def test_save_and_load_round_trip(tmp_path):
    model = make_model(n_decoder_layer=1)
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path)
    src, mask, tgt = batch()
    torch.testing.assert_close(loaded(src, tgt, src_mask=mask).logits, model(src, tgt, src_mask=mask).logits)
    assert len(loaded.decoder) == 1 and len(loaded.encoder) == 2


@pytest.mark.parametrize("bad, message", [
    (dict(mixer="ssm", positions="none"), "model.mixer is not an option of family seq2seq"),
    (dict(positions="alibi"), "'model.positions' must be one of learned, sinusoidal, rope, none; got 'alibi'"),
    (dict(moe_experts=2), "model.moe_experts is not an option of family seq2seq"),
    (dict(n_decoder_layer=0), "n_decoder_layer"),
])
def test_check_config_rejects_unsupported(bad, message):
    with pytest.raises(ConfigError, match=message):
        make_model(**bad)


# ------------------------------------------------------------------------------------ decoding


@pytest.mark.parametrize("decode", ["greedy", "beam"])
def test_cached_decoding_equals_uncached(decode):
    model = make_model(seed=3)
    src, mask, _ = batch(seed=4)
    if decode == "greedy":
        run = lambda cache: greedy_decode(model, src, mask, BOS, EOS, max_len=12, use_cache=cache)  # noqa: E731
    else:
        run = lambda cache: beam_search(model, src, mask, BOS, EOS, max_len=12, beam_size=3,  # noqa: E731
                                        alpha=0.6, use_cache=cache)
    a, b = run(True), run(False)
    assert a.tokens == b.tokens
    assert a.scores == pytest.approx(b.scores, abs=1e-5)


def test_greedy_log_prob_is_the_teacher_forced_log_prob():
    model = make_model(seed=5)
    src, mask, _ = batch()
    out = greedy_decode(model, src, mask, BOS, EOS, max_len=10)
    for b, seq in enumerate(out.tokens):
        tgt_in = torch.tensor([[BOS, *seq]])
        labels = [*seq, EOS] if len(seq) < 10 else seq
        logits = model(src[b : b + 1, : int(mask[b].sum())], tgt_in[:, : len(labels)]).logits
        logp = torch.log_softmax(logits[0], -1)[torch.arange(len(labels)), labels].sum().detach()
        assert out.log_probs[b] == pytest.approx(float(logp), abs=1e-4)


def test_beam_of_one_is_greedy():
    model = make_model(seed=1)
    src, mask, _ = batch(seed=2)
    g = greedy_decode(model, src, mask, BOS, EOS, max_len=12)
    b1 = beam_search(model, src, mask, BOS, EOS, max_len=12, beam_size=1)
    assert b1.tokens == g.tokens
    assert b1.log_probs == pytest.approx(g.log_probs, abs=1e-5)


def test_beam_never_scores_below_greedy_on_random_models():
    for seed in range(3):
        model = make_model(seed=seed, init_std=0.5)
        src, mask, _ = batch(seed=seed)
        g = greedy_decode(model, src, mask, BOS, EOS, max_len=8)
        b = beam_search(model, src, mask, BOS, EOS, max_len=8, beam_size=4)
        # beam runs the decoder on B*K rows, greedy on B: other kernels, so each step's float32 log p may
        # differ in its last bits (a few ulp); over max_len steps that is at most ~max_len * 2 * eps32 relative
        tol = 8 * 2 * torch.finfo(torch.float32).eps
        assert all(bs >= gs - tol * abs(gs) for bs, gs in zip(b.scores, g.scores))


class PlantedModel:
    """A decoder whose next-token distribution depends only on the previous token (hand-written table).

    Vocabulary: 0 pad, 1 BOS, 2 EOS, 3 "A", 4 "B". After BOS: A 0.6, B 0.4. After A: A 0.3, B 0.3,
    EOS 0.4. After B: EOS 0.9, A 0.05, B 0.05. Greedy takes A then EOS: p = 0.6 * 0.4 = 0.24; the best
    sequence is B EOS: p = 0.4 * 0.9 = 0.36, which a beam of 2 finds.
    """

    TABLE: ClassVar[dict[int, dict[int, float]]] = {
        1: {3: 0.6, 4: 0.4}, 3: {3: 0.3, 4: 0.3, 2: 0.4}, 4: {2: 0.9, 3: 0.05, 4: 0.05}}

    def eval(self):
        return self

    def _logits(self, prev: torch.Tensor) -> torch.Tensor:  # prev (N,) -> (N, 5)
        probs = torch.full((prev.size(0), 5), 1e-12)
        for i, p in enumerate(prev.tolist()):
            for tok, q in self.TABLE.get(p, {2: 1.0}).items():
                probs[i, tok] = q
        return probs.log()

    def encode(self, src_ids, src_mask):
        return src_ids.float().unsqueeze(-1)  # (B, S, 1): unused by the table

    def start_decoding(self, memory, memory_mask, max_len):
        return _PlantedState()

    def decode_step(self, tokens, state):
        return self._logits(tokens[:, -1])

    def decode(self, tgt_in, memory, memory_mask):
        return self._logits(tgt_in[:, -1]).unsqueeze(1)


class _PlantedState:
    def reorder(self, index):
        pass


def test_planted_case_beam_beats_greedy():
    model, src = PlantedModel(), torch.zeros(2, 3, dtype=torch.long)
    g = greedy_decode(model, src, None, BOS, EOS, max_len=5)
    assert g.tokens == [[3], [3]]
    assert g.log_probs[0] == pytest.approx(math.log(0.6 * 0.4), abs=1e-6)
    for cache in (True, False):
        b = beam_search(model, src, None, BOS, EOS, max_len=5, beam_size=2, use_cache=cache)
        assert b.tokens == [[4], [4]]
        assert b.log_probs[0] == pytest.approx(math.log(0.4 * 0.9), abs=1e-6)


def test_length_penalty_is_gnmt_and_can_prefer_a_longer_hypothesis():
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx((12 / 6) ** 0.6)
    # log p of "A EOS" = log .24 (|Y| = 2), of "A A B EOS"-like longer ones smaller; with alpha the
    # normalised score of a longer hypothesis rises relative to a short one
    short, long_ = math.log(0.24) / length_penalty(2, 1.0), math.log(0.2) / length_penalty(4, 1.0)
    assert long_ > short
