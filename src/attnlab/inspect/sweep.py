"""Activation-patching sweeps of a GPT in batches: every layer x position (x head) at once, the numbers of one
patched run per cell (``intervene.patch_recovery``) with far fewer passes.

    heads       out[l, p, h] = m(corrupted run with x_{l,h}[p] <- clean x_{l,h}[p])    (L, T, H)
                for a per-head point x (``hook_z`` by default: TransformerLens's
                ``get_act_patch_attn_head_out_by_pos``, [layer, pos, head])
    residual    out[l, p] = m(corrupted run with resid_pre_l[p] <- clean resid_pre_l[p])   (L, T)
                (TransformerLens's ``get_act_patch_resid_pre``)

with m the metric of the output (e.g. ``intervene.logit_difference``). Three things make it cheap, none of
which changes a number beyond float rounding:

  * the blocks before l compute exactly what the corrupted run computed, so every patched run of layer l
    starts from the corrupted stream entering block l (kept from one corrupted run): L - l blocks, not L;
  * the patched runs of a layer are stacked along the batch, ``max_rows`` rows a pass (cells x B rows);
  * only the last position's logits are formed, (rows, 1, V): ``metric`` is called on an output whose
    ``logits`` hold the last position only, as ``logit_difference(position=-1)`` reads them.

The clean activations come from one clean run, or from ``clean_cache`` (``run_with_cache`` of the clean input).
For a pre-norm GPT with residual=standard whose blocks carry the stream (``hook_resid_pre`` fires).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from attnlab.core.errors import ConfigError
from attnlab.inspect.intervene import Metric, run_with_cache
from attnlab.nn.hooks import hooks
from attnlab.nn.mixing import BlockContext

HEAD_POINTS = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result")  # (B, H, T, ·): a head on axis 1


def _check(model: nn.Module, clean: Tensor, corrupted: Tensor) -> None:
    c = getattr(model, "config", None)
    if c is None or c.family != "gpt" or getattr(model, "residual", None) is not None:
        raise ConfigError("a patching sweep runs a gpt's blocks from the middle: a gpt with residual=standard")
    if clean.shape != corrupted.shape or clean.dim() != 2:
        raise ConfigError(f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} token ids must both "
                          "be (B, T): patching lines positions up")


def last_logits_from(model: nn.Module, layer: int, x: Tensor, idx: Tensor | None = None) -> Tensor:
    """The logits at the last position when the stream entering block ``layer`` is x (B, T, C): (B, 1, V),
    computed as ``model(idx)`` computes them from there on (positions 0 .. T-1, causal, no cache); ``idx`` (B, T),
    the token ids, for the blocks that look them up (Engram layers)."""
    T = x.size(1)
    pos = torch.arange(T, device=x.device)
    rotary, bias = model.positions.rotary(pos), model.positions.contiguous_bias(T, T, x.device)
    for block in model.blocks[layer:]:
        x = block(x, BlockContext(bias=bias, rotary=rotary, is_causal=True, token_ids=idx))  # (B, T, C)
    return model.head(model.norm_f(x[:, -1:]))  # (B, 1, V)


def _per_cell(metric: Metric, logits: Tensor, B: int) -> list[float]:
    """The metric of each stacked run: logits (cells * B, 1, V), run i in rows i*B .. (i+1)*B - 1."""
    return [float(metric(SimpleNamespace(logits=chunk))) for chunk in logits.split(B)]


def _sweep(model: nn.Module, corrupted: Tensor, metric: Metric, cells: list, patch_point: Callable[[int], str],
           write: Callable[[Tensor, list], Tensor], max_rows: int, layers: Sequence[int]) -> list[list[float]]:
    """For each of ``layers``: the metric of every cell of ``cells`` patched by ``write(x, cells)`` at the point
    ``patch_point(l)``, the runs stacked in passes of at most ``max_rows`` rows."""
    B = corrupted.size(0)
    _, corr = run_with_cache(model, corrupted, "blocks.*.hook_resid_pre")
    per = max(1, max_rows // B)  # cells a pass
    out = []
    for layer in layers:
        start = corr[f"blocks.{layer}.hook_resid_pre"]  # (B, T, C)
        values: list[float] = []
        for first in range(0, len(cells), per):
            chunk = cells[first:first + per]

            def patch(x: Tensor, name: str, chunk=chunk, layer=layer) -> Tensor:
                return write(x, [(layer, *cell) for cell in chunk])

            with torch.no_grad(), hooks(model, {patch_point(layer): patch}):
                logits = last_logits_from(model, layer, start.repeat(len(chunk), 1, 1),  # cell-major rows
                                          corrupted.repeat(len(chunk), 1))
            values += _per_cell(metric, logits, B)
        out.append(values)
    return out


@torch.no_grad()
def head_patching(model: nn.Module, clean: Tensor, corrupted: Tensor, metric: Metric, point: str = "hook_z",
                  clean_cache: Mapping[str, Tensor] | None = None, max_rows: int = 512,
                  layers: Sequence[int] | None = None) -> Tensor:
    """out[l, p, h] (L, T, H): the metric with head h's ``mixer.{point}`` at position p of layer l patched
    from the clean run into the corrupted one (module docstring); clean, corrupted (B, T) token ids.
    ``layers``: sweep only these (rows of out in that order); default every layer."""
    _check(model, clean, corrupted)
    layers = list(range(model.config.n_layer)) if layers is None else list(layers)
    if any(not 0 <= layer < model.config.n_layer for layer in layers):
        raise ConfigError(f"layers {layers}: this model has layers 0 .. {model.config.n_layer - 1}")
    if point not in HEAD_POINTS:
        raise ConfigError(f"head patching reads a per-head point ({', '.join(HEAD_POINTS)}), not {point!r}")
    H, T = model.config.n_head, clean.size(1)
    names = [f"blocks.{layer}.mixer.{point}" for layer in range(model.config.n_layer)]
    source = clean_cache if clean_cache is not None and all(n in clean_cache for n in names) \
        else run_with_cache(model, clean, names)[1]
    cells = [(p, h) for p in range(T) for h in range(H)]

    def write(x: Tensor, chunk: list) -> Tensor:  # x (cells * B, H', T, ·): cell i's rows take its head and position
        layer = chunk[0][0]
        clean_x = source[names[layer]]  # (B, H', T, ·)
        B = clean_x.size(0)
        x = x.reshape(len(chunk), B, *x.shape[1:]).clone()  # (cells, B, H', T, ·)
        cell = torch.arange(len(chunk))
        pos = torch.tensor([p for _, p, _ in chunk])
        head = torch.tensor([h for _, _, h in chunk])
        x[cell, :, head, pos] = clean_x[:, head, pos].transpose(0, 1)  # (cells, B, ·)
        return x.reshape(-1, *x.shape[2:])

    values = _sweep(model, corrupted, metric, cells, lambda layer: names[layer], write, max_rows, layers)
    return torch.tensor(values).view(len(layers), T, H)


@torch.no_grad()
def residual_patching(model: nn.Module, clean: Tensor, corrupted: Tensor, metric: Metric,
                      clean_cache: Mapping[str, Tensor] | None = None, max_rows: int = 512) -> Tensor:
    """out[l, p] (L, T): the metric with the stream entering block l at position p patched from the clean run."""
    _check(model, clean, corrupted)
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(model.config.n_layer)]
    source = clean_cache if clean_cache is not None and all(n in clean_cache for n in names) \
        else run_with_cache(model, clean, names)[1]
    cells = [(p,) for p in range(clean.size(1))]

    def write(x: Tensor, chunk: list) -> Tensor:  # x (cells * B, T, C)
        clean_x = source[names[chunk[0][0]]]  # (B, T, C)
        B = clean_x.size(0)
        x = x.reshape(len(chunk), B, *x.shape[1:]).clone()  # (cells, B, T, C)
        pos = torch.tensor([p for _, p in chunk])
        x[torch.arange(len(chunk)), :, pos] = clean_x[:, pos].transpose(0, 1)  # (cells, B, C)
        return x.reshape(-1, *x.shape[2:])

    return torch.tensor(_sweep(model, corrupted, metric, cells, lambda layer: names[layer], write, max_rows,
                               range(model.config.n_layer)))
