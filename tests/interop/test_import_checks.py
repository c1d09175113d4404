"""import-hf refuses, in one line with exit 2 and nothing at --out, the folders that would give a model with
non-finite logits, a tokenizer that indexes past the embedding, or a read that never ends; a kill while it
writes leaves no half folder, and the next run is not refused because of it."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab.cli import main
from attnlab.core.staging import STAGING_MARK, staged_folder
from attnlab.models.registry import from_pretrained
from attnlab.tokenizers import CharTokenizer, load_tokenizer
from tests.hf_folders import VOCAB, tiny_hf_folders

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Tiny random-weights transformers folders, written by transformers itself (tests/hf_folders.py)."""
    return tiny_hf_folders(tmp_path_factory.mktemp("hf-sources"))


@pytest.fixture(autouse=True)
def _no_hang():
    """A read that blocks (a FIFO) fails the test after a minute instead of hanging the suite."""
    def stop(*_):
        raise TimeoutError("import-hf blocked")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _copy(sources, name, tmp_path):
    return shutil.copytree(sources / name, tmp_path / "hf", symlinks=True)


def _edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        cfg[key] = value
    path.write_text(json.dumps(cfg))  # NaN and inf as JSON's NaN / Infinity, as Python writes them


def _edit_tensor(folder, fragment, value, dtype=None):
    """Put ``value`` into the first element of the first tensor whose name holds ``fragment``."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    name = next(k for k in sorted(tensors) if fragment in k)
    t = tensors[name].to(dtype or tensors[name].dtype).clone()
    t.view(-1)[0] = value
    tensors[name] = t
    save_file(tensors, path, metadata={"format": "pt"})


def _refused(tmp_path, capsys, *expected):
    """import-hf of tmp_path/hf exits 2 with one line holding every ``expected`` text, and writes nothing."""
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for text in expected:
        assert text in err, err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no staging, no lock
    return err


def test_clean_imports_work_and_are_whole(sources, tmp_path, capsys):
    for name in ("gpt2", "bert", "vit"):
        out = tmp_path / name
        assert main(["import-hf", str(sources / name), "--out", str(out)]) == 0
        model = from_pretrained(out)  # every file matches the manifest
        files = {p.name for p in out.iterdir()}
        assert {"config.json", "attnlab_model.safetensors", "imported.json", "manifest.json"} <= files
        assert ".attnlab-staging" not in files and oct(out.stat().st_mode & 0o777) != "0o700"
        if name == "vit":
            labels = json.loads((out / "labels.json").read_text())
            assert labels["mean"] == [0.5, 0.4, 0.3] and labels["std"] == [0.2, 0.3, 0.4]
        else:
            assert load_tokenizer(out).vocab_size <= model.config.vocab_size
    assert "nsp_head.weight" in json.loads((tmp_path / "bert" / "imported.json").read_text())["fresh_heads"]
    assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]


@pytest.mark.parametrize("family, fragment, value, dtype, expected", [
    ("gpt2", "c_attn.weight", math.nan, None, "NaN"),
    ("llama", "down_proj.weight", math.inf, None, "infinite"),
    ("bert", "query.weight", -math.inf, torch.float16, "infinite"),
    # finite in the file, infinite once cast to the model's float32
    ("gpt2", "c_fc.weight", 1e300, torch.float64, "blocks.0.ffn.fc_in.weight infinite (as float32)"),
    ("vit", "classifier.weight", math.nan, None, "head.weight"),
], ids=["gpt2-nan", "llama-inf", "bert-fp16-inf", "gpt2-fp64-overflow", "vit-nan-head"])
def test_non_finite_weights_are_refused(sources, tmp_path, capsys, family, fragment, value, dtype, expected):
    _edit_tensor(_copy(sources, family, tmp_path), fragment, value, dtype)
    _refused(tmp_path, capsys, expected, "finite weights only")


@pytest.mark.parametrize("family, changes, expected", [
    ("gpt2", {"layer_norm_epsilon": math.nan}, "layer_norm_epsilon=nan"),
    ("bert", {"layer_norm_eps": math.inf}, "layer_norm_eps=inf"),
    ("vit", {"layer_norm_eps": math.nan}, "layer_norm_eps=nan"),
    ("llama", {"rms_norm_eps": 0}, "rms_norm_eps=0"),
    ("llama", {"rope_theta": math.nan, "rope_parameters": None}, "rope_theta=nan"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": math.inf}}, "rope_parameters.rope_theta=inf"),
    ("bert", {"initializer_range": math.nan}, "initializer_range=nan"),  # the fresh heads' init
    ("gpt2", {"n_layer": "2"}, "n_layer='2'"),
    ("llama", {"num_attention_heads": 0}, "num_attention_heads=0"),
    ("bert", {"num_attention_heads": 5}, "does not divide"),
    ("gpt2", {"vocab_size": 2 * 10**9}, "to load it needs about"),
    ("gpt2", {"vocab_size": 10**12}, "vocab_size=1000000000000"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_config_numbers_are_refused(sources, tmp_path, capsys, family, changes, expected):
    _edit_config(_copy(sources, family, tmp_path), **changes)
    _refused(tmp_path, capsys, expected)


@pytest.mark.parametrize("processor, expected", [
    ({"image_std": [0]}, "image_std"),
    ({"image_std": [0.2, 0.0, 0.3]}, "image_std[1]=0.0"),
    ({"image_mean": [math.nan, 0.5, 0.5]}, "image_mean[0]=nan"),
    ({"image_mean": [0.5, 0.5]}, "list of 3"),
], ids=["std-one-zero", "std-zero", "mean-nan", "mean-channels"])
def test_bad_image_normalisation_is_refused(sources, tmp_path, capsys, processor, expected):
    folder = _copy(sources, "vit", tmp_path)
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    _refused(tmp_path, capsys, "preprocessor_config.json", expected)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(sources, tmp_path, capsys):
    folder = _copy(sources, "gpt2", tmp_path)
    CharTokenizer([chr(c) for c in range(0x100, 0x100 + VOCAB + 40)]).save(folder)  # 100 tokens, 60 rows
    _refused(tmp_path, capsys, "tokenizer.json", "100 tokens", f"vocabulary of {VOCAB}")


def test_added_tokens_past_the_vocabulary_are_refused(sources, tmp_path, capsys):
    folder = _copy(sources, "llama", tmp_path)
    payload = json.loads((folder / "tokenizer.json").read_text())
    start = len(payload["model"]["vocab"])
    payload["added_tokens"] = [{"id": start + i, "content": f"<extra_{i}>", "special": True, "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False} for i in range(VOCAB)]
    (folder / "tokenizer.json").write_text(json.dumps(payload))
    _refused(tmp_path, capsys, "tokenizer.json", f"vocabulary of {VOCAB}")


def test_a_repeated_token_is_refused(sources, tmp_path, capsys):
    folder = _copy(sources, "bert", tmp_path)
    lines = (folder / "vocab.txt").read_text().splitlines()
    (folder / "vocab.txt").write_text("\n".join([*lines, "q"]) + "\n")
    _refused(tmp_path, capsys, "vocab.txt", f"line {len(lines) + 1} repeats the token 'q'")
    # tokenizer.json's vocabulary is a JSON object: a repeated token keeps its last id, and the first is missing
    folder = _copy(sources, "gpt2", tmp_path / "json")
    payload = json.loads((folder / "tokenizer.json").read_text())
    vocab = payload["model"]["vocab"]
    payload["model"]["vocab"] = "VOCAB"
    repeated = json.dumps(vocab)[:-1] + f', "a": {len(vocab)}}}'  # "a" was id 0
    (folder / "tokenizer.json").write_text(json.dumps(payload).replace('"VOCAB"', repeated))
    _refused(tmp_path / "json", capsys, "tokenizer.json", "no token has id 0", "a repeated token?")


@pytest.mark.parametrize("family, name", [
    ("gpt2", "config.json"), ("gpt2", "tokenizer.json"), ("bert", "vocab.txt"), ("gpt2", "model.safetensors"),
    ("vit", "preprocessor_config.json"), ("bert", "modules.json"), ("bert", "tokenizer_config.json"),
    ("bert", "1_Pooling/config.json"),
])
@pytest.mark.parametrize("how", ["fifo", "dev-zero"])
def test_files_that_are_not_regular_are_refused_without_blocking(sources, tmp_path, capsys, family, name, how):
    folder = _copy(sources, family, tmp_path)
    if name == "1_Pooling/config.json":  # a sentence-transformers folder around the BERT
        (folder / "modules.json").write_text(json.dumps(
            [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (folder / "1_Pooling").mkdir()
    (folder / name).unlink(missing_ok=True)
    if how == "fifo":
        os.mkfifo(folder / name)
    else:
        (folder / name).symlink_to("/dev/zero")
    _refused(tmp_path, capsys, name, "not a regular file")


def test_an_oversized_config_is_refused_unread(sources, tmp_path, capsys):
    folder = _copy(sources, "gpt2", tmp_path)
    os.truncate(folder / "config.json", 17 * 2**20)  # sparse: 17 MB that would take a while to parse
    _refused(tmp_path, capsys, "config.json", "more than the 16 MB")


def test_a_link_to_a_regular_file_is_followed(sources, tmp_path, capsys):
    """Hugging Face's cache links each file of a snapshot to a blob: such a folder imports."""
    folder = _copy(sources, "gpt2", tmp_path)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).rename(blobs / name)
        (folder / name).symlink_to(blobs / name)
    assert main(["import-hf", str(folder), "--out", str(tmp_path / "out")]) == 0


KILLED_IMPORT = """
import os, signal, sys
import attnlab.interop.hf as hf
hf.write_manifest = lambda folder: os.kill(os.getpid(), signal.SIGKILL)  # the last write of the import
hf.import_hf(sys.argv[1], sys.argv[2])
"""


def test_a_kill_during_the_write_leaves_nothing_and_the_rerun_works(sources, tmp_path, capsys):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", KILLED_IMPORT, str(sources / "bert"), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not out.exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".out.staging-")]
    assert len(leftovers) == 1 and (leftovers[0] / "imported.json").is_file()  # killed with the folder written
    assert main(["import-hf", str(sources / "bert"), "--out", str(out)]) == 0
    assert (out / "imported.json").is_file() and from_pretrained(out) is not None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.staging-")]


def test_staged_folder_publishes_whole_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), staged_folder(out) as staging:
        (staging / "a.txt").write_text("a")
        raise RuntimeError("failed halfway")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".staging-" in p.name]
    lookalike = tmp_path / ".out.staging-mine"  # not made by staged_folder (no mark): left alone
    lookalike.mkdir()
    leftover = tmp_path / ".out.staging-dead"  # made by a killed staged_folder
    leftover.mkdir()
    (leftover / STAGING_MARK).touch()
    out.mkdir()  # an empty folder is replaced
    with staged_folder(out) as staging:
        (staging / "a.txt").write_text("a")
        assert not out.joinpath("a.txt").exists()
    assert [p.name for p in out.iterdir()] == ["a.txt"]
    assert lookalike.is_dir() and not leftover.exists()
    with pytest.raises(OSError, match="cannot put the finished folder"), staged_folder(out) as staging:
        (staging / "b.txt").write_text("b")  # out is full now: refused, and out kept as it was
    assert [p.name for p in out.iterdir()] == ["a.txt"]
