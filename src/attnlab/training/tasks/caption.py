"""Image captioning (task "caption", family captioner): write the caption of a generated micrograph.

    L = -(1/N) sum_{b,t: y_bt != pad} log p(y_{b,t} | y_{b,<t}, image_b)      teacher forcing

Images are the defect-count micrographs (``data/captions.py`` writes each caption from the image's ground
truth), normalised as for classification and never shifted or flipped (that could move a defect into
another quadrant and make its caption wrong). The tokenizer (char or byte-level BPE, with PAD/BOS/EOS)
is trained on the training captions. During training the metrics are teacher-forced (``token_accuracy``,
``exact_match``); ``eval_report`` decodes the test images greedily and scores exact match and BLEU, and
draws for a few test images the cross-attention of each generated word over the patches (``cross_attention.png``,
``tasks/caption_attention.py``), with the pointing game: does the patch a defect word ("pore") attends to
most hold a defect of that kind?
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError, DataError
from attnlab.core.extras import require
from attnlab.core.fileio import atomic_write_text
from attnlab.data.pairs import PairEncoder
from attnlab.training.tasks.base import Batch, sample_rows
from attnlab.training.tasks.images import ImageClassificationTask
from attnlab.training.tasks.seq2seq import build_pair_tokenizer, score_translations

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig


def captions_of(origin: Tensor, n: int, size: int, seed: int) -> list[str]:
    """The caption of each generated image ``origin`` (rows of the defect-count set of n images)."""
    from attnlab.data.captions import caption
    from attnlab.data.micrographs import generate

    defects = generate("count", n, size, seed)[3]
    return [caption(defects[int(i)], size) for i in origin]


class CaptionTask(ImageClassificationTask):
    """Generated micrographs and their captions; the tokenizer and the normalisation are saved with the model."""

    task = "caption"

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        from attnlab.data.captions import SOURCE
        from attnlab.tokenizers import load_tokenizer

        if cfg.data != SOURCE:
            raise ConfigError(f"task caption reads data={SOURCE} (captions written from each image's defects), "
                              f"not {cfg.data}")
        require("sacrebleu", "BLEU of captioning runs")  # before any work, not at the first evaluation
        super().__init__(cfg, assets, world_size)
        opts, size = cfg.images, cfg.model.image_size
        self.captions = {split: captions_of(self.data[split].origin, opts.n_generated, size, opts.data_seed)
                         for split in self.splits}
        if (pretrained := self.tokenizer_source(assets)) is not None:
            self.tokenizer = load_tokenizer(pretrained)
        else:
            self.tokenizer = build_pair_tokenizer(cfg.tokenizer, self.captions["train"], cfg.bpe_vocab_size)
        self.encoder = PairEncoder(self.tokenizer, cfg.model.block_size)
        longest = max(len(self.encoder.ids(c)) for split in self.splits for c in self.captions[split])
        if longest >= cfg.model.block_size:
            raise DataError(f"the longest caption has {longest} tokens; model.block_size={cfg.model.block_size} "
                            f"must be at least {longest + 1} (room for BOS / EOS)")
        cfg.model.vocab_size = self.tokenizer.vocab_size

    def _batch(self, split: str, index: Tensor) -> Batch:
        from attnlab.data.images import normalize

        part = self.data[split]
        text = self.encoder.batch([("", self.captions[split][int(i)]) for i in index])
        return {"images": normalize(part.images[index], self.mean, self.std), "tgt_in": text["tgt_in"],
                "labels": text["labels"]}

    def batch(self, split: str, batch_size: int, generator: torch.Generator,
              shard: tuple[int, int] = (0, 1)) -> Batch:
        return self._batch(split, sample_rows(len(self.data[split]), batch_size, generator, shard))

    def eval_batches(self, split: str, batch_size: int, n_batches: int, seed: int) -> Iterator[Batch]:
        """val/test: every image once, in near-equal batches; train: ``n_batches`` random batches."""
        n = len(self.data[split])
        if split == "train":
            gen = torch.Generator().manual_seed(seed)
            for _ in range(n_batches):
                yield self._batch(split, torch.randint(n, (batch_size,), generator=gen))
            return
        for index in torch.arange(n).tensor_split(-(-n // batch_size)):
            yield self._batch(split, index)

    def count(self, batch: Batch) -> int:
        return batch["images"].size(0)

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        labels = batch["labels"]  # (B, T)
        real = labels != -100
        right = (out.logits.argmax(dim=-1) == labels) & real
        return {"token_accuracy": right.sum() / real.sum().clamp(min=1),
                "exact_match": (right | ~real).all(dim=1).float().mean()}

    def save(self, folder: Path) -> None:
        super().save(folder)  # labels.json: the normalisation (the classes are the defect counts)
        self.tokenizer.save(folder)

    @torch.no_grad()
    def generate(self, model: torch.nn.Module, split: str, limit: int | None = None,
                 batch_size: int = 128) -> list[str]:
        """Greedy captions of the first ``limit`` (default: every) image of ``split``."""
        from attnlab.generation import greedy_decode

        model.eval()
        device = next(model.parameters()).device
        n = len(self.data[split]) if limit is None else min(limit, len(self.data[split]))
        out: list[str] = []
        for index in torch.arange(n).split(batch_size):
            images = self._batch(split, index)["images"].to(device)
            decoded = greedy_decode(model, images, None, self.encoder.bos_id, self.encoder.eos_id,
                                    model.config.block_size - 1)
            out += [self.encoder.text(ids) for ids in decoded.tokens]
        return out

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """Greedy captions of the test images: exact match (beside the baseline that always writes the most common
        training caption) and BLEU (caption_eval.json, captions_test.txt), and the per-word cross-attention figure
        with its pointing game."""
        from attnlab.core.fileio import atomic_write_text
        from attnlab.training.tasks.caption_attention import pointing_game, render_word_attention

        refs = self.captions["test"]
        hyps = self.generate(model, "test")
        scores = score_translations(hyps, refs)
        part = self.data["test"]
        batch = self._batch("test", torch.arange(min(len(part), 200)))
        pointing = pointing_game(model, self.encoder, batch["images"], part.masks[: len(batch["images"])])
        common = max(set(self.captions["train"]), key=self.captions["train"].count)
        baseline = {"caption": common, "exact_match": sum(r == common for r in refs) / len(refs)}
        report = {"data": self.cfg.data, "n": len(refs), "greedy": scores, "most_common_caption": baseline,
                  "pointing": pointing}
        print(f" test greedy: exact match {scores['exact_match']:.4f} (always '{common}': "
              f"{baseline['exact_match']:.4f})  BLEU {scores['bleu']:.2f}  ({len(refs)} images); "
              f"pointing game {pointing['accuracy']:.3f} (chance {pointing['chance']:.3f}, "
              f"{pointing['n']} words, {pointing['hallucinated']} defect words of absent kinds)")
        paths = [run_dir / "caption_eval.json", run_dir / "captions_test.txt"]
        atomic_write_text(paths[0], json.dumps(report, indent=2) + "\n")
        atomic_write_text(paths[1], "".join(f"reference: {r}\ngenerated: {h}\n\n" for r, h in zip(refs, hyps)))
        shown = torch.arange(min(4, len(part)))
        paths.append(render_word_attention(model, self.encoder, self._batch("test", shown)["images"],
                                           part.images[shown], run_dir / "cross_attention.png"))
        return paths

    def write_samples(self, model: torch.nn.Module, run_dir: Path) -> str | None:
        """Caption the first 8 test images beside their references; none with sample_tokens=0."""
        if self.cfg.sample_tokens <= 0:
            return None
        refs = self.captions["test"][:8]
        hyps = self.generate(model, "test", limit=8)
        text = "\n".join(f"{h}   (reference: {r})" for h, r in zip(hyps, refs))
        atomic_write_text(run_dir / "samples.txt", text + "\n")
        return text
