"""Normalisation, the feed-forward network and the transformer block.

One ``TransformerBlock`` serves every family: bidirectional (encoder), causal (decoder), and
with a cross-attention sub-layer (decoder of an encoder-decoder). Its token mixer is multi-head
attention (``mixer="attention"``), multi-head latent attention (``"latent"``) or a selective
state-space layer (``"ssm"``); its feed-forward is dense or a mixture of experts. Sub-layers are
wired either

    pre-norm  (GPT-2, LLaMA):   x = x + Sublayer(Norm(x))
    post-norm (2017, BERT):     x = Norm(x + Sublayer(x))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn import roles
from attnlab.nn.activations import activate, check_activation
from attnlab.nn.attention import Backend, KVCache, MultiHeadAttention
from attnlab.nn.latent_attention import LatentKVCache, MultiHeadLatentAttention
from attnlab.nn.moe import MoEFeedForward
from attnlab.nn.ssm import SelectiveSSM, SSMState

NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")
NormPosition = Literal["pre", "post"]
MIXERS: tuple[str, ...] = ("attention", "latent", "ssm")
LayerCache = KVCache | LatentKVCache | SSMState


class LayerNorm(nn.Module):
    """LayerNorm(x) = (x - mean) / sqrt(var + eps) * gamma + beta, over the last dim; beta optional."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gamma (Zhang & Sennrich 2019): no centring, no beta."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def build_norm(kind: str, dim: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    if kind == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; choose one of {NORMS}")


class FeedForward(nn.Module):
    """Position-wise MLP.

    relu/gelu:  FFN(x) = act(x W_1 + b_1) W_2 + b_2
    swiglu:     FFN(x) = (SiLU(x W_gate) * (x W_up)) W_2   (Shazeer 2020; W_gate, W_up fused)
    """

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True, dropout: float = 0.0
    ) -> None:
        super().__init__()
        check_activation(activation)
        self.activation = activation
        n_in = 2 * d_ff if activation == "swiglu" else d_ff
        self.fc_in = nn.Linear(d_model, n_in, bias=bias)
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)
        roles.declare(self, "fc_out.weight", roles.RESIDUAL_OUT)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        h = activate(self.fc_in(x), self.activation)  # (B, T, d_ff)
        y = self.fc_out(h)  # (B, T, C)
        return F.dropout(y, self.dropout, self.training) if self.dropout > 0 else y


def default_d_ff(d_model: int, activation: str) -> int:
    """4 d for relu/gelu; for SwiGLU 2/3 of that (same parameter count), rounded up to 8."""
    if activation == "swiglu":
        return 8 * ((int(8 * d_model / 3) + 7) // 8)
    return 4 * d_model


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention, feed-forward; each a residual sub-layer."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        d_ff: int | None = None,
        activation: str = "gelu",
        norm: str = "layernorm",
        norm_position: NormPosition = "pre",
        norm_eps: float = 1e-5,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        bias: bool = True,
        backend: Backend = "eager",
        cross_attention: bool = False,
        d_memory: int | None = None,
        moe_experts: int = 0,
        moe_top_k: int = 2,
        moe_capacity_factor: float | None = 1.25,
        mixer: str = "attention",
        latent: dict[str, Any] | None = None,
        ssm: dict[str, Any] | None = None,
    ) -> None:
        """``latent``: MultiHeadLatentAttention options (d_latent, d_rope, q_latent, max_len);
        ``ssm``: SelectiveSSM options (d_state, d_conv, expand)."""
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        if mixer not in MIXERS:
            raise ValueError(f"unknown mixer {mixer!r}; choose one of {MIXERS}")
        self.norm_position = norm_position
        self.dropout = dropout
        self.mixer = mixer
        mha = dict(n_kv_heads=n_kv_heads, bias=bias, dropout=attn_dropout, backend=backend)
        self.self_attn: nn.Module | None = None
        self.ssm: SelectiveSSM | None = None
        if mixer == "attention":
            self.self_attn = MultiHeadAttention(d_model, n_heads, **mha)
        elif mixer == "latent":
            self.self_attn = MultiHeadLatentAttention(
                d_model, n_heads, bias=bias, dropout=attn_dropout, backend="eager" if backend == "eager" else "sdpa",
                **(latent or {}),
            )
        else:
            self.ssm = SelectiveSSM(d_model, bias=bias, **(ssm or {}))
        self.norm_self = build_norm(norm, d_model, norm_eps, bias)
        self.cross_attn: MultiHeadAttention | None = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(d_model, n_heads, cross=True, d_memory=d_memory, **mha)
            self.norm_cross = build_norm(norm, d_model, norm_eps, bias)
        d_ff = d_ff or default_d_ff(d_model, activation)
        self.ffn: nn.Module
        if moe_experts > 0:  # a mixture of experts in place of the single feed-forward network
            # top-1 gates with the raw router probability (Switch), so the router also learns from
            # the task loss; top-k>1 renormalises the k probabilities (Mixtral)
            self.ffn = MoEFeedForward(d_model, d_ff, n_experts=moe_experts, top_k=moe_top_k,
                                      capacity_factor=moe_capacity_factor, activation=activation, bias=bias,
                                      dropout=dropout, normalize_top_k=moe_top_k > 1)
        else:
            self.ffn = FeedForward(d_model, d_ff, activation, bias=bias, dropout=dropout)
        self.norm_ffn = build_norm(norm, d_model, norm_eps, bias)

    @property
    def n_sublayers(self) -> int:
        """Residual sub-layers: mixer, (cross-attention), feed-forward."""
        return 3 if self.cross_attn is not None else 2

    def new_cache(
        self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> LayerCache:
        """The decoding cache this block's mixer needs: keys/values, latents, or an SSM state."""
        if self.ssm is not None:
            return self.ssm.new_state(batch_size, dtype=dtype, device=device)
        if isinstance(self.self_attn, MultiHeadLatentAttention):
            return self.self_attn.new_cache(batch_size, max_len, dtype=dtype, device=device)
        attn = self.self_attn
        return KVCache(batch_size, attn.n_kv_heads, max_len, attn.head_dim, dtype=dtype, device=device)

    def _residual(self, x: Any, norm: nn.Module, sublayer, scheme: Any = None, index: int = 0) -> tuple[Any, Any]:
        """pre: x + f(norm(x));  post: norm(x + f(x)). ``sublayer`` returns (out, extra).

        With a model-level residual scheme (hyper-connections, mHC, attention residuals) ``x`` is
        that scheme's state: the sub-layer reads ``layer_input(state, i)`` and its output is folded
        back with ``add(state, y, i)``, i = ``index`` being the global sub-layer index.
        """
        if scheme is not None:
            out, extra = sublayer(norm(scheme.layer_input(x, index)))
            return scheme.add(x, out, index), extra
        if self.norm_position == "pre":
            out, extra = sublayer(norm(x))
            return x + out, extra
        out, extra = sublayer(x)
        return norm(x + out), extra

    def _drop(self, y: Tensor) -> Tensor:
        return F.dropout(y, self.dropout, self.training) if self.dropout > 0 else y

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        attn_bias: Tensor | Callable[[Tensor, Tensor], Tensor] | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        is_causal: bool = False,
        cache: LayerCache | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cross_cache: KVCache | None = None,
        need_weights: bool = False,
        residual: Any = None,
        sublayer_index: int = 0,
    ) -> tuple[Any, dict[str, Any] | None]:
        """x (B, T, C) -> (B, T, C), plus extras: {"self": probs, "cross": probs} when need_weights,
        {"moe": MoEStats} for a mixture-of-experts block; None when there is nothing to report.

        ``residual``: a model-level ``ResidualScheme`` (x is then its state) whose sub-layers
        ``sublayer_index``, ``sublayer_index + 1``, ... belong to this block; None = x + f(norm(x)).
        """

        def self_attention(h: Tensor) -> tuple[Tensor, Tensor | None]:
            if self.ssm is not None:  # a causal state-space mixer: no mask, positions or weights
                return self._drop(self.ssm(h, state=cache)), None
            y, probs = self.self_attn(
                h, mask=mask, bias=attn_bias, rotary=rotary, cache=cache,
                is_causal=is_causal, need_weights=need_weights,
            )
            return self._drop(y), probs

        def cross_attention(h: Tensor) -> tuple[Tensor, Tensor | None]:
            assert self.cross_attn is not None
            y, probs = self.cross_attn(
                h, memory=memory, mask=memory_mask, cache=cross_cache, need_weights=need_weights
            )
            return self._drop(y), probs

        i = sublayer_index
        x, self_probs = self._residual(x, self.norm_self, self_attention, residual, i)
        cross_probs = None
        if self.cross_attn is not None:
            i += 1
            x, cross_probs = self._residual(x, self.norm_cross, cross_attention, residual, i)
        def feed_forward(h: Tensor) -> tuple[Tensor, Any]:
            out = self.ffn(h)
            return out if isinstance(self.ffn, MoEFeedForward) else (out, None)

        x, moe_stats = self._residual(x, self.norm_ffn, feed_forward, residual, i + 1)
        extras: dict[str, Any] = {}
        if need_weights:
            extras["self"] = self_probs
            if cross_probs is not None:
                extras["cross"] = cross_probs
        if moe_stats is not None:
            extras["moe"] = moe_stats
        return x, extras or None
