"""The operating system's refusals a user can cause (a name too long, no permission, a full disk, ulimit -f, a
read-only file system, a file in place of a folder, a link loop) are one line naming the path and what to do, exit 2;
and an out_dir that is not UTF-8 is refused before training, not written into a run that can never be loaded."""

from __future__ import annotations

import errno
import os
import resource

import pytest

from attnlab.cli import main
from attnlab.core.oserrors import ADVICE, describe, is_user_error
from tests.helpers import tiny_overrides, write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("os-errors") / "corpus.txt")


def train(corpus, out_dir, **extra) -> int:
    overrides = tiny_overrides(corpus, out_dir, name="r", max_iters=2, eval_interval=2, mfu="false", **extra)
    return main(["train", "configs/shakespeare-char.yaml", *overrides])


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnlab: error: ") and len(err) < 600, err[:700]
    assert "Error:" not in err and "--debug" not in err  # no exception name
    return err


@pytest.mark.parametrize("code", [errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EFBIG,
                                  errno.EROFS, errno.ENOTDIR, errno.ELOOP])
def test_each_error_is_described_with_its_path_and_what_to_do(code):
    err = OSError(code, os.strerror(code), "/data/runs/" + "x" * 500)
    assert is_user_error(err)
    text = describe(err)
    assert text.startswith("/data/runs/xxx") and "(511 characters)" in text and "\n" not in text
    assert text.endswith(ADVICE[code][1]) and len(text) < 400
    assert describe(OSError(code, os.strerror(code))) == "; ".join(ADVICE[code])  # no path: what and what to do
    rename = describe(OSError(code, os.strerror(code), b"a\xff", None, "b"))  # bytes not UTF-8: shown escaped
    assert rename.startswith("a\\xff -> b: ")


def test_an_error_from_a_command_is_one_line_and_exit_2(corpus, tmp_path, capsys, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "runs" / "r" / "model.safetensors"))

    monkeypatch.setattr("attnlab.training.trainer.Trainer.train", full)
    assert train(corpus, tmp_path / "runs") == 2
    err = one_line(capsys)
    assert "model.safetensors: no space left on the device; free some space" in err


def test_a_name_too_long(corpus, tmp_path, capsys):
    assert train(corpus, tmp_path / ("o" * 300)) == 2  # refused by the config check, before the data is read
    assert "'out_dir' holds a folder name of 300 bytes" in one_line(capsys)
    assert main(["train", "configs/shakespeare-char.yaml", f"data={tmp_path / ('d' * 300)}",
                 f"out_dir={tmp_path / 'runs'}"]) == 2  # the system's ENAMETOOLONG, mapped by the handler
    assert "a name in the path is too long" in one_line(capsys)
    assert main(["sample", str(tmp_path / ("r" * 300))]) == 2
    assert "a name in the path is too long" in one_line(capsys)


def test_a_file_size_limit(corpus, tmp_path, capsys):
    """``ulimit -f``: a write past it fails with EFBIG (Python ignores SIGXFSZ), here when the first checkpoint's
    model is saved (by safetensors, whose I/O errors are messages, not OSErrors)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        code = train(corpus, tmp_path / "runs")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 2
    assert "checkpoints/step-0000002 (File too large); the previous checkpoint is kept" in one_line(capsys)


def test_a_read_only_folder(corpus, tmp_path):
    """In a process of its own, where permissions bind it (``as_unprivileged``: root too)."""
    import subprocess
    import sys

    from tests.helpers import as_unprivileged

    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    overrides = tiny_overrides(corpus, folder / "runs", name="r", max_iters=2, eval_interval=2, mfu="false")
    argv = as_unprivileged([sys.executable, "-m", "attnlab.cli", "train", "configs/shakespeare-char.yaml", *overrides])
    if argv is None:
        pytest.skip("root without setpriv writes in any folder")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    finally:
        folder.chmod(0o700)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot write in out_dir" in done.stderr and "Error:" not in done.stderr
    assert not (folder / "runs").exists()


def test_an_out_dir_that_is_not_utf8_is_refused(corpus, tmp_path, capsys):
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/runs-\xff")  # as the command line hands such a name over
    assert train(corpus, out) == 2
    assert "runs-\\xff" in (line := one_line(capsys)) and "is not valid UTF-8" in line  # the command line's check
    assert not os.path.exists(os.fsencode(str(tmp_path)) + b"/runs-\xff")
    from attnlab.core.errors import ConfigError
    from attnlab.training.runs import load_train_config

    with pytest.raises(ConfigError, match="'out_dir' holds bytes that are not UTF-8 text"):  # the config's, for Python
        load_train_config(None, [f"out_dir={out}"])


def test_an_io_error_of_a_library_in_rust_is_mapped(corpus, tmp_path, capsys, monkeypatch):
    """safetensors and tokenizers report an I/O error as a message ending "(os error N)"."""
    from attnlab.core.oserrors import as_os_error

    message = "Error while serializing: I/O error: No space left on device (os error 28)"
    err = as_os_error(RuntimeError(message), tmp_path / "model.safetensors")
    assert err.errno == errno.ENOSPC and err.filename == str(tmp_path / "model.safetensors")
    assert as_os_error(RuntimeError("shape mismatch")) is None

    def full(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr("attnlab.training.trainer.Trainer.train", full)
    assert train(corpus, tmp_path / "runs") == 2
    assert one_line(capsys) == "attnlab: error: no space left on the device; free some space, or choose a folder on " \
                               "another disk\n"
