"""Where a captioner looks while it writes each word: cross-attention over the image patches, and the pointing game.

For an image, decode its caption greedily, then run the decoder once more teacher-forced on BOS y_1 .. y_n and
read the last decoder layer's cross-attention (heads averaged; the [CLS] column dropped and the rest renormalised):

    a_t[p] = mean_h P^h[t, 1 + p] / sum_p' mean_h P^h[t, 1 + p']       p = 1..N patches, row t predicts y_t

A word's map is the map of its first token (the step at which the model chose the word). Pointing game
(Zhang et al. 2018), fixed before any run: for every generated defect word ("pore", "crack", "inclusion")
whose kind is in the image, a hit when the patch of largest a_t holds at least one pixel of a defect of
that kind (``masks``); chance is the fraction of patches that do. Defect words of kinds absent from the
image are counted as ``hallucinated`` and not scored.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.core.fileio import save_figure
from attnlab.nn.hooks import capture


def words_of(labels: list[str]) -> list[tuple[str, int]]:
    """Token labels -> (word, index of its first token); a word starts at a token beginning with a space."""
    words: list[tuple[str, int]] = []
    for i, lab in enumerate(labels):
        if not lab:  # a special token: no word
            continue
        if not words or lab.startswith(" "):
            words.append((lab.strip(), i))
        else:
            words[-1] = (words[-1][0] + lab, words[-1][1])
    return [(w, i) for w, i in words if w]


@torch.no_grad()
def caption_attention(model: torch.nn.Module, encoder, image: Tensor) -> tuple[list[tuple[str, int]], Tensor]:
    """One normalised image (C, H, W) -> (its generated words with their first token, maps (T, gh, gw))."""
    from attnlab.generation import greedy_decode
    from attnlab.training.tasks.seq2seq import token_labels

    model.eval()
    x = image[None].to(next(model.parameters()).device)
    ids = greedy_decode(model, x, None, encoder.bos_id, encoder.eos_id, model.config.block_size - 1).tokens[0]
    tgt_in = torch.tensor([[encoder.bos_id, *ids]], device=x.device)
    last = f"decoder.{len(model.decoder) - 1}.cross_attn.hook_pattern"
    with capture(model, last) as seen:
        model(x, tgt_in)
    a = seen[last][0].float().mean(0)[:, 1:]  # (T, N): heads averaged, [CLS] dropped
    a = a / a.sum(-1, keepdim=True).clamp(min=1e-12)
    gh, gw = model.grid_size
    specials = {encoder.pad_id, encoder.bos_id, encoder.eos_id}
    labels = ["" if i in specials else lab for i, lab in zip(ids, token_labels(encoder.tokenizer, ids))]
    return words_of(labels), a.reshape(-1, gh, gw).cpu()


def patch_hits(mask: Tensor, code: int, grid: tuple[int, int]) -> Tensor:
    """(gh, gw) bool: patches holding at least one pixel of mask code ``code``."""
    gh, gw = grid
    H, W = mask.shape
    return (mask == code).reshape(gh, H // gh, gw, W // gw).any(dim=3).any(dim=1)


def pointing_game(model: torch.nn.Module, encoder, images: Tensor, masks: Tensor) -> dict[str, Any]:
    """The pointing game over ``images`` (B, C, H, W) normalised with their defect ``masks`` (B, H, W)."""
    from attnlab.data.micrographs import KINDS

    hits, n, chance, hallucinated = 0, 0, 0.0, 0
    for image, mask in zip(images, masks):
        words, maps = caption_attention(model, encoder, image)
        for word, t in words:
            if word not in KINDS:
                continue
            where = patch_hits(mask, 1 + KINDS.index(word), model.grid_size)
            if not where.any():
                hallucinated += 1
                continue
            peak = int(maps[t].argmax())
            hits += bool(where.flatten()[peak])
            chance += float(where.float().mean())
            n += 1
    return {"accuracy": hits / max(n, 1), "chance": chance / max(n, 1), "n": n, "hallucinated": hallucinated,
            "rule": "argmax patch of the word's last-layer cross-attention holds a defect of that kind"}


def render_word_attention(model: torch.nn.Module, encoder, images: Tensor, shown: Tensor, path: Path,
                          max_words: int = 14) -> Path:
    """PNG: one row per image (``images`` normalised, ``shown`` the uint8 pixels drawn): the image, then each
    generated word's cross-attention over the patches, overlaid."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

    rows = [caption_attention(model, encoder, image) for image in images]
    cols = 1 + min(max_words, max(len(w) for w, _ in rows))
    fig = Figure(figsize=(1.25 * cols, 1.6 * len(rows)), dpi=110)
    FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
    axes = fig.subplots(len(rows), cols, squeeze=False)
    H, W = shown.shape[-2:]
    for r, ((words, maps), pixels) in enumerate(zip(rows, shown)):
        grey = pixels[0].float().tolist()
        for ax in axes[r]:
            ax.axis("off")
        axes[r, 0].imshow(grey, cmap="gray")
        text = textwrap.wrap(" ".join(w for w, _ in words), 26)
        axes[r, 0].set_title("\n".join(text[:3] + (["..."] if len(text) > 3 else [])), fontsize=5, loc="left")
        for c, (word, t) in enumerate(words[: cols - 1], start=1):
            up = torch.nn.functional.interpolate(maps[t][None, None], size=(H, W), mode="nearest")[0, 0]
            axes[r, c].imshow(grey, cmap="gray")
            axes[r, c].imshow(up.tolist(), cmap="jet", alpha=0.45)
            axes[r, c].set_title(word, fontsize=7)
    fig.suptitle("cross-attention of each generated word over the patches (last decoder layer, heads averaged)",
                 fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    return path
