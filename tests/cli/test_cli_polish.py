"""The command line's own surface: --version, the defaults in every --help, shell completion scripts, and a missing
optional extra refused before anything is written."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

import pytest

from attnlab.cli import main
from attnlab.cli.errors import DefaultsFormatter
from attnlab.cli.parser import build_parser
from attnlab.core.version import __version__
from tests.helpers import train_tiny_run

Parsers = dict[tuple[str, ...], argparse.ArgumentParser]


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Parsers:
    """Every sub-command under ``parser`` by its path: ("train",), ("lens", "logit-lens"), ..."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found |= {(*prefix, name): child, **_commands(child, (*prefix, name))}
    return found


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"attnlab {__version__}\n"


def test_help_shows_defaults_once(capsys):
    assert main(["eval", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--batch-size BATCH_SIZE (default: 32)" in out and "--kernels KERNELS attnlab's C++" in out
    assert "(default: none)" in out
    assert main(["inspect", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default 200)" in out and "(default: 200)" not in out  # a help that says its default keeps its words
    assert "--resize resize an image" in out and "(default: False)" not in out  # a flag shows no default
    assert main(["sample", "--help"]) == 0
    assert "(default: '\\n')" in capsys.readouterr().out  # a newline shown as one, not printed


def test_every_sub_parser_shows_defaults():
    commands = _commands(build_parser())
    assert "(default: zero)" in commands["lens", "ablate"].format_help()  # a sub-command's sub-command
    assert "(default: 8000)" in commands["explore",].format_help()
    assert all(isinstance(p.formatter_class(p.prog), DefaultsFormatter) for p in commands.values())


def test_bash_completion_names_every_command_and_completes(tmp_path, capsys):
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    for command in _commands(build_parser()):
        assert command[-1] in script, command
    assert "--version" in script and "--batch-size" in script
    if shutil.which("bash") is None:
        pytest.skip("no bash to run the script in")
    (tmp_path / "attnlab.bash").write_text(script)
    complete = ("source attnlab.bash; COMP_WORDS=({words}); COMP_CWORD={n}; _shtab_attnlab; "
                'printf "%s\\n" "${{COMPREPLY[@]}}"')
    def replies(*words: str) -> list[str]:
        cmd = complete.format(words=" ".join(f"'{w}'" for w in words), n=len(words) - 1)
        proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, text=True, check=True)
        return proc.stdout.split()
    assert replies("attnlab", "pre") == ["predict"]
    assert sorted(replies("attnlab", "lens", "")) == ["ablate", "dla", "logit-lens", "patch", "probe"]
    assert "--batch-size" in replies("attnlab", "eval", "run", "--b")


def test_zsh_completion_and_an_unknown_shell(capsys):
    assert main(["completion", "zsh"]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#compdef attnlab") and "logit-lens" in script and "import-hf" in script
    assert main(["completion", "fish"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "invalid choice: 'fish'" in err


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("polish"), max_iters=2)


@pytest.mark.parametrize("argv, needs", [
    (["--text", "The dog."], "the attribution figure of inspect --text needs captum"),
    (["--text", "The dog.", "--faithfulness", "{out}/f.json"], "inspect --faithfulness needs captum"),
])
def test_inspect_without_captum_writes_nothing(gpt_run, tmp_path, monkeypatch, capsys, argv, needs):
    monkeypatch.setitem(sys.modules, "captum", None)  # `import captum` raises ImportError
    out = tmp_path / "out"
    code = main(["inspect", str(gpt_run), "--out", str(out), *(a.format(out=out) for a in argv)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and needs in err and "attnlab[inspect]" in err, err
    assert not out.exists() or not any(out.iterdir())
