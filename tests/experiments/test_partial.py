"""experiments/partial.py: parts kept as they finish, taken back on resume only from the same experiment and
settings, and a wall time that adds the sittings."""

from __future__ import annotations

import json

import pytest

from attnlab.core.errors import ConfigError
from attnlab.experiments.partial import FILE, run_parts


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
