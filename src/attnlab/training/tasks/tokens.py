"""Token classification (named entities): a tag per word from a BERT's token classifier.

    p(y_t | x) = softmax(Dropout(h_L(x)[t]) W_tc + b_tc),   L = mean over labelled t of -log p(y_t | x)

Rows are words with BIO tags (``data/spans.py``: ``generated:entities``, a folder of train/val/test.jsonl, or one
.jsonl file split by ``classify.test_fraction``). Each word is cut into word pieces; its tag labels the first
piece, the others (and [CLS], [SEP], padding) carry -100 and no loss. A word's prediction is its first piece's
arg-max; entities are read from the words' tags (``span_metrics.entities``) and scored by exact-match F1 beside
two baselines: every word O, and each word's most frequent training tag. The tag names are saved as tags.json.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.errors import CheckpointError, ConfigError, DataError
from attnlab.models.bert.model import IGNORE_INDEX
from attnlab.training.tasks.base import Batch, RowsTask
from attnlab.training.tasks.names import check_family
from attnlab.training.tasks.span_metrics import entities, entity_scores
from attnlab.training.tasks.text_rows import text_tokenizer

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig

TAGS_FILE = "tags.json"


def align_labels(word_ids: list[int | None], word_labels: list[int]) -> list[int]:
    """Per token: the label of its word where it is the word's first piece, else -100 (later pieces, [CLS],
    [SEP], padding: ``word_ids`` None)."""
    out, previous = [], None
    for w in word_ids:
        out.append(IGNORE_INDEX if w is None or w == previous else word_labels[w])
        previous = w
    return out


def first_pieces(word_ids: list[int | None], n_words: int) -> list[int]:
    """The position of each word's first piece (-1 for a word cut off by the context)."""
    first = [-1] * n_words
    for t, w in enumerate(word_ids):
        if w is not None and first[w] < 0:
            first[w] = t
    return first


def encode_words(tokenizer, rows: list[list[str]], max_len: int) -> list[Any]:
    """``tokenizers`` encodings of pre-split words, [CLS] words [SEP], cut to ``max_len`` tokens."""
    hf = tokenizer.tokenizer
    hf.enable_truncation(max_len)
    try:
        return hf.encode_batch(rows, is_pretokenized=True, add_special_tokens=True)
    finally:
        hf.no_truncation()


def load_tags(folder: Path) -> list[str]:
    """The tag names a token-classification run saved (tags.json), index i for class i."""
    file = folder / TAGS_FILE
    try:
        tags = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read the tag names in {file}: {e}") from None
    if not isinstance(tags, list) or not tags or not all(isinstance(t, str) for t in tags):
        raise CheckpointError(f"{file} must hold a JSON list of tag names")
    return tags


class TokenClassificationTask(RowsTask):
    """BIO tagging with a BERT's token classifier; metrics tag accuracy (per batch) and entity F1 (per split)."""

    name = "token-classification"
    unit = "examples"
    target_keys = ("token_labels",)

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        from attnlab.data.labelled import split_indices
        from attnlab.data.spans import read_splits

        super().__init__(cfg, assets, world_size)
        check_family(self.name, cfg.model.family)
        if cfg.model.head_type not in ("sequence", "token"):
            raise ConfigError(f"task {self.name} trains model.head_type=token, not "
                              f"model.head_type={cfg.model.head_type}")
        opts = cfg.classify
        splits = read_splits(cfg.data, "entities")
        if "all" in splits:
            train, val = split_indices(len(splits["all"]), opts.test_fraction, opts.split_seed)
            splits = {"train": [splits["all"][i] for i in train], "val": [splits["all"][i] for i in val]}
        found = sorted({t for rows in splits.values() for r in rows for t in r["tags"]} - {"O"})
        self.tags = load_tags(assets) if assets is not None else ["O", *found]
        unknown = sorted(set(found) - set(self.tags))
        if unknown:
            raise ConfigError(f"{cfg.data} has tags the model was not trained on: {unknown[:3]}")
        if assets is None and not any(t != "O" for r in splits["train"] for t in r["tags"]):
            raise DataError(f"{cfg.data}: the training rows tag no entity (every tag is O); nothing to learn")
        source = Path(opts.init_from) if assets is None and opts.init_from else self.tokenizer_source(assets)
        texts = [" ".join(r["tokens"]) for r in splits["train"]]
        self.tokenizer = text_tokenizer(cfg, texts, source, self.name)
        self.max_len = min(opts.max_len or cfg.model.block_size, cfg.model.block_size)
        self.words = {s: [r["tokens"] for r in rows] for s, rows in splits.items()}
        self.true_tags = {s: [r["tags"] for r in rows] for s, rows in splits.items()}
        index = {t: i for i, t in enumerate(self.tags)}
        every = [r for rows in splits.values() for r in rows]  # one table; each split a range of its rows
        enc = encode_words(self.tokenizer, [r["tokens"] for r in every], self.max_len)
        self.inputs = self._tensors(enc, [[index[t] for t in r["tags"]] for r in every])  # (N, T) each
        self.first = [first_pieces(e.word_ids, len(r["tokens"])) for e, r in zip(enc, every)]
        self.rows, start = {}, 0
        for split, rows in splits.items():
            self.rows[split] = torch.arange(start, start + len(rows))
            start += len(rows)
        cfg.model.head_type = "token"
        cfg.model.n_classes = len(self.tags)
        cfg.model.vocab_size = self.tokenizer.vocab_size

    def _tensors(self, enc: list[Any], labels: list[list[int]]) -> dict[str, Tensor]:
        """(N, T) input_ids, attention_mask, token_type_ids, token_labels, padded with [PAD] / -100."""
        T = max(len(e.ids) for e in enc)
        pad = self.tokenizer.pad_id

        def padded(rows: list[list[int]], value: int) -> Tensor:
            return torch.tensor([r + [value] * (T - len(r)) for r in rows], dtype=torch.long)

        return {"input_ids": padded([e.ids for e in enc], pad),
                "attention_mask": padded([[1] * len(e.ids) for e in enc], 0),
                "token_type_ids": padded([e.type_ids for e in enc], 0),
                "token_labels": padded([align_labels(e.word_ids, y) for e, y in zip(enc, labels)], IGNORE_INDEX)}

    def _gather(self, rows: Tensor) -> Batch:
        batch = {k: v[rows] for k, v in self.inputs.items()}
        width = int(batch["attention_mask"].sum(1).max())  # trim the columns that are padding in every row
        return {k: v[:, :width] for k, v in batch.items()}

    def count(self, batch: Batch) -> int:
        return int(batch["input_ids"].size(0))

    def reported_loss(self, out: Any) -> Tensor:
        return out.cls_loss

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        labelled = batch["token_labels"] != IGNORE_INDEX
        hits = out.token_logits.argmax(-1)[labelled] == batch["token_labels"][labelled]
        return {"tag_accuracy": hits.float().mean()}

    def predict_tags(self, model: torch.nn.Module, split: str, batch_size: int = 64) -> list[list[str]]:
        """The predicted tag of every word of ``split`` (a word cut off by the context: O)."""
        preds: list[list[str]] = []
        firsts = [self.first[int(i)] for i in self.rows[split]]
        for out, _ in self._outputs(model, split, batch_size):
            for row in out.token_logits.argmax(-1).cpu():  # (T,) each
                preds.append([self.tags[int(row[t])] if t >= 0 else "O" for t in firsts[len(preds)]])
        return preds

    def scores(self, model: torch.nn.Module, split: str = "val",
               preds: list[list[str]] | None = None) -> dict[str, Any]:
        """Entity precision, recall and F1 over every row of ``split`` (of ``preds`` where given, else the model's
        tags), and the baselines' F1."""
        s = entity_scores(self.true_tags[split], preds if preds is not None else self.predict_tags(model, split))
        return {"entity_f1": s["f1"], "precision": s["precision"], "recall": s["recall"], **self.baselines(split),
                "n": len(self.words[split])}

    def baselines(self, split: str) -> dict[str, float]:
        """Entity F1 of tagging every word O, and of each word's most frequent tag in the training rows."""
        seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for words, tags in zip(self.words["train"], self.true_tags["train"]):
            for w, t in zip(words, tags):
                seen[w][t] += 1
        true = self.true_tags[split]
        majority = [[seen[w].most_common(1)[0][0] if w in seen else "O" for w in words] for words in self.words[split]]
        return {"all_o_f1": entity_scores(true, [["O"] * len(r) for r in true])["f1"],
                "majority_f1": entity_scores(true, majority)["f1"]}

    def save(self, folder: Path) -> None:
        from attnlab.core.fileio import atomic_write_text

        self.tokenizer.save(folder)
        atomic_write_text(folder / TAGS_FILE, json.dumps(self.tags, ensure_ascii=False, indent=1) + "\n")

    def _write_scores(self, model: torch.nn.Module, run_dir: Path) -> tuple[dict[str, Any], dict[str, list]]:
        """scores.json ({split: scores} of val and test), and the predicted tags of each split."""
        from attnlab.core.fileio import atomic_write_text

        preds = {split: self.predict_tags(model, split) for split in ("val", "test") if split in self.words}
        result = {split: self.scores(model, split, p) for split, p in preds.items()}
        atomic_write_text(run_dir / "scores.json", json.dumps(result, indent=1) + "\n")
        return result, preds

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """scores.json: entity F1 (and the baselines') on val and, where the data has one, test."""
        self._write_scores(model, run_dir)
        return [run_dir / "scores.json"]

    def write_samples(self, model: torch.nn.Module, run_dir: Path) -> str | None:
        """The entity F1 of val (and test) beside the baselines' (also in scores.json), and a tagged example."""
        result, preds = self._write_scores(model, run_dir)
        lines = [f"{split}: entity F1 {s['entity_f1']:.3f} (every word O {s['all_o_f1']:.3f}, each word's most "
                 f"frequent tag {s['majority_f1']:.3f}), {s['n']} rows" for split, s in result.items()]
        split = "test" if "test" in self.words else "val"
        words, tags = self.words[split][0], preds[split][0]
        shown = [f"[{' '.join(words[a:b])}]{kind}" for kind, a, b in entities(tags)]
        lines.append(f"{' '.join(words)}  ->  {', '.join(shown) or 'no entities'}")
        return "\n".join(lines)
