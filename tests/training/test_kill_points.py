"""kill -9 through the command line at every named window (core/killpoints.py), then ``attnlab resume``:
the run ends bit-identical to an uninterrupted one, never at a dead end, and best/ is never lost.
benchmarks/kill_trials.py runs 30 such trials (every window at several passes, and random moments)."""

from __future__ import annotations

import pytest

from attnlab.core.killpoints import KILL_POINTS
from tests.helpers import write_corpus
from tests.kill_trials import reference, trial

# four windows, each at the pass where a kill used to lose something: the first checkpoint write (a dead
# end), the last checkpoint renamed in before best/ and the top level caught up (resume found nothing to
# do and left them a step behind), a best/ swap (the first has no old best/ to move aside), a half-renamed
# top level. benchmarks/kill_trials.py covers every window of KILL_POINTS at three passes.
PASSES = {"checkpoint.writing": 1, "checkpoint.renamed": 12, "best.swap": 1, "mirror.renaming": 7}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    corpus, preset = write_corpus(root / "corpus.txt"), root / "defaults.yaml"
    preset.write_text("{}\n")
    return corpus, root / "runs", preset, reference(corpus, root / "runs", preset, in_process=True)


def test_the_windows_are_named_kill_points():
    assert set(PASSES) <= set(KILL_POINTS)


@pytest.mark.parametrize("point", sorted(PASSES))
def test_killed_at_a_named_window_resumes_bit_identically(setup, point):
    corpus, out, preset, ref = setup
    result = trial(corpus, out, preset, ref, name=point.replace(".", "-"), kill_at=f"{point}:{PASSES[point]}",
                   resume_in_process=True)  # the kill is of a real process; the resume reads what it left
    assert result["killed"], f"the run never reached {point}"
    assert not result["dead_end"], result["resume_error"]
    assert result["identical"] and result["best_kept"], result


def test_a_train_killed_before_it_wrote_anything_is_started_again(tmp_path, capsys):
    """Nothing to resume (no config.yaml, no checkpoints/): resume says to run the train command again."""
    from attnlab.cli import main

    (tmp_path / "runs" / "early").mkdir(parents=True)
    assert main(["resume", str(tmp_path / "runs" / "early")]) == 2
    err = capsys.readouterr().err
    assert "nothing of a run was saved there, so run the train command again" in err and err.count("\n") == 1
