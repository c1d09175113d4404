"""The folder kill trials (tests/kill_trials_folders.py, run in full by ``benchmarks/kill_trials.py --command
folders``) on their cheapest command: a trial sees a kill at the staging window leave no folder and the command
run again to the uninterrupted output, and it notices a folder left mixed."""

from __future__ import annotations

from tests.kill_trials_folders import Writer, reference, snapshot, trial


def test_a_micrographs_trial_killed_while_staging(tmp_path):
    writer = Writer("data micrographs", ["data", "micrographs", "--n", "12", "--size", "32"])
    ref = reference(writer, tmp_path)
    assert ref["earlier"] is None and "defects.jsonl" in ref["new"] and len(ref["new"]) > 12
    r = trial(writer, ref, tmp_path / "trial", kill_at="staging.filled")
    assert r["killed"] and r["found"] == "absent" and r["whole"] and r["identical"] and r["clean"], r
    assert not r["dead_end"]


def test_a_snapshot_tells_a_mixed_folder_from_a_whole_one(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.png").write_bytes(b"png one")
    (out / "b.svg").write_text("<svg>drawn at noon</svg>")
    whole = snapshot(out)
    (out / "b.svg").write_text("<svg>drawn at one</svg>")  # an SVG is compared by name: its time stamp differs
    assert snapshot(out) == whole
    (out / "a.png").write_bytes(b"png two")
    assert snapshot(out) != whole
    assert snapshot(tmp_path / "none") is None
