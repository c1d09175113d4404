"""Circuits: what each head and MLP writes to the answer, and which head feeds which.

Direct logit attribution (Elhage et al. 2021). In a pre-norm GPT the final residual stream is a sum
of what the embeddings, every head and every MLP wrote:

    r_L = e + sum_l ( sum_h z_{l,h} W_O^{l,h} + b_O^l + mlp_l )          (B, T, C)
    logit_a - logit_b = FinalNorm(r_L) . u,   u = W_U[a] - W_U[b]       (the unembedding rows)

Freezing the norm's scale s at its value on r_L (LayerNorm: s = sqrt(var(r_L) + eps), and the mean
is removed from each part; RMSNorm: s = sqrt(mean(r_L^2) + eps)) makes the norm linear, so

    logit_a - logit_b = sum_parts  centre(part) / s . (gamma * u)  +  beta . u

exactly: each part's term is its direct effect on the answer (not through later layers).

Path patching (Wang et al. 2022, "IOI"), with the conventions of ``intervene.patch_recovery``: let the
sender head S carry its clean output into the corrupted run *only along the paths that end in the
receiver heads R* (later layers):

    run 1: the corrupted input; S's output <- its clean value; every other head frozen at its corrupted
           value; the MLPs recomputed (or frozen too: the direct path only); the receivers recomputed
           -> z_R'
    run 2: the corrupted input with each receiver's output <- z_R'; the rest as usual

and report recovered = (m(run 2) - m(corrupted)) / (m(clean) - m(corrupted)): the part of the clean
behaviour that flows from S through R.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.core.errors import ConfigError
from attnlab.inspect.intervene import Inputs, Metric, PatchResult, Site, call, patched, run_with_cache
from attnlab.nn.hooks import capture, hook_points, hooks


def _module(model: nn.Module, point: str) -> nn.Module:
    """The module a hook point belongs to: ``blocks.1.mixer.hook_z`` -> ``blocks.1.mixer``."""
    return model.get_submodule(point.rsplit(".", 1)[0])


def out_projection(attention: nn.Module) -> nn.Linear:
    """W_O of an attention module: ``out_proj`` (multi-head) or ``w_o`` (latent attention)."""
    proj = getattr(attention, "out_proj", None) or getattr(attention, "w_o", None)
    if not isinstance(proj, nn.Linear):
        raise ConfigError(f"{type(attention).__name__} has no output projection W_O to split by head")
    return proj


def head_output(attention: nn.Module, z: Tensor, h: int) -> Tensor:
    """What head h writes to the stream: z[:, h] W_O^h, (B, H, T, D) -> (B, T, C); no bias."""
    D = z.size(-1)
    return z[:, h] @ out_projection(attention).weight[:, h * D:(h + 1) * D].T


# --------------------------------------------------------------------------- direct logit attribution


@dataclass
class Attribution:
    """parts[name] = that part's direct effect on logit(answer) - logit(wrong) at ``position``, per example
    (B,); ``total`` (B,) = the model's own logit difference; sum(parts) == total up to rounding."""

    parts: dict[str, Tensor]
    total: Tensor

    def ranked(self) -> list[tuple[str, float]]:
        """(name, mean over the batch) by absolute size, largest first."""
        means = [(k, float(v.mean())) for k, v in self.parts.items()]
        return sorted(means, key=lambda kv: -abs(kv[1]))


def _require_standard_gpt(model: nn.Module) -> None:
    c = getattr(model, "config", None)
    if c is None or c.family != "gpt" or c.norm_position != "pre" or getattr(model, "residual", None) is not None:
        raise ConfigError("direct logit attribution reads one sum of parts: a pre-norm gpt with residual=standard")
    if getattr(c, "logit_softcap", None) is not None:
        raise ConfigError(f"direct logit attribution splits the logit linearly, and model.logit_softcap="
                          f"{c.logit_softcap:g} bends it (cap * tanh(z / cap)); it reads uncapped models only")


@torch.no_grad()
def direct_logit_attribution(model: nn.Module, idx: Tensor, answer: int | Tensor, wrong: int | Tensor | None = None,
                             position: int = -1) -> Attribution:
    """Split the logit of ``answer`` (minus that of ``wrong``, if given) at ``position`` of idx (B, T) into
    the direct effects of the embeddings, every head, every attention output bias and every MLP (names
    "embed", "L{l}H{h}", "L{l} attn bias", "L{l} mlp", "final norm bias"; a block whose mixer is not
    attention gives one "L{l} mixer")."""
    _require_standard_gpt(model)
    L = model.config.n_layer
    wanted = ["blocks.*.hook_resid_pre", "blocks.*.hook_mixer_out", "blocks.*.hook_ffn_out",
              f"blocks.{L - 1}.hook_resid_post"]
    if any(n.endswith("mixer.hook_z") for n in hook_points(model)):
        wanted.append("blocks.*.mixer.hook_z")
    with capture(model, *wanted) as seen:
        out = call(model, idx)
    B = idx.size(0)
    rows = torch.arange(B)
    a = torch.as_tensor(answer).expand(B)
    u = model.lm_head.weight[a]  # (B, C)
    if wrong is not None:
        u = u - model.lm_head.weight[torch.as_tensor(wrong).expand(B)]
    logits = out.logits[:, position]  # (B, V)
    total = logits[rows, a] - (0 if wrong is None else logits[rows, torch.as_tensor(wrong).expand(B)])
    final = seen[f"blocks.{L - 1}.hook_resid_post"][:, position]  # (B, C)
    norm = model.norm_f
    eps = norm.eps
    centred = type(norm).__name__ == "LayerNorm"
    if centred:
        scale = (final.var(dim=-1, unbiased=False, keepdim=True) + eps).sqrt()
    else:
        scale = (final.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()
    direction = norm.weight * u / scale  # (B, C)

    def effect(part: Tensor) -> Tensor:  # (B, C) -> (B,)
        if centred:
            part = part - part.mean(dim=-1, keepdim=True)
        return (part * direction).sum(-1)

    parts = {"embed": effect(seen["blocks.0.hook_resid_pre"][:, position])}
    for layer in range(L):
        z = seen.get(f"blocks.{layer}.mixer.hook_z")
        attention = model.blocks[layer].mixer
        if z is None:
            parts[f"L{layer} mixer"] = effect(seen[f"blocks.{layer}.hook_mixer_out"][:, position])
        else:
            for h in range(z.size(1)):
                parts[f"L{layer}H{h}"] = effect(head_output(attention, z, h)[:, position])
            if out_projection(attention).bias is not None:
                parts[f"L{layer} attn bias"] = effect(out_projection(attention).bias.expand(B, -1))
        parts[f"L{layer} mlp"] = effect(seen[f"blocks.{layer}.hook_ffn_out"][:, position])
    if getattr(norm, "bias", None) is not None:
        parts["final norm bias"] = (norm.bias * u).sum(-1)
    return Attribution(parts, total)


# --------------------------------------------------------------------------- path patching


def _layer_of(site: Site) -> tuple[str, int]:
    """("blocks", 1) for ``blocks.1.mixer.hook_z``; a head site is required."""
    parts = site.point.split(".")
    if site.head is None or parts[-1] != "hook_z" or len(parts) < 4 or not parts[1].isdigit():
        raise ConfigError(f"path patching joins two heads (sites of a mixer's hook_z with a head); got {site}")
    return parts[0], int(parts[1])


@torch.no_grad()
def path_patch(model: nn.Module, clean: Inputs, corrupted: Inputs, sender: Site, receivers: Site | Sequence[Site],
               metric: Metric, through_mlps: bool = True) -> PatchResult:
    """Path patching from the ``sender`` head to one receiver head or a group of them (a circuit often
    spreads a job over several heads), all in later layers of the same stack (see the module docstring).
    ``through_mlps``: the MLPs between them are recomputed, so the path may pass through them (Wang et
    al.'s convention); False freezes them too and keeps only the direct path through the residual stream.
    Returns the metric on the clean, corrupted and patched runs."""
    receivers = [receivers] if isinstance(receivers, Site) else list(receivers)
    if not receivers:
        raise ConfigError("path patching needs at least one receiver head")
    stack, s_layer = _layer_of(sender)
    for receiver in receivers:
        r_stack, r_layer = _layer_of(receiver)
        if r_stack != stack or s_layer >= r_layer:
            raise ConfigError(f"the sender ({sender.point}) must sit in an earlier layer of the receiver's stack "
                              f"({receiver.point})")
    frozen = [n for n in hook_points(model) if n.startswith(f"{stack}.")
              and (n.endswith(".hook_z") or (not through_mlps and n.endswith(".hook_ffn_out")))]
    out_clean, clean_cache = run_with_cache(model, clean, [sender.point])
    out_corr, corr_cache = run_with_cache(model, corrupted, frozen)

    def freeze(point: str):
        recomputed = [r.head for r in receivers if r.point == point]

        def fn(x: Tensor, name: str) -> Tensor:
            new = corr_cache[point].clone()
            for h in recomputed:
                new[:, h] = x[:, h]
            if point == sender.point:
                new[sender.index()] = clean_cache[point][sender.index()]
            return new

        return fn

    with capture(model, *{r.point for r in receivers}) as source, hooks(model, {p: freeze(p) for p in frozen}):
        call(model, corrupted)
    with patched(model, receivers, source):
        out_patched = call(model, corrupted)
    return PatchResult(float(metric(out_clean)), float(metric(out_corr)), float(metric(out_patched)))
