"""Named hook points: one way to look inside any model, and to change what flows through it.

A ``HookPoint`` is the identity, x -> x, placed where something is worth looking at (TransformerLens's
design, and its names where the meaning is the same). PyTorch forward hooks on it read the tensor, and
a hook that returns a tensor replaces it, so the rest of the model computes with the replacement
(ablation, patching). The points, by module name:

    blocks.{i}.hook_resid_pre          (B, T, C)     the stream entering block i
    blocks.{i}.norm_mixer.hook_scale   (B, T, 1)     the norm's divisor s (TransformerLens's ln1.hook_scale) *
    blocks.{i}.norm_mixer.hook_normalized (B, T, C)  (x - mean) / s, before gamma and beta *
    blocks.{i}.mixer.hook_q / hook_k / hook_v  (B, H, T, D)  the projections split into heads
    blocks.{i}.mixer.hook_attn_scores  (B, H, T, S)  q k^T / sqrt(D) + bias, masked entries -inf *
    blocks.{i}.mixer.hook_pattern      (B, H, T, S)  attention probabilities (each row sums to 1, or is 0) *
    blocks.{i}.mixer.hook_z            (B, H, T, D)  each head's output, before W_O mixes the heads
    blocks.{i}.mixer.hook_result       (B, H, T, C)  each head's write into the stream, z_h W_O^h *
    blocks.{i}.mixer.hook_scores       (q, k, mask, bias, is_causal, scale): the exact inputs of the softmax,
                                       whatever the backend; read-only (``inspect.record`` rebuilds the
                                       probabilities from them without changing which kernel runs)
    blocks.{i}.hook_mixer_out          (B, T, C)     what the token mixer adds to the stream (after dropout);
                                                     also answers to TransformerLens's ``hook_attn_out``
    blocks.{i}.hook_resid_mid          (B, T, C)     the stream between the two sub-layers
    blocks.{i}.norm_ffn.hook_scale / hook_normalized  as for norm_mixer (TransformerLens's ln2) *
    blocks.{i}.ffn.hook_pre            (B, T, d_ff)  x W_1 + b_1, before the activation (TransformerLens's mlp.hook_pre)
    blocks.{i}.ffn.hook_post           (B, T, d_ff)  after it, what W_2 reads
    blocks.{i}.hook_ffn_out            (B, T, C)     what the feed-forward network adds; also ``hook_mlp_out``
    blocks.{i}.hook_cross_out          (B, T, C)     what cross-attention adds (decoder blocks)
    blocks.{i}.engram.hook_gate        (B, T, 1)     an Engram layer's context gate alpha_t in (0, 1) (``nn/engram.py``)
    blocks.{i}.hook_engram_out         (B, T, C)     what the Engram memory adds, before the mixer (Engram blocks)
    blocks.{i}.hook_resid_post         (B, T, C)     the stream leaving block i
    norm_f.hook_scale / hook_normalized               the final norm (TransformerLens's ln_final) *

(seq2seq: ``encoder.{i}...``, ``decoder.{i}...``, and ``decoder.{i}.cross_attn.hook_pattern``). The points
marked * are formed only while a hook listens (``FORMED_WHEN_HOOKED``): the fused attention kernels never
form the scores or probabilities, nor the fused norms s, and the per-head writes cost a (B, H, T, C)
tensor; a layer with a hook on one takes its written-out path instead, so what the hook sees (or writes)
is what the output is computed from. Every other point is on the path the layer always computes, and
costs nothing while nothing listens. A model-level residual scheme (hyper-connections, mHC, attention
residuals) does not call whole blocks, so ``hook_resid_pre/mid/post`` stay silent there; the sub-layer
outputs still fire. ``docs/lens.md`` has the full table against TransformerLens's names and shapes.

    with capture(model, "blocks.*.mixer.hook_pattern") as seen:
        model(idx)
    seen["blocks.0.mixer.hook_pattern"]            # (B, H, T, T)

    with hooks(model, {"blocks.2.mixer.hook_z": lambda z, name: z.index_fill(1, torch.tensor([3]), 0.0)}):
        logits = model(idx).logits                 # head 3 of layer 2 ablated (zeroed)
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

from torch import Tensor, nn

HookFn = Callable[[Tensor, str], Tensor | None]  # (tensor, hook point name) -> replacement or None

# points whose tensor a layer forms only while a hook listens (it then computes the equation written out)
FORMED_WHEN_HOOKED: tuple[str, ...] = ("hook_attn_scores", "hook_pattern", "hook_result", "hook_scale",
                                       "hook_normalized")
# TransformerLens's names for points attnlab names otherwise: alias -> attnlab's name (the last part of a name)
ALIASES: dict[str, str] = {"hook_attn_out": "hook_mixer_out", "hook_mlp_out": "hook_ffn_out"}


class HookPoint(nn.Module):
    """The identity at a named point of the computation; hooks registered on it read or replace x."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    @property
    def active(self) -> bool:
        """Whether any hook is attached (a layer may then take a slower path that forms this tensor)."""
        return bool(self._forward_hooks or self._forward_pre_hooks)


class ScoresPoint(HookPoint):
    """A read-only hook point for the inputs of attention's softmax: (q, k, mask, bias, is_causal, scale),
    q (B, H, T, D) and k (B, H_kv, S, D) after RoPE and the cache. The layer ignores what it returns,
    so a hook here can look but not change; reading it leaves the layer on its fast kernel."""

    def forward(self, q: Tensor, k: Tensor, mask: Tensor | None, bias: Tensor | None, is_causal: bool,
                scale: float) -> tuple:
        return q, k, mask, bias, is_causal, scale


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` by name, in model order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}


def aliased_points(model: nn.Module) -> dict[str, HookPoint]:
    """The points that answer to an alias of ``ALIASES``, by the aliased name (``blocks.0.hook_attn_out``)."""
    renamed = {attnlab: alias for alias, attnlab in ALIASES.items()}
    out = {}
    for name, point in hook_points(model).items():
        stem, _, last = name.rpartition(".")
        if last in renamed:
            out[f"{stem}.{renamed[last]}" if stem else renamed[last]] = point
    return out


def _matching(model: nn.Module, patterns: Iterable[str]) -> dict[str, list[tuple[str, HookPoint]]]:
    """Each pattern's (name, point) pairs; a pattern that matches no point's own name is tried on the aliases
    (``ALIASES``), and its hooks then receive the aliased name."""
    points = hook_points(model)
    found: dict[str, list[tuple[str, HookPoint]]] = {}
    for pattern in patterns:
        if pattern in points:  # a plain name
            found[pattern] = [(pattern, points[pattern])]
            continue
        found[pattern] = [(n, p) for n, p in points.items() if fnmatch.fnmatchcase(n, pattern)]
        if not found[pattern]:
            found[pattern] = [(n, p) for n, p in aliased_points(model).items() if fnmatch.fnmatchcase(n, pattern)]
        if not found[pattern]:
            example = next(iter(points), "none")
            raise KeyError(f"no hook point matches {pattern!r} (this model has {len(points)}, e.g. {example!r})")
    return found


@contextmanager
def hooks(model: nn.Module, fns: Mapping[str, HookFn]) -> Iterator[None]:
    """Attach ``fn(x, name)`` to every hook point whose name matches a pattern (fnmatch: ``*``, ``?``)
    for the duration of the block; a function that returns a tensor replaces x. Removed on exit."""
    handles = []
    try:
        for pattern, points in _matching(model, fns).items():
            fn = fns[pattern]
            for name, point in points:
                handles.append(point.register_forward_hook(lambda m, args, out, fn=fn, name=name: fn(out, name)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def capture(model: nn.Module, *patterns: str, detach: bool = True) -> Iterator[dict[str, Tensor]]:
    """Record what flows through the matching hook points: a dict name -> tensor, filled as the model
    runs (a point that runs several times, as in decoding with a cache, keeps its last tensor)."""
    seen: dict[str, Tensor] = {}

    def keep(x: Tensor | tuple, name: str) -> None:
        if isinstance(x, tuple):  # a ScoresPoint's inputs
            seen[name] = tuple(t.detach() if detach and isinstance(t, Tensor) else t for t in x)
        else:
            seen[name] = x.detach() if detach else x

    with hooks(model, {pattern: keep for pattern in patterns}):
        yield seen
