"""Causal interventions on the hook points (``attnlab.nn.hooks``): ablate a part of the model, or patch
activations from one input into the run of another, and measure what the output does.

A ``Site`` names what to change: a hook point, and optionally one head (axis 1 of the (B, H, T, ·)
points ``mixer.hook_q/k/v/attn_scores/pattern/z/result``) and some positions (the T axis). Then

    ablation    x[site] <- 0                                  "zero"
                x[site] <- mean of x[site] over a reference set (its batch and positions)   "mean"
                x[site] <- x[site] on another input           "resample"
    patching    run the clean input and keep x[site]; run the corrupted input with x[site] put back:
                recovered = (m(patched) - m(corrupted)) / (m(clean) - m(corrupted))
                for a metric m of the output (e.g. the logit difference of two answers); 1 = the site
                alone restores the clean behaviour, 0 = it carries none of it.

Everything else is computed as usual: an intervention changes the sites and nothing upstream of
them. Sites are given by name, so the same code serves every family (GPT ``blocks.{i}``, BERT
``blocks.{i}``, seq2seq ``encoder.{i}`` / ``decoder.{i}`` with ``cross_attn``, ViT patches as positions).

    from attnlab.inspect.intervene import Site, ablated, head, patch_recovery, logit_difference
    with ablated(model, [head(1, 3)], how="mean", reference=ref_cache):
        logits = model(idx).logits
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.nn.hooks import FORMED_WHEN_HOOKED, capture, hook_points, hooks

How = Literal["zero", "mean", "resample"]
Inputs = Any  # what the model is called with: a tuple (positional), a dict (keywords) or one tensor
Metric = Callable[[Any], Tensor]  # model output -> a scalar (or per-example) tensor

# points shaped (B, H, T, ·): a head is axis 1, positions axis 2
HEADED = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z", "hook_result")


@dataclass(frozen=True)
class Site:
    """A hook point, optionally narrowed to one head and/or some positions (query positions for a pattern)."""

    point: str
    head: int | None = None
    positions: tuple[int, ...] | None = None

    @property
    def headed(self) -> bool:
        """Whether the site's hook point has a head dimension (patterns, head outputs)."""
        return self.point.rsplit(".", 1)[-1] in HEADED

    def index(self) -> tuple:
        """The index of the site inside its point's tensor: (B, H, T, ·) or (B, T, ·)."""
        pos = slice(None) if self.positions is None else list(self.positions)
        if self.headed:
            return (slice(None), slice(None) if self.head is None else self.head, pos)
        if self.head is not None:
            raise ValueError(f"{self.point} has no head axis; heads are sites of a mixer's per-head points "
                             f"({', '.join(HEADED)})")
        return (slice(None), pos)


def head(layer: int, index: int, prefix: str = "blocks", module: str = "mixer") -> Site:
    """The output of one attention head (before W_O mixes the heads): ``{prefix}.{layer}.{module}.hook_z``."""
    return Site(f"{prefix}.{layer}.{module}.hook_z", head=index)


def mixer(layer: int, prefix: str = "blocks") -> Site:
    """What the token mixer (attention) of a block adds to the stream."""
    return Site(f"{prefix}.{layer}.hook_mixer_out")


def mlp(layer: int, prefix: str = "blocks") -> Site:
    """What the feed-forward network of a block adds to the stream."""
    return Site(f"{prefix}.{layer}.hook_ffn_out")


def resid(layer: int, positions: Sequence[int] | None = None, prefix: str = "blocks") -> Site:
    """The residual stream entering block ``layer`` (all positions, or the given ones)."""
    return Site(f"{prefix}.{layer}.hook_resid_pre", positions=None if positions is None else tuple(positions))


def call(model: nn.Module, inputs: Inputs) -> Any:
    """model(*inputs) for a tuple, model(**inputs) for a dict, model(inputs) otherwise."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


def run_with_cache(
    model: nn.Module, inputs: Inputs, points: str | Iterable[str] | None = None
) -> tuple[Any, dict[str, Tensor]]:
    """Run the model and keep what flows through the matching hook points (TransformerLens's
    ``run_with_cache``): (output, {point name: tensor}). ``points``: fnmatch pattern(s); by default
    every point but the read-only scores and those formed only when hooked (``nn.hooks.FORMED_WHEN_HOOKED``:
    attention scores and patterns, per-head results, the norms' scale and normalized input). Asking for
    one of those moves its layer to the written-out path (e.g. ``*hook_pattern``: eager attention), so
    such a cache comes from that computation, equal to the fused one to ~1e-7 but not bit for bit."""
    if points is None:
        names = [n for n in hook_points(model) if not n.endswith((*FORMED_WHEN_HOOKED, "hook_scores"))]
        patterns = names or ["*"]
    else:
        patterns = [points] if isinstance(points, str) else list(points)
    with torch.no_grad(), capture(model, *patterns) as cache:
        out = call(model, inputs)
    return out, dict(cache)


def _replacement(site: Site, x: Tensor, how: How, reference: Mapping[str, Tensor] | None) -> Tensor:
    """The value the site takes under the ablation, broadcastable to x[site.index()]."""
    if how == "zero":
        return torch.zeros((), dtype=x.dtype, device=x.device)
    if reference is None or site.point not in reference:
        raise ValueError(f"{how}-ablation of {site.point} needs its activations on a reference set (run_with_cache)")
    ref = reference[site.point].to(device=x.device, dtype=x.dtype)
    if how == "mean":  # averaged over the reference's batch and positions, per head and feature
        if site.headed:  # (1, H, 1, D) -> that head's (1, 1, D)
            mean = ref.mean(dim=(0, 2), keepdim=True)
            return mean if site.head is None else mean[:, site.head]
        return ref.mean(dim=(0, 1), keepdim=True)  # (1, 1, C)
    if how == "resample":
        if ref.shape[1:] != x.shape[1:] or ref.size(0) not in (1, x.size(0)):
            raise ValueError(f"resampling {site.point}: reference {tuple(ref.shape)} does not fit {tuple(x.shape)}")
        return ref.expand_as(x)[site.index()]
    raise ValueError(f"unknown ablation {how!r}; choose zero, mean or resample")


def _with_sites(sites: Iterable[Site], value_of: Callable[[Site, Tensor], Tensor]) -> dict[str, Callable]:
    """Hook functions, one per point, that overwrite each site of that point with ``value_of(site, x)``."""
    by_point: dict[str, list[Site]] = {}
    for site in sites:
        by_point.setdefault(site.point, []).append(site)

    def make(point_sites: list[Site]) -> Callable[[Tensor, str], Tensor]:
        def write(x: Tensor, name: str) -> Tensor:
            x = x.clone()
            for site in point_sites:
                x[site.index()] = value_of(site, x)
            return x

        return write

    return {point: make(point_sites) for point, point_sites in by_point.items()}


@contextmanager
def ablated(model: nn.Module, sites: Iterable[Site], how: How = "zero",
            reference: Mapping[str, Tensor] | None = None):
    """While the block runs, every site is replaced as ``how`` says (see the module docstring);
    ``reference``: activations by point name (``run_with_cache`` on the reference inputs) for
    "mean" and "resample". No sites: the model runs exactly as without the context."""
    fns = _with_sites(list(sites), lambda site, x: _replacement(site, x, how, reference))
    if not fns:
        yield
        return
    with hooks(model, fns):
        yield


@contextmanager
def patched(model: nn.Module, sites: Iterable[Site], source: Mapping[str, Tensor]):
    """While the block runs, every site takes its value from ``source`` (activations of another run)."""
    with ablated(model, sites, how="resample", reference=source):
        yield


def logit_difference(correct: int | Tensor, wrong: int | Tensor, position: int = -1) -> Metric:
    """m(out) = mean over the batch of logits[:, position, correct] - logits[:, position, wrong]
    (token ids, or one per example); for classifiers (B, n_classes) ``position`` is not used."""

    def metric(out: Any) -> Tensor:
        logits = out.logits if hasattr(out, "logits") else out
        last = logits[:, position] if logits.dim() == 3 else logits  # (B, V)
        rows = torch.arange(last.size(0), device=last.device)
        c = torch.as_tensor(correct, device=last.device).expand(last.size(0))
        w = torch.as_tensor(wrong, device=last.device).expand(last.size(0))
        return (last[rows, c] - last[rows, w]).mean()

    return metric


@dataclass
class PatchResult:
    """A metric on the clean run, the corrupted run, and the corrupted run with the sites patched from the clean one."""
    clean: float  # m(clean run)
    corrupted: float  # m(corrupted run)
    patched: float  # m(corrupted run with the sites from the clean run)

    @property
    def recovered(self) -> float:
        """(patched - corrupted) / (clean - corrupted): the fraction of the metric's gap the sites restore."""
        gap = self.clean - self.corrupted
        return float("nan") if gap == 0 else (self.patched - self.corrupted) / gap


@torch.no_grad()
def patch_recovery(model: nn.Module, clean: Inputs, corrupted: Inputs, sites: Iterable[Site], metric: Metric,
                   clean_cache: Mapping[str, Tensor] | None = None) -> PatchResult:
    """Activation patching: the metric on the clean run, the corrupted run, and the corrupted run with
    ``sites`` patched in from the clean one (``clean_cache``: reuse a ``run_with_cache`` of ``clean``)."""
    sites = list(sites)
    if clean_cache is None:
        out_clean, clean_cache = run_with_cache(model, clean, [s.point for s in sites] or None)
    else:
        out_clean = call(model, clean)
    corrupted_m = metric(call(model, corrupted))
    with patched(model, sites, clean_cache):
        patched_m = metric(call(model, corrupted))
    return PatchResult(float(metric(out_clean)), float(corrupted_m), float(patched_m))


@torch.no_grad()
def residual_patching(model: nn.Module, clean: Inputs, corrupted: Inputs, metric: Metric, n_layer: int,
                      n_positions: int, prefix: str = "blocks") -> Tensor:
    """Recovered fraction of patching the residual stream entering each block at each position:
    (n_layer, n_positions), the standard first map of where the information lives."""
    _, cache = run_with_cache(model, clean, f"{prefix}.*.hook_resid_pre")
    grid = torch.empty(n_layer, n_positions)
    for layer in range(n_layer):
        for t in range(n_positions):
            grid[layer, t] = patch_recovery(model, clean, corrupted, [resid(layer, [t], prefix)], metric,
                                            clean_cache=cache).recovered
    return grid
