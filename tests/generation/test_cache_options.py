"""Decoding with the KV cache gives the full forward's logits for every option of a GPT (tests/gpt_options.py):
the whole sequence at once, in uneven pieces, and one token at a time."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import GPTConfig
from tests.gpt_options import BASES, CHANGES, SHAPE, built, change_id


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("change", CHANGES, ids=change_id)
def test_cached_decoding_equals_the_full_forward(base, change):
    model = built(GPTConfig(**{**SHAPE, **BASES[base], **change}))
    T = model.config.block_size
    idx = torch.randint(0, model.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx).logits
        for pieces in ([T], [7, 1, 1, 5, T - 14], [1] * T):
            cache, logits, t = model.new_cache(2), [], 0
            for n in pieces:
                logits.append(model(idx[:, t:t + n], cache=cache).logits)
                t += n
            assert (torch.cat(logits, 1) - full).abs().max().item() < 1e-4, pieces
