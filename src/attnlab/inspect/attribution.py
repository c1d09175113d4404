"""Which input tokens matter for an output? Attribution beside attention, with Captum.

Attention weights say where a head *reads*, not what the prediction *depends on* (Jain & Wallace
2019); gradient-based and perturbation-based attributions answer the second question. For a
scalar output f (a next-token logit of a GPT, or a class logit) and token embeddings e_t:

    gradient x input      a_t = sum_c (df/de_t)_c (e_t)_c
    integrated gradients  a_t = sum_c (e_t - e'_t)_c  * int_0^1 df/de_t(e' + a (e - e'))_c da
                          (Sundararajan et al. 2017; sum_t a_t = f(e) - f(e'): completeness)
    occlusion             a_t = f(x) - f(x with token t replaced by the baseline token)

computed by Captum (LayerGradientXActivation, LayerIntegratedGradients on the token-embedding
layer, Occlusion on the ids); the baseline e' is the embedding of ``baseline_id`` at every
position. Attention rollout (Abnar & Zuidema 2020) multiplies the head-averaged attention
(+ identity, renormalised) through the layers; its last row is the attention-flow view of the
same question.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from attnlab.core.extras import require
from attnlab.inspect.record import record
from attnlab.inspect.rollout import attention_rollout

METHODS: tuple[str, ...] = ("gradient_x_input", "integrated_gradients", "occlusion")
Forward = Callable[[Tensor], Tensor]


def next_token_logits(model: nn.Module, position: int = -1) -> Forward:
    """idx (B, T) -> logits (B, V) that a GPT predicts for the token after ``position``."""
    return lambda idx: model(idx).logits[:, position]


def class_logits(model: nn.Module) -> Forward:
    """idx (B, T) -> logits (B, n_classes) of a sequence classifier (out.logits already pooled)."""
    return lambda idx: model(idx).logits


def token_attributions(
    forward: Forward,
    embedding: nn.Module,
    idx: Tensor,
    target: int | Tensor,
    methods: Sequence[str] = METHODS,
    baseline_id: int = 0,
    n_steps: int = 64,
) -> dict[str, Tensor]:
    """Per-token importance (B, T) of each method for the output ``forward(idx)[:, target]``.

    ``embedding``: the module whose output is the token embedding (e.g. ``model.tok_emb``). The
    model should be in eval mode (no dropout). Integrated gradients also returns
    ``"ig_delta"`` (B,): sum_t a_t - (f(x) - f(x')), Captum's completeness error.
    """
    require("captum", "attributions (integrated gradients, occlusion)")
    from captum.attr import LayerGradientXActivation, LayerIntegratedGradients, Occlusion

    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown attribution method(s) {bad}; choose from {METHODS}")
    baseline = torch.full_like(idx, baseline_id)
    out: dict[str, Tensor] = {}
    if "gradient_x_input" in methods:
        gxi = LayerGradientXActivation(forward, embedding).attribute(idx, target=target)  # (B, T, C)
        out["gradient_x_input"] = gxi.sum(-1).detach()
    if "integrated_gradients" in methods:
        lig = LayerIntegratedGradients(forward, embedding)
        ig, delta = lig.attribute(idx, baselines=baseline, target=target, n_steps=n_steps,
                                  return_convergence_delta=True)  # (B, T, C), (B,)
        out["integrated_gradients"] = ig.sum(-1).detach()
        out["ig_delta"] = delta.detach()
    if "occlusion" in methods:
        with torch.no_grad():
            occ = Occlusion(forward).attribute(idx, sliding_window_shapes=(1,), baselines=baseline_id, target=target)
        out["occlusion"] = occ.detach().float()  # (B, T)
    return out


def rollout_from(model: nn.Module, forward: Forward, idx: Tensor) -> Tensor:
    """Attention rollout (B, T, T) through every self-attention layer of ``model`` on ``idx``."""
    with torch.no_grad(), record(model, what=("probs",)) as rec:
        forward(idx)
    names = rec.select("self")
    return attention_rollout([rec.probs[n] for n in names])


def explain(
    model: nn.Module,
    idx: Tensor,
    embedding: nn.Module,
    forward: Forward | None = None,
    target: int | None = None,
    baseline_id: int = 0,
    n_steps: int = 64,
) -> dict[str, Tensor]:
    """Rollout and the three attributions for one sequence idx (1, T), for the last position's
    prediction (``target`` = its argmax when None). Returns (T,) vectors plus "target" and "ig_delta"."""
    forward = forward or next_token_logits(model)
    model.eval()
    with torch.no_grad():
        logits = forward(idx)  # (1, V)
    target = int(logits[0].argmax()) if target is None else int(target)
    result = token_attributions(forward, embedding, idx, target, baseline_id=baseline_id, n_steps=n_steps)
    result = {k: v[0] for k, v in result.items()}
    result["rollout"] = rollout_from(model, forward, idx)[0, -1].float().cpu()  # the last query's row
    result["target"] = torch.tensor(target)
    return result
