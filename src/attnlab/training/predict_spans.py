"""``attnlab predict`` for span runs: the entities of each text (token-classification) and the answer to each
question (question-answering), with their character offsets.

    token-classification   texts: .txt (a line each), .csv/.tsv ("text" column), .jsonl ("text" key)
                           -> entities [{text, label, start, end, score}], start/end characters of the text
    question-answering     .jsonl rows {"question": ..., "context": ...} (an "answer" key is ignored)
                           -> answer, start, end (characters of the context), score = p_start p_end

A text is split into words as the tokenizer's pre-tokenizer splits it; a word's tag is its first piece's arg-max
and an entity's score the mean of its words' probabilities, as transformers' token-classification pipeline with
``aggregation_strategy="first"`` gives them. An answer is the span of ``tasks.qa.decode_answers``. A text (or a
context) too long for the model is cut to fit and marked ``"truncated": true``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlab.core.errors import DataError


def _batches(n: int, size: int):
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _padded(enc: list[Any], pad: int) -> dict[str, torch.Tensor]:
    T = max(len(e.ids) for e in enc)
    return {"input_ids": torch.tensor([e.ids + [pad] * (T - len(e.ids)) for e in enc]),
            "attention_mask": torch.tensor([[1] * len(e.ids) + [0] * (T - len(e.ids)) for e in enc]),
            "token_type_ids": torch.tensor([e.type_ids + [0] * (T - len(e.ids)) for e in enc])}


@torch.no_grad()
def predict_entities(model, run: Path, texts: list[str], batch_size: int) -> list[dict[str, Any]]:
    """The entities of each text: {input, prediction ("text (LABEL); ..."), entities, [truncated]}."""
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training.tasks.span_metrics import entities
    from attnlab.training.tasks.tokens import first_pieces, load_tags

    tok, tags = load_tokenizer(run), load_tags(run)
    if len(tags) != model.config.n_classes:
        raise DataError(f"{run}: tags.json names {len(tags)} tags for a head of {model.config.n_classes}")
    hf, T = tok.tokenizer, model.config.block_size
    rows: list[dict[str, Any]] = []
    for s in _batches(len(texts), batch_size):
        full = hf.encode_batch(texts[s], add_special_tokens=True)
        hf.enable_truncation(T)
        try:
            enc = hf.encode_batch(texts[s], add_special_tokens=True)
        finally:
            hf.no_truncation()
        probs = model(**_padded(enc, tok.pad_id)).token_logits.float().softmax(-1)  # (B, T, K)
        for text, e, whole, p in zip(texts[s], enc, full, probs):
            n_words = max((w for w in whole.word_ids if w is not None), default=-1) + 1
            first = [t for t in first_pieces(e.word_ids, n_words) if t >= 0]  # the words that fit
            score, best = p[first].max(-1) if first else (torch.zeros(0), torch.zeros(0, dtype=torch.long))
            word_tags = [tags[int(k)] for k in best]
            found = []
            for label, a, b in entities(word_tags):
                last = max(t for t, w in enumerate(e.word_ids) if w == b - 1)  # the last piece of the last word
                begin, end = e.offsets[first[a]][0], e.offsets[last][1]
                found.append({"text": text[begin:end], "label": label, "start": begin, "end": end,
                              "score": float(f"{float(score[a:b].mean()):.6g}")})
            row = {"input": text, "prediction": "; ".join(f"{x['text']} ({x['label']})" for x in found),
                   "entities": found}
            rows.append({**row, "truncated": True} if len(whole.ids) > T else row)
    return rows


def read_questions(path: Path) -> list[dict[str, str]]:
    """The {question, context} rows of a .jsonl file (DataError naming the line of a bad one)."""
    from attnlab.core.fileio import check_regular_file
    from attnlab.data.labelled import jsonl_records, read_table_text

    check_regular_file(path, "input file", DataError)
    if path.suffix.lower() != ".jsonl":
        raise DataError(f"{path}: questions are read from a .jsonl file of {{\"question\": ..., \"context\": ...}} "
                        "rows")
    rows = []
    for n, row in jsonl_records(path, read_table_text(path, "input file")):
        if not (isinstance(row, dict) and isinstance(row.get("question"), str) and row["question"].strip()
                and isinstance(row.get("context"), str) and row["context"].strip()):
            raise DataError(f"{path}:{n}: each line needs an object with non-empty 'question' and 'context' strings")
        rows.append({"question": row["question"], "context": row["context"]})
    if not rows:
        raise DataError(f"{path}: no questions to answer")
    return rows


@torch.no_grad()
def predict_answers(model, run: Path, rows: list[dict[str, str]], batch_size: int) -> list[dict[str, Any]]:
    """The answer to each question: {input (the question), prediction (the answer), start, end, score, [truncated]}."""
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training.tasks.qa import context_mask, decode_answers, encode_pairs

    tok, T = load_tokenizer(run), model.config.block_size
    out_rows: list[dict[str, Any]] = []
    for s in _batches(len(rows), batch_size):
        questions, contexts = [r["question"] for r in rows[s]], [r["context"] for r in rows[s]]
        enc = encode_pairs(tok, questions, contexts, T)
        inputs = _padded(enc, tok.pad_id)
        out = model(**inputs)
        answers = decode_answers(enc, contexts, out, context_mask(enc, inputs["input_ids"].size(1)))
        for r, e, a in zip(rows[s], enc, answers):
            row = {"input": r["question"], "prediction": a["answer"], "start": a["start"], "end": a["end"],
                   "score": float(f"{a['score']:.6g}")}
            out_rows.append({**row, "truncated": True} if e.overflowing else row)
    return out_rows
