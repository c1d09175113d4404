"""Token classification and question answering end to end on tiny runs: training writes the scores beside their
baselines, ``attnlab predict`` writes spans with character offsets, ``attnlab export`` writes folders that
transformers loads as BertForTokenClassification / BertForQuestionAnswering with attnlab's logits (to 1e-4) and
its pipelines' predictions, and bad inputs are refused in one line with exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.data.spans import write_folder
from attnlab.models.registry import from_pretrained
from attnlab.tokenizers import load_tokenizer
from tests.cli.test_predict import SMALL, TINY

TEXTS = ["Nadia Holm joined Axon Bank in May 1999 .", "The meeting in Leipzig was led by Walter Fischer ."]
QUESTIONS = [{"question": "Where was Ana Rivas born?", "context": "Tomas Berg works for Halden Bank. Ana Rivas was "
              "born in Lisbon. Ana Rivas is a friend of Tomas Berg."},
             {"question": "Who does Tomas Berg work for?", "context": "Tomas Berg works for Halden Bank."}]


def _exit(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny trained token-classification run and question-answering run, with the data they trained on."""
    tmp = tmp_path_factory.mktemp("spans")
    write_folder(tmp / "ents", "entities", 80)
    write_folder(tmp / "qs", "questions", 80)
    folders = {"tmp": tmp}
    for name, preset, data in (("ner", "bert-ner", "ents"), ("qa", "bert-qa", "qs")):
        out = tmp / "runs" / name
        assert main(["train", preset, f"data={tmp / data}", f"out_dir={out}", "batch_size=8", "model.block_size=96",
                     "threads=1", *TINY, *SMALL]) == 0
        folders[name] = next(out.iterdir())
    return folders


def test_training_writes_the_scores_beside_their_baselines(runs):
    ner = json.loads((runs["ner"] / "scores.json").read_text())
    assert set(ner) == {"val", "test"} and ner["test"]["n"] == 8
    assert {"entity_f1", "precision", "recall", "all_o_f1", "majority_f1"} <= set(ner["test"])
    assert ner["test"]["all_o_f1"] == 0.0 and 0 < ner["val"]["majority_f1"] <= 1
    qa = json.loads((runs["qa"] / "scores.json").read_text())
    assert {"exact_match", "f1", "baseline_exact_match", "baseline_f1"} <= set(qa["test"])
    assert json.loads((runs["ner"] / "tags.json").read_text())[0] == "O"


def test_predict_writes_entities_and_answers_with_character_offsets(runs, capsys):
    tmp = runs["tmp"]
    (tmp / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    (tmp / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    assert main(["predict", str(runs["ner"]), "--data", str(tmp / "texts.txt"), "--out", str(tmp / "e.jsonl")]) == 0
    questions = str(tmp / "questions.jsonl")
    assert main(["predict", str(runs["qa"]), "--data", questions, "--out", str(tmp / "a.jsonl")]) == 0
    for row, text in zip(map(json.loads, (tmp / "e.jsonl").read_text().splitlines()), TEXTS, strict=True):
        assert row["input"] == text
        for e in row["entities"]:
            assert text[e["start"]:e["end"]] == e["text"] and e["label"] in ("PER", "LOC", "ORG", "DATE")
            assert 0 < e["score"] <= 1
    for row, q in zip(map(json.loads, (tmp / "a.jsonl").read_text().splitlines()), QUESTIONS, strict=True):
        assert row["input"] == q["question"] and q["context"][row["start"]:row["end"]] == row["prediction"]
        assert row["prediction"] and 0 < row["score"] <= 1
    assert main(["predict", str(runs["qa"]), "--data", str(tmp / "questions.jsonl"), "--out", str(tmp / "a.csv")]) == 0
    assert (tmp / "a.csv").read_text().splitlines()[0] == "input,prediction,start,end,score"


@pytest.fixture(scope="module")
def exported(runs):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    folders = {}
    for name in ("ner", "qa"):
        out = runs["tmp"] / f"hf-{name}"
        assert main(["export", str(runs[name]), "--format", "hf", "--out", str(out)]) == 0
        folders[name] = out
    return transformers, folders


def test_exported_heads_give_attnlabs_logits_in_transformers(runs, exported):
    transformers, folders = exported
    token = transformers.AutoModelForTokenClassification.from_pretrained(folders["ner"]).eval()
    qa = transformers.AutoModelForQuestionAnswering.from_pretrained(folders["qa"]).eval()
    assert type(token).__name__ == "BertForTokenClassification" and type(qa).__name__ == "BertForQuestionAnswering"
    tok = load_tokenizer(runs["ner"])
    enc = {k: torch.tensor(v) for k, v in tok.encode_batch(TEXTS, max_len=96).items()}
    mask = enc["attention_mask"].bool()
    with torch.no_grad():
        ours = from_pretrained(runs["ner"]).eval()(**enc).token_logits
        assert (token(**enc).logits - ours)[mask].abs().max().item() < 1e-4
        tok = load_tokenizer(runs["qa"])
        enc = {k: torch.tensor(v) for k, v in tok.encode_batch([q["question"] for q in QUESTIONS],
                                                             [q["context"] for q in QUESTIONS], max_len=96).items()}
        mask = enc["attention_mask"].bool()
        mine, theirs = from_pretrained(runs["qa"]).eval()(**enc), qa(**enc)
        assert (theirs.start_logits - mine.start_logits)[mask].abs().max().item() < 1e-4
        assert (theirs.end_logits - mine.end_logits)[mask].abs().max().item() < 1e-4
    card = (folders["ner"] / "README.md").read_text()
    assert "pipeline_tag: token-classification" in card and "AutoModelForTokenClassification" in card
    assert "pipeline_tag: question-answering" in (folders["qa"] / "README.md").read_text()


def test_transformers_pipelines_predict_what_attnlab_predicts(runs, exported):
    from attnlab.training.predict_spans import predict_answers, predict_entities

    transformers, folders = exported
    ner = transformers.pipeline("token-classification", model=str(folders["ner"]), aggregation_strategy="first")
    ours = predict_entities(from_pretrained(runs["ner"]).eval(), runs["ner"], TEXTS, 8)
    for text, mine in zip(TEXTS, ours, strict=True):
        theirs = ner(text)
        assert [(e["entity_group"], e["start"], e["end"]) for e in theirs] == \
            [(e["label"], e["start"], e["end"]) for e in mine["entities"]]
        assert [float(e["score"]) for e in theirs] == pytest.approx([e["score"] for e in mine["entities"]], abs=1e-4)
    # transformers 5 has no question-answering pipeline: its decoding (transformers 4.x's
    # QuestionAnsweringPipeline: non-context logits -1e4, softmax, [CLS] zeroed, the best start <= end < start + 15,
    # widened to words) on the exported model's logits, the text encoded by the exported tokenizer
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["qa"])
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(folders["qa"]).eval()
    answers = predict_answers(from_pretrained(runs["qa"]).eval(), runs["qa"], QUESTIONS, 8)
    for q, mine in zip(QUESTIONS, answers, strict=True):
        enc = tokenizer(q["question"], q["context"], return_tensors="pt")
        with torch.no_grad():
            out = model(**{k: v for k, v in enc.items() if k != "offset_mapping"})
        context = torch.tensor([s == 1 for s in enc.sequence_ids(0)]) & (enc["input_ids"][0] != tokenizer.sep_token_id)
        undesired = ~context
        undesired[0] = False  # [CLS] takes part in the softmax, then is zeroed
        p_start = out.start_logits[0].masked_fill(undesired, -10000.0).softmax(-1)
        p_end = out.end_logits[0].masked_fill(undesired, -10000.0).softmax(-1)
        p_start[0] = p_end[0] = 0.0
        candidates = torch.tril(torch.triu(p_start[:, None] * p_end[None, :]), 14)
        score, flat = candidates.flatten().max(-1)
        s, e = divmod(int(flat), candidates.size(1))
        begin = enc.word_to_chars(0, enc.token_to_word(0, s), sequence_index=1)[0]
        end = enc.word_to_chars(0, enc.token_to_word(0, e), sequence_index=1)[1]
        assert (q["context"][begin:end], begin, end) == (mine["prediction"], mine["start"], mine["end"])
        assert float(score) == pytest.approx(mine["score"], abs=1e-4)


@pytest.mark.parametrize("argv, message", [
    (["train", "bert-qa", "data={tmp}/runs"], "no train.jsonl or val.jsonl"),
    (["train", "bert-qa", "data={tmp}/ents"], "train.jsonl:1: each line needs 'context' and 'question'"),
    (["train", "bert-qa", "data=generated:entities"], "holds entities; this task reads questions"),
    (["train", "bert-ner", "data={tmp}/texts.txt"], "are read from a folder of train/val/test.jsonl"),
    (["train", "bert-ner", "model.head_type=span"], "task token-classification trains model.head_type=token"),
    (["train", "bert-qa", "model.n_classes=3"], "model.head_type=span has its own start/end head"),
    (["train", "bert-ner", "classify.max_len=2"], "classify.max_len must be >= 3"),
    (["train", "bert-solubility", "task=classify", "model.head_type=token"], "classify trains model.head_type=seq"),
    (["train", "bert-ner", "images.shift=1"], "is not used"),
    (["predict", "{qa}", "--data", "{tmp}/texts.txt", "--out", "{tmp}/x.jsonl"], "questions are read from a .jsonl"),
])
def test_bad_inputs_are_refused_in_one_line(runs, capsys, argv, message):
    argv = [a.format(tmp=runs["tmp"], qa=runs["qa"]) for a in argv]
    if argv[0] == "train":
        argv += [f"out_dir={runs['tmp'] / 'refused'}", *TINY]
    capsys.readouterr()
    assert _exit(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err
    assert not (runs["tmp"] / "refused").exists() or not any((runs["tmp"] / "refused").iterdir())


def test_a_pre_trained_bert_starts_a_token_classifier_with_init_from(runs, capsys):
    """The two-command recipe: a masked-LM run, then bert-ner from it (its encoder and WordPiece; a fresh head)."""
    from tests.helpers import write_corpus

    tmp = runs["tmp"]
    corpus = write_corpus(tmp / "corpus.txt")
    assert main(["train", "bert-mlm", f"data={corpus}", f"out_dir={tmp / 'mlm'}", "batch_size=4", "bpe_vocab_size=200",
                 "model.block_size=96", *TINY, *SMALL]) == 0
    mlm = next((tmp / "mlm").iterdir())
    capsys.readouterr()
    assert main(["train", "bert-ner", f"data={tmp / 'ents'}", f"init_from={mlm}", f"out_dir={tmp / 'ner-ft'}",
                 "batch_size=8", "model.block_size=96", "model.norm_eps=1e-12", *TINY, *SMALL]) == 0
    ner = next((tmp / "ner-ft").iterdir())
    assert (ner / "tokenizer.json").read_text() == (mlm / "tokenizer.json").read_text()
    pre, tuned = from_pretrained(mlm).state_dict(), from_pretrained(ner).state_dict()
    assert "token_classifier.weight" in tuned and "token_classifier.weight" not in pre
    assert not torch.equal(pre["blocks.0.mixer.qkv_proj.weight"], tuned["blocks.0.mixer.qkv_proj.weight"])  # trained on
    assert "fresh" in capsys.readouterr().out


def test_a_question_too_long_for_the_model_is_refused_and_a_long_context_cut(runs, capsys):
    tmp = runs["tmp"]
    (tmp / "long.jsonl").write_text(json.dumps({"question": "who " * 200 + "?", "context": "Ana was born in Oslo."})
                                    + "\n", encoding="utf-8")
    assert _exit(["predict", str(runs["qa"]), "--data", str(tmp / "long.jsonl"), "--out", str(tmp / "l.jsonl")]) == 2
    assert "leaves no room for its context" in capsys.readouterr().err and not (tmp / "l.jsonl").exists()
    (tmp / "long.jsonl").write_text(json.dumps({"question": "Where was Ana born?",
                                                "context": "Ana was born in Oslo. " * 60}) + "\n", encoding="utf-8")
    assert main(["predict", str(runs["qa"]), "--data", str(tmp / "long.jsonl"), "--out", str(tmp / "l.jsonl")]) == 0
    assert json.loads((tmp / "l.jsonl").read_text())["truncated"] is True
