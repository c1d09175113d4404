"""Labelled text rows for a BERT encoder: the rows, their tokenizer, the held-out split (shared by classify and
regress).

Rows come from a CSV (``text,label`` header), a JSONL file or a built-in set (``data/labelled.py``). The held-out
split "val" is the data's official test split where it has one, else a seeded ``classify.test_fraction``; it is
never trained on. The tokenizer is the pre-trained model's (``classify.init_from``, or the run's own when
resuming), else one trained on the rows: ``tokenizer=wordpiece`` (BERT's sub-words) or ``tokenizer=char`` (one
token per character, case kept: SMILES, formulas, codes).
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError
from attnlab.training.tasks.base import Batch, RowsTask
from attnlab.training.tasks.names import check_family

if TYPE_CHECKING:
    from attnlab.data.labelled import LabelledText
    from attnlab.tokenizers import WordPieceTokenizer
    from attnlab.training.config import TrainConfig


def text_tokenizer(cfg: TrainConfig, texts: list[str], source: Path | None, task: str) -> WordPieceTokenizer:
    """The run's tokenizer: the one saved in ``source`` (a run or pre-trained model), else trained on ``texts``."""
    from attnlab.tokenizers import WordPieceTokenizer, load_tokenizer, train_tokenizer

    if source is not None:
        tokenizer = load_tokenizer(source)
    elif cfg.tokenizer == "char":
        tokenizer = WordPieceTokenizer.characters("".join(texts))
    elif cfg.tokenizer == "wordpiece":
        tokenizer = train_tokenizer("wordpiece", "\n".join(texts), cfg.bpe_vocab_size)
    else:
        raise ConfigError(f"task {task} needs tokenizer=wordpiece or tokenizer=char (or classify.init_from=RUN), "
                          f"got {cfg.tokenizer}")
    if not isinstance(tokenizer, WordPieceTokenizer):
        raise ConfigError(f"task {task} needs a BERT (WordPiece) tokenizer, {source} has {tokenizer!r}")
    return tokenizer


class TextRowsTask(RowsTask):
    """Tokenised rows of labelled text for a BERT; subclasses turn the labels into targets (``_targets``)."""

    unit = "examples"
    name = "text rows"

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        from attnlab.data.labelled import held_out_split, read_labelled

        super().__init__(cfg, assets, world_size)
        check_family(self.name, cfg.model.family)
        opts = cfg.classify
        data = read_labelled(cfg.data)
        source = Path(opts.init_from) if assets is None and opts.init_from else self.tokenizer_source(assets)
        self._targets(data, assets)  # refuses labels that do not fit the task before a tokenizer is trained
        self.tokenizer = text_tokenizer(cfg, data.texts, source, self.name)
        max_len = min(opts.max_len or cfg.model.block_size, cfg.model.block_size)
        enc = self.tokenizer.encode_batch(data.texts, max_len=max_len)
        self.inputs = {k: torch.tensor(v, dtype=torch.long) for k, v in enc.items()}  # (N, T) each
        train, held_out = held_out_split(data, opts.test_fraction, opts.split_seed)
        if assets is None:  # training: the rows it learns from must be learnable
            self._check_training_rows(data, train)
        self.rows = {"train": torch.tensor(train), "val": torch.tensor(held_out)}
        cfg.model.vocab_size = self.tokenizer.vocab_size

    def _check_training_rows(self, data: LabelledText, rows: list[int]) -> None:
        """Refuse, in one line, training rows a model cannot learn from (a task's own rule; none here)."""

    @abstractmethod
    def _targets(self, data: LabelledText, assets: Path | None) -> None:
        """Set ``self.targets`` (N, ...) from the labels, and the model's head size; check them against ``assets``."""

    def _gather(self, rows: Tensor) -> Batch:
        batch = {k: v[rows] for k, v in self.inputs.items()}
        width = int(batch["attention_mask"].sum(1).max())  # trim the columns that are padding in every row
        batch = {k: v[:, :width] for k, v in batch.items()}
        batch[self.target_keys[0]] = self.targets[rows]
        return batch

    def count(self, batch: Batch) -> int:
        return int(batch[self.target_keys[0]].size(0))
