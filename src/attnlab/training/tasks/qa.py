"""Extractive question answering: the answer is a span of the context, found by start and end logits.

    [s_t, e_t] = h_L(x)[t] W_s + b_s            x = [CLS] question [SEP] context [SEP]
    L = (CE(s, start) + CE(e, end)) / 2          over the positions t of the row
    answer = argmax_{i <= j < i + MAX_ANSWER_TOKENS, i, j in the context} p_start(i) p_end(j)

Rows are SQuAD-shaped (``data/spans.py``: ``generated:questions``, a folder of train/val/test.jsonl, or one
.jsonl file split by ``classify.test_fraction``); the context is cut to fit ``classify.max_len`` (a training row
whose answer falls outside is dropped). A span is mapped back to characters through the tokenizer's offsets,
widened to whole words as transformers' pipeline does. Scores: SQuAD's exact match and token F1, beside a
baseline that answers with the context's longest run of capitalised words (or numbers) not in the question.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError, DataError
from attnlab.training.tasks.base import Batch, RowsTask
from attnlab.training.tasks.names import check_family
from attnlab.training.tasks.span_metrics import best_spans, exact_match, token_f1
from attnlab.training.tasks.text_rows import text_tokenizer

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig

MAX_ANSWER_TOKENS = 15  # the longest answer considered, in tokens (transformers' pipeline default)


def encode_pairs(tokenizer, questions: list[str], contexts: list[str], max_len: int) -> list[Any]:
    """``tokenizers`` encodings of [CLS] question [SEP] context [SEP], the context cut to fit ``max_len``."""
    hf = tokenizer.tokenizer
    hf.enable_truncation(max_len, strategy="only_second")
    try:
        return hf.encode_batch(list(zip(questions, contexts, strict=True)), add_special_tokens=True)
    except Exception:  # the tokenizer's truncation error: a question too long to leave room for any context
        raise DataError(f"a question leaves no room for its context in the model's {max_len} tokens; shorten "
                        "it") from None
    finally:
        hf.no_truncation()


def context_mask(enc: list[Any], T: int) -> Tensor:
    """(N, T) True at the context's tokens (sequence 1, not [SEP])."""
    mask = torch.zeros(len(enc), T, dtype=torch.bool)
    for i, e in enumerate(enc):
        for t, (seq, special) in enumerate(zip(e.sequence_ids, e.special_tokens_mask)):
            mask[i, t] = seq == 1 and not special
    return mask


def answer_tokens(e: Any, start: int, text: str) -> tuple[int, int] | None:
    """The first and last token of the answer at characters start .. start + len(text) - 1 of the context; None
    where the context was cut before its end."""
    first, last = e.char_to_token(start, 1), e.char_to_token(start + len(text) - 1, 1)
    return None if first is None or last is None else (first, last)


def span_chars(e: Any, s: int, t: int) -> tuple[int, int]:
    """Characters [begin, end) in the context of tokens s..t, widened to whole words (as transformers' pipeline
    with align_to_words); the pieces' own offsets where the words cannot be found."""
    try:
        return e.word_to_chars(e.token_to_word(s), 1)[0], e.word_to_chars(e.token_to_word(t), 1)[1]
    except Exception:
        return e.offsets[s][0], e.offsets[t][1]


def capitalised_answer(context: str, question: str) -> str:
    """The baseline's answer: the longest run of capitalised words or numbers in the context that the question
    does not hold (the first of equal length); "" where there is none."""
    best, run = "", []
    for word in [*re.findall(r"[^\s.,;:!?]+|[.,;:!?]", context), "."]:  # punctuation ends a run
        if word[0].isupper() or word.isdigit():
            run.append(word)
            continue
        text = " ".join(run)
        if run and text not in question and len(run) > len(best.split()):
            best = text
        run = []
    return best


def decode_answers(enc: list[Any], contexts: list[str], out: Any, allowed: Tensor) -> list[dict[str, Any]]:
    """{answer, start, end, score} of the best span of each row of a model output (start_logits, end_logits)."""
    s, t, score = best_spans(out.start_logits, out.end_logits, allowed.to(out.start_logits.device),
                             MAX_ANSWER_TOKENS)
    rows = []
    for e, context, a, b, p in zip(enc, contexts, s.tolist(), t.tolist(), score.tolist()):
        begin, end = span_chars(e, a, b) if p > 0 else (0, 0)
        rows.append({"answer": context[begin:end], "start": begin, "end": end, "score": p})
    return rows


class QuestionAnsweringTask(RowsTask):
    """Extractive QA with a BERT's span head; metrics span accuracy (per batch), exact match and F1 (per split)."""

    name = "question-answering"
    unit = "examples"
    target_keys = ("start_positions", "end_positions")

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        from attnlab.data.labelled import split_indices
        from attnlab.data.spans import read_splits

        super().__init__(cfg, assets, world_size)
        check_family(self.name, cfg.model.family)
        if cfg.model.head_type not in ("sequence", "span") or cfg.model.n_classes is not None:
            raise ConfigError(f"task {self.name} trains model.head_type=span (no model.n_classes)")
        opts = cfg.classify
        splits = read_splits(cfg.data, "questions")
        if "all" in splits:
            train, val = split_indices(len(splits["all"]), opts.test_fraction, opts.split_seed)
            splits = {"train": [splits["all"][i] for i in train], "val": [splits["all"][i] for i in val]}
        source = Path(opts.init_from) if assets is None and opts.init_from else self.tokenizer_source(assets)
        texts = [f"{r['question']}\n{r['context']}" for r in splits["train"]]
        self.tokenizer = text_tokenizer(cfg, texts, source, self.name)
        self.max_len = min(opts.max_len or cfg.model.block_size, cfg.model.block_size)
        if self.max_len < 8:
            raise ConfigError(f"task {self.name} needs classify.max_len >= 8 (a question and a context), got "
                              f"{self.max_len}")
        self.examples: dict[str, list[dict[str, Any]]] = {}
        self.encodings: list[Any] = []
        positions: list[tuple[int, int]] = []
        self.rows, start = {}, 0
        for split, rows in splits.items():
            enc = encode_pairs(self.tokenizer, [r["question"] for r in rows], [r["context"] for r in rows],
                               self.max_len)
            found = [answer_tokens(e, r["answer"]["start"], r["answer"]["text"]) for e, r in zip(enc, rows)]
            keep = [i for i, f in enumerate(found) if f is not None or split != "train"]  # scored all the same
            if split == "train" and not keep:
                raise DataError(f"{cfg.data}: no training answer fits in {self.max_len} tokens with its question")
            self.examples[split] = [rows[i] for i in keep]
            self.encodings += [enc[i] for i in keep]
            positions += [found[i] or (0, 0) for i in keep]  # an answer cut off: [CLS], as SQuAD v2 marks none
            self.rows[split] = torch.arange(start, start + len(keep))
            start += len(keep)
        self.inputs = self._tensors(self.encodings, positions)  # (N, T) each, positions (N,)
        self.allowed = context_mask(self.encodings, self.inputs["input_ids"].size(1))  # (N, T): the context's tokens
        cfg.model.head_type = "span"
        cfg.model.vocab_size = self.tokenizer.vocab_size

    def _tensors(self, enc: list[Any], positions: list[tuple[int, int]]) -> dict[str, Tensor]:
        T = max(len(e.ids) for e in enc)
        pad = self.tokenizer.pad_id

        def padded(rows: list[list[int]], value: int) -> Tensor:
            return torch.tensor([r + [value] * (T - len(r)) for r in rows], dtype=torch.long)

        return {"input_ids": padded([e.ids for e in enc], pad),
                "attention_mask": padded([[1] * len(e.ids) for e in enc], 0),
                "token_type_ids": padded([e.type_ids for e in enc], 0),
                "start_positions": torch.tensor([p[0] for p in positions], dtype=torch.long),
                "end_positions": torch.tensor([p[1] for p in positions], dtype=torch.long)}

    def _gather(self, rows: Tensor) -> Batch:
        batch = {k: v[rows] for k, v in self.inputs.items()}
        width = int(batch["attention_mask"].sum(1).max())  # trim the columns that are padding in every row
        return {k: v[:, :width] if v.dim() == 2 else v for k, v in batch.items()}

    def count(self, batch: Batch) -> int:
        return int(batch["input_ids"].size(0))

    def reported_loss(self, out: Any) -> Tensor:
        return out.span_loss

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        allowed = (batch["token_type_ids"] == 1) & (batch["attention_mask"] == 1) \
            & (batch["input_ids"] != self.tokenizer.sep_id)
        s, e, _ = best_spans(out.start_logits, out.end_logits, allowed, MAX_ANSWER_TOKENS)
        hit = (s == batch["start_positions"]) & (e == batch["end_positions"])
        return {"span_accuracy": hit.float().mean()}

    def predict_answers(self, model: torch.nn.Module, split: str, batch_size: int = 64) -> list[dict[str, Any]]:
        """The best answer of every row of ``split``."""
        answers: list[dict[str, Any]] = []
        ids = self.rows[split].tolist()
        for out, batch in self._outputs(model, split, batch_size):
            part = ids[len(answers):len(answers) + len(batch["input_ids"])]
            width = batch["input_ids"].size(1)
            answers += decode_answers([self.encodings[i] for i in part],
                                      [self.examples[split][i - ids[0]]["context"] for i in part],
                                      out, self.allowed[part, :width])
        return answers

    def scores(self, model: torch.nn.Module, split: str = "val",
               answers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """SQuAD exact match and F1 (means over the rows of ``split``), and the capitalised-span baseline's."""
        rows = self.examples[split]
        answers = answers if answers is not None else self.predict_answers(model, split)
        truth = [r["answer"]["text"] for r in rows]
        guess = [capitalised_answer(r["context"], r["question"]) for r in rows]

        def mean(f, predicted) -> float:
            return sum(f(p, t) for p, t in zip(predicted, truth, strict=True)) / len(truth)

        predicted = [a["answer"] for a in answers]
        return {"exact_match": mean(exact_match, predicted), "f1": mean(token_f1, predicted),
                "baseline_exact_match": mean(exact_match, guess), "baseline_f1": mean(token_f1, guess), "n": len(rows)}

    def save(self, folder: Path) -> None:
        self.tokenizer.save(folder)

    def _write_scores(self, model: torch.nn.Module, run_dir: Path) -> tuple[dict[str, Any], dict[str, list]]:
        from attnlab.core.fileio import atomic_write_text

        answers = {s: self.predict_answers(model, s) for s in ("val", "test") if s in self.examples}
        result = {s: self.scores(model, s, a) for s, a in answers.items()}
        atomic_write_text(run_dir / "scores.json", json.dumps(result, indent=1) + "\n")
        return result, answers

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """scores.json: exact match and F1 (and the baseline's) on val and, where the data has one, test."""
        self._write_scores(model, run_dir)
        return [run_dir / "scores.json"]

    def write_samples(self, model: torch.nn.Module, run_dir: Path) -> str | None:
        """Exact match and F1 of val (and test) beside the baseline's (also in scores.json), and an answer."""
        result, answers = self._write_scores(model, run_dir)
        lines = [f"{split}: exact match {s['exact_match']:.3f}, F1 {s['f1']:.3f} (longest capitalised span: "
                 f"{s['baseline_exact_match']:.3f}, {s['baseline_f1']:.3f}), {s['n']} questions"
                 for split, s in result.items()]
        split = "test" if "test" in self.examples else "val"
        row = self.examples[split][0]
        lines.append(f"{row['question']} -> {answers[split][0]['answer']!r} (true: {row['answer']['text']!r})")
        return "\n".join(lines)

