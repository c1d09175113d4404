"""Captions from ground truth: every defect named with its quadrant, in a fixed order; and the pointing game's
bookkeeping (words from tokens, patches holding a kind, hits, chance and hallucinated words)."""

from __future__ import annotations

import torch

from attnlab.data.captions import caption, quadrant
from attnlab.data.micrographs import Defect, generate
from attnlab.training.tasks import caption_attention as CA


def _d(kind, row, col):
    return Defect(kind, (row, col), (0, 0, 0, 0))


def test_captions_name_every_defect_by_kind_then_quadrant():
    assert caption((), 64) == "no defects"
    assert [quadrant(_d("pore", r, c), 64) for r, c in ((5, 5), (5, 40), (40, 5), (32, 32))] == [0, 1, 2, 3]
    got = caption((_d("inclusion", 50, 50), _d("pore", 40, 10), _d("pore", 3, 60)), 64)
    assert got == "a pore at the top right and a pore at the bottom left and an inclusion at the bottom right"


def test_generated_captions_agree_with_the_masks():
    _, labels, masks, defects = generate("count", 40, 64, 0)
    for label, mask, placed in zip(labels, masks, defects):
        text = caption(placed, 64)
        assert (text == "no defects") == (label == 0) and text.count(" at the ") == label
        for kind in ("pore", "crack", "inclusion"):
            assert (f" {kind} " in f" {text} ") == bool((mask == 1 + ("pore", "crack", "inclusion").index(kind)).any())


def test_words_start_at_a_space_and_skip_special_tokens():
    assert CA.words_of(["a", " po", "re", "", " at"]) == [("a", 0), ("pore", 1), ("at", 4)]


def test_the_pointing_game_scores_the_first_token_of_each_defect_word(monkeypatch):
    mask = torch.zeros(2, 8, 8, dtype=torch.uint8)
    mask[0, 0:2, 0:2] = 1  # a pore in the top-left patch of a 2 x 2 grid of 4 x 4 patches
    maps = torch.zeros(3, 2, 2)
    maps[0, 0, 0] = 1.0  # "pore" looks at the top-left patch: a hit
    maps[2, 1, 1] = 1.0  # "crack": no crack in image 0 -> hallucinated; in image 1 no crack either

    class Model:
        grid_size = (2, 2)

    monkeypatch.setattr(CA, "caption_attention", lambda m, e, image: ([("pore", 0), ("at", 1), ("crack", 2)], maps))
    r = CA.pointing_game(Model(), None, torch.zeros(2, 1, 8, 8), mask)
    assert r["n"] == 1 and r["accuracy"] == 1.0 and r["chance"] == 0.25 and r["hallucinated"] == 3
    assert CA.patch_hits(mask[0], 1, (2, 2)).tolist() == [[True, False], [False, False]]
