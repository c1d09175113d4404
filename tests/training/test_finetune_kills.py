"""kill -9 of ``attnlab finetune`` at every named write window (core/killpoints.py), then ``attnlab resume``: the
run goes on as a fine-tuning (the pre-trained encoder reloaded while no checkpoint is complete), ends with the
uninterrupted fine-tuning's weights byte for byte and writes its finetune.json. Also what resume refuses: an
override that would change what the run is, and a NaN in metrics.jsonl kept past the resume.
benchmarks/kill_trials.py --command finetune runs every window at several passes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from attnlab.cli import main
from attnlab.core.killpoints import KILL_POINTS
from attnlab.models.registry import from_pretrained
from tests.kill_trials import finetune_inputs, finetune_reference, finetune_verdict, launch_finetune

# one pass per window: the first checkpoint write (resume used to train a random encoder and exit 0), the last
# checkpoint renamed in before best/ and the top level caught up, the first best/ swap, a first checkpoint
# staged and half renamed in at the top, the last top level without its manifest, the first prune, and a
# finished fine-tuning without its finetune.json
PASSES = {"checkpoint.writing": 1, "checkpoint.renamed": 6, "best.swap": 1, "mirror.staged": 1,
          "mirror.renaming": 2, "mirror.manifest": 6, "prune": 1, "finetune.report": 1}
AT_ONCE = 4  # killed fine-tunings running together (each a new interpreter: ~3 s of imports)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune-kills")
    pretrained, data = finetune_inputs(root)
    return pretrained, data, root / "runs", *finetune_reference(pretrained, data, root / "runs")


@pytest.fixture(scope="module")
def trials(setup):
    """Every window's trial: the killed fine-tunings in subprocesses, AT_ONCE at a time; each resumed here."""
    pretrained, data, out, ref, _ = setup
    results = {}
    points = sorted(PASSES)
    for first in range(0, len(points), AT_ONCE):
        wave = {p: launch_finetune(pretrained, data, out, p.replace(".", "-"), f"{p}:{PASSES[p]}")
                for p in points[first:first + AT_ONCE]}
        for point, proc in wave.items():
            results[point] = finetune_verdict(out / point.replace(".", "-"), ref, proc.wait(timeout=300),
                                              f"{point}:{PASSES[point]}", resume_in_process=True)
    return results


def test_every_window_of_a_finetune_is_tried(setup):
    """The windows tried are those the uninterrupted fine-tuning passes (each at a pass it reaches), all named."""
    windows = setup[4]
    assert set(PASSES) == set(windows) and set(windows) <= set(KILL_POINTS)
    assert all(PASSES[w] <= windows[w] for w in PASSES), windows


@pytest.mark.parametrize("point", sorted(PASSES))
def test_finetune_killed_at_a_named_window_resumes_bit_identically(trials, point):
    result = trials[point]
    assert result["killed"], f"the fine-tuning never reached {point}"
    assert not result["dead_end"], result["resume_error"]
    assert result["identical"] and result["best_kept"], result
    assert result["report"], "finetune.json missing or not the uninterrupted run's scores"


def test_the_reference_starts_from_the_pretrained_encoder(setup):
    """What the trials compare against is a fine-tuning: its first checkpoint's encoder is the pre-trained one a
    step on (a random encoder lies ~0.1 away), not a fresh model."""
    pretrained, _, _, ref, _ = setup
    first = from_pretrained(ref / "checkpoints" / "best")  # the step-2 best at least: trained from the encoder
    pre = from_pretrained(pretrained).embeddings.tok_emb.weight
    fresh = torch.nn.init.normal_(torch.empty_like(pre), std=0.02)
    assert (first.embeddings.tok_emb.weight - pre).abs().max() < (fresh - pre).abs().max() / 2
    assert json.loads((ref / "finetuned_from.json").read_text()) == {"pretrained": str(pretrained)}


def test_a_finetune_killed_before_its_run_began_says_to_run_it_again(setup, tmp_path, capsys):
    """Only the record of what it fine-tunes was written (no config.yaml): one line naming the command, exit 2."""
    pretrained = setup[0]
    run = tmp_path / "early"
    run.mkdir()
    (run / "finetuned_from.json").write_text(json.dumps({"pretrained": str(pretrained)}))
    assert main(["resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"so run attnlab finetune {pretrained} again" in err and err.count("\n") == 1


def test_a_finetune_refused_for_its_data_leaves_no_folder(setup, tmp_path, capsys):
    """The record is written before the Trainer reads the data; refused there, the folder made for it goes."""
    bad = tmp_path / "bad.csv"
    bad.write_text("text,label\n")
    assert main(["finetune", str(setup[0]), f"data={bad}", f"out_dir={tmp_path / 'runs'}"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("override, named", [
    ("tokenizer=bpe", "tokenizer=bpe cannot change on resume"),
    ("model.n_layer=3", "model.n_layer=3 cannot change on resume"),
    ("n_layer=3", "model.n_layer=3 cannot change on resume"),  # a bare model key is the model's
    ("classify.test_fraction=0.5", "classify.test_fraction=0.5 cannot change on resume"),
    ("seed=5", "seed=5 cannot change on resume"),
    ("name=other", "name= is not an option of resume"),
])
def test_resume_refuses_an_override_that_changes_the_run(setup, tmp_path, capsys, override, named):
    """Refused in one line before any work, config.yaml untouched (tokenizer=bpe used to be ignored and written
    into it)."""
    run = shutil.copytree(setup[3], tmp_path / "run")
    before = (run / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["resume", str(run), override]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1, err
    assert (run / "config.yaml").read_text() == before


def test_resume_keeps_run_settings_and_drops_nan_from_the_metrics(setup, tmp_path, capsys):
    """A run setting may change (threads, an override equal to the run's own value); a NaN that metrics.jsonl
    holds (an earlier version wrote them) is null after the resume, and a line that is no record is dropped."""
    run = shutil.copytree(setup[3], tmp_path / "run")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[0] = lines[0].replace('"train_loss": ', '"train_loss": NaN, "was": ')
    (run / "metrics.jsonl").write_text("\n".join([*lines, '[1, 2]', '{"step": "x"}']) + "\n")
    assert main(["resume", str(run), "threads=1", "task=classify", "max_iters=6"]) == 0
    assert "held-out accuracy" in capsys.readouterr().out  # at its max_iters: the report written again
    text = (run / "metrics.jsonl").read_text()
    records = [json.loads(x, parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl")) for x in text.splitlines()]
    assert records[0]["train_loss"] is None and records[0]["nonfinite"] == {"train_loss": "nan"}
    assert len(records) == len(lines) and all(isinstance(r.get("step"), int) for r in records)


def test_the_run_folder_stays_locked_until_finetune_json_is_written(setup, tmp_path, monkeypatch, capsys):
    """A second writer cannot slip in between the last checkpoint and the report: the lock is still held while
    finetune.json is written, and released after."""
    from attnlab.core.locks import held_here
    from attnlab.training import finetune
    from tests.kill_trials import finetune_args

    seen = []
    report = finetune.finetune_report

    def watched(trainer, *args, **kwargs):
        seen.append(held_here(trainer.run_dir))
        return report(trainer, *args, **kwargs)

    monkeypatch.setattr(finetune, "finetune_report", watched)
    pretrained, data = setup[0], setup[1]
    assert main(finetune_args(pretrained, data, tmp_path / "runs", "held")) == 0
    assert seen == [True] and not held_here(tmp_path / "runs" / "held")
    assert (tmp_path / "runs" / "held" / "finetune.json").is_file()
    capsys.readouterr()
