"""experiments/partial.py: parts kept as they finish, taken back on resume only from the same experiment and
settings, and a wall time that adds the sittings."""

from __future__ import annotations

import json

import pytest

from attnlab.core.errors import ConfigError
from attnlab.experiments.partial import FILE, refuse_to_overwrite, run_parts


def test_parts_are_kept_and_resumed(tmp_path):
    calls: list[str] = []

    def one(part: str) -> dict:
        calls.append(part)
        return {"value": (len(part), 1.5), 2.0: "float key"}

    parts, spent, _ = run_parts(tmp_path, "x", {"a": (1, 2)}, False, ["p"], one, resume=False)
    assert parts == {"p": {"value": [1, 1.5], "2.0": "float key"}}  # as JSON reads it back
    kept = json.loads((tmp_path / FILE).read_text())
    kept["wall_time_s"]["p"] = 100.0  # an earlier sitting that took 100 s
    (tmp_path / FILE).write_text(json.dumps(kept))
    calls.clear()
    parts, spent, origin = run_parts(tmp_path, "x", {"a": (1, 2)}, False, ["p", "qq"], one, resume=True)
    assert calls == ["qq"] and list(parts) == ["p", "qq"] and spent["p"] == 100.0
    import time

    assert time.perf_counter() - origin >= 100.0
    # without --resume everything runs again
    calls.clear()
    run_parts(tmp_path, "x", {"a": (1, 2)}, False, ["p"], one, resume=False)
    assert calls == ["p"]


@pytest.mark.parametrize("change", ["experiment", "settings", "quick", "corrupt"])
def test_resume_refuses_another_record_before_any_work(tmp_path, change):
    run_parts(tmp_path, "x", {"a": 1}, False, ["p"], lambda part: 1, resume=False)
    if change == "corrupt":
        (tmp_path / FILE).write_text("{not json")
    name, settings, quick = ("y" if change == "experiment" else "x", {"a": 2} if change == "settings" else {"a": 1},
                             change == "quick")
    calls: list[str] = []
    with pytest.raises(ConfigError, match="cannot resume"):
        run_parts(tmp_path, name, settings, quick, ["p", "q"], lambda part: calls.append(part), resume=True)
    assert calls == []


class Cut(Exception):
    """A sitting cut off in the middle of a part."""


def _cut_after_first(part: str, *keep) -> int:
    if part != "p":
        raise Cut
    return 1


def test_a_fresh_run_refuses_to_throw_away_an_unfinished_one(tmp_path):
    """Forgetting --resume, adding --quick or changing a setting must not cost hours: an unfinished run (parts kept
    in partial.json, or single runs kept) is refused before any work and left as it was, whatever the new run's
    settings; a finished one runs afresh."""
    from attnlab.experiments.partial import runs_folder

    with pytest.raises(Cut):
        run_parts(tmp_path, "x", {"a": 1}, False, ["p", "q"], _cut_after_first, resume=False)  # p of p, q kept
    before = (tmp_path / FILE).read_text()
    calls: list[str] = []
    for settings, quick in (({"a": 1}, False), ({"a": 2}, False), ({"a": 1}, True)):
        with pytest.raises(ConfigError, match=r"unfinished run of x \(1 of 2 parts kept.*--resume"):
            run_parts(tmp_path, "x", settings, quick, ["p", "q"], lambda part: calls.append(part), resume=False)
    assert calls == [] and (tmp_path / FILE).read_text() == before
    run_parts(tmp_path, "x", {"a": 1}, False, ["p", "q"], lambda part: calls.append(part), resume=True)
    assert calls == ["q"]
    run_parts(tmp_path, "x", {"a": 2}, False, ["p", "q"], lambda part: calls.append(part), resume=False)
    assert calls == ["q", "p", "q"]  # finished: it may be run again, with other settings too

    fresh = tmp_path / "cut"  # a first sitting cut off before any part finished: only single runs kept
    folder = runs_folder(fresh, "x", {"a": 1}, False, "p")
    folder.mkdir(parents=True)
    (folder / "arm_0.001_0.json").write_text(json.dumps({"result": {}, "finished_at": 0.0}))
    for name in ("x", "y"):  # a fresh run forgets every kept run, so another experiment's is refused too
        with pytest.raises(ConfigError, match=r"holds 1 single runs of an unfinished experiment"):
            run_parts(fresh, name, {"a": 1}, False, ["p"], lambda part, keep: 1, resume=False, keep_runs=True)
    assert (folder / "arm_0.001_0.json").exists()
    run_parts(fresh, "x", {"a": 1}, False, ["p"], lambda part, keep: 1, resume=True, keep_runs=True)
    run_parts(fresh, "x", {"a": 1}, False, ["p"], lambda part, keep: 1, resume=False, keep_runs=True)  # finished


def test_a_quick_run_or_another_experiment_never_overwrites_a_full_run(tmp_path):
    from attnlab.experiments.partial import refuse_to_overwrite

    run_parts(tmp_path, "x", {"a": 1}, False, ["p"], lambda part: 1, resume=False)  # a finished full run
    (tmp_path / "results.json").write_text(json.dumps({"experiment": "x", "quick": False}))
    refuse_to_overwrite(tmp_path, "x", quick=False)  # the same experiment, full: may run again
    with pytest.raises(ConfigError, match=r"holds a full run of x \(partial.json\); a --quick run would overwrite"):
        refuse_to_overwrite(tmp_path, "x", quick=True)
    with pytest.raises(ConfigError, match=r"holds the partial.json of another experiment \('x'\)"):
        refuse_to_overwrite(tmp_path, "y", quick=False)
    (tmp_path / FILE).unlink()  # an experiment without parts: its results.json alone
    with pytest.raises(ConfigError, match=r"holds a full run of x \(results.json\)"):
        refuse_to_overwrite(tmp_path, "x", quick=True)
    with pytest.raises(ConfigError, match=r"holds the results.json of another experiment"):
        refuse_to_overwrite(tmp_path, "y", quick=True)
    (tmp_path / "results.json").write_text(json.dumps({"accuracy": 0.9}))  # not an experiment's: kept too
    with pytest.raises(ConfigError, match=r"holds the results.json of something else; choose another --out"):
        refuse_to_overwrite(tmp_path, "y", quick=False)
    (tmp_path / "results.json").write_text("{not json")  # unreadable: not a record, so not this run's to replace
    with pytest.raises(ConfigError, match=r"holds files that are not a run of y \(results.json\)"):
        refuse_to_overwrite(tmp_path, "y", quick=True)


def test_a_partial_record_without_its_part_names_is_finished_only_beside_its_results(tmp_path):
    """Records written before partial.json named its parts (chomsky's kept tasks): unfinished unless the run's
    results.json lies beside it."""
    from attnlab.experiments.partial import refuse_to_overwrite

    legacy = {"experiment": "x", "quick": False, "settings": {}, "parts": {"p": 1}, "wall_time_s": {"p": 9.0}}
    (tmp_path / FILE).write_text(json.dumps(legacy))
    with pytest.raises(ConfigError, match=r"unfinished run of x \(1 parts kept in partial.json, 0 single runs"):
        refuse_to_overwrite(tmp_path, "x", quick=False)
    (tmp_path / "results.json").write_text(json.dumps({"experiment": "x", "quick": False}))
    refuse_to_overwrite(tmp_path, "x", quick=False)


def test_a_part_cut_off_mid_way_counts_the_earlier_sittings_kept_work(tmp_path, monkeypatch):
    import time

    from attnlab.experiments import partial
    from attnlab.experiments.study import write_run

    def run(seed: int, lr: float, where=None) -> None:  # a run of arm "a" finishes and is kept (study.run_arms)
        write_run(where or folder, "a", lr, seed, {"x": seed})

    real_runs_folder = partial.runs_folder
    folder = tmp_path / partial.RUNS / "p-0123"
    clock = iter([1000.0, 1030.0, 1050.0, 2000.0, 2100.0])  # sitting 1 starts; runs end; sitting 2 starts; ...
    monkeypatch.setattr(partial.time, "time", lambda: next(clock))
    assert partial.begin_sitting(folder) == 0.0  # sitting 1 at 1000
    run(0, 0.1)  # kept at 1030
    run(1, 0.1)  # kept at 1050; sitting 1 is then cut off (what it had under way is lost)
    assert partial.begin_sitting(folder) == 50.0  # sitting 2 at 2000: sitting 1 kept 50 s of work
    run(2, 0.1)  # kept at 2100
    monkeypatch.setattr(partial.time, "time", lambda: 3000.0)
    assert partial.begin_sitting(folder) == 150.0  # 50 + 100
    # run_parts adds that time to the part's and to the total wall time, and forgets the runs once all are kept
    monkeypatch.setattr(partial.time, "time", time.time)
    monkeypatch.setattr(partial, "runs_folder", lambda *args: folder)
    calls = []
    _, spent, origin = partial.run_parts(tmp_path, "x", {}, False, ["p"],
                                         lambda p, where: calls.append((p, where)) or 1, resume=True, keep_runs=True)
    assert calls == [("p", folder)] and spent["p"] >= 150.0 and time.perf_counter() - origin >= 150.0
    assert not (tmp_path / partial.RUNS).exists() and (tmp_path / partial.FILE).exists()
    # a fresh run would forget every kept run, so it is refused while any is kept, whatever made it
    # (test_a_fresh_run_refuses_to_throw_away_an_unfinished_one)
    monkeypatch.setattr(partial, "runs_folder", real_runs_folder)
    other = real_runs_folder(tmp_path, "x", {}, False, "p")
    run(0, 0.1, other)
    with pytest.raises(ConfigError, match="single runs of an unfinished experiment"):
        partial.run_parts(tmp_path, "x", {}, False, ["p"], lambda p, where: 1, resume=False, keep_runs=True)
    assert other.exists()


def test_a_fresh_run_over_a_finished_one_with_other_settings_can_be_resumed_when_cut_off(tmp_path):
    """A finished run re-run afresh with new settings, cut off in its second part, resumes: the finished run's
    partial.json (other settings) used to stop the --resume in one line, so the kept work was unreachable."""
    run_parts(tmp_path, "x", {"lr": 1}, False, ["p", "q"], lambda part: 1, resume=False)  # the finished run

    def cut_off(part: str) -> int:
        if part == "q":
            raise KeyboardInterrupt
        return 2

    with pytest.raises(KeyboardInterrupt):
        run_parts(tmp_path, "x", {"lr": 3}, False, ["p", "q"], cut_off, resume=False)
    calls: list[str] = []
    parts, _, _ = run_parts(tmp_path, "x", {"lr": 3}, False, ["p", "q"], lambda part: calls.append(part) or 3,
                            resume=True)
    assert calls == ["q"] and parts == {"p": 2, "q": 3}


def test_a_folder_of_ones_own_files_is_refused_before_any_work(tmp_path):
    """An --out holding files but no record of the experiment: its report.md would be replaced (it was, exit 0)."""
    from attnlab.experiments.partial import refuse_foreign_files

    (tmp_path / "report.md").write_text("my own notes")
    with pytest.raises(ConfigError, match=r"holds files that are not a run of x \(report\.md\)"):
        refuse_to_overwrite(tmp_path, "x", quick=False)
    with pytest.raises(ConfigError, match="choose a new or empty --out"):
        refuse_foreign_files(tmp_path, "x")  # what a --resume checks
    assert (tmp_path / "report.md").read_text() == "my own notes"
    run_parts(tmp_path / "own", "x", {}, False, ["p"], lambda part: 1, resume=False)  # a new folder: fine
    (tmp_path / "own" / "notes.md").write_text("beside a run of x")
    refuse_to_overwrite(tmp_path / "own", "x", quick=False)  # a run of x with a note beside it may run again
    refuse_foreign_files(tmp_path / "empty", "x")  # missing or empty: fine


def test_the_single_runs_of_a_part_are_kept_apart_by_device_and_threads(tmp_path):
    """A chomsky resumed with --device cuda (or other threads) must not take the runs its CPU sitting kept."""
    from attnlab.experiments.engine import InProcess, using
    from attnlab.experiments.partial import runs_folder

    plain_here = runs_folder(tmp_path, "x", {"a": 1}, False, "p")
    with using(InProcess(context={"threads": 1})):
        one = runs_folder(tmp_path, "x", {"a": 1}, False, "p")
    with using(InProcess(context={"threads": 2})):
        two = runs_folder(tmp_path, "x", {"a": 1}, False, "p")
    engine = InProcess(context={"threads": 1})
    engine.device = "cuda"  # as on a GPU machine
    with using(engine):
        gpu = runs_folder(tmp_path, "x", {"a": 1}, False, "p")
    assert len({plain_here, one, two, gpu}) == 4 and all(f.name.startswith("p-") for f in (one, two, gpu))
