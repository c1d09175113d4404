"""micrograph-saliency in quick mode: the protocol, every map scored against the defect masks, the figures."""

from __future__ import annotations

import torch

from attnlab.experiments.micrograph_saliency import GRID, region_patches
from tests.helpers import run_quick_experiment


def test_region_patches_are_the_patches_a_mask_touches():
    mask = torch.zeros(64, 64, dtype=torch.uint8)
    mask[9:11, 30:42] = 2  # rows of patch row 1; columns of patch columns 3, 4, 5
    assert region_patches(mask) == {GRID + 3, GRID + 4, GRID + 5}


def test_quick_run_scores_every_map(tmp_path):
    record, results = run_quick_experiment("micrograph-saliency", tmp_path)
    assert record["protocol"]["seeds"] == [0, 1, 2] and record["verdict"] in ("held", "not held", "not decidable")
    for m in ("attention", "rollout", "gradcam", "random_vit", "random_cnn"):
        row = results["methods"][m]
        assert 0 <= row["pointing"]["mean"] <= 1 and 0 < row["chance"]["mean"] < 1 and len(row["auc"]["values"]) == 3
    assert {o["rule"].split("'")[0] for o in results["outcomes"]} == {"attention", "rollout", "gradcam"}
    assert (tmp_path / "maps.png").stat().st_size > 5000
