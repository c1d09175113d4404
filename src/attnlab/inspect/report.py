"""What ``attnlab inspect --text`` and ``attnlab heads`` do, as plain functions on a run folder.

inspect_text: tokenise a text, run the model once while recording every attention module, and
write the figures (one head's heatmap, the grid of a layer's heads, the per-head entropy
overview, attention rollout beside integrated gradients) plus ``attention.json``.

head_report: run the model on random windows of a text file (and on repeated random sequences
for the induction score), and write the head table (JSON, CSV, markdown) and its figure.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.core.errors import ConfigError, DataError
from attnlab.core.staging import check_own_folder, staged_folder
from attnlab.inspect import plots
from attnlab.inspect.heads import (
    THRESHOLDS,
    HeadRow,
    HeadStats,
    ablation_effects,
    collect_head_stats,
    flagged,
    repeated_random_tokens,
    write_head_table,
)
from attnlab.inspect.record import Recording, record

MAX_TEXT_TOKENS = 512  # the JSON dump and the figures grow as layers x heads x T^2
MAX_BATCHES = 10_000  # heads --n-batches: far beyond what the averages need
# the names of the files each command writes: an --out holding only these is an earlier output, replaced whole
TEXT_OUTPUTS = re.compile(r"attention\.json|(attention_layer\d+_head\d+|heads_layer\d+|entropy|attribution)\.(png|svg)")
HEAD_OUTPUTS = re.compile(r"heads\.(json|csv|md|png|svg)")


def check_text_out(out: str | Path) -> None:
    """ConfigError unless ``out`` can take ``inspect --text``'s files: new, empty, or an earlier output of it."""
    check_own_folder(out, TEXT_OUTPUTS.fullmatch, "--out", ConfigError)


def check_heads_out(out: str | Path) -> None:
    """ConfigError unless ``out`` can take ``heads``'s files: new, empty, or an earlier output of it."""
    check_own_folder(out, HEAD_OUTPUTS.fullmatch, "--out", ConfigError)


def _load(run_dir: str | Path) -> tuple[nn.Module, object]:
    from attnlab.training.runs import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(run_dir)
    return model.eval(), tok


def _context(model: nn.Module) -> int:
    return int(getattr(model.config, "block_size", MAX_TEXT_TOKENS))


def _encode_text(model: nn.Module, tok, text: str, limit: int) -> list[int]:
    """The ids the model reads for ``text`` (a BERT's with its [CLS] and [SEP]: ``tokenizers.specials``)."""
    from attnlab.tokenizers.specials import encode_for, n_specials

    ids = encode_for(model, tok, text)  # TokenizerError for characters outside the vocabulary
    if len(ids) <= n_specials(model, tok):
        raise ConfigError("the text is empty: give at least one token with --text")
    if len(ids) > limit:
        raise ConfigError(f"the text has {len(ids)} tokens, more than the {limit} this model can inspect; shorten it")
    return ids


def _pick(rec: Recording, layer: int | None, head: int | None) -> tuple[str, int]:
    """The self-attention module of ``layer`` (default: the last) and a head (default 0), checked."""
    names = rec.select("self")
    layers = sorted({rec.layer[n] for n in names})
    layer = layers[-1] if layer is None else layer
    if layer not in layers:
        raise ConfigError(f"--layer {layer} does not exist; this model has layers {layers[0]}..{layers[-1]}")
    name = next(n for n in names if rec.layer[n] == layer)
    n_heads = rec.probs[name].size(1)
    head = 0 if head is None else head
    if not 0 <= head < n_heads:
        raise ConfigError(f"--head {head} does not exist; layer {layer} has heads 0..{n_heads - 1}")
    return name, head


def attention_json(rec: Recording, tokens: list[str], ids: list[int], text: str, digits: int = 5) -> dict:
    """The recorded probabilities as plain JSON: modules -> layer, kind, heads, probs[h][i][j]."""
    return {
        "text": text, "tokens": tokens, "ids": ids,
        "modules": {
            name: {"layer": rec.layer[name], "kind": rec.kind[name], "heads": rec.heads[name],
                   "probs": [[[round(x, digits) for x in row] for row in head]
                             for head in rec.probs[name][0].tolist()]}
            for name in rec.names
        },
    }


def entropy_per_head(rec: Recording, names: list[str]) -> Tensor:
    """(layers, H) mean entropy of each head's rows that see more than one key (nats)."""
    rows = []
    for n in names:
        p = rec.probs[n][0].double()  # (H, T, S)
        h = -(p * p.clamp_min(1e-300).log()).sum(-1)  # (H, T)
        choice = (p > 0).sum(-1) > 1 if p.size(1) > 1 else torch.ones_like(h, dtype=torch.bool)
        rows.append((h * choice).sum(-1) / choice.sum(-1).clamp_min(1))
    return torch.stack(rows)


def inspect_text(
    run_dir: str | Path,
    text: str,
    out: str | Path,
    layer: int | None = None,
    head: int | None = None,
    formats: tuple[str, ...] = ("png", "svg"),
    attribution: bool = True,
) -> list[Path]:
    """Write attention figures and ``attention.json`` for ``text`` into ``out``; return the paths."""
    from attnlab.models.base import read_config

    family = read_config(run_dir).family if Path(run_dir).is_dir() else None
    if family is not None and family not in ("gpt", "bert"):
        hint = {"vit": "give it an image with --image", "seq2seq": "run it with attnlab translate; its attention "
                "maps are hook points in Python, attnlab.nn.hooks"}.get(family, "it has no text tokenizer")
        raise ConfigError(f"inspect --text reads a gpt or bert run; {run_dir} holds a {family} model ({hint})")
    model, tok = _load(run_dir)
    ids = _encode_text(model, tok, text, min(_context(model), MAX_TEXT_TOKENS))
    tokens = [tok.decode([i]) for i in ids]
    idx = torch.tensor([ids])
    with torch.no_grad(), record(model, what=("probs",)) as rec:
        model(idx)
    name, head = _pick(rec, layer, head)
    out = Path(out)
    with staged_folder(out, ConfigError, replace=True) as folder:  # a kill leaves the old output or the new one
        check_text_out(out)  # again, under the folder's lock
        written = _text_figures(model, tok, rec, name, head, idx, ids, tokens, text, folder, formats, attribution)
    return [out / p.name for p in written]


def _text_figures(model: nn.Module, tok, rec: Recording, name: str, head: int, idx: Tensor, ids: list[int],
                  tokens: list[str], text: str, out: Path, formats: tuple[str, ...], attribution: bool) -> list[Path]:
    """Write inspect --text's files into ``out``: attention.json, one head's heatmap, the layer's heads, the
    entropy overview and (a model with token embeddings) the attribution comparison."""
    lay = rec.layer[name]
    paths = [out / "attention.json"]
    paths[0].write_text(json.dumps(attention_json(rec, tokens, ids, text)) + "\n", encoding="utf-8")
    paths += plots.save(plots.heatmap(rec.probs[name][0, head], tokens, title=f"{name}, head {head}"),
                        out / f"attention_layer{lay}_head{head}", formats)
    paths += plots.save(plots.head_grid(rec.probs[name][0], tokens, f"{name}: all heads"),
                        out / f"heads_layer{lay}", formats)
    names = rec.select("self")
    overview = plots.layer_head_overview(entropy_per_head(rec, names), names, "entropy per head (nats) on this text")
    paths += plots.save(overview, out / "entropy", formats)
    embedding = getattr(model, "tok_emb", None)
    if attribution and embedding is not None and len(ids) > 1:
        from attnlab.inspect.attribution import explain

        result = explain(model, idx, embedding)
        target = tok.decode([int(result["target"])])
        panels = {"attention rollout": result["rollout"], "integrated gradients": result["integrated_gradients"],
                  "gradient × input": result["gradient_x_input"], "occlusion": result["occlusion"]}
        title = f"what the next-token prediction {plots.token_label(target)!r} depends on"
        paths += plots.save(plots.attribution_comparison(tokens, panels, title), out / "attribution", formats)
    return paths


# ----------------------------------------------------------------------------------- heads


@dataclass
class HeadReport:
    """The head table of ``attnlab heads``, the figures it wrote and the number of windows it averaged."""
    rows: list[HeadRow]
    paths: list[Path]
    n_windows: int


def heads_figure(stats: HeadStats):
    """Layer x head panels of the detector scores, entropy and mean distance."""
    plt = plots._plt()
    panels = [("previous_token", "previous-token score", (0, 1)), ("first_token", "first-token score", (0, 1)),
              ("induction", "induction score (repeated random)", (0, 1)), ("uniform", "uniformity H / log n", (0, 1)),
              ("entropy", "entropy (nats)", (None, None)), ("mean_distance", "mean distance (positions)", (None, None))]
    names, _ = stats.matrix("entropy")
    layers = [f"layer {stats.layer[n]}" for n in names]
    H = stats.matrix("entropy")[1].size(1)
    fig, axes = plt.subplots(2, 3, figsize=(3 * (1.2 + 0.55 * H), 2 * (1.3 + 0.45 * len(names))), squeeze=False)
    for ax, (metric, title, (lo, hi)) in zip(axes.flat, panels):
        plots.layer_head_overview(stats.matrix(metric)[1], layers, title, vmin=lo, vmax=hi, ax=ax)
    fig.tight_layout()
    return fig


def text_windows(ids: Tensor, block: int, n: int, seed: int) -> Tensor:
    """(n, block) random windows of a 1-D id tensor."""
    if ids.numel() < block:
        raise DataError(f"the data has {ids.numel()} tokens, fewer than one window of {block}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - block + 1, (n,), generator=g)
    return torch.stack([ids[s : s + block] for s in starts.tolist()])


def head_report(
    run_dir: str | Path,
    data: str,
    out: str | Path,
    n_batches: int = 8,
    batch_size: int = 16,
    seed: int = 0,
    formats: tuple[str, ...] = ("png", "svg"),
) -> HeadReport:
    """Head statistics of a run on ``data`` (a text file or a built-in corpus name), written to ``out``."""
    from attnlab.core.resources import check_room
    from attnlab.data.text import read_text, resolve_text_source
    from attnlab.models.size import check_fits

    if n_batches < 1 or batch_size < 1:
        raise ConfigError("--n-batches and --batch-size must be >= 1")
    if n_batches > MAX_BATCHES:  # each batch is a forward pass: a count far past this runs for days
        raise ConfigError(f"--n-batches {n_batches:,} is more than {MAX_BATCHES:,}; the averages settle long before")
    model, tok = _load(run_dir)
    check_fits(model.config, "the model", batch_size, inference=True, patterns=True)  # every layer's (B, H, T, T)
    block = _context(model)
    check_room(f"{n_batches:,} batches of {batch_size} x {block} tokens", memory=8 * batch_size * block
               * (n_batches + max(1, n_batches // 2)), advice="use a smaller --n-batches")  # int64 ids, kept
    ids = torch.tensor(tok.encode(read_text(resolve_text_source(data))))
    batches = [text_windows(ids, block, batch_size, seed + b) for b in range(n_batches)]
    vocab = int(getattr(model.config, "vocab_size", 0) or tok.vocab_size)
    probe = [repeated_random_tokens(batch_size, block // 2, vocab, seed=seed + 1000 + b)
             for b in range(max(1, n_batches // 2))]
    stats = collect_head_stats(model, batches, induction_batches=probe)
    rows = stats.rows()
    if model.config.family == "gpt" and getattr(model, "residual", None) is None:  # the causal side
        rise = ablation_effects(model, batches, model.config.n_layer, model.config.n_head, next_token_loss)
        for row in rows:
            row.ablation_loss_increase = float(rise[row.layer, row.head])
        rows.sort(key=lambda r: -r.ablation_loss_increase)
    out = Path(out)
    with staged_folder(out, ConfigError, replace=True) as folder:  # a kill leaves the old output or the new one
        check_heads_out(out)  # again, under the folder's lock
        paths = write_head_table(rows, folder)
        paths += plots.save(heads_figure(stats), folder / "heads", formats)
    return HeadReport(rows, [out / p.name for p in paths], n_batches * batch_size)


def next_token_loss(model: nn.Module, window: Tensor) -> Tensor:
    """Mean next-token cross-entropy of a GPT on windows (B, T): inputs [:, :-1], targets [:, 1:]."""
    return model(window[:, :-1], targets=window[:, 1:]).loss


def heads_json(rows: list[HeadRow]) -> dict:
    """{"heads": [{layer, head, previous_token, induction, duplicate_token, ablation_loss_increase}, ...]}
    in the order of ``rows`` (by causal effect when it was measured); NaN (not measured) becomes null."""
    keys = ("layer", "head", "previous_token", "induction", "duplicate_token", "ablation_loss_increase")

    def clean(v):
        return None if isinstance(v, float) and math.isnan(v) else v

    return {"heads": [{k: clean(getattr(r, k)) for k in keys} for r in rows]}


def summary(rows: list[HeadRow]) -> list[str]:
    """The heads ranked by causal effect (when measured), then one line per head type."""
    lines = []
    ranked = [r for r in rows if not math.isnan(r.ablation_loss_increase)]
    if ranked:
        lines.append("heads by causal effect (loss rise when mean-ablated, nats):")
        for r in ranked[:8]:
            lines.append(f"  L{r.layer}H{r.head}  {r.ablation_loss_increase:+.4f}   previous-token "
                         f"{r.previous_token:.2f}  induction {r.induction:.2f}  "
                         f"duplicate-token {r.duplicate_token:.2f}")
    for kind, cut in THRESHOLDS.items():
        found = flagged(rows, kind)
        heads = ", ".join(f"L{layer}H{h}" for layer, h in found) or "none"
        lines.append(f"{kind.replace('_', '-')} heads (score >= {cut}): {heads}")
    return lines
