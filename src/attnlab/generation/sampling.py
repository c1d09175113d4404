"""Autoregressive generation: greedy, temperature, top-k, top-p (nucleus) and min-p sampling with a
KV cache, a repetition penalty, and beam search (``generation/beam.py``).

At each step the model gives logits z over the vocabulary for the next token, processed in the order
``transformers`` applies them:

    z_v <- z_v / r if z_v > 0 else z_v * r,  for every token v already in the sequence   (repetition, r)
    p = softmax(z / temperature),   restricted to the k most likely tokens (top-k), to the smallest
                                    set whose probability reaches top_p (nucleus), and to the tokens
                                    with p_v >= min_p * max_u p_u (min-p)

then draws from p (or takes the argmax at temperature 0, after the repetition penalty). A temperature is 0 or
at least MIN_TEMPERATURE (1e-4): below it z / temperature leaves the range of a float, and the draw is the
argmax anyway. A top_p as small as a float allows keeps the most likely token (the nucleus is never empty). The
repetition penalty r is in REPETITION_PENALTY_RANGE (1e-3 to 1e3).

With the cache, the prompt is run once (prefill) and each later step feeds one token; the
output is identical to re-running the whole sequence every step (tested). ``compile=True`` runs
the cached steps through ``torch.compile`` (inductor with its C++ wrapper; dynamic in the prompt and
cache lengths, so it compiles two graphs per model: the prefill and the one-token step), which
removes most of the per-operator overhead that dominates small models at batch 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.generation.processors import filter_logits, repetition_penalty

MAX_NEW_TOKENS = 100_000  # tokens one call generates (at 1 ms a token, about 2 minutes)
MIN_TEMPERATURE = 1e-4  # the smallest temperature > 0: below it sampling is greedy, and z / T overflows
REPETITION_PENALTY_RANGE = (1e-3, 1e3)  # beyond it z / r overflows (a penalty of 1e-300 is a division by 0)


@dataclass
class SamplingConfig:
    """How to generate: length, temperature (0 = greedy), top-k, top-p, min-p, repetition penalty, beams, cache,
    seed, compile."""
    max_new_tokens: int = 200
    temperature: float = 1.0  # 0 = greedy (argmax)
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None  # keep tokens with p >= min_p * the top token's p (Nguyen et al. 2024)
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the sequence (Keskar et al. 2019)
    num_beams: int = 1  # > 1: beam search (deterministic; temperature and the filters do not apply)
    use_cache: bool = True
    seed: int | None = None
    compile: bool = False  # torch.compile the cached one-token decode step (first call compiles)

    def validate(self) -> None:
        """Range checks; ConfigError (one line) naming the option."""
        import math

        from attnlab.core.errors import ConfigError

        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):  # nan passes every comparison below
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and math.isfinite(value)):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        for name in ("max_new_tokens", "top_k", "num_beams"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
        if not 0 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ConfigError(f"max_new_tokens must be 0 to {MAX_NEW_TOKENS:,} (a generation would run for hours "
                              f"beyond), got {self.max_new_tokens:,}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ConfigError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {self.temperature:g}; "
                              "use 0 for the most likely token at each step")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"min_p must be in [0, 1], got {self.min_p}")
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            raise ConfigError(f"repetition_penalty must be in [{low:g}, {high:g}] (1 = none, > 1 discourages "
                              f"repeats), got {self.repetition_penalty:g}")
        if self.num_beams < 1:
            raise ConfigError(f"num_beams must be >= 1, got {self.num_beams}")


def next_token(
    logits: Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None, seq: Tensor | None = None
) -> Tensor:
    """Pick the next token (B, 1) from the final-position logits (B, V); ``seq`` (B, T): the sequence so far."""
    if seq is not None:
        logits = repetition_penalty(logits.float(), seq, cfg.repetition_penalty)
    if cfg.temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = filter_logits(logits.float() / cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


def _decode_step(model, token: Tensor, cache: list) -> Tensor:
    """One cached step: token (B, 1) -> final-position logits (B, V)."""
    return model(token, cache=cache, last_only=True).logits[:, -1]


_compiled_decode_step: Callable | None = None


def compiled_decode_step() -> Callable:
    """``_decode_step`` through torch.compile, built once per process (graphs are cached per model)."""
    global _compiled_decode_step
    if _compiled_decode_step is None:
        # cpp_wrapper: the compiled graph is called from generated C++ rather than Python, one call per
        # graph instead of one per kernel (faster for small models; docs/benchmarks.md)
        _compiled_decode_step = torch.compile(_decode_step, dynamic=True, options={"cpp_wrapper": True})
    return _compiled_decode_step


@torch.no_grad()
def stream(model, idx: Tensor, cfg: SamplingConfig) -> Iterator[Tensor]:
    """Yield each new token (B, 1) as it is produced. idx (B, T) is the prompt.

    Within the context (block_size) every step after the prefill feeds one token through the
    cache. Once the sequence outgrows the context, each step re-runs the last block_size tokens
    (a sliding window), exactly as the uncached path does.
    """
    model.eval()
    block = model.config.block_size
    if idx.size(1) > block:
        raise ValueError(f"prompt has {idx.size(1)} tokens; the model's context is {block}")
    if idx.size(1) == 0:
        raise ValueError("prompt is empty: give at least one token")
    generator = None
    if cfg.seed is not None:
        generator = torch.Generator(device=idx.device).manual_seed(cfg.seed)
    cache = model.new_cache(idx.size(0)) if cfg.use_cache else None
    decode = compiled_decode_step() if cfg.compile and cache is not None else _decode_step
    seq = idx
    step_input = idx
    for _ in range(cfg.max_new_tokens):
        if cache is not None and seq.size(1) <= block:
            logits = decode(model, step_input, cache)  # (B, V); the prefill too (a second graph)
        else:
            logits = model(seq[:, -block:], last_only=True).logits[:, -1]
        token = next_token(logits, cfg, generator, seq)  # (B, 1)
        seq = torch.cat([seq, token], dim=1)
        step_input = token
        yield token


def generate(model, idx: Tensor, cfg: SamplingConfig, on_token: Callable[[Tensor], None] | None = None) -> Tensor:
    """Return the prompt followed by ``cfg.max_new_tokens`` generated tokens, (B, T + N)."""
    if cfg.num_beams > 1:
        from attnlab.generation.beam import beam_generate

        return beam_generate(model, idx, cfg.num_beams, cfg.max_new_tokens, cfg.repetition_penalty)
    tokens = [idx]
    for token in stream(model, idx, cfg):
        tokens.append(token)
        if on_token is not None:
            on_token(token)
    return torch.cat(tokens, dim=1)
