"""Span decoding and scores against hand-computed examples: BIO chunks, entity F1, SQuAD's exact match and F1,
the best answer span, and word-piece label alignment."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.training.tasks.qa import capitalised_answer
from attnlab.training.tasks.span_metrics import best_spans, entities, entity_scores, exact_match, token_f1
from attnlab.training.tasks.tokens import align_labels, first_pieces


def test_bio_chunks_as_conlleval_reads_them():
    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-ORG", "B-DATE"]
    # an I- after O opens an entity; B- always does; an I- of another type ends the open one and opens its own
    assert entities(tags) == [("PER", 0, 2), ("LOC", 3, 5), ("LOC", 5, 6), ("ORG", 6, 7), ("DATE", 7, 8)]
    assert entities(["O", "O"]) == [] and entities([]) == []


def test_entity_f1_is_exact_span_match():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-DATE"]]  # PER cut short: wrong; LOC, ORG right; DATE extra
    s = entity_scores(true, pred)
    assert s["precision"] == pytest.approx(2 / 4) and s["recall"] == pytest.approx(2 / 3)
    assert s["f1"] == pytest.approx(2 * (1 / 2) * (2 / 3) / (1 / 2 + 2 / 3))
    assert entity_scores(true, true)["f1"] == 1.0
    assert entity_scores(true, [["O"] * 4, ["O"] * 2]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    # the same span in another row is no match: entities are keyed by their row
    assert entity_scores([["B-PER"], ["O"]], [["O"], ["B-PER"]])["f1"] == 0.0


def test_squad_exact_match_and_f1():
    assert exact_match("The Eiffel Tower!", "eiffel   tower") == 1.0  # case, article, punctuation, spaces
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert token_f1("Eiffel", "the Eiffel Tower") == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert token_f1("in Paris France", "Paris") == pytest.approx(2 * (1 / 3) * 1.0 / (1 / 3 + 1))
    assert token_f1("a", "the") == 1.0 and token_f1("Rome", "Paris") == 0.0
    assert token_f1("", "Paris") == 0.0


def test_best_span_is_the_highest_p_start_p_end_within_the_context_and_max_length():
    start = torch.tensor([[5.0, 0.0, 2.0, 0.0, 1.0, 9.0]])
    end = torch.tensor([[5.0, 0.0, 0.0, 3.0, 0.0, 9.0]])
    allowed = torch.tensor([[False, True, True, True, True, False]])  # [CLS], the context's 4 tokens, [SEP]
    s, e, score = best_spans(start, end, allowed, max_len=15)
    # [CLS] and [SEP] score highest but are never chosen; [CLS] is in the softmax's normaliser, [SEP] is not
    z_s = math.exp(5) + math.exp(0) + math.exp(2) + math.exp(0) + math.exp(1)
    z_e = math.exp(5) + 1 + 1 + math.exp(3) + 1
    assert (int(s), int(e)) == (2, 3)
    assert float(score) == pytest.approx(math.exp(2) / z_s * math.exp(3) / z_e, rel=1e-5)
    s, e, _ = best_spans(start, end, allowed, max_len=1)  # one token at most: (3, 3), e^0 e^3 > e^2 e^0
    assert (int(s), int(e)) == (3, 3)
    s, e, _ = best_spans(start, torch.tensor([[0.0, 4.0, 0.0, 0.0, 0.0, 0.0]]), allowed, max_len=15)
    assert int(e) >= int(s)  # the end's best token (1) lies before the best start: a later end is taken
    nothing = best_spans(start, end, torch.zeros_like(allowed), 15)
    assert float(nothing[2]) == 0.0


def test_labels_go_to_the_first_piece_of_each_word():
    word_ids = [None, 0, 0, 1, 2, 2, 2, None]  # [CLS] Ana ##s visited Lis ##b ##on [SEP]
    assert align_labels(word_ids, [3, 0, 5]) == [-100, 3, -100, 0, 5, -100, -100, -100]
    assert first_pieces(word_ids, 4) == [1, 3, 4, -1]  # a fourth word cut off by the context: -1


def test_the_capitalised_baseline_answers_the_longest_capitalised_run_not_in_the_question():
    context = "Ana Rivas was born in Lisbon. Ana Rivas works for Halden Bank Group. Tomas was born in 1990."
    assert capitalised_answer(context, "Who does Ana Rivas work for?") == "Halden Bank Group"
    assert capitalised_answer("nothing here.", "What?") == ""
