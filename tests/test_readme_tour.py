"""The README's tour runs as written from a fresh clone: every command of the fenced block marked ``<!-- tour -->``,
in order, in an empty folder with no ``../shared`` beside it (the built-in corpora and generated data only), each
``attnlab train`` with a short budget added (the only change), ``runs/latest`` standing for each new run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from attnlab.cli import main

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- tour -->"

# per preset: the overrides that make its training a few steps long (a preset the tour trains without a line here
# fails the test, so the tour cannot grow slow unnoticed)
SHORT = ["max_iters=4", "eval_interval=4", "eval_iters=1", "log_interval=2", "warmup_iters=1", "mfu=false",
         "progress=false"]
BUDGETS = {
    "shakespeare-char": [*SHORT, "sample_tokens=20"],
    "vit-micrographs": [*SHORT, "images.n_generated=120", "batch_size=16"],
    "bert-solubility": [*SHORT, "batch_size=8"],
}


def tour_commands(readme: str) -> list[str]:
    """The command lines of the fenced block right after the tour's mark (comments and blank lines dropped)."""
    after = readme.split(MARK, 1)[1]
    block = re.match(r"\s*```bash\n(.*?)\n```", after, re.S)
    assert block, f"no ```bash block right after {MARK} in README.md"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def with_budget(argv: list[str]) -> list[str]:
    if argv[0] != "train":
        return argv
    assert argv[1] in BUDGETS, f"the tour trains {argv[1]}: give it a short budget in BUDGETS"
    return [*argv, *BUDGETS[argv[1]]]


def test_the_tour_is_marked_and_uses_no_shared_data():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count(MARK) == 1
    commands = tour_commands(readme)
    assert len(commands) >= 8 and all(line.startswith("attnlab ") for line in commands)
    assert not any("../shared" in line or "*" in line for line in commands)  # no shared data, no globs


def test_every_tour_command_runs_as_written(tmp_path, monkeypatch, capsys):
    commands = tour_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    fresh = tmp_path / "clone"
    fresh.mkdir()
    monkeypatch.chdir(fresh)  # runs/, inspect/, micrographs/ ... are made here; nothing of the repository is read
    assert not (fresh.parent / "shared").exists()
    for line in commands:
        argv = with_budget(shlex.split(line, comments=True)[1:])
        code = main(argv)
        out = capsys.readouterr()
        if code != 0:
            pytest.fail(f"`{line}` exited {code}:\n{out.err[-2000:]}")
    assert (fresh / "my-model-hf" / "config.json").is_file()
    assert (fresh / "saliency.png").is_file() and (fresh / "defects.csv").is_file()
    assert len(list((fresh / "runs").iterdir())) == 3  # the three trained runs, each read back as runs/latest
