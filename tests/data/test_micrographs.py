"""Generated micrographs: reproducible, labels that match the drawn defects, masks that mark them, visible defects,
the image-data source, the folder writer and the command that runs it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.core.errors import DataError
from attnlab.data import micrographs as M
from attnlab.data.images import load_image_folder, load_splits


def test_an_image_is_redrawn_exactly_from_its_seed_and_index():
    a, b = M.micrograph(64, ["pore", "crack"], seed=3, index=7), M.micrograph(64, ["pore", "crack"], seed=3, index=7)
    assert np.array_equal(a.image, b.image) and np.array_equal(a.mask, b.mask)
    c = M.micrograph(64, ["pore", "crack"], seed=4, index=7)
    assert not np.array_equal(a.image, c.image)


@pytest.mark.parametrize("task", list(M.TASKS))
def test_labels_cycle_through_the_classes_and_match_the_defects_drawn(task):
    images, labels, masks, defects = M.generate(task, 24, 64, 0)
    assert images.shape == (24, 1, 64, 64) and images.dtype == np.uint8 and masks.shape == (24, 64, 64)
    assert np.bincount(labels).tolist() == [24 // len(M.TASKS[task])] * len(M.TASKS[task])
    for label, mask, placed in zip(labels, masks, defects):
        name = M.TASKS[task][label]
        codes = set(np.unique(mask).tolist()) - {0}
        assert codes == {1 + M.KINDS.index(d.kind) for d in placed}  # every defect drawn is in the mask
        if task == "type":
            assert [d.kind for d in placed] == [name]
        elif task == "count":
            assert len(placed) == int(name)
        else:
            assert (len(placed) == 0) == (name == "none") and len(placed) <= 3


def test_each_defects_box_holds_its_mask_and_defects_do_not_touch():
    for i in range(30):
        m = M.micrograph(64, ["pore", "crack", "inclusion"], seed=0, index=i)
        boxes = []
        for d in m.defects:
            top, left, bottom, right = d.box
            inside = np.zeros_like(m.mask, dtype=bool)
            inside[top:bottom, left:right] = True
            code = 1 + M.KINDS.index(d.kind)
            assert (m.mask == code).any() and not ((m.mask == code) & ~inside).any()
            boxes.append(m.mask == code)
        grown = [M._dilate(b, 1) for b in boxes]  # 2 w apart: even grown by 1 px, no two defects meet
        assert not any((grown[a] & grown[b]).any() for a in range(3) for b in range(a + 1, 3))


def test_defects_are_visible_against_the_grains():
    """Pores and cracks are darker than the image around them, inclusions brighter (after blur and noise)."""
    darker = {"pore": [], "crack": [], "inclusion": []}
    for i in range(20):
        m = M.micrograph(64, ["pore", "crack", "inclusion"], seed=1, index=i)
        background = m.image[m.mask == 0].mean()
        for k, kind in enumerate(M.KINDS):
            darker[kind].append(m.image[m.mask == k + 1].mean() - background)
    assert np.mean(darker["pore"]) < -40 and np.mean(darker["crack"]) < -25 and np.mean(darker["inclusion"]) > 40


@pytest.mark.parametrize("size", [32, 128])
def test_sizes_scale_the_same_field(size):
    m = M.micrograph(size, ["pore"], seed=0, index=0)
    assert m.image.shape == (size, size) and 0 < (m.mask > 0).mean() < 0.05


def test_sizes_outside_the_range_and_unknown_names_are_one_line_errors():
    with pytest.raises(DataError, match="32 to 512"):
        M.micrograph(16, [], 0, 0)
    with pytest.raises(DataError, match="generated:micrograph-types"):
        load_splits("generated:micrograph", 1, 64, 0.1, 0.2)


def test_the_image_source_keeps_masks_aligned_with_images_through_the_splits():
    splits = load_splits("generated:micrograph-types", 3, 32, 0.1, 0.2, n_generated=60, data_seed=5)
    images, labels, masks, _ = M.generate("type", 60, 32, 5)
    assert sum(len(s) for s in splits.values()) == 60
    for part in splits.values():
        assert part.images.shape[1:] == (3, 32, 32) and part.classes == ["crack", "inclusion", "pore"]
        for img, mask, label in zip(part.images, part.masks, part.labels):
            j = next(j for j in range(60) if np.array_equal(images[j, 0], img[0].numpy()))
            assert torch.equal(mask, torch.from_numpy(masks[j].copy())) and label == labels[j]
            assert torch.equal(img[0], img[2])  # grey repeated to RGB


def test_the_folder_writer_round_trips_through_the_folder_loader(tmp_path):
    out = tmp_path / "mg"
    assert main(["data", "micrographs", "--out", str(out), "--task", "count", "--n", "40", "--size", "32",
                 "--seed", "2"]) == 0
    images, labels, masks, defects = M.generate("count", 40, 32, 2)
    train = load_image_folder(out / "train", 1, 32)
    test = load_image_folder(out / "test", 1, 32, classes=train.classes)
    assert len(train) + len(test) == 40 and len(test) == 8 and train.classes == ["0", "1", "2", "3"]
    rows = [json.loads(line) for line in (out / "defects.jsonl").read_text().splitlines()]
    for row in rows:
        i = int(row["file"].split("/")[-1].split(".")[0])
        assert row["class"] == str(len(row["defects"])) == M.TASKS["count"][labels[i]]
        assert [d["kind"] for d in row["defects"]] == [d.kind for d in defects[i]]
        from PIL import Image

        assert np.array_equal(np.asarray(Image.open(out / row["file"])), images[i, 0])
        assert np.array_equal(np.asarray(Image.open(out / "masks" / row["file"])) // 80, masks[i])


@pytest.mark.parametrize("argv, message", [
    (["--size", "20"], "--size must be 32 to 512"),
    (["--n", "2", "--test-fraction", "0.9"], "--test-fraction must leave images"),
    (["--task", "colour"], "invalid choice"),
])
def test_bad_arguments_get_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "x"
    assert main(["data", "micrographs", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_non_empty_out_folder_is_refused(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["data", "micrographs", "--out", str(tmp_path), "--n", "4"]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_an_out_folder_that_cannot_be_written_is_refused_before_generating(tmp_path, capsys, monkeypatch):
    import attnlab.data.micrographs as micrographs

    monkeypatch.setattr(micrographs, "generate", lambda *a: pytest.fail("images were generated"))
    (tmp_path / "a-file").write_text("x")
    assert main(["data", "micrographs", "--out", str(tmp_path / "a-file" / "sub"), "--n", "4"]) == 2
    err = capsys.readouterr().err
    assert "cannot write in --out" in err and len(err.strip().splitlines()) == 1


def test_a_vit_trains_on_generated_micrographs_through_the_cli(tmp_path):
    assert main(["train", "vit-micrographs", f"out_dir={tmp_path}", "max_iters=4", "eval_interval=4", "eval_iters=1",
                 "batch_size=8", "images.n_generated=40", "model.image_size=32", "progress=false"]) == 0
    run = next(tmp_path.iterdir())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("test_accuracy" in r for r in records)
    assert json.loads((run / "labels.json").read_text())["classes"] == ["defect", "none"]


def test_a_kill_before_the_folder_is_in_place_leaves_nothing_and_the_rerun_writes_it_whole(tmp_path):
    """Killed (SIGKILL) with every image written but the folder not yet renamed in: no --out at all (a partial
    set once trained silently on 18 of 40 images), and the same command then succeeds, clearing its leftover."""
    import os
    import subprocess
    import sys

    out = tmp_path / "mg"
    argv = [sys.executable, "-m", "attnlab.cli", "data", "micrographs", "--out", str(out), "--n", "6", "--size", "32"]
    killed = subprocess.run(argv, env={**os.environ, "ATTNLAB_KILL_AT": "staging.filled"}, capture_output=True)
    assert killed.returncode == -9 and not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".mg.staging-")]  # the killed one's leftover
    assert main(["data", "micrographs", "--out", str(out), "--n", "6", "--size", "32"]) == 0
    assert len(list(out.glob("t*/*/*.png"))) == 6 and (out / "defects.jsonl").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".mg.staging-")]
