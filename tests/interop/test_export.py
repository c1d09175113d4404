"""``attnlab export``: folders that transformers' Auto classes read with attnlab's logits and token ids,
refusals in one line, and run folders transformers cannot mistake for its own."""

from __future__ import annotations

import json
import random

import pytest
import torch

from attnlab.cli import main
from attnlab.data.labelled import generate_topics, write_labelled_csv
from attnlab.models.registry import from_pretrained
from attnlab.tokenizers import load_tokenizer
from tests.helpers import train_tiny_run, write_corpus

transformers = pytest.importorskip("transformers")
TEXT = "Before we proceed any further hear me speak.\nAll the kings men."


@pytest.fixture(autouse=True)
def _quiet():
    transformers.logging.set_verbosity_error()


def _check_causal_lm(run, out, architecture):
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == architecture
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ours, our_tok = from_pretrained(run), load_tokenizer(run)
    ids = our_tok.encode(TEXT)
    assert tok(TEXT)["input_ids"] == ids and tok.decode(ids) == TEXT
    idx = torch.tensor([ids[:16], ids[-16:]])
    with torch.no_grad():
        diff = (hf(input_ids=idx).logits - ours(idx).logits).abs().max().item()
    assert diff < 1e-4


@pytest.mark.parametrize("preset, extra, architecture", [
    ("configs/shakespeare-char.yaml", {}, "GPTNeoXForCausalLM"),  # the default: RoPE, LayerNorm, no biases
    ("configs/quickstart.yaml", {}, "GPT2LMHeadModel"),  # learned positions, no biases (zeros in GPT-2)
    ("configs/shakespeare-char.yaml", {"model.norm": "rmsnorm", "model.activation": "swiglu", "model.n_kv_head": 1},
     "LlamaForCausalLM"),
    ("configs/shakespeare-char.yaml", {"model.activation": "relu2"}, "GPTNeoXForCausalLM"),  # ACT2FN's relu2
])
def test_gpt_runs_export_to_the_standard_architecture(tmp_path, capsys, preset, extra, architecture):
    run = train_tiny_run(tmp_path, **extra) if preset.endswith("char.yaml") else _quickstart_run(tmp_path)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert "exported" in capsys.readouterr().out
    out = tmp_path / "hf"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "README.md"} <= {p.name for p in out.iterdir()}
    assert "## Metrics" in (out / "README.md").read_text()
    _check_causal_lm(run, out, architecture)
    assert not list(tmp_path.glob(".hf.export-*"))  # no staging folder left


def _quickstart_run(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    assert main(["train", "configs/quickstart.yaml", f"data={corpus}", f"out_dir={tmp_path / 'runs'}", "name=q",
                 "max_iters=6", "eval_interval=6", "eval_iters=1", "batch_size=4", "progress=false",
                 "sample_tokens=0", "model.n_layer=1", "model.d_model=32", "model.block_size=32"]) == 0
    return tmp_path / "runs" / "q"


def test_bert_and_vit_runs_export(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt")
    tiny = ["batch_size=8", "max_iters=6", "eval_interval=6", "eval_iters=1", "progress=false", "bpe_vocab_size=200",
            "block_size=32", "n_layer=2", "n_head=2", "d_model=32"]
    assert main(["train", "configs/bert-mlm.yaml", f"data={corpus}", f"out_dir={tmp_path}", "name=bert", *tiny]) == 0
    with pytest.raises(OSError):  # the run folder itself is not a transformers folder: no random BERT
        transformers.BertForMaskedLM.from_pretrained(tmp_path / "bert")
    assert main(["export", str(tmp_path / "bert"), "--out", str(tmp_path / "bert-hf")]) == 0
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "bert-hf").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "bert-hf")
    ours, our_tok = from_pretrained(tmp_path / "bert"), load_tokenizer(tmp_path / "bert")
    batch = our_tok.encode_batch(["hear me speak", "the king is dead, long live the king"], max_len=32)
    assert tok(["hear me speak", "the king is dead, long live the king"], padding=True)["input_ids"] == \
        batch["input_ids"]
    args = {k: torch.tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        diff = (hf(**args).logits - ours(**args, with_mlm=True).mlm_logits).abs().max().item()
    assert diff < 1e-4

    tiny = ["max_iters=4", "eval_interval=4", "batch_size=16", "progress=false", "warmup_iters=1",
            "model.n_layer=1", "model.d_model=32"]
    assert main(["train", "configs/vit-digits.yaml", f"out_dir={tmp_path}", "name=vit", *tiny]) == 0
    assert main(["export", str(tmp_path / "vit"), "--out", str(tmp_path / "vit-hf")]) == 0
    hf = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "vit-hf").eval()
    ours = from_pretrained(tmp_path / "vit")
    x = torch.randn(3, 1, ours.config.image_size, ours.config.image_size)
    with torch.no_grad():
        assert (hf(pixel_values=x).logits - ours(x).logits).abs().max().item() < 1e-4
    assert hf.config.id2label[3] == "3"
    processor = json.loads((tmp_path / "vit-hf" / "preprocessor_config.json").read_text())
    assert processor["image_mean"] == json.loads((tmp_path / "vit" / "labels.json").read_text())["mean"]


HEAD_BERT = ["tokenizer=char", "max_iters=6", "eval_interval=6", "eval_iters=1", "batch_size=16", "progress=false",
             "warmup_iters=2", "sample_tokens=0", "model.n_layer=1", "model.n_head=2", "model.d_model=32",
             "model.block_size=40", "model.norm_position=post", "model.pooling=cls"]


def _rows(path, task):
    rows = generate_topics(60, seed=3) if task == "classify" else None
    if rows is not None:
        return write_labelled_csv(rows, path)
    rng = random.Random(0)
    texts = ["".join(rng.choice("ab") for _ in range(rng.randint(6, 18))) for _ in range(80)]
    path.write_text("text,label\n" + "".join(f"{t},{10 * t.count('a') / len(t) + 3:.3f}\n" for t in texts))
    return path


@pytest.mark.parametrize("task", ["classify", "regress"])
def test_a_bert_with_a_head_exports_it_for_sequence_classification(tmp_path, capsys, task):
    """A fine-tuned head goes with the export: BertForSequenceClassification gives attnlab's class logits, or its
    predictions in the targets' own units (the standardisation folded in, as ``attnlab predict`` writes them);
    AutoModelForMaskedLM still reads the encoder from the same folder."""
    data = _rows(tmp_path / "rows.csv", task)
    assert main(["train", "bert-solubility", f"data={data}", f"task={task}", f"out_dir={tmp_path}", "name=h",
                 *HEAD_BERT]) == 0
    run, out = tmp_path / "h", tmp_path / "h-hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ours, our_tok = from_pretrained(run), load_tokenizer(run)
    texts = ["abba", "aaaab", "baa"] if task == "regress" else ["Food and cooking", "the match was won"]
    batch = our_tok.encode_batch(texts, max_len=40)
    assert tok(texts, padding=True)["input_ids"] == batch["input_ids"]
    args = {k: torch.tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        theirs, mine = hf(**args).logits, ours(**args)
    if task == "classify":
        expected = mine.logits
        assert list(hf.config.id2label.values()) == json.loads((run / "labels.json").read_text())
    else:
        scale = json.loads((run / "targets.json").read_text())
        expected = mine.predictions * torch.tensor(scale["std"]) + torch.tensor(scale["mean"])  # original units
        assert hf.config.problem_type == "regression" and expected.abs().min() > 1.0  # not the standardised values
    assert theirs.shape == expected.shape and (theirs - expected).abs().max().item() < 1e-4
    assert "AutoModelForSequenceClassification" in (out / "README.md").read_text()
    assert type(transformers.AutoModelForMaskedLM.from_pretrained(out)).__name__ == "BertForMaskedLM"
    capsys.readouterr()
    assert main(["import-hf", str(out), "--out", str(tmp_path / "back")]) == 0  # the encoder, and a note on the head
    assert "classifier) is not imported" in capsys.readouterr().out


def test_a_head_without_an_exact_equivalent_is_refused(tmp_path, capsys):
    """Mean pooling (bert-solubility's) has no place in BertForSequenceClassification, which pools with [CLS]'s tanh
    pooler: refused in one line naming the option, rather than exported without the head the run was trained for."""
    data = _rows(tmp_path / "rows.csv", "regress")
    assert main(["train", "bert-solubility", f"data={data}", "task=regress", f"out_dir={tmp_path}", "name=m",
                 *HEAD_BERT[:-1], "model.pooling=mean"]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "m"), "--out", str(tmp_path / "m-hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert "pooling='mean'" in err and len(err.splitlines()) == 1 and not (tmp_path / "m-hf").exists()


def test_refusals_are_one_line_and_write_nothing(tmp_path, capsys):
    run = train_tiny_run(tmp_path, max_iters=2, **{"model.positions": "alibi"})
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "positions='alibi'" in err and len(err.splitlines()) == 1 and not (tmp_path / "x").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert main(["export", str(run), "--out", str(full)]) == 2
    assert "not an empty folder" in capsys.readouterr().err and (full / "keep.txt").read_text() == "mine"
    assert main(["export", str(run), "--format", "sentence-transformers", "--out", str(tmp_path / "y")]) == 2
    assert "needs a bert encoder" in capsys.readouterr().err
    capped = train_tiny_run(tmp_path, name="capped", max_iters=2, **{"model.qk_norm": True, "model.logit_softcap": 20})
    capsys.readouterr()
    assert main(["export", str(capped), "--out", str(tmp_path / "z")]) == 2
    err = capsys.readouterr().err.strip()
    assert "qk_norm=True" in err and "logit_softcap=20" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "z").exists()


def test_transformers_refuses_a_run_folder_loudly(tmp_path):
    """A run folder's weights are not under the name transformers reads, so its classes fail instead of
    returning a model initialised from defaults."""
    run = train_tiny_run(tmp_path, max_iters=2, **{"model.positions": "learned"})
    with pytest.raises(OSError):
        transformers.GPT2LMHeadModel.from_pretrained(run)
    with pytest.raises((OSError, ValueError)):
        transformers.AutoModelForCausalLM.from_pretrained(run)
