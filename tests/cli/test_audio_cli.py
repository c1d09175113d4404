"""Speech through the CLI: write a spoken-word folder, train the transformer and the LSTM presets on it, predict
new clips, draw the attention over time, and refuse what does not fit in one line."""

from __future__ import annotations

import csv
import json

import pytest

from attnlab.cli import main

pytest.importorskip("librosa")
TINY = ["max_iters=4", "eval_interval=4", "log_interval=2", "batch_size=8", "progress=false", "warmup_iters=1"]


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    root = tmp_path_factory.mktemp("speech")
    assert main(["data", "spoken-words", "--out", str(root / "sw"), "--n", "40", "--seed", "1"]) == 0
    return root


@pytest.mark.parametrize("preset", ["speech-words", "lstm-words"])
def test_both_presets_train_on_a_wav_folder_and_predict_new_clips(words, preset, capsys):
    runs = words / "runs"
    assert main(["train", preset, f"data={words / 'sw'}", f"out_dir={runs}", f"name={preset}", *TINY,
                 "model.d_model=16"] + (["model.d_ff=32", "model.n_layer=1"] if preset == "speech-words" else [])) == 0
    run = runs / preset
    saved = json.loads((run / "inputs.json").read_text())
    assert saved["audio"] == {"seconds": 1.0, "n_mels": 40} and len(saved["classes"]) == 10
    scores = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").exists() else None
    assert scores is None or isinstance(scores, (dict, list))
    out = words / f"{preset}.csv"
    assert main(["predict", str(run), "--data", str(words / "sw" / "test"), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 10 and {r["prediction"] for r in rows} <= set(saved["classes"])
    assert all(0 < float(r["probability"]) <= 1 for r in rows) and rows[0]["input"].endswith(".wav")
    capsys.readouterr()
    assert main(["predict", str(run), "--data", str(words / "sw" / "clips.jsonl"), "--out", str(words / "x.csv")]) == 2
    assert "trained on audio" in capsys.readouterr().err


def test_inspect_audio_draws_the_attention_over_time_and_refuses_a_recurrent_run(words, capsys):
    run = words / "runs" / "speech-words"
    if not run.exists():
        pytest.skip("needs the speech-words run of the test above")
    clip = next((words / "sw" / "test").rglob("*.wav"))
    png = words / "aot.png"
    assert main(["inspect", str(run), "--audio", str(clip), "--out", str(png)]) == 0
    assert png.stat().st_size > 10_000 and "rollout peaks at" in capsys.readouterr().out
    assert main(["inspect", str(words / "runs" / "lstm-words"), "--audio", str(clip)]) == 2
    assert "encoder run with pooling=cls" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["data", "spoken-words", "--n", "5"], ">= 20"),
    (["train", "speech-words", "continuous.n_mels=4"], "n_mels"),
    (["train", "lstm-words", "model.cell=transformer"], "cell"),
    (["train", "lstm-words", "data=generated:set-interaction", "model.head=regression"], "feature sequences only"),
])
def test_bad_speech_inputs_are_one_line(words, tmp_path, argv, message, capsys):
    argv = [*argv, "--out", str(tmp_path / "new")] if argv[0] == "data" else [*argv, f"out_dir={tmp_path / 'runs'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
