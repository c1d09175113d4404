"""Regression or classification of continuous inputs (feature sequences, (element, value) sets) with
the encoder family.

    regression:      targets standardised with the training split's mean mu and std s,
                     y~ = (y - mu) / s;  L = mean (y_hat - y~)^2;  reported MAE = s * mean |y_hat - y~|
    classification:  L = cross-entropy over the class names found in the data (sorted)

A seeded ``continuous.test_fraction`` of the rows is split "val" and never trained on; evaluation walks
all of it. What the model needs besides its weights (element names, class names, mu and s) is saved
as ``inputs.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from attnlab.core.errors import CheckpointError, ConfigError, DataError
from attnlab.core.fileio import save_figure
from attnlab.training.tasks.base import Batch, RowsTask
from attnlab.training.tasks.names import check_family

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig

INPUTS_FILE = "inputs.json"


def r2_score(pred: Tensor, true: Tensor) -> float:
    """R^2 = 1 - sum (y - y_hat)^2 / sum (y - mean y)^2 (over all rows and outputs)."""
    ss_res = float(((true - pred) ** 2).sum())
    ss_tot = float(((true - true.mean(0)) ** 2).sum())
    return 1.0 - ss_res / max(ss_tot, 1e-12)


class ContinuousTask(RowsTask):
    """Encoder on continuous data; metrics MAE (regression, original units) or accuracy (classification)."""

    unit = "examples"
    target_keys = ("targets", "labels")

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        from attnlab.data.continuous import read_continuous
        from attnlab.data.labelled import split_indices

        super().__init__(cfg, assets, world_size)
        check_family("continuous", cfg.model.family)
        from attnlab.data.audio import FrontEnd

        opts = cfg.continuous
        saved = self._load_inputs(assets) if assets is not None else None
        self.front = FrontEnd(**saved["audio"]) if saved and saved.get("audio") else \
            FrontEnd(opts.audio_seconds, opts.n_mels)
        data = read_continuous(cfg.data, opts.target, opts.n_generated, opts.data_seed,
                               element_names=saved["element_names"] if saved and saved["element_names"] else None,
                               front=self.front)
        self.audio = data.front is not None  # the features are log-mel frames of audio clips
        m = cfg.model
        if data.kind != getattr(m, "inputs", "features"):
            if m.family in ("recurrent", "mlp"):
                raise ConfigError(f"{cfg.data} holds sets; the {m.family} family reads feature sequences only")
            raise ConfigError(f"{cfg.data} holds {data.kind} but model.inputs={m.inputs}; set model.inputs={data.kind}")
        self.regression = m.head == "regression"
        if data.held_out is not None:  # the data's own test split (audio folders, generated speech)
            train, held_out = np.flatnonzero(~data.held_out).tolist(), np.flatnonzero(data.held_out).tolist()
        else:
            train, held_out = split_indices(len(data), opts.test_fraction, opts.split_seed)
        self.rows = {"train": torch.tensor(train), "val": torch.tensor(held_out)}
        self.inputs: dict[str, Tensor] = {}
        if data.features is not None:
            self.inputs["features"] = torch.from_numpy(data.features)  # (N, T, F)
            m.n_features = int(data.features.shape[-1])
            if m.family == "mlp":  # a fixed input length: T as well
                if m.n_steps not in (None, data.features.shape[1]):
                    raise DataError(f"{cfg.data} has {data.features.shape[1]} steps per row; this mlp takes "
                                    f"{m.n_steps}")
                m.n_steps = int(data.features.shape[1])
        else:
            self.inputs["elements"] = torch.from_numpy(data.elements)  # (N, S)
            self.inputs["values"] = torch.from_numpy(data.values)  # (N, S)
            self.inputs["mask"] = torch.from_numpy(data.mask)  # (N, S)
            n_el = len(saved["element_names"]) if saved and saved["element_names"] else len(data.element_names)
            if int(data.elements[data.mask].max()) >= n_el:
                raise DataError(f"{cfg.data} has element ids >= {n_el}, more than the model knows")
            m.n_elements = n_el
        self.element_names = data.element_names
        if self.regression:
            try:
                y = torch.tensor([[float(v)] if not isinstance(v, list) else [float(x) for x in v]
                                  for v in data.targets], dtype=torch.float64)  # (N, k)
            except (TypeError, ValueError):
                raise DataError(f"{cfg.data}: head=regression needs numeric targets; use model.head=classification "
                                "for class names") from None
            if not torch.isfinite(y).all():
                raise DataError(f"{cfg.data}: targets hold NaN or infinite values")
            if saved:
                self.mean, self.std = torch.tensor(saved["target_mean"]), torch.tensor(saved["target_std"])
            else:
                yt = y[self.rows["train"]]
                self.mean, self.std = yt.mean(0), yt.std(0).clamp(min=1e-12)
            self.targets = ((y - self.mean) / self.std).float()  # (N, k) standardised
            self.classes: list[str] = []
            m.n_outputs = int(y.shape[1])
        else:
            names = [str(v) for v in data.targets]
            self.classes = saved["classes"] if saved else sorted(set(names))
            unknown = sorted(set(names) - set(self.classes))
            if unknown:
                raise ConfigError(f"{cfg.data} has labels the model was not trained on: {unknown[:3]}")
            if len(self.classes) < 2:
                raise DataError(f"{cfg.data}: every row has the label {self.classes[0]!r}; nothing to learn")
            index = {c: i for i, c in enumerate(self.classes)}
            self.labels = torch.tensor([index[v] for v in names], dtype=torch.long)  # (N,)
            m.n_classes = len(self.classes)

    @staticmethod
    def _load_inputs(folder: Path) -> dict[str, Any]:
        file = folder / INPUTS_FILE
        try:
            saved = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"cannot read {file}: {e}") from None
        keys = {"element_names", "classes", "target_mean", "target_std"}
        if not isinstance(saved, dict) or not keys <= set(saved):
            raise CheckpointError(f"{file} must be an object with keys {sorted(keys)}")
        return saved

    def save(self, folder: Path) -> None:
        from attnlab.core.fileio import atomic_write_text

        saved = {"element_names": self.element_names, "classes": self.classes,
                 "target_mean": self.mean.tolist() if self.regression else None,
                 "target_std": self.std.tolist() if self.regression else None,
                 "audio": {"seconds": self.front.seconds, "n_mels": self.front.n_mels} if self.audio else None}
        atomic_write_text(folder / INPUTS_FILE, json.dumps(saved, indent=1) + "\n")

    def _gather(self, rows: Tensor) -> Batch:
        batch = {k: v[rows] for k, v in self.inputs.items()}
        if "mask" in batch:  # trim the slots that are padding in every row
            width = int(batch["mask"].sum(1).max())
            batch = {k: v[:, :width] for k, v in batch.items()}
        if self.regression:
            batch["targets"] = self.targets[rows]  # (B, k)
        else:
            batch["labels"] = self.labels[rows]  # (B,)
        return batch

    def count(self, batch: Batch) -> int:
        return int(next(iter(batch.values())).size(0))

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        if self.regression:
            err = (out.predictions.float() - batch["targets"]).abs() * self.std.to(out.predictions.device).float()
            return {"mae": err.mean()}
        return {"accuracy": (out.predictions.argmax(-1) == batch["labels"]).float().mean()}

    def predict(self, model: torch.nn.Module, split: str = "val", batch_size: int = 256) -> tuple[Tensor, Tensor]:
        """(predictions, truths) over the whole split: original units (regression) or class ids."""
        preds, trues = [], []
        for out, batch in self._outputs(model, split, batch_size):
            if self.regression:
                preds.append(out.predictions.double().cpu() * self.std + self.mean)
                trues.append(batch["targets"].double() * self.std + self.mean)
            else:
                preds.append(out.predictions.argmax(-1).cpu())
                trues.append(batch["labels"])
        return torch.cat(preds), torch.cat(trues)

    def scores(self, model: torch.nn.Module, split: str = "val") -> dict[str, float]:
        """Regression: MSE, MAE, R^2 in original units; classification: accuracy; over every row of ``split``."""
        pred, true = self.predict(model, split)
        if self.regression:
            return {"mse": float(((pred - true) ** 2).mean()), "mae": float((pred - true).abs().mean()),
                    "r2": r2_score(pred, true), "n": len(true)}
        return {"accuracy": float((pred == true).double().mean()), "n": len(true)}

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """scores.json, and predicted-vs-true.png (regression) on the held-out rows."""
        from attnlab.core.fileio import atomic_write_text

        s = self.scores(model, "val")
        out = [run_dir / "scores.json"]
        atomic_write_text(out[0], json.dumps(s, indent=1) + "\n")
        if self.regression:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

            pred, true = self.predict(model, "val")
            fig = Figure(figsize=(4, 4))
            FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
            ax = fig.subplots()
            ax.scatter(np.asarray(true[:, 0]), np.asarray(pred[:, 0]), s=4, alpha=0.5)
            lo, hi = float(true.min()), float(true.max())
            ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
            ax.set_xlabel("true")
            ax.set_ylabel("predicted")
            ax.set_title(f"held-out: R² = {s['r2']:.3f}, MAE = {s['mae']:.3g}")
            fig.tight_layout()
            out.append(run_dir / "predicted-vs-true.png")
            save_figure(fig, out[-1], dpi=120)
        return out
