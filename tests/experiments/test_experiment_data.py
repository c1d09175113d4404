"""`attnlab experiment NAME --data FILE`: the experiments that train on a text (scaling, moe-vs-dense,
ssm-vs-attention) take it from a given file instead of ../shared/data, name it in their results and reports,
and the others refuse the option; all of it before any work."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.core.errors import DataError
from tests.helpers import needs_shakespeare


@pytest.fixture
def text_file(tmp_path) -> Path:
    rng = random.Random(0)
    path = tmp_path / "corpus.txt"
    path.write_text("".join(rng.choice(string.ascii_lowercase + " \n") for _ in range(20_000)), encoding="utf-8")
    return path


def test_data_is_refused_where_it_means_nothing_or_is_missing(tmp_path, capsys, monkeypatch, text_file):
    from attnlab.experiments import scaling

    monkeypatch.setattr(scaling, "fit", lambda *a, **k: pytest.fail("a model was trained"))
    assert main(["experiment", "hand-trace", "--data", str(text_file), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'hand-trace' makes its own data; --data applies to" in err, err
    assert all(name in err for name in ("moe-vs-dense", "ssm-vs-attention", "scaling"))
    assert main(["experiment", "scaling", "--data", str(tmp_path / "no-such.txt"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip().endswith("no-such.txt is not a file")
    (tmp_path / "binary").write_bytes(bytes(range(256)))
    (tmp_path / "short.txt").write_text("hello world\n")
    for path, said in (("binary", "is not UTF-8 text (byte 128 cannot be read)"), ("short.txt", "has 12 characters")):
        assert main(["experiment", "scaling", "--quick", "--in-process", "--data", str(tmp_path / path),
                     "--out", str(tmp_path / "o")]) == 2  # were a UnicodeDecodeError and a RuntimeError, exit 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
    assert main(["experiment", "scaling", "--data", "", "--out", str(tmp_path / "o")]) == 2
    assert "--data is empty" in capsys.readouterr().err
    assert main(["experiment", "--list", "--data", str(text_file)]) == 2
    assert "--data only apply to a run" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_given_text_reaches_the_experiment(tmp_path, capsys, monkeypatch, text_file):
    from attnlab.experiments import scaling

    seen = []

    def fake_run(out, quick, given, device="cpu"):
        seen.append(given)
        return {"claim_held": True, "verdict": "held", "wall_time_s": 0.0}

    monkeypatch.setattr(scaling, "_run", fake_run)
    assert main(["experiment", "scaling", "--quick", "--in-process", "--data", str(text_file),
                 "--out", str(tmp_path / "o")]) == 0
    assert seen == [text_file]


def test_text_of_names_the_text_it_read(text_file):
    from attnlab.experiments.scaling import char_data, text_of

    text, about = text_of(text_file, 32)
    assert text == text_file.read_text(encoding="utf-8")
    assert about["file"] == str(text_file) and about["chars"] == 20_000 and len(about["sha256"]) == 16
    splits, vocab = char_data(32, text)
    assert vocab == 28 and sum(len(splits[k]) for k in ("train", "val", "test")) == 20_000
    with pytest.raises(DataError, match="text not found"):
        text_of(text_file.with_name("missing.txt"), 32)
    with pytest.raises(DataError, match="has 20,000 characters; at context 2000 the experiment needs at least 20,030"):
        text_of(text_file, 2000)


@needs_shakespeare
def test_moe_vs_dense_keeps_runs_on_a_given_text_apart(tmp_path, monkeypatch, text_file):
    """Its kept runs are keyed by the settings; with --data by the text's hash too, so that a --resume on
    another text is refused (``partial.finished_parts``) instead of mixing runs of two texts."""
    from attnlab.experiments import moe_vs_dense
    from attnlab.experiments.scaling import text_of

    keys = []

    def stop(out, name, settings, *rest, **kw):
        keys.append(settings)
        raise KeyboardInterrupt

    monkeypatch.setattr(moe_vs_dense, "run_parts", stop)
    for data in (None, text_file):
        with pytest.raises(KeyboardInterrupt):
            moe_vs_dense.run(tmp_path, quick=True, data=data)
    assert keys[0] == moe_vs_dense.QUICK  # as before --data: a resume of an earlier default run still matches
    assert keys[1] == {**moe_vs_dense.QUICK, "text_sha256": text_of(text_file, 32)[1]["sha256"]}
