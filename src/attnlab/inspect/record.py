"""Record attention (and optionally the residual stream) inside any attnlab model, with hooks.

    with record(model, layers=[0, 2], heads=[1], what=("probs", "scores")) as rec:
        model(idx)
    rec.probs["blocks.2.mixer"]      # (B, 1, T, S): head 1 of layer 2

The recorder rides on the hook points of ``attnlab.nn.hooks``. Every ``MultiHeadAttention`` (self- or
cross-attention, in any family) and every ``MultiHeadLatentAttention`` (MLA) passes the exact inputs
of its softmax through its read-only ``hook_scores`` point: q (B, H, T, D) after RoPE, k (B, H_kv,
S, D) after RoPE and the KV cache, the mask, the bias (ALiBi) and ``is_causal``. From them the recorder
recomputes, for the kept layers and heads only,

    scores = q k^T * scale + bias,   masked entries -inf      (B, h, T, S),  scale = 1/sqrt(d_k)
    probs  = softmax(scores)           rows with no visible key are 0

with the eager reference (``scaled_dot_product_attention``) — so the probabilities are the same
whatever backend (eager, sdpa, tiled) runs the model, and the model's own computation is never
touched: its outputs stay bit-identical. Names are the modules' own (``blocks.2.mixer``,
``decoder.0.cross_attn``). The residual stream and the sub-layer outputs come from the blocks'
``hook_resid_pre``/``hook_resid_post`` and ``hook_mixer_out``/``hook_cross_out``/``hook_ffn_out``.

Memory: only the selected layers (``layers``: indices of transformer blocks; or ``modules``:
glob patterns on names) and heads are kept, detached, on ``device`` (default: CPU) in ``dtype``.
If a module runs several times inside the context (decoding with a cache) the last call is kept.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.nn.attention import ScoresHooks, causal_mask, combine_masks
from attnlab.nn.attention.reference import attention_probs
from attnlab.nn.blocks import Block

WHAT: tuple[str, ...] = ("probs", "scores", "residual", "sublayers")
# sub-layer -> the block's hook point of what it adds to the stream (nn/hooks.py)
SUBLAYERS: dict[str, str] = {"mixer": "hook_mixer_out", "cross_attn": "hook_cross_out", "ffn": "hook_ffn_out"}


@dataclass
class Recording:
    """What one ``record`` context captured; every dict is keyed by module name.

    probs, scores: attention module -> (B, h, T, S) for the kept heads ``heads[name]``.
    residual_in, residual: transformer block -> the stream entering / leaving it (B, T, C).
    sublayers: sub-layer module (``blocks.0.mixer``, ``blocks.0.ffn``, ...) -> its output (B, T, C).
    layer: attention module -> index of its block; kind: "self" or "cross"; heads: kept head indices.
    """

    probs: dict[str, Tensor] = field(default_factory=dict)
    scores: dict[str, Tensor] = field(default_factory=dict)
    residual_in: dict[str, Tensor] = field(default_factory=dict)
    residual: dict[str, Tensor] = field(default_factory=dict)
    sublayers: dict[str, Tensor] = field(default_factory=dict)
    layer: dict[str, int] = field(default_factory=dict)
    kind: dict[str, str] = field(default_factory=dict)
    heads: dict[str, list[int]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Attention modules recorded, in model order."""
        return list(self.layer)

    def select(self, kind: str = "self", prefix: str = "") -> list[str]:
        """Names of the recorded attention modules of one kind (and name prefix, e.g. "decoder."), by layer."""
        return [n for n in self.names if self.kind[n] == kind and n.startswith(prefix)]

    def stack(self, kind: str = "self", prefix: str = "") -> Tensor:
        """The probabilities of ``select(kind, prefix)`` stacked: (L, B, h, T, S) (needs equal shapes)."""
        names = self.select(kind, prefix)
        if not names:
            raise KeyError(f"no recorded {kind}-attention probabilities under {prefix!r}")
        return torch.stack([self.probs[n] for n in names])


def block_index(name: str) -> int:
    """The layer number of a module named like ``blocks.3`` or ``decoder.layers.3.cross_attn``: 3
    (0 for a module outside any numbered stack, e.g. a lone attention pooling layer)."""
    numbers = re.findall(r"(?:^|\.)(\d+)(?=\.|$)", name)
    return int(numbers[-1]) if numbers else 0


def _as_list(sel: int | Iterable[int] | None) -> list[int] | None:
    if sel is None:
        return None
    return [sel] if isinstance(sel, int) else [int(i) for i in sel]


def _select_heads(t: Tensor | None, heads: Tensor, H: int) -> Tensor | None:
    """Keep ``heads`` along the head axis (-3) of a mask/bias broadcastable to (B, H, T, S)."""
    if t is None or t.dim() < 3 or t.size(-3) == 1:
        return t
    if t.size(-3) != H:
        raise ValueError(f"mask/bias head axis {t.size(-3)} does not match {H} heads")
    return t.index_select(-3, heads)


def attention_from_qk(
    q: Tensor,
    k: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    heads: list[int] | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Scores and probabilities of the eager reference for the chosen heads, from q and k alone.

    q (B, H, T, D); k (B, H_kv, S, D) with H_kv dividing H (query head h reads key head
    h // (H / H_kv)); mask (bool, True = attend), bias broadcast to (B, H, T, S). Returns
    scores (B, h, T, S) = q k^T * scale + bias (scale default 1 / sqrt(D)) with masked entries -inf,
    and probs (B, h, T, S). Half/bfloat16 inputs (autocast) are computed in float32.
    """
    if q.dtype in (torch.float16, torch.bfloat16):
        with torch.autocast(q.device.type, enabled=False):
            return attention_from_qk(q.float(), k.float(), mask, None if bias is None else bias.float(), is_causal,
                                     heads, scale)
    H, Hkv, T, S = q.size(1), k.size(1), q.size(2), k.size(2)
    idx = torch.arange(H, device=q.device) if heads is None else torch.as_tensor(heads, device=q.device)
    qs = q.index_select(1, idx)  # (B, h, T, D)
    ks = k.index_select(1, idx // (H // Hkv))  # (B, h, S, D): the key head each kept query head reads
    mask, bias = _select_heads(mask, idx, H), _select_heads(bias, idx, H)
    if is_causal:
        mask = combine_masks(mask, causal_mask(T, S, device=q.device))
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    probs = attention_probs(qs, ks, mask, bias, scale)  # exactly as the eager backend computes them
    scores = (qs @ ks.transpose(-2, -1)) * scale  # (B, h, T, S)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores, probs


@contextmanager
def record(
    model: nn.Module,
    layers: int | Iterable[int] | None = None,
    heads: int | Iterable[int] | None = None,
    what: Iterable[str] = ("probs",),
    modules: str | Iterable[str] | None = None,
    device: torch.device | str | None = "cpu",
    dtype: torch.dtype | None = torch.float32,
) -> Iterator[Recording]:
    """Record attention inside ``model`` while the context is open; hooks are removed on exit.

    ``layers``: block indices to keep (None = all); ``heads``: head indices (None = all);
    ``modules``: glob pattern(s) on attention module names (e.g. ``"decoder.*.cross_attn"``);
    ``what``: any of "probs", "scores", "residual", "sublayers"; ``device``/``dtype``: where the
    records are stored (None = leave as computed). Raises ValueError on an unknown ``what`` or a
    selection that matches no attention module.
    """
    what = tuple(what)
    bad = [w for w in what if w not in WHAT]
    if bad:
        raise ValueError(f"unknown record item(s) {bad}; choose from {WHAT}")
    keep_layers, keep_heads = _as_list(layers), _as_list(heads)
    patterns = [modules] if isinstance(modules, str) else (list(modules) if modules is not None else None)
    rec = Recording()

    def store(t: Tensor) -> Tensor:
        return t.detach().to(device=device if device is not None else t.device, dtype=dtype or t.dtype)

    def wanted(name: str, by_pattern: bool = True) -> bool:
        if keep_layers is not None and block_index(name) not in keep_layers:
            return False
        return not by_pattern or patterns is None or any(fnmatch.fnmatchcase(name, p) for p in patterns)

    handles = []
    for name, module in model.named_modules():
        if isinstance(module, ScoresHooks) and wanted(name) and ("probs" in what or "scores" in what):
            H = module.n_heads
            kept = list(range(H)) if keep_heads is None else keep_heads
            if any(not 0 <= h < H for h in kept):
                raise ValueError(f"heads {kept} out of range for {name} with {H} heads")
            rec.layer[name], rec.heads[name] = block_index(name), kept
            rec.kind[name] = "cross" if getattr(module, "cross", False) else "self"

            def on_scores(mod, q, k, mask, bias, is_causal, scale, name=name, kept=kept):
                with torch.no_grad():
                    scores, probs = attention_from_qk(q, k, mask, bias, is_causal, kept, scale)
                if "probs" in what:
                    rec.probs[name] = store(probs)
                if "scores" in what:
                    rec.scores[name] = store(scores)

            handles.append(module.register_scores_hook(on_scores))
        elif isinstance(module, Block) and wanted(name, by_pattern=False):  # the block's hook points
            points = []
            if "residual" in what:
                points += [(module.hook_resid_pre, rec.residual_in, name), (module.hook_resid_post, rec.residual, name)]
            if "sublayers" in what:
                points += [(getattr(module, point), rec.sublayers, f"{name}.{child}")
                           for child, point in SUBLAYERS.items() if hasattr(module, point)]
            for point, into, key in points:
                def on_point(mod, args, output, into=into, key=key):
                    into[key] = store(output)

                handles.append(point.register_forward_hook(on_point))
    if not handles:
        raise ValueError(f"nothing to record: no attention module matches layers={keep_layers} modules={patterns}")
    try:
        yield rec
    finally:
        for handle in handles:
            handle.remove()
