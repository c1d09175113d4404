"""Self-distillation pre-training (task "dino", family dino): no labels, two global and V local views per image.

    L = mean over (teacher view g_i, student view x != g_i) of H(P_t(g_i), P_s(x))    (models/dino/model.py)

Images come from any image source (``data/images.py``); their labels, if any, are ignored. Each batch of B
images becomes 2 global views (model.image_size) and ``images.n_local_crops`` local ones (model.local_size),
augmented by ``data/multicrop.py`` after the classification normalisation (saved in labels.json, so a probe
or a classifier started from the run sees the pixels the encoder saw). The logged ``teacher_entropy`` is the
entropy of the batch-mean teacher distribution: ln K when the prototypes are all in use, near 0 when the
outputs have collapsed to one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.training.tasks.base import Batch, sample_rows
from attnlab.training.tasks.images import ImageClassificationTask

if TYPE_CHECKING:
    pass


class SelfDistillationTask(ImageClassificationTask):
    """Images (labels ignored) as multi-crop views for a DINO student and teacher."""

    task = "dino"

    def _views(self, images: Tensor, generator: torch.Generator) -> Batch:
        from attnlab.data.images import normalize
        from attnlab.data.multicrop import multi_crop

        m = self.cfg.model
        globals_, locals_ = multi_crop(normalize(images, self.mean, self.std), m.image_size, m.local_size,
                                       self.cfg.images.n_local_crops, generator)
        return {"globals_": globals_, "locals_": locals_}

    def batch(self, split: str, batch_size: int, generator: torch.Generator,
              shard: tuple[int, int] = (0, 1)) -> Batch:
        part = self.data[split]
        return self._views(part.images[sample_rows(len(part), batch_size, generator, shard)], generator)

    def eval_batches(self, split: str, batch_size: int, n_batches: int, seed: int) -> Iterator[Batch]:
        """``n_batches`` batches of views of the split's first images, drawn from ``seed`` (the same every time)."""
        part = self.data[split]
        gen = torch.Generator().manual_seed(seed)
        for i in range(n_batches):
            index = torch.arange(i * batch_size, (i + 1) * batch_size) % len(part)
            yield self._views(part.images[index], gen)

    def count(self, batch: Batch) -> int:
        return batch["globals_"].size(0)

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        return {"teacher_entropy": out.teacher_entropy, "per_image_entropy": out.per_image_entropy}

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """No figure: measure the encoder with ``attnlab probe RUN data=IMAGES`` (frozen features, linear probe)."""
        return []
