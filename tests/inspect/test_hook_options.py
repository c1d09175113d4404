"""The hook points tell the truth for every option of a GPT (tests/gpt_options.py): listening on the attention
probabilities leaves the logits as they were; those probabilities are causal rows that sum to 1 and equal what
``inspect.record`` rebuilds from the softmax's inputs; and in a standard pre-norm block the stream leaving it is
the stream entering it plus what the mixer and the feed-forward network add."""

from __future__ import annotations

import fnmatch

import pytest
import torch

from attnlab.inspect.record import record
from attnlab.models import GPTConfig
from attnlab.nn.hooks import capture, hook_points
from tests.gpt_options import BASES, CHANGES, SHAPE, built, change_id

POINTS = ("blocks.*.mixer.hook_pattern", "blocks.*.hook_resid_pre", "blocks.*.hook_resid_post",
          "blocks.*.hook_mixer_out", "blocks.*.hook_ffn_out")


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
