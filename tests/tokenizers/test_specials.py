"""One text encoding for every path: ``encode_for`` adds a BERT's [CLS] and [SEP] (its tokenizer's template)
and nothing for a GPT, and ``attnlab inspect --text``, the explorer and ``attnlab.load(...).attention`` give
the same maps for the same text."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from attnlab.core.errors import TokenizerError
from attnlab.tokenizers import CharTokenizer, WordPieceTokenizer
from attnlab.tokenizers.specials import encode_for, n_specials

BERT = SimpleNamespace(config=SimpleNamespace(family="bert"))  # what encode_for reads of a model: its family
GPT = SimpleNamespace(config=SimpleNamespace(family="gpt"))


@pytest.fixture(scope="module")
def wordpiece():
    return WordPieceTokenizer.train("the quick brown fox jumps over the lazy dog\n" * 20, vocab_size=60)


def test_a_bert_reads_cls_text_sep_as_its_training_rows_and_a_gpt_the_bare_text(wordpiece):
    text = "the quick fox"
    ids = encode_for(BERT, wordpiece, text)
    assert ids == [wordpiece.cls_id, *wordpiece.encode(text), wordpiece.sep_id]
    assert ids == wordpiece.encode_batch([text])["input_ids"][0]  # what training and predict feed the model
    assert encode_for(GPT, wordpiece, text) == wordpiece.encode(text)
    assert n_specials(BERT, wordpiece) == 2 and n_specials(GPT, wordpiece) == 0


def test_a_template_less_tokenizer_still_gets_cls_and_sep_and_one_without_them_is_one_line(wordpiece):
    from tokenizers import Tokenizer

    bare = WordPieceTokenizer(Tokenizer.from_str(wordpiece.to_json()))
    bare.tokenizer.post_processor = None
    assert encode_for(BERT, bare, "the dog") == [bare.cls_id, *bare.encode("the dog"), bare.sep_id]
    with pytest.raises(TokenizerError, match=r"reads \[CLS\] text \[SEP\].*no \[CLS\] or \[SEP\]"):
        encode_for(BERT, CharTokenizer.train("abc"), "ab")


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    from tests.web_helpers import train_tiny_bert

    return train_tiny_bert(tmp_path_factory.mktemp("specials"))


def test_inspect_the_explorer_and_the_api_give_the_same_bert_maps_with_cls_and_sep(bert_run, tmp_path, capsys):
    import attnlab
    from attnlab.cli import main
    from attnlab.web.model_adapter import load_adapter

    text = "the quick brown fox"
    assert main(["inspect", str(bert_run), "--text", text, "--out", str(tmp_path / "inspect")]) == 0
    dump = json.loads((tmp_path / "inspect" / "attention.json").read_text())
    assert dump["tokens"][0] == "[CLS]" and dump["tokens"][-1] == "[SEP]" and len(dump["tokens"]) >= 4
    explorer = load_adapter(bert_run).attention_maps(text)
    assert explorer["tokens"] == dump["tokens"]
    inspected = [m["probs"] for m in sorted(dump["modules"].values(), key=lambda m: m["layer"]) if m["kind"] == "self"]
    assert len(inspected) == len(explorer["layers"]) == 2
    for ours, theirs in zip(inspected, explorer["layers"], strict=True):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), atol=2e-5, rtol=0)
    api = attnlab.load(bert_run).attention(text)
    for ours, theirs in zip(api, explorer["layers"], strict=True):
        assert ours.shape[-1] == len(dump["tokens"])
        torch.testing.assert_close(ours, torch.tensor(theirs), atol=2e-5, rtol=0)
