"""The routes to the attention that the eager reference (``reference.py``) specifies: one table.

    ROUTES[name] = Route(function, serves, supports, instead)

    eager       the reference itself, probabilities formed (grouped key/value heads repeated)
    sdpa        PyTorch's fused kernel (flash / memory-efficient), with attnlab's rules for empty rows
    tiled       attnlab's exact block-tiled kernel with an online softmax (``tiled.py``)
    bmm         batched matmuls that keep the probabilities (``bmm.py``)             stands in for sdpa
    sdpa-fp32   sdpa on float32 copies, for CPU half precision and narrow heads      stands in for sdpa
    gqa-decode  one decoding query per head: a group's query heads as rows           stands in for sdpa

Every route computes softmax(Q K^T * scale + bias, masked) V for q (B, H, T, D), k (B, H_kv, S, D),
v (B, H_kv, S, Dv) -> (B, H, T, Dv), and is tested against ``reference.scaled_dot_product_attention`` to 1e-5 in
float32, forward and backward, with and without masks.

A model names the route it asks for (``attn_backend``: ``CHOICES``). Which route computes a call is decided by
one rule, ``route_for``: the first route that stands in for the one asked for (``STANDS_IN``) and serves the
call; else the one asked for, if it serves the call; else, by the same rule, the route it names as ``instead``.
Routes outside ``nn`` (attnlab's C++ kernel, ``attnlab.cpu``) join the table with ``register``; adding a route
touches the table and its test only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.core.errors import ConfigError
from attnlab.nn.attention.bmm import bmm_attention, use_bmm_attention
from attnlab.nn.attention.reference import causal_mask, combine_masks, scaled_dot_product_attention

# what a route may be asked to compute besides causal self-attention with one key/value head per head
FEATURES: dict[str, str] = {
    "bidirectional": "attention both ways (an encoder)",
    "mask": "padding masks",
    "bias": "additive score terms (ALiBi, relative positions)",
    "dropout": "dropout on the probabilities",
    "gqa": "fewer key/value heads than heads",
    "latent": "multi-head latent attention",
}
ALL = frozenset(FEATURES)

# fn(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> out; serves(...) -> whether it computes it
AttentionFn = Callable[..., Tensor]


@dataclass(frozen=True)
class Route:
    """One way to compute attention: ``function`` for the calls ``serves`` accepts (both take the arguments of
    ``attend`` but ``name``), ``supports`` the FEATURES a model may use with it, ``head_dim_multiple`` the head
    sizes it computes, and ``instead`` the route that computes the calls it does not serve."""

    function: AttentionFn
    serves: Callable[..., bool]
    supports: frozenset[str] = ALL
    head_dim_multiple: int = 1
    instead: str | None = None
    doc: str = ""


def _everything(*args: object) -> bool:
    return True


def _eager(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> Tensor:
    """The reference; grouped key/value heads repeated out to every query head."""
    if enable_gqa:  # each group of H/H_kv query heads reads one key/value head
        k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)  # (B, H, S, D)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), dim=-3)
    if is_causal:
        mask = combine_masks(mask, causal_mask(q.size(-2), k.size(-2), device=q.device))
    return scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, scale=scale, dropout_p=dropout_p)[0]


def _sdpa(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> Tensor:
    """PyTorch's fused kernel. ``is_causal`` lets it skip the masked half when there is no other mask or bias;
    a fully masked row is given a dummy key and zeroed afterwards, matching the eager reference. With
    ``enable_gqa`` each group of query heads reads its shared key/value head without copying it out."""
    T, S = q.size(-2), k.size(-2)
    if is_causal and T == 1:
        is_causal = False  # one query at the end of the sequence sees every key
    if is_causal and mask is None and bias is None and T == S:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale,
                                              enable_gqa=enable_gqa)
    if is_causal:
        mask = combine_masks(mask, causal_mask(T, S, device=q.device))
    has_key = None
    if mask is not None:
        has_key = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
        mask = mask | ~has_key  # a dummy "attend everything" for empty rows, zeroed below
    attn_mask: Tensor | None = mask
    if bias is not None:
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale,
                                         enable_gqa=enable_gqa)
    return out if has_key is None else out * has_key


def _tiled(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> Tensor:
    from attnlab.nn.attention.tiled import tiled_attention  # O(T) memory; groups handled inside, no repeat

    return tiled_attention(q, k, v, mask=mask, bias=bias, scale=scale, is_causal=is_causal, dropout_p=dropout_p)[0]


def _bmm(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> Tensor:
    return bmm_attention(q, k, v, bias=bias, scale=scale, dropout_p=dropout_p, is_causal=is_causal)


def _serves_bmm(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> bool:
    """CPU training in bf16 on short sequences (``bmm.py``: there it beats the flash kernel's backward)."""
    return use_bmm_attention(q, k, v, mask, bias, enable_gqa)


def _sdpa_fp32(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> Tensor:
    """sdpa on float32 copies, autocast off so that it does not cast them straight back; the result in q's dtype."""
    with torch.autocast("cpu", enabled=False):
        out = attend("sdpa", q.float(), k.float(), v.float(), mask, None if bias is None else bias.float(), scale,
                     dropout_p, is_causal, enable_gqa)
    return out.to(q.dtype)


def _serves_sdpa_fp32(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> bool:
    """CPU half precision where PyTorch's CPU flash kernel is slow: float16 always, bfloat16 for heads under 64
    (figures: docs/benchmarks.md)."""
    return q.device.type == "cpu" and (q.dtype == torch.float16 or (q.dtype == torch.bfloat16 and q.size(-1) < 64))


def _gqa_decode(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> Tensor:
    """A group's query heads become rows against its shared key/value head: one (G x S) problem per group, no
    copy of the cache."""
    B, H, _, D = q.shape
    Hkv = k.size(-3)
    out = F.scaled_dot_product_attention(q.reshape(B, Hkv, H // Hkv, D), k, v, dropout_p=dropout_p, scale=scale)
    return out.reshape(B, H, 1, v.size(-1))  # (B, Hkv, G, Dv) -> (B, H, 1, Dv)


def _serves_gqa_decode(q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa) -> bool:
    """One decoding query per head, grouped key/value heads, no mask or bias."""
    return mask is None and bias is None and enable_gqa and q.size(-2) == 1


ROUTES: dict[str, Route] = {
    "eager": Route(_eager, _everything, doc="the reference, probabilities formed"),
    "sdpa": Route(_sdpa, _everything, doc="PyTorch's fused kernel"),
    "tiled": Route(_tiled, _everything, supports=ALL - {"latent"}, doc="exact block-tiled attention, O(T) memory"),
    "bmm": Route(_bmm, _serves_bmm, doc="batched matmuls keeping the probabilities (bf16 CPU training)"),
    "sdpa-fp32": Route(_sdpa_fp32, _serves_sdpa_fp32, doc="sdpa on float32 copies (CPU half precision)"),
    "gqa-decode": Route(_gqa_decode, _serves_gqa_decode, doc="grouped heads decoding one token"),
}
# the routes a model may ask for by name (attn_backend); the others stand in for one of them
CHOICES: tuple[str, ...] = ("eager", "sdpa", "tiled")
Backend = Literal["eager", "sdpa", "tiled"]
BACKENDS = CHOICES
# the routes that stand in for a route where they serve the call, tried in this order
STANDS_IN: dict[str, tuple[str, ...]] = {"sdpa": ("bmm", "sdpa-fp32", "gqa-decode")}


def register(name: str, route: Route, stands_in_for: str | None = None) -> None:
    """Add a route to the table (attnlab.cpu adds its C++ kernel); ``stands_in_for``: a route it stands in for.
    Registering the same name again replaces the route."""
    ROUTES[name] = route
    if stands_in_for is not None and name not in STANDS_IN.get(stands_in_for, ()):
        STANDS_IN[stands_in_for] = (name, *STANDS_IN.get(stands_in_for, ()))


def route_for(name: str, *call: object) -> Route:
    """The rule: the route that computes ``call`` (``attend``'s arguments) for a layer that asks for ``name``."""
    for stand_in in STANDS_IN.get(name, ()):
        if ROUTES[stand_in].serves(*call):
            return ROUTES[stand_in]
    route = ROUTES[name]
    if route.serves(*call) or route.instead is None:
        return route
    return route_for(route.instead, *call)


def attend(
    name: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(Q K^T * scale + bias, masked) V through the route ``route_for`` picks for a layer asking for ``name``.

    q (B, H, T, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv) -> (B, H, T, Dv). ``mask`` (bool, True = attend) and
    ``bias`` broadcast to (B, H, T, S); ``is_causal`` adds the causal mask aligned to the end of the keys (query
    i sees key j iff j <= i + S - T); ``enable_gqa``: k and v have fewer heads than q (a divisor); ``scale``
    None = 1/sqrt(D)."""
    call = (q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa)
    return route_for(name, *call).function(*call)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> Tensor:
    """``attend("sdpa", ...)``: PyTorch's fused kernel, or the route that stands in for it on this call."""
    return attend("sdpa", q, k, v, mask, bias, scale, dropout_p, is_causal, enable_gqa)


def check_route(name: str, needs: Mapping[str, str], head_dim: int, key: str) -> None:
    """ConfigError, before any model is built, where route ``name`` cannot compute what a model asks of it:
    ``needs`` maps each FEATURE the model uses to the option that makes it use it (``{"latent": "mixer=latent"}``),
    ``head_dim`` is d_model / n_head, ``key`` the option that asked for the route. The line lists the routes that
    can."""
    route = ROUTES[name]
    missing = [feature for feature in needs if feature not in route.supports]
    if not missing and head_dim % route.head_dim_multiple == 0:
        return
    if missing:
        why = "; ".join(f"{FEATURES[f]} ({needs[f]})" for f in missing)
        able = [n for n in CHOICES if set(needs) <= ROUTES[n].supports and head_dim % ROUTES[n].head_dim_multiple == 0]
    else:
        why = f"a head dimension of {head_dim}: it computes multiples of {route.head_dim_multiple}"
        able = [n for n in CHOICES if head_dim % ROUTES[n].head_dim_multiple == 0]
    raise ConfigError(f"{key}: the {name} route does not compute {why}; routes that do: {', '.join(able)}")
