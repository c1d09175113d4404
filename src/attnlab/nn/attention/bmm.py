"""The bmm route: attention by batched matmuls that keeps its probabilities for the backward pass.

    S = Q K^T * scale + bias        (BH, T, S)    one baddbmm: the bias (causal -inf, ALiBi) rides along
    P = softmax(S)                  (BH, T, S)    kept for the backward
    P' = dropout(P)                 (BH, T, S)    kept too when dropout_p > 0
    O = P' V                        (BH, T, Dv)

and the backward, with dO the gradient of O:

    dV = P'^T dO,   dP' = dO V^T,   dP = dP' * [P' != 0] / (1 - p)
    dS = P * (dP - rowsum(dP * P))                  (softmax backward)
    dQ = dS K * scale,   dK = dS^T Q * scale

This is the textbook algorithm, with no approximation. It exists for speed: for short sequences
on a CPU in bf16, six small matmuls and one softmax beat PyTorch's CPU flash-attention kernel,
whose reduced-precision backward re-computes the scores tile by tile; for long ones the flash kernel
is faster (``python benchmarks/attention_bf16.py``; figures in docs/benchmarks.md).

The price is memory: P (and P') is kept, B*H*T*S bf16 elements per layer (6 MiB at B=8, H=6,
T=256; 96 MiB at B=64, H=12), which is why the route table (``kernels.py``) takes this route for short sequences only
(``use_bmm_attention``); ``attnlab.nn.attention.bmm.MAX_SCORES = 0`` turns it off.

Rounding: in bf16 the scores are rounded to bf16 before the softmax, as in PyTorch's bf16 kernels.
Against float64 the error is within 2x of the bf16 flash kernel's (tested). A row whose bias is -inf
at every key gives NaN, as in the eager reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.nn.attention.reference import causal_mask

# the largest T*S routed here (at 512 x 512 the flash kernel is faster, and P grows with T*S)
MAX_SCORES = 256 * 256


def use_bmm_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, enable_gqa: bool
) -> bool:
    """True where ``bmm_attention`` is the faster exact path: CPU training in bf16,
    short sequences, no boolean mask (an additive bias is fine), as many key heads as query heads."""
    return (
        q.device.type == "cpu"
        and q.dtype == torch.bfloat16  # fp16: no clear gain (slower at T=64, measured); it stays on fp32 SDPA
        and k.dtype == v.dtype == q.dtype
        and q.dim() == k.dim() == v.dim() == 4
        and q.shape[:2] == k.shape[:2] == v.shape[:2]  # (B, H) alike: no broadcast key heads
        and torch.is_grad_enabled()
        and any(t is not None and t.requires_grad for t in (q, k, v, bias))
        and mask is None
        and not enable_gqa
        and q.size(-2) * k.size(-2) <= MAX_SCORES
    )


def _formula(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float, keep: Tensor | None) -> Tensor:
    """The forward as differentiable torch ops; ``keep`` = the dropout mask already divided by 1 - p."""
    probs = torch.softmax(torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale), dim=-1)
    return torch.bmm(probs if keep is None else probs * keep, v)


class _BmmAttention(torch.autograd.Function):
    """q (N, T, D), k (N, S, D), v (N, S, Dv), bias broadcastable to (N, T, S) -> out (N, T, Dv)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float, dropout_p: float) -> Tensor:
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)  # (N, T, S)
        probs = torch.softmax(scores, dim=-1)  # (N, T, S)
        dropped = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
        ctx.save_for_backward(q, k, v, bias, probs, dropped)
        ctx.scale, ctx.dropout_p = scale, dropout_p
        return torch.bmm(dropped, v)  # (N, T, Dv)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, bias, probs, dropped = ctx.saved_tensors
        if ctx.dropout_p > 0:  # only the kept entries pass, scaled as in the forward
            keep = (dropped != 0).to(probs.dtype) / (1 - ctx.dropout_p)
        if torch.is_grad_enabled():  # create_graph=True: differentiate the formula so higher derivatives hold
            inputs = (q, k, v, bias)
            with torch.enable_grad():
                out = _formula(q, k, v, bias, ctx.scale, keep if ctx.dropout_p > 0 else None)
            wanted = [t for t, need in zip(inputs, ctx.needs_input_grad) if need]
            grads = iter(torch.autograd.grad(out, wanted, grad_out, create_graph=True))
            return (*(next(grads) if need else None for need in ctx.needs_input_grad[:4]), None, None)
        grad_out = grad_out.contiguous()
        grad_v = torch.bmm(dropped.transpose(1, 2), grad_out)  # (N, S, Dv)
        grad_probs = torch.bmm(grad_out, v.transpose(1, 2))  # (N, T, S)
        if ctx.dropout_p > 0:
            grad_probs = grad_probs * keep
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)  # (N, T, S)
        grad_q = torch.bmm(grad_scores, k).mul_(ctx.scale)  # (N, T, D)
        grad_k = torch.bmm(grad_scores.transpose(1, 2), q).mul_(ctx.scale)  # (N, S, D)
        grad_bias = grad_scores.sum_to_size(bias.shape) if ctx.needs_input_grad[3] else None
        return grad_q, grad_k, grad_v, grad_bias, None, None


def bmm_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """softmax(Q K^T * scale + bias, causal) V for q (B, H, T, D), k (B, H, S, D), v (B, H, S, Dv).

    ``bias`` broadcasts to (B, H, T, S) and may require grad. ``is_causal`` aligns the diagonal to
    the end of the keys (query i sees key j iff j <= i + S - T), as ``causal_mask`` does. Returns
    (B, H, T, Dv), computed in q's dtype (under autocast the inputs already carry its choice).
    """
    B, H, T, D = q.shape
    S, Dv = k.size(-2), v.size(-1)
    if not k.dtype == v.dtype == q.dtype:
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    scale = D**-0.5 if scale is None else scale
    additive = torch.zeros(T, S, dtype=q.dtype, device=q.device)  # (T, S): broadcasts over B*H
    if is_causal:
        additive = additive.masked_fill(~causal_mask(T, S, device=q.device), float("-inf"))
    if bias is not None:  # (.., T, S) -> (B*H, T, S)
        additive = (bias.to(q.dtype) + additive).expand(B, H, T, S).reshape(B * H, T, S)
    with torch.autocast(q.device.type, enabled=False):
        out = _BmmAttention.apply(
            q.reshape(B * H, T, D), k.reshape(B * H, S, D), v.reshape(B * H, S, Dv), additive, scale, dropout_p
        )
    return out.view(B, H, T, Dv)
