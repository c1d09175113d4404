"""The hook points tell the truth for every option of a GPT (tests/gpt_options.py), and for BERT and seq2seq on a
padded batch: listening on the attention probabilities leaves the outputs as they were; those probabilities equal
what ``inspect.record`` rebuilds from the softmax's inputs, are causal rows that sum to 1 (GPT) and give no padded
key any probability (BERT, seq2seq); and in a standard pre-norm block the stream leaving it is the stream entering it
plus what the mixer and the feed-forward network (and, where it has one, the Engram memory) add."""

from __future__ import annotations

import fnmatch

import pytest
import torch

from attnlab.inspect.record import record
from attnlab.models import GPTConfig
from attnlab.nn.hooks import capture, hook_points
from tests.gpt_options import BASES, CHANGES, SHAPE, built, change_id

POINTS = ("blocks.*.mixer.hook_pattern", "blocks.*.hook_resid_pre", "blocks.*.hook_resid_post",
          "blocks.*.hook_mixer_out", "blocks.*.hook_ffn_out", "blocks.*.hook_engram_out")


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("change", CHANGES, ids=change_id)
def test_hook_points_tell_the_truth(base, change):
    model = built(GPTConfig(**{**SHAPE, **BASES[base], **change}))
    c = model.config
    idx = torch.randint(0, c.vocab_size, (2, c.block_size), generator=torch.Generator().manual_seed(1))
    names = list(hook_points(model))
    present = [p for p in POINTS if fnmatch.filter(names, p)]
    with torch.no_grad():
        plain = model(idx).logits
        with capture(model, *present) as seen:
            listened = model(idx).logits  # a hook on hook_pattern sends attention down the eager path
        torch.testing.assert_close(listened, plain, rtol=1e-5, atol=1e-5)  # two kernels' float32 rounding
        if c.residual == "standard" and c.norm_position == "pre":
            for i in range(c.n_layer):
                b = f"blocks.{i}."
                added = seen[b + "hook_resid_pre"] + seen[b + "hook_mixer_out"] + seen[b + "hook_ffn_out"]
                if b + "hook_engram_out" in seen:  # an Engram block: x + Engram(Norm(x), ids) before the mixer
                    added = added + seen[b + "hook_engram_out"]
                torch.testing.assert_close(seen[b + "hook_resid_post"], added, rtol=1e-5, atol=1e-5)
        patterns = {k.removesuffix(".hook_pattern"): v for k, v in seen.items() if k.endswith("hook_pattern")}
        if not patterns:
            assert c.mixer == "ssm"  # no attention anywhere
            return
        with record(model, what=("probs",)) as rec:
            assert torch.equal(model(idx).logits, plain)  # the recorder reads, and changes nothing
    assert set(rec.probs) == set(patterns)
    for name, probs in rec.probs.items():
        pattern = patterns[name]  # (B, H, T, S)
        T, S = pattern.shape[-2:]
        assert (pattern - probs).abs().max().item() < 1e-5
        assert (pattern.sum(-1) - 1).abs().max().item() < 1e-5
        assert pattern[..., torch.ones(T, S, dtype=torch.bool).triu(1)].abs().max().item() == 0


ENCODER_CHANGES = [{}, *({"positions": p} for p in ("sinusoidal", "rope", "alibi", "relative", "none")),
                   {"norm_position": "post"}, {"qk_norm": True}, {"n_kv_head": 2}, {"attn_backend": "eager"},
                   {"attn_backend": "tiled"}, {"norm": "rmsnorm"}]


@pytest.mark.parametrize("family", ["bert", "seq2seq"])
@pytest.mark.parametrize("change", ENCODER_CHANGES, ids=change_id)
def test_with_padding_the_patterns_are_the_models_own_and_never_see_a_padded_key(family, change):
    """BERT and seq2seq (self-, causal and cross-attention) on a batch whose second source is padded: listening
    changes nothing, ``record`` equals ``hook_pattern``, and no query gives a padded key any probability."""
    from attnlab.models import BertConfig, Seq2SeqConfig

    shape = {"vocab_size": 40, "block_size": 24, "n_layer": 2, "n_head": 4, "d_model": 32}
    model = built((BertConfig if family == "bert" else Seq2SeqConfig)(**{**shape, **change}))
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(0, 40, (2, 20), generator=gen)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 13:] = 0
    if family == "bert":
        def run():
            return model(src, attention_mask=mask).hidden_states
    else:
        tgt = torch.randint(0, 40, (2, 24), generator=gen)

        def run():
            return model(src, tgt, mask.bool()).logits
    with torch.no_grad():
        plain = run()
        with capture(model, *fnmatch.filter(list(hook_points(model)), "*hook_pattern")) as seen:
            torch.testing.assert_close(run(), plain, rtol=1e-5, atol=1e-5)
        with record(model, what=("probs",)) as rec:
            assert torch.equal(run(), plain)
    assert {f"{name}.hook_pattern" for name in rec.probs} == set(seen)
    for name, probs in rec.probs.items():
        pattern = seen[f"{name}.hook_pattern"]
        assert (pattern - probs).abs().max().item() < 1e-5
        if not name.startswith("decoder.") or "cross_attn" in name:  # keys from the padded source
            assert pattern[1, :, :, 13:].abs().max().item() == 0
