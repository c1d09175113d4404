"""benchmarks/engram_lookup.py: a GPT's forward with and without Engram, timed alternately. A tiny run here: the
table and the JSON it writes (every round of every contender, the lookup alone), and bad arguments refused in one
line before any work. The script runs in this process (``bench_here``)."""

from __future__ import annotations

import json

from tests.helpers import bench_here


def test_times_the_models_with_and_without_engram(tmp_path, capfd):
    argv = ["--rounds", "3", "--batch", "1", "--table-sizes", "31", "101", "--threads", "1"]
    assert bench_here("engram_lookup", *argv, "--results", str(tmp_path)) == 0
    record = json.loads((tmp_path / "engram_lookup.json").read_text())
    rows = {r["model"]: r for r in record["rows"]}
    assert list(rows) == ["no Engram", "Engram, 31 rows a head", "Engram, 101 rows a head"]
    assert all(len(r["forward_s"]) == 3 and r["median_forward_s"] > 0 for r in rows.values())
    assert rows["no Engram"]["lookup_s"] is None and len(rows["Engram, 31 rows a head"]["lookup_s"]) == 3
    assert rows["Engram, 101 rows a head"]["parameters"] - rows["Engram, 31 rows a head"]["parameters"] == \
        2 * 2 * 64 * (101 - 31)  # two layers, two orders of 64 dims a row
    assert "| Engram, 101 rows a head |" in capfd.readouterr().out


def test_bad_arguments_are_refused_in_one_line(tmp_path, capfd):
    for argv in (["--rounds", "1"], ["--table-sizes", "0"], ["--table-sizes", "99999999999"]):
        assert bench_here("engram_lookup", *argv, "--results", str(tmp_path)) == 2
        err = capfd.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "engram_lookup.json").exists()
