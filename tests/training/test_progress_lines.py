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


def test_a_100_step_run_piped_to_a_file_has_no_carriage_return(tmp_path):
    """The real process, its stdout and stderr redirected to a file (progress=true, the default)."""
    import subprocess
    import sys

    corpus = write_corpus(tmp_path / "corpus.txt")
    overrides = [o for o in tiny_overrides(corpus, tmp_path / "runs", name="file", max_iters=100, eval_interval=50,
                                           n_layer=1, d_model=16) if not o.startswith("progress=")]
    log = tmp_path / "train.log"
    with open(log, "wb") as f:
        subprocess.run([sys.executable, "-m", "attnlab.cli", "train", "configs/shakespeare-char.yaml", *overrides],
                       stdout=f, stderr=subprocess.STDOUT, check=True)
    text = log.read_bytes()
    assert b"\r" not in text and text.count(b": train loss") == 100 // 5 + 2  # 20 log lines, 2 evaluations
