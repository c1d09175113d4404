"""Image classification: predict the class y of an image x (ViT or CNN).

    L = -(1/B) sum_b log softmax(f(x_b))[y_b],      accuracy = (1/B) sum_b [argmax f(x_b) = y_b]

Training batches are drawn at random (with replacement of batches, not within one) from the
training split, augmented and normalised; evaluation walks the whole val and test splits.
Besides the weights every checkpoint holds ``labels.json``: the class names and the normalisation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.errors import CheckpointError, DataError
from attnlab.core.fileio import atomic_write_text, save_figure
from attnlab.training.tasks.base import Batch, Task, sample_rows
from attnlab.training.tasks.names import check_family

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig

LABELS_NAME = "labels.json"


def load_labels(folder: str | Path) -> dict[str, Any]:
    """``labels.json`` of a run/checkpoint: {"classes": [...], "mean": [...], "std": [...]}."""
    path = Path(folder) / LABELS_NAME
    if not path.is_file():
        raise CheckpointError(f"no {LABELS_NAME} in {folder}: not an image classification run")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(data["classes"], list) and len(data["mean"]) == len(data["std"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AssertionError):
        raise CheckpointError(f"{path} is corrupt: expected classes, mean and std") from None
    return data


class ImageClassificationTask(Task):
    """Images and labels from data/images.py; class names and normalisation saved with the model."""

    unit = "images"
    splits = ("train", "val", "test")
    task: str = "image-classification"  # the task's name, for messages

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        from attnlab.data.images import channel_stats, load_splits

        super().__init__(cfg, assets, world_size)
        m, opts = cfg.model, cfg.images
        check_family(self.task, m.family)
        saved = load_labels(assets) if assets is not None else None
        self.data = load_splits(cfg.data, m.in_channels, m.image_size, cfg.val_fraction, opts.test_fraction,
                                opts.train_fraction, opts.split_seed, opts.resize,
                                classes=saved["classes"] if saved else None, n_generated=opts.n_generated,
                                data_seed=opts.data_seed)
        self.classes: list[str] = self.data["train"].classes
        if saved is not None:
            if saved["classes"] != self.classes:
                raise DataError(f"data '{cfg.data}' has classes {self.classes[:5]}..., but the model in {assets} "
                                f"was trained on {saved['classes'][:5]}...")
            self.mean, self.std = saved["mean"], saved["std"]
        else:
            self.mean, self.std = channel_stats(self.data["train"].images)
        if len(self.data["train"]) < world_size:
            raise DataError(f"the training split has {len(self.data['train'])} images, fewer than {world_size} "
                            "processes")
        if hasattr(cfg.model, "n_classes"):  # a classifier; a masked autoencoder has no head to size
            cfg.model.n_classes = len(self.classes)

    def _inputs(self, images: Tensor, labels: Tensor) -> Batch:
        from attnlab.data.images import normalize

        return {"images": normalize(images, self.mean, self.std), "labels": labels}

    def batch(self, split: str, batch_size: int, generator: torch.Generator,
              shard: tuple[int, int] = (0, 1)) -> Batch:
        from attnlab.data.images import augment

        part = self.data[split]
        index = sample_rows(len(part), batch_size, generator, shard)  # (B,)
        images = part.images[index]  # (B, C, H, W) uint8
        if split == "train":
            images = augment(images, generator, self.cfg.images.shift, self.cfg.images.flip)
        return self._inputs(images, part.labels[index])

    def eval_batches(self, split: str, batch_size: int, n_batches: int, seed: int) -> Iterator[Batch]:
        """val/test: the whole split once, in order, in near-equal batches (sizes differ by at most 1,
        so the mean of batch accuracies is the accuracy over the split to within 1/N^2); train:
        ``n_batches`` random un-augmented batches."""
        if split == "train":
            gen = torch.Generator().manual_seed(seed)
            part = self.data["train"]
            for _ in range(n_batches):
                index = torch.randint(len(part), (batch_size,), generator=gen)
                yield self._inputs(part.images[index], part.labels[index])
            return
        part = self.data[split]
        n = -(-len(part) // batch_size)  # ceil
        for index in torch.arange(len(part)).tensor_split(n):
            yield self._inputs(part.images[index], part.labels[index])

    def count(self, batch: Batch) -> int:
        return batch["labels"].numel()

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        return {"accuracy": (out.logits.argmax(dim=-1) == batch["labels"]).float().mean()}

    def save(self, folder: Path) -> None:
        labels = {"classes": self.classes, "mean": self.mean, "std": self.std, "data": self.cfg.data}
        atomic_write_text(Path(folder) / LABELS_NAME, json.dumps(labels, indent=2))

    @torch.no_grad()
    def predict(self, model: torch.nn.Module, split: str, batch_size: int = 256) -> tuple[Tensor, Tensor]:
        """(predicted, true) labels over a whole split."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        preds, trues = [], []
        for batch in self.eval_batches(split, batch_size, 0, 0):
            preds.append(model(batch["images"].to(device)).logits.argmax(-1).cpu())
            trues.append(batch["labels"])
        model.train(was_training)
        return torch.cat(preds), torch.cat(trues)

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """confusion_matrix.png: counts of (true class, predicted class) on the test split."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

        pred, true = self.predict(model, "test")
        k = len(self.classes)
        counts = torch.bincount(true * k + pred, minlength=k * k).reshape(k, k)  # (true, predicted)
        accuracy = counts.diag().sum().item() / max(len(true), 1)
        size = max(4.0, 0.55 * k + 2)
        fig = Figure(figsize=(size, size * 0.9), dpi=110)
        FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
        ax = fig.subplots()
        ax.imshow(counts.tolist(), cmap="Blues")
        if k <= 20:
            top = counts.max().item()
            for i in range(k):
                for j in range(k):
                    v = counts[i, j].item()
                    ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                            color="white" if v > 0.5 * top else "black")
        names = [c if len(c) <= 12 else c[:11] + "." for c in self.classes]
        ax.set_xticks(range(k), names, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(k), names, fontsize=8)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title(f"test accuracy {accuracy:.2%} ({len(true)} images)")
        fig.tight_layout()
        path = Path(run_dir) / "confusion_matrix.png"
        save_figure(fig, path)
        return [path]
