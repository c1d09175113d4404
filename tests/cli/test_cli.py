"""The command line: a small run end to end, and one-line errors (exit 2, no traceback)."""

import pytest

from attnlab.cli import main
from tests.helpers import tiny_overrides, write_corpus


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    corpus = write_corpus(tmp / "corpus.txt")
    code = main(["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp / "runs", name="r")])
    assert code == 0
    return tmp / "runs" / "r", corpus


def _one_line_error(capsys, code, expected_code=2):
    err = capsys.readouterr().err.strip()
    assert code == expected_code
    assert len(err.splitlines()) == 1, err
    assert err.startswith("attnlab: error:")
    assert "Traceback" not in err
    return err


def test_train_sample_eval(trained_run, capsys):
    run, _ = trained_run
    assert (run / "loss.png").is_file() and (run / "attnlab_model.safetensors").is_file()
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", "The ", "--max-new-tokens", "30", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The ") and len(out) >= 34
    assert main(["sample", str(run), "--prompt", "The ", "--max-new-tokens", "30", "--seed", "1"]) == 0
    assert capsys.readouterr().out == out  # the same seed gives the same text
    assert main(["eval", str(run), "--eval-iters", "3", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "val loss" in out and "perplexity" in out


def test_resume_command_continues_a_run(trained_run, capsys):
    run, _ = trained_run
    assert main(["resume", str(run), "max_iters=30"]) == 0
    out = capsys.readouterr().out
    assert "resumed" in out and "step 30" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "configs/shakespeare-char.yaml", "n_layr=2"],
         "unknown config key 'n_layr'; did you mean 'n_layer'"),
        (["train", "configs/shakespeare-char.yaml", "max_iters=lots"], "'max_iters' must be int"),
        (["train", "configs/shakespeare-char.yaml", "data=/no/such/file.txt"],
         "data file not found: /no/such/file.txt"),
        (["train", "configs/no-such-preset.yaml"], "no config file or preset named"),
        (["train", "shakespeare-chr"], "did you mean 'shakespeare-char'"),
        (["train", "configs/shakespeare-char.yaml", "device=gpu"], "'device' must be auto, cpu, cuda, cuda:N or mps"),
        (["sample", "/no/such/run"], "run folder not found"),
        (["eval", "/no/such/run"], "not a run folder"),
    ],
)
def test_bad_input_gives_one_line(argv, message, capsys):
    err = _one_line_error(capsys, main(argv))
    assert message in err


def test_prompt_outside_char_vocabulary(trained_run, capsys):
    run, _ = trained_run
    err = _one_line_error(capsys, main(["sample", str(run), "--prompt", "héllo €"]))
    assert "not in the tokenizer's vocabulary" in err and "'é'" in err


def test_sample_device_option(trained_run, capsys):
    run, _ = trained_run
    assert main(["sample", str(run), "--prompt", "The ", "--max-new-tokens", "5", "--device", "cpu"]) == 0
    err = _one_line_error(capsys, main(["sample", str(run), "--device", "gpu0"]))
    assert "device must be auto, cpu, cuda, cuda:N or mps, got 'gpu0'" in err


def test_prompt_longer_than_context_is_cropped_with_a_notice(trained_run, capsys):
    run, _ = trained_run
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", "the " * 20, "--max-new-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("the " * 20) and "generating from its last 16" in err


def test_sample_stops_at_a_stop_string_and_runs_beam_search(trained_run, capsys):
    run, _ = trained_run
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", "The ", "--temperature", "0", "--stop", "e", "--stop", " ",
                 "--max-new-tokens", "50"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    assert out[len("The "):][-1] in "e " and len(out) < len("The ") + 50
    assert main(["sample", str(run), "--prompt", "The ", "--num-beams", "3", "--max-new-tokens", "8",
                 "--repetition-penalty", "1.2"]) == 0
    assert capsys.readouterr().out.startswith("The ")
    assert main(["sample", str(run), "--stop", ""]) == 2  # "" is in every text: one line, not an empty answer
    assert capsys.readouterr().err.count("\n") == 1


def test_bad_sampling_options(trained_run, capsys):
    run, _ = trained_run
    err = _one_line_error(capsys, main(["sample", str(run), "--top-p", "1.5"]))
    assert "top_p must be in (0, 1]" in err


def test_empty_and_binary_data_files(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    for path in (empty, binary):
        err = _one_line_error(capsys, main(["train", "configs/shakespeare-char.yaml", f"data={path}",
                                            f"out_dir={tmp_path}"]))
        assert str(path) in err


def test_debug_flag_shows_the_traceback():
    with pytest.raises(Exception, match="unknown config key"):
        main(["--debug", "train", "configs/shakespeare-char.yaml", "n_layr=2"])


def test_data_shorter_than_one_block(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be.\n" * 3)
    err = _one_line_error(capsys, main(["train", "configs/shakespeare-char.yaml", f"data={short}",
                                        f"out_dir={tmp_path}"]))
    assert "fewer than one block" in err and str(short) in err


def test_profile_flag_writes_a_trace(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt")
    argv = ["train", "configs/shakespeare-char.yaml",
            *tiny_overrides(corpus, tmp_path / "runs", name="p", max_iters=16), "--profile"]
    assert main(argv) == 0
    profile = tmp_path / "runs" / "p" / "profile"
    assert (profile / "trace.json").stat().st_size > 1000
    assert "aten::" in (profile / "ops.txt").read_text()
    assert "profile of 10 steps" in capsys.readouterr().out


def test_bench_lists_runs_and_rejects_unknown_names(tmp_path, capsys):
    assert main(["bench", "--list"]) == 0
    listing = capsys.readouterr().out
    for name in ("train_throughput", "attention", "generation_cache", "shakespeare_char"):
        assert name in listing
    err = _one_line_error(capsys, main(["bench", "atention"]))
    assert "did you mean 'attention'" in err
    assert main(["bench", "--list", "attention"]) == 0  # one line: that benchmark's
    assert capsys.readouterr().out.splitlines() == [line for line in listing.splitlines()
                                                    if line.startswith("attention ")]
    assert "unknown benchmark 'atention'" in _one_line_error(capsys, main(["bench", "--list", "atention"]))
    assert "--quick would be passed to a run" in _one_line_error(capsys, main(["bench", "--list", "attention",
                                                                               "--quick"]))
    out = tmp_path / "a.json"
    code = main(["bench", "attention", "--lengths", "128", "--block", "64", "--out", str(out),
                 "--plot", str(tmp_path / "a.png")])
    assert code == 0 and out.is_file()


def test_progress_lines_reach_a_pipe_as_they_are_printed():
    """stdout redirected to a file or a pipe is block-buffered by Python: a long run's progress lines would
    arrive only at its end. The command line switches it to line buffering."""
    import subprocess
    import sys

    code = ("import sys; from attnlab.cli import main; main(['experiment', '--list']); "
            "sys.stderr.write(str(sys.stdout.line_buffering))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stderr.strip().endswith("True"), done.stderr
