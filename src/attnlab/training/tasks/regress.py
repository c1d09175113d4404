"""Regression on text: a BERT encoder predicts a number (or several) from a text, e.g. a property from a SMILES.

    y~ = (y - mu) / s   (mu, s: mean and std of the training rows' targets)
    y_hat~ = Dropout(pool(h_L(x))) W_r + b_r,      L = mean (y_hat~ - y~)^2
    reported: MAE = s mean |y_hat~ - y~| (original units); final scores MSE, MAE, R^2 and two baselines:
    the training mean, and ridge regression on bag-of-characters counts c(x) (a linear model that sees which
    characters a text holds but not their order): w = (C^T C + I)^-1 C^T y~ on the training rows

Rows, held-out split and tokenizer as in ``tasks/text_rows.py``; every label must be a finite number (a
label ``"2.5;0.1"`` gives two targets). mu and s are saved as ``targets.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.errors import CheckpointError, DataError
from attnlab.core.fileio import save_figure
from attnlab.training.tasks.base import Batch
from attnlab.training.tasks.text_rows import TextRowsTask

if TYPE_CHECKING:
    from attnlab.data.labelled import LabelledText

TARGETS_FILE = "targets.json"


def parse_targets(labels: list[str], source: str) -> Tensor:
    """Labels -> float64 targets (N, k): each label one number, or k numbers separated by ';'."""
    rows = []
    for i, label in enumerate(labels):
        try:
            values = [float(v) for v in label.split(";")]
        except ValueError:
            raise DataError(f"{source}: task=regress needs numeric labels, row {i + 1} has {label[:40]!r} "
                            "(use task=classify for class names)") from None
        if not all(math.isfinite(v) for v in values):
            raise DataError(f"{source}: row {i + 1} has a label that is not a finite number: {label[:40]!r}")
        if rows and len(values) != len(rows[0]):
            raise DataError(f"{source}: row {i + 1} has {len(values)} targets, row 1 has {len(rows[0])}")
        rows.append(values)
    return torch.tensor(rows, dtype=torch.float64)


def bag_of_characters_ridge(train_texts: list[str], train_y: Tensor, texts: list[str], ridge: float = 1.0) -> Tensor:
    """Predictions (N, k) for ``texts`` of a ridge regression on character counts fit to (train_texts, train_y):
    counts standardised on the training rows, an intercept, w = (C^T C + ridge I)^-1 C^T (y - mean y)."""
    chars = sorted(set("".join(train_texts)))
    index = {c: i for i, c in enumerate(chars)}

    def counts(rows: list[str]) -> Tensor:
        out = torch.zeros(len(rows), len(chars), dtype=torch.float64)  # (N, V)
        for r, text in enumerate(rows):
            for ch in text:
                if ch in index:
                    out[r, index[ch]] += 1
        return out

    c = counts(train_texts)
    mu, sd = c.mean(0), c.std(0).clamp(min=1e-9)
    z = (c - mu) / sd  # (N, V)
    y_mean = train_y.mean(0)
    w = torch.linalg.solve(z.T @ z + ridge * torch.eye(len(chars), dtype=torch.float64), z.T @ (train_y - y_mean))
    return ((counts(texts) - mu) / sd) @ w + y_mean


class RegressTask(TextRowsTask):
    """Text regression with a BERT encoder; metric MAE in the targets' units, R^2 at the end."""

    name = "regress"
    target_keys = ("targets",)

    def _targets(self, data: LabelledText, assets: Path | None) -> None:
        from attnlab.data.labelled import held_out_split

        y = parse_targets(data.labels, self.cfg.data)  # (N, k)
        if assets is not None:
            saved = self._load(assets)
            self.mean, self.std = torch.tensor(saved["mean"]), torch.tensor(saved["std"])
            if len(self.mean) != y.shape[1]:
                raise DataError(f"{self.cfg.data} has {y.shape[1]} targets per row, the model in {assets} "
                                f"predicts {len(self.mean)}")
        else:
            train, _ = held_out_split(data, self.cfg.classify.test_fraction, self.cfg.classify.split_seed)
            self.mean, self.std = y[train].mean(0), y[train].std(0).clamp(min=1e-12)
        self.targets = ((y - self.mean) / self.std).float()  # (N, k) standardised
        self.texts = data.texts
        self.cfg.model.n_targets = int(y.shape[1])

    @staticmethod
    def _load(folder: Path) -> dict[str, Any]:
        file = folder / TARGETS_FILE
        try:
            saved = json.loads(file.read_text(encoding="utf-8"))
            assert isinstance(saved, dict) and len(saved["mean"]) == len(saved["std"]) > 0
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AssertionError):
            raise CheckpointError(f"{file} is missing or corrupt: expected the targets' mean and std") from None
        return saved

    def save(self, folder: Path) -> None:
        from attnlab.core.fileio import atomic_write_text

        self.tokenizer.save(folder)
        atomic_write_text(folder / TARGETS_FILE, json.dumps({"mean": self.mean.tolist(), "std": self.std.tolist()},
                                                            indent=1) + "\n")

    def reported_loss(self, out: Any) -> Tensor:
        return out.reg_loss

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        err = (out.predictions.float() - batch["targets"]).abs() * self.std.to(out.predictions.device).float()
        return {"mae": err.mean()}

    def predict(self, model: torch.nn.Module, split: str = "val", batch_size: int = 64) -> tuple[Tensor, Tensor]:
        """(predictions, truths) (N, k) in the targets' units over the whole split."""
        preds, trues = [], []
        for out, batch in self._outputs(model, split, batch_size):
            preds.append(out.predictions.double().cpu() * self.std + self.mean)
            trues.append(batch["targets"].double() * self.std + self.mean)
        return torch.cat(preds), torch.cat(trues)

    def scores(self, model: torch.nn.Module, split: str = "val") -> dict[str, float]:
        """MSE, MAE, R^2 in the targets' units over every row of ``split``, and the baselines a model has to
        beat: the MAE of predicting the training mean, and the MAE and R^2 of the bag-of-characters ridge."""
        from attnlab.training.tasks.continuous import r2_score

        pred, true = self.predict(model, split)
        train = self.rows["train"].tolist()
        y_train = self.targets[train].double() * self.std + self.mean
        ridge = bag_of_characters_ridge([self.texts[i] for i in train], y_train,
                                        [self.texts[i] for i in self.rows[split].tolist()])
        return {"mse": float(((pred - true) ** 2).mean()), "mae": float((pred - true).abs().mean()),
                "r2": r2_score(pred, true), "mae_of_the_mean": float((self.mean - true).abs().mean()),
                "mae_of_bag_of_characters": float((ridge - true).abs().mean()),
                "r2_of_bag_of_characters": r2_score(ridge, true), "n": len(true)}

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """scores.json and predicted-vs-true.png on the held-out rows."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

        from attnlab.core.fileio import atomic_write_text

        s = self.scores(model, "val")
        atomic_write_text(run_dir / "scores.json", json.dumps(s, indent=1) + "\n")
        pred, true = self.predict(model, "val")
        fig = Figure(figsize=(4, 4))
        FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
        ax = fig.subplots()
        ax.scatter(true[:, 0].numpy(), pred[:, 0].numpy(), s=5, alpha=0.5)
        lo, hi = float(true.min()), float(true.max())
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
        ax.set_xlabel("true")
        ax.set_ylabel("predicted")
        ax.set_title(f"held-out: R² = {s['r2']:.3f}, MAE = {s['mae']:.3g}\nbaselines: the mean, MAE "
                     f"{s['mae_of_the_mean']:.3g}; bag of characters, MAE {s['mae_of_bag_of_characters']:.3g}",
                     fontsize=8)
        fig.tight_layout()
        save_figure(fig, run_dir / "predicted-vs-true.png", dpi=120)
        return [run_dir / "scores.json", run_dir / "predicted-vs-true.png"]


def load_target_scale(folder: Path) -> tuple[list[float], list[float]]:
    """The mean and std of the targets a regression run saved (targets.json): y = y~ std + mean."""
    saved = RegressTask._load(folder)
    return [float(v) for v in saved["mean"]], [float(v) for v in saved["std"]]
