"""Provenance and pre-registration: every committed results.json says where it came from, its rule is the code's
rule, and that rule was fixed no later than the run (git ancestry); the registry holds every experiment's rule as
the code states it, so a rule cannot change without a commit that shows it."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from attnlab.experiments import EXPERIMENTS, load
from attnlab.experiments.provenance import REGISTRY, check_registered, digest, provenance, registered, rule_commit

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "docs" / "experiments").glob("*/results.json"))
FIELDS = {"commit", "dirty", "data_sha256", "device", "engine", "rule_commit"}


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


HISTORY = _git("rev-parse", "HEAD").returncode == 0 and _git("rev-parse", "--is-shallow-repository").stdout.strip() \
    == "false"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.parent.name)
def test_a_committed_result_carries_its_provenance_and_the_code_s_rule(path):
    record = json.loads(path.read_text())
    p = record["provenance"]
    assert set(p) >= FIELDS, FIELDS - set(p)
    assert p["device"] in ("cpu", "cuda") and p["engine"]
    assert len(p["commit"]) == 40 and len(p["rule_commit"]) == 40
    assert record["protocol"]["verdict_rule"] == list(load(record["experiment"]).rule()), \
        "the committed run was decided by another rule than the code's"


@pytest.mark.skipif(not HISTORY, reason="needs the repository's full git history")
@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.parent.name)
def test_a_committed_result_s_rule_was_fixed_no_later_than_its_run(path):
    p = json.loads(path.read_text())["provenance"]
    for commit in (p["commit"], p["rule_commit"]):
        assert _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0, f"{commit} is not in this history"
    assert _git("merge-base", "--is-ancestor", p["rule_commit"], p["commit"]).returncode == 0, \
        f"the rule was fixed at {p['rule_commit'][:10]}, after the run at {p['commit'][:10]}"


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_the_registry_holds_each_experiment_s_rule_as_the_code_states_it(name):
    entry = registered()[name]
    assert entry["rule"] == list(load(name).rule()), f"register the rule: python scripts/register_rules.py {name}"
    assert entry["sha256"] == digest(entry["rule"])
    check_registered(name, load(name).rule())


def test_a_full_run_under_an_unregistered_rule_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    from attnlab.cli import main

    module = load("hand-trace")
    monkeypatch.setattr(module, "rule", lambda: ["a rule changed after seeing the result"])
    monkeypatch.setattr(module, "run", lambda *a, **k: pytest.fail("the experiment ran"))
    assert main(["experiment", "hand-trace", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not the one registered in rules.json" in err


def test_a_full_run_with_the_registry_uncommitted_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    from attnlab.cli import main
    from attnlab.experiments import provenance

    module = load("hand-trace")
    monkeypatch.setattr(module, "run", lambda *a, **k: pytest.fail("the experiment ran"))
    monkeypatch.setattr(provenance, "_git", lambda *args: " M src/attnlab/experiments/rules.json"
                        if args[0] == "status" else None)
    assert main(["experiment", "hand-trace", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has uncommitted changes" in err


@pytest.mark.skipif(not HISTORY, reason="needs the repository's full git history")
def test_a_rule_registered_without_a_written_commit_is_found_from_git(monkeypatch):
    """An entry with ``fixed_at: null`` resolves to the newest commit that added its digest to the registry."""
    entry = dict(registered()["sqrt-dk"])
    log = _git("log", "--format=%H", "-S", entry["sha256"], "--", str(REGISTRY.relative_to(ROOT))).stdout.split()
    if not log:
        pytest.skip("the registry is not committed yet")
    monkeypatch.setattr("attnlab.experiments.provenance.registered",
                        lambda: {"sqrt-dk": {**entry, "fixed_at": None}})
    assert rule_commit("sqrt-dk") == log[0]


def test_a_new_record_names_its_commit_data_and_engine(tmp_path):
    data = tmp_path / "corpus.txt"
    data.write_text("to be or not to be")
    p = provenance("sqrt-dk", data, "cpu", "in-process")
    assert set(p) == FIELDS
    assert p["data_sha256"] == {"corpus.txt": hashlib.sha256(b"to be or not to be").hexdigest()}
    assert p["rule_commit"] == rule_commit("sqrt-dk")
    if HISTORY:
        assert p["commit"] == _git("rev-parse", "HEAD").stdout.strip() and isinstance(p["dirty"], bool)
