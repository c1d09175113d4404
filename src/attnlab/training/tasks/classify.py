"""Sequence classification of (text, label) rows: fine-tuning an encoder (or training one from scratch).

    p(y | x) = softmax(Dropout(pool(h_L(x))) W_c + b_c),    L = -(1/B) sum_b log p(y_b | x_b)

Rows, held-out split and tokenizer as in ``tasks/text_rows.py`` (wordpiece or char, or the pre-trained
model's); class names are saved as labels.json. Labels that are all numbers (more than ten values) are
refused: that is ``task=regress``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.errors import CheckpointError, ConfigError, DataError
from attnlab.core.fileio import save_figure
from attnlab.training.metrics import accuracy, confusion_matrix, macro_f1
from attnlab.training.tasks.base import Batch
from attnlab.training.tasks.text_rows import TextRowsTask

if TYPE_CHECKING:
    from attnlab.data.labelled import LabelledText

LABELS_FILE = "labels.json"


class ClassifyTask(TextRowsTask):
    """Text classification with a BERT encoder; metrics accuracy and macro-F1 on the held-out rows."""

    name = "classify"

    def _targets(self, data: LabelledText, assets: Path | None) -> None:
        numbers = data.numeric_labels()
        if numbers is not None and assets is None:
            raise DataError(f"{self.cfg.data}: every label is a number ({len(set(numbers))} distinct values, "
                            f"{min(numbers):g} to {max(numbers):g}): a regression target, not classes; train it with "
                            "task=regress (or write the labels as class names)")
        self.classes = self._load_classes(assets) if assets is not None else data.classes
        unknown = sorted(set(data.labels) - set(self.classes))
        if unknown:
            raise ConfigError(f"{self.cfg.data} has labels the model was not trained on: {unknown[:3]}")
        index = {c: i for i, c in enumerate(self.classes)}
        self.targets = self.labels = torch.tensor([index[y] for y in data.labels], dtype=torch.long)  # (N,)
        self.cfg.model.n_classes = len(self.classes)

    def _check_training_rows(self, data: LabelledText, rows: list[int]) -> None:
        seen = {data.labels[i] for i in rows}
        if len(seen) < 2:
            raise DataError(f"{self.cfg.data}: classify.test_fraction={self.cfg.classify.test_fraction:g} leaves "
                            f"{len(rows)} training row{'s' * (len(rows) != 1)} of {len(seen)} class; a classifier "
                            "needs two or more (use a smaller classify.test_fraction or more rows)")

    @staticmethod
    def _load_classes(folder: Path) -> list[str]:
        file = folder / LABELS_FILE
        try:
            classes = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"cannot read the class names in {file}: {e}") from None
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise CheckpointError(f"{file} must hold a JSON list of class names")
        return classes

    def reported_loss(self, out: Any) -> Tensor:
        return out.cls_loss

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        return {"accuracy": (out.logits.argmax(-1) == batch["labels"]).float().mean()}

    def predict(self, model: torch.nn.Module, split: str, batch_size: int = 64) -> tuple[Tensor, Tensor]:
        """(predicted class ids, true class ids) over the whole split."""
        preds, trues = [], []
        for out, batch in self._outputs(model, split, batch_size):
            preds.append(out.logits.argmax(-1).cpu())
            trues.append(batch["labels"])
        return torch.cat(preds), torch.cat(trues)

    def scores(self, model: torch.nn.Module, split: str = "val") -> dict[str, float]:
        """Exact accuracy and macro-F1 (``training/metrics.py``) over every row of ``split``."""
        pred, true = self.predict(model, split)
        return {"accuracy": accuracy(true, pred), "macro_f1": macro_f1(true, pred, len(self.classes)),
                "n": len(true)}

    def save(self, folder: Path) -> None:
        from attnlab.core.fileio import atomic_write_text

        self.tokenizer.save(folder)
        atomic_write_text(folder / LABELS_FILE, json.dumps(self.classes, ensure_ascii=False, indent=1) + "\n")

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """confusion.png: held-out confusion matrix (rows true, columns predicted), and the exact scores."""
        pred, true = self.predict(model, "val")
        fig = confusion_figure(confusion_matrix(true, pred, len(self.classes)).numpy(), self.classes,
                               self.scores(model, "val"))
        path = run_dir / "confusion.png"
        save_figure(fig, path, dpi=100)
        return [path]


def load_classes(folder: Path) -> list[str]:
    """The class names a classification run saved (labels.json), index i for class i."""
    return ClassifyTask._load_classes(folder)


def confusion_figure(cm: Any, classes: list[str], scores: dict[str, float]) -> Any:
    """The confusion matrix ``cm`` (K x K counts, rows true) as a figure titled with the held-out accuracy and
    macro-F1 (on two lines, centred on the figure, so that it fits at any K and any length of class name)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

    fig = Figure(figsize=(max(3.0, 1.2 + 0.6 * len(classes)), 1 + 0.6 * len(classes)))
    FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
    ax = fig.subplots()
    ax.imshow(cm, cmap="Blues")
    for (i, j), v in np.ndenumerate(cm):
        ax.text(j, i, str(v), ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(classes)), classes, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.suptitle(f"held-out accuracy {scores['accuracy']:.3f}\nmacro-F1 {scores['macro_f1']:.3f}", fontsize=9)
    fig.tight_layout()
    return fig
