"""Output a log file can hold: piped (not a terminal), training writes no progress bar and no carriage
return, one plain line per log interval instead, with progress=true as with progress=false."""

from __future__ import annotations

import re

import pytest

from attnlab.cli import main
from tests.helpers import tiny_overrides, write_corpus


@pytest.mark.parametrize("progress", ["true", "false"])
def test_piped_training_writes_plain_lines_without_carriage_returns(tmp_path, capsys, progress):
    corpus = write_corpus(tmp_path / "corpus.txt")
    overrides = tiny_overrides(corpus, tmp_path / "runs", name="piped", max_iters=10, log_interval=2, eval_interval=10)
    overrides = [o for o in overrides if not o.startswith("progress=")] + [f"progress={progress}"]
    preset = tmp_path / "defaults.yaml"
    preset.write_text("{}\n")
    assert main(["train", str(preset), *overrides]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    record = re.compile(r"step \d+: train loss [\d.]+, lr [\d.e-]+, [\d,]+ \w+/s")
    lines = [line for line in out.splitlines() if record.match(line)]
    assert [int(line.split()[1].rstrip(":")) for line in lines] == [2, 4, 6, 8, 10]
