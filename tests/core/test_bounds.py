"""Bounds on what a config or a data row may hold: YAML aliases (billion laughs), deep nesting, integers past Python's
4,300 digits, and the length of the error that quotes a value. Each is one short line and exit 2, before any work."""

from __future__ import annotations

import json

import pytest
import yaml

from attnlab import presets
from attnlab.cli import main
from attnlab.core import jsonsafe, yamlsafe
from attnlab.core.errors import ConfigError, DataError
from attnlab.core.schema import MAX_CONFIG_BYTES, load_yaml
from attnlab.data.pairs import read_pair_file


def billion_laughs() -> str:
    """A few hundred bytes of YAML whose aliases expand to 9**9 strings."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    lines.append("name: *i")
    return "\n".join(lines) + "\n"


def train_fails(capsys, *argv: str) -> str:
    """``attnlab train ARGV`` exits 2 with one short line on stderr; that line."""
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnlab: error: ") and len(err) < 400, err[:500]
    return err


def test_a_billion_laughs_is_one_short_line(tmp_path, capsys):
    config = tmp_path / "laughs.yaml"
    config.write_text(billion_laughs())
    assert len(config.read_bytes()) < 600
    err = train_fails(capsys, str(config))
    assert "aliases" in err and "(line 2)" in err  # the first alias


def test_merge_keys_are_aliases_too(tmp_path):
    config = tmp_path / "merge.yaml"
    config.write_text("base: &base {n_layer: 2}\nmodel:\n  <<: *base\n")
    with pytest.raises(ConfigError, match="aliases"):
        load_yaml(config)


def test_deep_nesting_is_refused(tmp_path, capsys):
    config = tmp_path / "deep.yaml"
    config.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")  # PyYAML composes recursively
    assert f"nested more than {yamlsafe.MAX_DEPTH} levels" in train_fails(capsys, str(config))
    flow = tmp_path / "deep.json"  # JSON is YAML: the same for a config written as JSON
    flow.write_text('{"name": ' + '{"a": ' * 100 + "1" + "}" * 100 + "}")
    assert "nested more than" in train_fails(capsys, str(flow))


def test_an_integer_past_pythons_digit_limit_is_refused(tmp_path, capsys):
    config = tmp_path / "big.yaml"
    config.write_text("max_iters: " + "1" * 5000 + "\n")
    assert "an integer of 5000 digits" in train_fails(capsys, str(config))
    # an override: read as text, then refused by the schema (never a ValueError)
    assert "outside the range of a 64-bit integer" in train_fails(capsys, "quickstart", "max_iters=" + "9" * 5000)


def test_a_long_value_is_cut_in_the_error(capsys):
    err = train_fails(capsys, "quickstart", "seed=" + "x" * 5000)
    assert "'seed' must be int" in err and "... (5002 characters)" in err
    err = train_fails(capsys, "quickstart", "k" * 5000 + "=1")
    assert "unknown config key" in err and "k" * 101 not in err
    err = train_fails(capsys, "quickstart", "tokenizer=" + "c" * 5000)
    assert "'tokenizer' must be one of" in err


def test_a_config_file_over_the_size_limit_is_refused(tmp_path):
    config = tmp_path / "huge.yaml"
    config.write_text("# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(ConfigError, match="at most"):
        load_yaml(config)


def test_every_preset_reads_as_plain_yaml_does():
    for name in presets.names():
        text = presets.resolve(name).read_text(encoding="utf-8")
        assert yamlsafe.safe_load(text) == yaml.safe_load(text), name


def test_json_rows_nested_or_with_long_integers_are_bad_json(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    for text in (deep, "1" * 5000):
        with pytest.raises(json.JSONDecodeError):
            jsonsafe.loads(text)
    assert jsonsafe.loads('{"a": [1, 2]}') == {"a": [1, 2]}
    rows = tmp_path / "pairs.jsonl"
    rows.write_text(f'{{"source": {deep}, "target": "x"}}\n' * 3)
    with pytest.raises(DataError, match=r"pairs.jsonl:1: not valid JSON \(nested deeper"):
        read_pair_file(rows)
    rows.write_text(f'{{"source": "a", "target": {"7" * 5000}}}\n' * 3)
    with pytest.raises(DataError, match="an integer of more than"):
        read_pair_file(rows)
