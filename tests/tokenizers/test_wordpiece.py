"""WordPiece: training, special tokens and pair layout, save/load, vocab.txt, agreement with transformers."""

from __future__ import annotations

import pytest

from attnlab.core.errors import TokenizerError
from attnlab.tokenizers import WordPieceTokenizer, load_tokenizer, train_tokenizer

TEXT = "\n".join(["First Citizen: Before we proceed any further, hear me speak.", "All: Speak, speak.",
                  "First Citizen: You are all resolved rather to die than to famish?",
                  "All: Resolved. resolved."] * 30)


@pytest.fixture(scope="module")
def tok() -> WordPieceTokenizer:
    t = train_tokenizer("wordpiece", TEXT, 120)
    assert isinstance(t, WordPieceTokenizer)
    return t


def test_special_tokens_come_first_and_pairs_have_bert_layout(tok):
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    enc = tok.encode_batch(["speak", "hear me speak"], ["resolved", "all"])
    ids, types, mask = enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]
    a, b = tok.encode("speak"), tok.encode("resolved")
    assert ids[0][: len(a) + len(b) + 3] == [2, *a, 3, *b, 3]
    assert types[0][: len(a) + len(b) + 3] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert len(set(map(len, ids))) == 1 and sum(mask[0]) == len(a) + len(b) + 3
    assert all(i == 0 for i, m in zip(ids[0], mask[0], strict=True) if m == 0)  # padding is [PAD]


def test_lowercases_splits_into_pieces_and_round_trips(tok, tmp_path):
    assert tok.decode(tok.encode("Hear ME speak?")) == "hear me speak?"
    pieces = [tok.tokenizer.id_to_token(i) for i in tok.encode("resolvedspeak")]
    assert len(pieces) > 1 and pieces[1].startswith("##")
    assert tok.encode("xxx ☃") == [tok.unk_id, tok.unk_id]  # unknown characters become [UNK]
    again = load_tokenizer(tok.save(tmp_path))
    assert isinstance(again, WordPieceTokenizer) and again.encode(TEXT[:200]) == tok.encode(TEXT[:200])
    truncated = tok.encode_batch([TEXT], max_len=10)["input_ids"][0]
    assert len(truncated) == 10 and truncated[0] == 2 and truncated[-1] == 3


def test_vocab_txt_matches_transformers_bert_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "##ting", ".",
             "!", "un", "##believ", "##able", "a"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    ours = load_tokenizer(tmp_path)  # a folder with only vocab.txt
    theirs = transformers.BertTokenizer(str(tmp_path / "vocab.txt"))
    for text in ["The cats sat on the mat.", "Unbelievable!", "a cat sitting", "dog"]:
        assert ours.encode_batch([text])["input_ids"][0] == theirs(text)["input_ids"], text
    assert ours.encode_batch(["the cat"], ["sat"])["token_type_ids"][0] == \
        theirs("the cat", "sat")["token_type_ids"]


def test_bad_vocabularies_are_tokenizer_errors(tmp_path):
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(TokenizerError, match="UNK"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "vocab.txt").write_text("[UNK]\na\n")
    with pytest.raises(TokenizerError, match=r"\[PAD\]"):
        load_tokenizer(tmp_path / "vocab.txt")


def test_training_gives_the_same_vocabulary_and_ids_in_every_process(tmp_path):
    """The trainer makes its ``##`` pieces in hash-map order (a new seed per process) and breaks ties between
    merges of equal count by their ids: on this text (the BERT tests' corpus) six processes learned six
    different sets before the ``##`` pieces were reserved in sorted order. Now the set and the ids agree."""
    import subprocess
    import sys

    from attnlab.data.labelled import generate_topics
    from tests.helpers import write_corpus

    corpus = write_corpus(tmp_path / "corpus.txt", n_chars=20_000)
    corpus.write_text(corpus.read_text() + "\n".join(generate_topics(400, seed=9).texts) + "\n")
    code = ("import hashlib, json, sys; from attnlab.tokenizers import WordPieceTokenizer; "
            "t = WordPieceTokenizer.train(open(sys.argv[1], encoding='utf-8').read(), 200); "
            "print(hashlib.sha256(json.dumps(t.tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest())")
    runs = {subprocess.run([sys.executable, "-c", code, str(corpus)], capture_output=True, text=True,
                           check=True).stdout for _ in range(3)}
    assert len(runs) == 1


def test_the_continuing_pieces_are_the_characters_that_follow_inside_a_word():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    from attnlab.tokenizers.wordpiece import WordPieceTokenizer, continuing_alphabet

    hf = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    WordPieceTokenizer._pipeline(hf, lowercase=True)
    # lower-cased, accents stripped; punctuation is its own word, so "!" never follows; "ab\ncd" is two words
    assert continuing_alphabet(["Hé ab!\ncd", "xY"], hf) == ["##b", "##d", "##e", "##y"]
