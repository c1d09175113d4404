"""Encoder-decoder decoding: greedy and beam search through the decoder's caches.

For a model with the encoder-decoder interface (attnlab.models.seq2seq.Seq2Seq):
  encode(src_ids, src_mask) -> (memory, _)                 run once per source
  start_decoding(memory, memory_mask, max_len) -> state    empty self/cross KV caches
  decode_step(tokens (N, 1), state) -> logits (N, V)       one token per row through the caches
  decode(tgt_in (N, T), memory, memory_mask) -> (logits (N, T, V), ...)   the uncached reference
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Decoded:
    """Decoded target ids per source (BOS and EOS removed), their total log-probability
    sum_t log p(y_t | y_<t, x) (EOS included when emitted), and the length-normalised score."""

    tokens: list[list[int]]
    log_probs: list[float]
    scores: list[float]


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016); a hypothesis scores log p(Y) / lp(Y)."""
    return ((5.0 + length) / 6.0) ** alpha


class _Stepper:
    """Next-token logits for N growing target prefixes: through the caches, or (use_cache=False)
    by re-running the decoder over each whole prefix (the reference the cache is tested against)."""

    def __init__(self, model, memory: Tensor, memory_mask: Tensor | None, max_len: int, use_cache: bool) -> None:
        self.model, self.memory, self.memory_mask = model, memory, memory_mask
        self.state = model.start_decoding(memory, memory_mask, max_len) if use_cache else None
        self.prefix: Tensor | None = None  # (N, t) tokens fed so far, uncached path only

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (N, 1) -> log-probabilities of the next token (N, V), in float32."""
        if self.state is not None:
            logits = self.model.decode_step(tokens, self.state)
        else:
            self.prefix = tokens if self.prefix is None else torch.cat([self.prefix, tokens], dim=1)
            logits = self.model.decode(self.prefix, self.memory, self.memory_mask)[:, -1]
        return torch.log_softmax(logits.float(), dim=-1)  # (N, V)

    def reorder(self, index: Tensor) -> None:
        if self.state is not None:
            self.state.reorder(index)
        else:
            self.memory = self.memory.index_select(0, index)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, index)
            if self.prefix is not None:
                self.prefix = self.prefix.index_select(0, index)


@torch.no_grad()
def greedy_decode(
    model, src_ids: Tensor, src_mask: Tensor | None, bos_id: int, eos_id: int, max_len: int,
    use_cache: bool = True, alpha: float = 0.0,
) -> Decoded:
    """y_t = argmax_v p(v | y_<t, x) until EOS or ``max_len`` tokens, for a batch of sources (B, S).

    ``alpha`` only affects the reported ``scores`` (log p / lp(|Y|)), so they compare with beam search's.
    """
    model.eval()
    B = src_ids.size(0)
    memory = model.encode(src_ids, src_mask)  # (B, S, C)
    stepper = _Stepper(model, memory, src_mask, max_len, use_cache)
    tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=src_ids.device)
    out: list[list[int]] = [[] for _ in range(B)]
    log_probs = [0.0] * B
    done = [False] * B
    for _ in range(max_len):
        logp = stepper.step(tokens)  # (B, V)
        best_lp, best = logp.max(dim=-1)  # (B,), (B,)
        for b, (tok, lp) in enumerate(zip(best.tolist(), best_lp.tolist())):
            if done[b]:
                continue
            log_probs[b] += lp
            if tok == eos_id:
                done[b] = True
            else:
                out[b].append(tok)
        if all(done):
            break
        tokens = best.unsqueeze(1)  # (B, 1)
    scores = [lp / length_penalty(len(seq) + done[b], alpha) for b, (seq, lp) in enumerate(zip(out, log_probs))]
    return Decoded(out, log_probs, scores)


@torch.no_grad()
def beam_search(
    model, src_ids: Tensor, src_mask: Tensor | None, bos_id: int, eos_id: int, max_len: int,
    beam_size: int = 4, alpha: float = 0.0, use_cache: bool = True,
) -> Decoded:
    """Beam search over a batch of sources (B, S): keep the ``beam_size`` most probable prefixes.

    Each step extends every live prefix by every token, scores log p(prefix) + log p(v | prefix),
    and keeps the best 2K candidates: those ending in EOS (among the top K) become finished
    hypotheses scored log p(Y) / lp(|Y|) (``alpha`` = GNMT length penalty; 0 = raw log-probability),
    the best K others stay alive (the caches follow them by ``reorder``). A source is done when its
    best finished score beats every live prefix normalised at the current length (exact for alpha=0,
    since log-probabilities only fall); at ``max_len`` the live prefixes are finished as they stand.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    model.eval()
    B, K, device = src_ids.size(0), beam_size, src_ids.device
    memory = model.encode(src_ids, src_mask)  # (B, S, C)
    memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, C): row b*K + k is beam k of source b
    mask = src_mask.repeat_interleave(K, dim=0) if src_mask is not None else None
    stepper = _Stepper(model, memory, mask, max_len, use_cache)
    # prefix log-probabilities add up in float64, as greedy_decode's Python floats do, so one hypothesis
    # gets one score whichever search found it
    alive = torch.full((B, K), float("-inf"), dtype=torch.float64, device=device)
    alive[:, 0] = 0.0  # all beams start as the same empty prefix: keep only one of them
    seqs: list[list[int]] = [[] for _ in range(B * K)]
    finished: list[list[tuple[float, float, list[int]]]] = [[] for _ in range(B)]  # (score, log p, tokens)
    done = [False] * B
    tokens = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
    for t in range(max_len):
        logp = stepper.step(tokens)  # (B*K, V)
        V = logp.size(-1)
        cand = (alive.view(B * K, 1) + logp.double()).view(B, K * V)  # (B, K*V) prefix log p + next token
        top_lp, top_idx = cand.topk(min(2 * K, K * V), dim=-1)  # (B, 2K)
        new_alive = torch.full((B, K), float("-inf"), dtype=torch.float64, device=device)
        rows = torch.arange(B * K, device=device)  # default: keep a row where it is (dead rows)
        next_tok = torch.full((B * K,), eos_id, dtype=torch.long, device=device)
        new_seqs: list[list[int]] = [[] for _ in range(B * K)]
        for b in range(B):
            if done[b]:
                continue
            n = 0
            for rank, (lp, idx) in enumerate(zip(top_lp[b].tolist(), top_idx[b].tolist())):
                if lp == float("-inf") or n == K:
                    break
                beam, tok = divmod(idx, V)
                row = b * K + beam
                if tok == eos_id:
                    if rank < K:  # an EOS outside the top K would not have survived the beam
                        seq = seqs[row]
                        finished[b].append((lp / length_penalty(len(seq) + 1, alpha), lp, seq))
                    continue
                new_alive[b, n] = lp
                rows[b * K + n] = row
                next_tok[b * K + n] = tok
                new_seqs[b * K + n] = seqs[row] + [tok]
                n += 1
            if finished[b]:
                best_done = max(f[0] for f in finished[b])
                best_alive = max(new_alive[b].tolist())
                if best_alive == float("-inf") or best_done >= best_alive / length_penalty(t + 1, alpha):
                    done[b] = True
        alive, seqs = new_alive, new_seqs
        if all(done):
            break
        stepper.reorder(rows)
        tokens = next_tok.unsqueeze(1)  # (B*K, 1)
    for b in range(B):
        if not done[b]:  # out of steps: the live prefixes compete as they are
            for k in range(K):
                lp = float(alive[b, k])
                if lp > float("-inf"):
                    seq = seqs[b * K + k]
                    finished[b].append((lp / length_penalty(len(seq), alpha), lp, seq))
    best = [max(f, key=lambda h: h[0]) for f in finished]
    return Decoded([h[2] for h in best], [h[1] for h in best], [h[0] for h in best])
