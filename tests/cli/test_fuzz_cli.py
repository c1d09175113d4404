"""Property-based tests: malformed configs, overrides, data files and prompts given to the CLI
always end in one line on stderr, exit status 2, no traceback, and no partial run folder."""

from __future__ import annotations

import dataclasses
import string

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from attnlab.cli import main
from attnlab.models.config import ModelConfig
from attnlab.training.config import TrainConfig
from attnlab.training.tasks.names import SECTIONS
from tests.helpers import tiny_overrides, write_corpus

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainConfig)}
MODEL_KEYS = ModelConfig.option_names()
# a task option written without its section (min_len for seq2seq.min_len) is known, not unknown
SECTION_KEYS = {f.name for section in SECTIONS for f in dataclasses.fields(getattr(TrainConfig(), section))}
INT_KEYS = ["max_iters", "batch_size", "grad_accum", "eval_iters", "n_layer", "n_head", "d_model", "block_size"]
POSITIVE_KEYS = ["max_iters", "batch_size", "grad_accum", "eval_interval", "n_layer", "n_head", "d_model",
                 "block_size", "keep_checkpoints"]


def _check_one_line(capsys, code: int, out_dir=None) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("attnlab: error:") and "Traceback" not in err
    if out_dir is not None and out_dir.exists():
        assert not any(out_dir.iterdir()), "a malformed input left files behind"
    return err


@pytest.fixture
def preset(tmp_path):
    p = tmp_path / "preset.yaml"
    p.write_text("max_iters: 1\n")
    return p


identifiers = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=12)


@SETTINGS
@given(key=identifiers)
def test_unknown_keys(key, preset, tmp_path, capsys):
    assume(key not in TRAIN_KEYS | MODEL_KEYS | SECTION_KEYS)
    out = tmp_path / "runs"
    err = _check_one_line(capsys, main(["train", str(preset), f"{key}=1", f"out_dir={out}"]), out)
    assert f"unknown config key '{key}'" in err


@SETTINGS
@given(key=st.sampled_from(INT_KEYS), value=st.text(alphabet=string.ascii_letters + "-_/", min_size=1, max_size=8))
def test_wrong_types(key, value, preset, tmp_path, capsys):
    assume(value.lower() not in ("true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"))
    out = tmp_path / "runs"
    err = _check_one_line(capsys, main(["train", str(preset), f"{key}={value}", f"out_dir={out}"]), out)
    assert key in err


@SETTINGS
@given(key=st.sampled_from(POSITIVE_KEYS), value=st.integers(max_value=0))
def test_out_of_range(key, value, preset, tmp_path, capsys):
    out = tmp_path / "runs"
    err = _check_one_line(capsys, main(["train", str(preset), f"{key}={value}", f"out_dir={out}"]), out)
    assert key in err


@SETTINGS
@given(d_model=st.integers(1, 512), n_head=st.integers(2, 16))
def test_heads_must_divide_width(d_model, n_head, preset, tmp_path, capsys):
    assume(d_model % n_head != 0)
    out = tmp_path / "runs"
    code = main(["train", str(preset), f"d_model={d_model}", f"n_head={n_head}", f"out_dir={out}"])
    assert "does not divide" in _check_one_line(capsys, code, out)


@SETTINGS
@given(content=st.text(min_size=1, max_size=200))
def test_malformed_yaml_files(content, tmp_path, capsys):
    try:
        parsed = yaml.safe_load(content)
    except yaml.YAMLError:
        parsed = "unparseable"
    assume(parsed is not None and parsed != {})
    p = tmp_path / "fuzz.yaml"
    p.write_text(content, encoding="utf-8")
    out = tmp_path / "runs"
    # data points nowhere, so even an accidentally valid config stops before training
    _check_one_line(capsys, main(["train", str(p), f"out_dir={out}", "data=/nonexistent/x.txt"]), out)


@SETTINGS
@given(blob=st.binary(min_size=1, max_size=300))
def test_binary_or_non_utf8_data_files(blob, preset, tmp_path, capsys):
    try:
        blob.decode("utf-8")
        assume(b"\0" in blob)
    except UnicodeDecodeError:
        pass
    data = tmp_path / "data.bin"
    data.write_bytes(blob)
    out = tmp_path / "runs"
    err = _check_one_line(capsys, main(["train", str(preset), f"data={data}", f"out_dir={out}"]), out)
    assert str(data) in err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzzrun")
    corpus = write_corpus(tmp / "corpus.txt")
    preset = tmp / "p.yaml"
    preset.write_text("{}\n")
    assert main(["train", str(preset), *tiny_overrides(corpus, tmp / "runs", name="r", max_iters=2)]) == 0
    return tmp / "runs" / "r"


@SETTINGS
@given(prompt=st.text(min_size=1, max_size=30))
def test_prompts_with_unknown_characters(prompt, run_dir, capsys):
    from attnlab.tokenizers import load_tokenizer

    vocab = set(load_tokenizer(run_dir).vocab)
    assume(any(ch not in vocab for ch in prompt))
    err = _check_one_line(capsys, main(["sample", str(run_dir), f"--prompt={prompt}", "--max-new-tokens", "2"]))
    assert "not in the tokenizer's vocabulary" in err


@SETTINGS
@given(top_p=st.floats(allow_nan=False), temperature=st.floats(max_value=-1e-9, allow_nan=False))
def test_bad_sampling_numbers(top_p, temperature, run_dir, capsys):
    args = ["sample", str(run_dir), "--max-new-tokens", "2", f"--temperature={temperature!r}"]
    if not 0.0 < top_p <= 1.0:
        args += [f"--top-p={top_p!r}"]
    _check_one_line(capsys, main(args))


@SETTINGS
@given(argv=st.lists(st.text(alphabet=string.ascii_letters + string.digits + "-=_./", min_size=1, max_size=10),
                     min_size=0, max_size=4))
def test_malformed_command_lines(argv, tmp_path, capsys):
    """Random words after `attnlab`: usage errors are one line too (or a clean one-line error)."""
    assume(not argv or argv[0] not in ("train", "resume", "sample", "eval"))
    assume("-h" not in argv and "--help" not in argv)
    assume(not any(a.startswith(("--h", "--v")) for a in argv))  # argparse accepts any unique prefix of --help
    assume(argv[:1] != ["completion"])  # --version and `completion SHELL` answer on stdout, exit 0
    _check_one_line(capsys, main(argv))
