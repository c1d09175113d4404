"""Beam search for a decoder-only model: keep the K prefixes of highest total log-probability.

    score(y_1..y_t) = sum_i log p(y_i | prompt, y_<i)          (repetition penalty applied to the logits first)
    step: extend each of the K beams by every token, keep the K best of the K * V candidates

With no end-of-sequence token every beam has the same length, so any length normalisation ranks them
the same way, and the result equals ``transformers``' ``generate(num_beams=K, do_sample=False)`` (tested).
Each step re-runs the model over the last ``block_size`` tokens of every beam (no cache: the caches of
the mixers (attention, SSM, latent) would each need re-ordering, and beams are for short outputs).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.generation.processors import repetition_penalty


@torch.no_grad()
def beam_generate(model, idx: Tensor, num_beams: int, max_new_tokens: int, penalty: float = 1.0) -> Tensor:
    """idx (B, T) -> (B, T + max_new_tokens): the prompt followed by each row's best beam."""
    model.eval()
    B = idx.size(0)
    K, block = num_beams, model.config.block_size
    seqs = idx.repeat_interleave(K, dim=0)  # (B K, T)
    scores = torch.full((B, K), float("-inf"), device=idx.device)
    scores[:, 0] = 0.0  # all beams start as the prompt: only the first may expand at step one
    for _ in range(max_new_tokens):
        logits = model(seqs[:, -block:], last_only=True).logits[:, -1].float()  # (B K, V)
        logp = torch.log_softmax(repetition_penalty(logits, seqs, penalty), dim=-1)
        V = logp.size(-1)
        total = (scores.reshape(B * K, 1) + logp).reshape(B, K * V)  # (B, K V)
        scores, flat = total.topk(K, dim=-1)  # (B, K), sorted best first
        beam, token = flat // V, flat % V
        rows = (torch.arange(B, device=idx.device).unsqueeze(1) * K + beam).reshape(-1)  # (B K,)
        seqs = torch.cat([seqs[rows], token.reshape(-1, 1)], dim=1)
    return seqs.reshape(B, K, -1)[:, 0]
