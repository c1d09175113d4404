"""Masked language modelling (BERT pre-training), with next-sentence prediction as an option.

    L = -(1/N) sum_{selected i} log p(x_i | x_masked)   [ + L_NSP = -log p(IsNext/NotNext | [CLS]) ]

The text is split into lines, tokenized with WordPiece and packed into segments (data/mlm.py); each
batch masks 15% of the tokens (80/10/10) and, with ``mlm.nsp=true``, pairs segments for NSP.
Metrics: masked-token accuracy, and two baselines that ignore the context: always answering the
training text's most frequent token (``majority_accuracy``) and the cross-entropy of its unigram
distribution (``unigram_loss``), so "the model learned something" is a comparison, not a feeling.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_write_text
from attnlab.training.tasks.base import Batch, Task
from attnlab.training.tasks.names import check_family

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig


class MaskedLanguageModelTask(Task):
    """MLM (+ NSP) on a text file with a WordPiece tokenizer (trained on the text, or the run's own)."""

    unit = "tokens"

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        from attnlab.data.mlm import MLMDataset, Specials
        from attnlab.data.text import read_text, resolve_text_source
        from attnlab.tokenizers import WordPieceTokenizer, load_tokenizer, train_tokenizer

        super().__init__(cfg, assets, world_size)
        check_family("mlm", cfg.model.family)
        opts = cfg.mlm
        if opts.max_len is not None and opts.max_len > cfg.model.block_size:
            raise ConfigError(f"mlm.max_len={opts.max_len} exceeds model.block_size={cfg.model.block_size}")
        text = read_text(resolve_text_source(cfg.data))
        if (pretrained := self.tokenizer_source(assets)) is not None:
            self.tokenizer = load_tokenizer(pretrained)
        elif cfg.tokenizer != "wordpiece":
            raise ConfigError(f"task mlm needs tokenizer=wordpiece ([CLS] [SEP] [MASK] [PAD]), got {cfg.tokenizer}")
        else:
            self.tokenizer = train_tokenizer("wordpiece", text, cfg.bpe_vocab_size)
        if not isinstance(self.tokenizer, WordPieceTokenizer):
            raise ConfigError(f"task mlm needs a WordPiece tokenizer, {assets} has {self.tokenizer!r}")
        tok = self.tokenizer
        lines = [e.ids for e in tok.tokenizer.encode_batch(text.splitlines(), add_special_tokens=False)]
        specials = Specials(pad=tok.pad_id, cls=tok.cls_id, sep=tok.sep_id, mask=tok.mask_id, all=tok.special_ids)
        self.data = MLMDataset(lines, specials, tok.vocab_size, opts.max_len or cfg.model.block_size, opts.nsp,
                               cfg.val_fraction)
        cfg.model.vocab_size = tok.vocab_size
        counts = self.data.counts().double()
        self.majority_token = int(counts.argmax())
        self.unigram_logp = torch.log((counts + 1) / (counts + 1).sum()).float()  # add-one smoothed

    def batch(self, split: str, batch_size: int, generator: torch.Generator,
              shard: tuple[int, int] = (0, 1)) -> Batch:
        o = self.cfg.mlm
        return self.data.batch(split, batch_size, generator, o.mask_prob, o.mask_token_prob, o.random_token_prob,
                               shard)

    def count(self, batch: Batch) -> int:
        return batch["input_ids"].numel()

    def reported_loss(self, out: Any) -> Tensor:
        return out.mlm_loss  # the masked-token cross-entropy (NSP is reported as a metric)

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        labels = batch["mlm_labels"]
        target = labels[labels != -100]  # (N,) in the order of out.mlm_logits
        m = {
            "mlm_accuracy": (out.mlm_logits.argmax(-1) == target).float().mean(),
            "majority_accuracy": (target == self.majority_token).float().mean(),
            "unigram_loss": -self.unigram_logp.to(target.device)[target].mean(),
        }
        if out.nsp_loss is not None:
            m["nsp_loss"] = out.nsp_loss
            m["nsp_accuracy"] = (out.nsp_logits.argmax(-1) == batch["next_sentence_label"]).float().mean()
        return m

    def save(self, folder: Path) -> None:
        self.tokenizer.save(folder)

    def write_samples(self, model: torch.nn.Module, run_dir: Path) -> str | None:
        """Fill the [MASK]s of a few validation lines: what the encoder predicts, beside the truth; none with
        sample_tokens=0 (the preset's switch, which this used to ignore)."""
        if self.cfg.sample_tokens <= 0:
            return None
        gen = torch.Generator().manual_seed(self.cfg.seed)
        batch = self.data.batch("val", 4, gen, mask_prob=self.cfg.mlm.mask_prob, mask_token_prob=1.0,
                                random_token_prob=0.0)
        device = next(model.parameters()).device
        model.eval()
        with torch.no_grad():
            out = model(**{k: v.to(device) for k, v in batch.items()})
        pred = out.mlm_logits.argmax(-1).cpu().tolist()
        lines, k = [], 0
        tok = self.tokenizer
        for row, labels, mask in zip(batch["input_ids"], batch["mlm_labels"], batch["attention_mask"], strict=True):
            shown, truth = [], []
            for i, lab in zip(row[mask.bool()].tolist(), labels[mask.bool()].tolist(), strict=True):
                if lab == -100:
                    shown.append(tok.tokenizer.id_to_token(i))
                    truth.append(tok.tokenizer.id_to_token(i))
                else:
                    shown.append("[" + tok.tokenizer.id_to_token(pred[k]).removeprefix("##") + "]")
                    truth.append("[" + tok.tokenizer.id_to_token(lab).removeprefix("##") + "]")
                    k += 1
            lines.append("truth:     " + " ".join(truth[1:-1]).replace(" ##", ""))
            lines.append("predicted: " + " ".join(shown[1:-1]).replace(" ##", ""))
        text = "\n".join(lines)
        atomic_write_text(run_dir / "samples.txt", text + "\n")
        return text
