"""micrograph-saliency in quick mode: the protocol, every map scored against the defect masks, the figures, and a
run cut off in the middle taken up again with --resume."""

from __future__ import annotations

import pytest
import torch

import attnlab.experiments.micrograph_saliency as ms
from attnlab.experiments.micrograph_saliency import GRID, region_patches
from tests.helpers import read_quick_experiment


def test_region_patches_are_the_patches_a_mask_touches():
    mask = torch.zeros(64, 64, dtype=torch.uint8)
    mask[9:11, 30:42] = 2  # rows of patch row 1; columns of patch columns 3, 4, 5
    assert region_patches(mask) == {GRID + 3, GRID + 4, GRID + 5}


def test_a_quick_run_cut_off_resumes_from_its_kept_runs_and_scores_every_map(tmp_path, monkeypatch):
    """The first sitting ends during the 4th of the 8 runs; --resume runs the other 5 and writes the whole record,
    checked as a quick run's (one run serves both checks: each sitting trains for a few seconds). The runs run in this
    process (the default engine), where the replaced ``seed_run`` counts them."""
    done: list[tuple[str, int, float]] = []
    real = ms.seed_run

    def cut(family, seed, lr, *rest):
        if len(done) == 3:
            raise KeyboardInterrupt  # the sitting ends during the 4th run
        done.append((family, seed, lr))
        return real(family, seed, lr, *rest)

    monkeypatch.setattr(ms, "seed_run", cut)
    with pytest.raises(KeyboardInterrupt):
        ms.run(tmp_path, quick=True)
    assert len(list((tmp_path / ".runs").glob("*/*.json"))) == 3 + 1  # 3 runs and the sittings record
    done.clear()
    monkeypatch.setattr(ms, "seed_run", lambda *a: (done.append(a[:3]), real(*a))[1])
    ms.run(tmp_path, quick=True, resume=True)
    assert len(done) == 2 * 4 - 3  # 2 families x (3 seeds + the held-out one), less the 3 kept
    record, results = read_quick_experiment("micrograph-saliency", tmp_path)
    assert len(results["arms"]["vit"]["test_accuracy"]["values"]) == 3
    assert (tmp_path / "maps.png").stat().st_size > 5000  # drawn from seed 0's weights kept by the first sitting
    assert (tmp_path / "pointing.png").stat().st_size > 1000  # drawn in the training part too, and published
    assert "![maps.png](maps.png)" in (tmp_path / "report.md").read_text()
    protocol = record["protocol"]
    assert protocol["seeds"] == [0, 1, 2] and protocol["confirm_seeds"] == [3]
    assert protocol["select_on"] == "val_accuracy" and set(protocol["lr_sweep"]) == {"vit", "cnn"}
    assert record["verdict"] in ("held", "not held", "not decidable")
    for m in ("attention", "rollout", "gradcam", "random_vit", "random_cnn"):
        row = results["methods"][m]
        assert 0 <= row["pointing"]["mean"] <= 1 and 0 < row["chance"]["mean"] < 1 and len(row["auc"]["values"]) == 3
    for arm in ("vit", "cnn"):  # each model trained to its budget or a plateau, with a held-out seed
        a = results["arms"][arm]
        assert a["steps"]["values"] == [ms.QUICK["max_steps"]] * 3
        assert len(a["confirmation"]["test_accuracy"]["values"]) == 1
        assert results["methods"]["gradcam" if arm == "cnn" else "rollout"]["accuracy"] == a["test_accuracy"]
    assert {o["rule"].split("'")[0] for o in results["outcomes"]} == {"attention", "rollout", "gradcam"}
    assert not (tmp_path / ".runs").exists()  # the kept runs (and seed 0's weights) go once the run is whole
