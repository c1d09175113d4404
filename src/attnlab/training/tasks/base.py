"""The interface between the training loop and what is trained: ``Task``.

The trainer calls, per optimisation step, ``batch("train", ...)`` and ``model(**batch)``, then
backpropagates ``out.loss`` (the full objective, auxiliary losses included) and logs
``reported_loss(out)`` (e.g. the cross-entropy alone). Evaluation averages ``reported_loss`` and
``metrics(out, batch)`` over ``eval_batches(split, ...)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig

Batch = dict[str, Tensor]


def sample_rows(n: int, batch_size: int, generator: torch.Generator, shard: tuple[int, int] = (0, 1)) -> Tensor:
    """Indices (B,) into a split of ``n`` examples: the generator draws a global batch of
    world_size x B indices and this process takes rows rank*B .. (rank+1)*B - 1 (see ``Task.batch``)."""
    rank, world = shard
    index = torch.randint(n, (batch_size * world,), generator=generator)  # (world B,)
    return index[rank * batch_size : (rank + 1) * batch_size]  # (B,)


class Task(ABC):
    """Data, objective and evaluation of one kind of training.

    The constructor reads the data named by ``cfg``, loads (from ``assets``, a checkpoint or run
    folder) or builds what the model needs besides its weights, and fills the model config fields
    that depend on the data (``vocab_size``, ``n_classes``, ...). Bad data raises DataError.
    """

    unit: str = "tokens"  # what throughput counts (logged as <unit>_per_s): tokens, images, examples
    splits: tuple[str, ...] = ("train", "val")  # evaluated during training, in this order

    def tokenizer_source(self, assets: Path | None) -> Path | None:
        """Where the run's tokenizer comes from: the checkpoint being resumed, else ``init_from``, else None
        (a new one is trained on the data)."""
        if assets is not None:
            return assets
        return Path(self.cfg.init_from) if self.cfg.init_from else None

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        self.cfg = cfg
        self.world_size = world_size

    @abstractmethod
    def batch(self, split: str, batch_size: int, generator: torch.Generator,
              shard: tuple[int, int] = (0, 1)) -> Batch:
        """A random training/eval batch (CPU tensors): keyword arguments of ``model.forward``.

        ``shard = (rank, world_size)``: rows rank*B .. (rank+1)*B - 1 of the global batch of
        world_size x B examples that ``generator`` draws (every process holds the same generator
        state), as torch's DistributedSampler does; so N processes step exactly like one process
        with N times the batch.
        """

    def eval_batches(self, split: str, batch_size: int, n_batches: int, seed: int) -> Iterator[Batch]:
        """The batches an evaluation averages over: the same ones at every evaluation.

        Default: ``n_batches`` random batches from a generator seeded with ``seed``. Tasks with a
        small finite split override this to walk the whole split once.
        """
        gen = torch.Generator().manual_seed(seed)
        for _ in range(n_batches):
            yield self.batch(split, batch_size, gen)

    def count(self, batch: Batch) -> int:
        """How many ``unit`` a batch holds (tokens/s, images/s); from shapes only, no device sync."""
        return next(iter(batch.values())).numel()

    def reported_loss(self, out: Any) -> Tensor:
        """The loss logged as train/val loss (default: the objective ``out.loss``)."""
        return out.loss

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        """Extra per-batch evaluation metrics (0-dim tensors, averaged over eval batches)."""
        return {}

    def flops_per_unit(self, model: torch.nn.Module) -> float | None:
        """Training FLOPs per ``unit`` for MFU (None: not counted for this task)."""
        return None

    @abstractmethod
    def save(self, folder: Path) -> None:
        """Write what the model needs besides config.json + attnlab_model.safetensors (tokenizer.json, ...)."""

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """Figures/tables ``attnlab eval`` writes beside the numbers (e.g. a confusion matrix PNG)."""
        return []

    def write_samples(self, model: torch.nn.Module, run_dir: Path) -> str | None:
        """Something to show at the end of training (generated text, ...); None for nothing."""
        return None


class RowsTask(Task):
    """A task over a small finite table of examples (labelled text rows, feature sequences, sets).

    Subclasses fill ``self.rows[split]`` (the row ids of each split) and implement ``_gather(rows)``
    (the batch of those rows). Training draws rows with ``sample_rows``; evaluation walks every row
    of the split once, in order; ``_outputs`` runs the model over a whole split for final scores.
    """

    rows: dict[str, Tensor]
    target_keys: tuple[str, ...] = ("labels",)  # batch entries the model must not receive when predicting

    @abstractmethod
    def _gather(self, rows: Tensor) -> Batch:
        """The batch of examples ``rows`` (B,)."""

    def batch(self, split: str, batch_size: int, generator: torch.Generator,
              shard: tuple[int, int] = (0, 1)) -> Batch:
        rows = self.rows[split]
        return self._gather(rows[sample_rows(len(rows), batch_size, generator, shard)])

    def eval_batches(self, split: str, batch_size: int, n_batches: int, seed: int) -> Iterator[Batch]:
        """Every row of the split once, in order (the held-out split is small and finite), in near-equal
        batches (sizes differ by at most 1), so the mean of per-batch metrics is the metric over the split to
        within 1/N^2 (fixed-size batches gave a last batch of one row the weight of a whole batch)."""
        rows = self.rows[split]
        for part in rows.tensor_split(-(-len(rows) // batch_size)):  # ceil(N / batch_size) parts
            yield self._gather(part)

    @torch.no_grad()
    def _outputs(self, model: torch.nn.Module, split: str, batch_size: int) -> Iterator[tuple[Any, Batch]]:
        """(model output, batch) over every row of ``split``, the model in eval mode without its targets."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        try:
            for batch in self.eval_batches(split, batch_size, 0, 0):
                yield model(**{k: v.to(device) for k, v in batch.items() if k not in self.target_keys}), batch
        finally:
            model.train(was_training)
