"""Language modelling: predict token t+1 from tokens 1..t on windows of a text corpus.

    L = -(1/BT) sum_{b,t} log p(x_{b,t+1} | x_{b,<=t})

Batches are random windows ``x = ids[i:i+T]``, ``y = ids[i+1:i+T+1]`` (see data/text.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.fileio import atomic_write_text
from attnlab.training.tasks.base import Batch, Task

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig


class LanguageModelTask(Task):
    """Next-token prediction on a text file (or a built-in corpus) with a char/BPE tokenizer."""

    unit = "tokens"

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        from attnlab.data.text import TextDataset, read_text, resolve_text_source
        from attnlab.tokenizers import load_tokenizer, train_tokenizer

        super().__init__(cfg, assets, world_size)
        source = resolve_text_source(cfg.data)
        if (pretrained := self.tokenizer_source(assets)) is not None:
            self.tokenizer = load_tokenizer(pretrained)
        else:
            self.tokenizer = train_tokenizer(cfg.tokenizer, read_text(source), cfg.bpe_vocab_size)
        self.data = TextDataset(source, self.tokenizer, val_fraction=cfg.val_fraction)
        self.data.check_block_size(cfg.model.block_size)
        cfg.model.vocab_size = self.tokenizer.vocab_size
        self.sample_ids = self._sample_prompt() if cfg.sample_tokens > 0 else []

    def _sample_prompt(self) -> list[int]:
        """The ids the end-of-training sample starts from, checked now rather than after the training:
        a prompt outside the vocabulary is a one-line error; the default (a newline) falls back to the
        corpus's first token when the corpus has no newline."""
        from attnlab.core.errors import AttnlabError, ConfigError
        from attnlab.training.config import TrainConfig

        prompt = self.cfg.sample_prompt
        try:
            ids = self.tokenizer.encode(prompt)
        except AttnlabError as e:
            if prompt != TrainConfig.sample_prompt:
                raise ConfigError(f"sample_prompt {prompt[:40]!r} cannot be encoded by this run's tokenizer: "
                                  f"{str(e).splitlines()[0]}") from None
            ids = []
        return ids or self.data.train_ids[:1].tolist()

    def batch(self, split: str, batch_size: int, generator: torch.Generator,
              shard: tuple[int, int] = (0, 1)) -> Batch:
        x, y = self.data.get_batch(split, batch_size, self.cfg.model.block_size, generator, shard)
        return {"idx": x, "targets": y}

    def reported_loss(self, out: Any) -> Tensor:
        return out.lm_loss  # cross-entropy without the mixture-of-experts auxiliary losses

    def flops_per_unit(self, model: torch.nn.Module) -> float | None:
        from attnlab.training.mfu import flops_per_token

        return flops_per_token(model)

    def save(self, folder: Path) -> None:
        self.tokenizer.save(folder)

    def write_samples(self, model: torch.nn.Module, run_dir: Path) -> str | None:
        from attnlab.generation import SamplingConfig, generate

        cfg = self.cfg
        if cfg.sample_tokens <= 0:
            return None
        device = next(model.parameters()).device
        idx = torch.tensor([self.sample_ids[-cfg.model.block_size:]], device=device)
        sampling = SamplingConfig(max_new_tokens=cfg.sample_tokens, temperature=0.8, top_k=None, seed=cfg.seed)
        out = generate(model, idx, sampling)
        text = self.tokenizer.decode(out[0].tolist())
        atomic_write_text(run_dir / "samples.txt", text + "\n")
        return text
