"""The verdict rule in code (``module.rule()``) is the one the committed full run recorded, and the one a run puts
in its protocol, for attention-saliency, chomsky, faithfulness, flash-memory, grokking, hand-trace, induction-heads
(both committed runs), long-range, micrograph-saliency and moe-vs-dense; every one of them that trains takes
``device`` (the two that train nothing do not), and its models and batches are on that device when training
starts. These read committed files and code, and train nothing beyond a step or two of tiny models."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch

from attnlab.experiments import load

DOCS = Path(__file__).resolve().parents[2] / "docs" / "experiments"
# committed folder -> experiment: induction-heads-5000 is the first full run of induction-heads (5,000 steps)
COMMITTED = {"attention-saliency": "attention-saliency", "chomsky": "chomsky", "faithfulness": "faithfulness",
             "flash-memory": "flash-memory", "grokking": "grokking", "hand-trace": "hand-trace",
             "induction-heads": "induction-heads", "induction-heads-5000": "induction-heads",
             "long-range": "long-range", "micrograph-saliency": "micrograph-saliency", "moe-vs-dense": "moe-vs-dense"}
TRAINED = ["attention-saliency", "chomsky", "faithfulness", "grokking", "induction-heads", "long-range",
           "micrograph-saliency", "moe-vs-dense"]
MEASURED = ["flash-memory", "hand-trace"]  # no model trained: no device


def _committed(folder: str) -> dict:
    return json.loads((DOCS / folder / "results.json").read_text())


@pytest.mark.parametrize("folder", sorted(COMMITTED))
def test_the_rule_in_code_is_the_committed_runs(folder):
    committed = _committed(folder)
    assert committed["quick"] is False and committed["experiment"] == COMMITTED[folder]
    assert load(COMMITTED[folder]).rule() == committed["protocol"]["verdict_rule"]


def test_the_5000_step_run_of_induction_heads_had_the_same_rule_under_other_settings():
    """Its settings differ from today's full run only in the budget and the evaluation interval; the rule does not
    depend on the settings."""
    from attnlab.experiments import induction_heads

    early, now = _committed("induction-heads-5000"), _committed("induction-heads")
    assert early["protocol"]["budget"]["steps"] == 5000 and now["protocol"]["budget"]["steps"] == 12000
    assert early["protocol"]["verdict_rule"] == now["protocol"]["verdict_rule"] == induction_heads.rule()
    budget = ("steps", "eval_every")
    assert early["results"]["settings"]["eval_every"] == 100 and induction_heads.FULL["eval_every"] == 200
    assert {k: v for k, v in early["results"]["settings"].items() if k not in budget} == {
        k: v for k, v in induction_heads.FULL.items() if k not in budget}


def test_the_chomsky_rule_follows_its_settings():
    from attnlab.experiments import chomsky as c

    committed = _committed("chomsky")
    assert c.rule() == c.rule(c.FULL) == c.rule(committed["results"]["settings"])
    assert len(c.rule()) == 30  # RNN and LSTM on the 4 regular tasks, RNN and Transformer on the 11 others
    quick = c.rule(c.QUICK)  # parity check (regular) and reverse string (not)
    assert len(quick) == 4 and quick[0].startswith("rnn@parity_check's mean test_score is above 0.9")
    assert quick[3].startswith("transformer@reverse_string's mean test_score is below 0.9")
    assert c.protocol(c.QUICK).verdict_rule == quick and c.protocol(c.FULL).verdict_rule == c.rule()


def test_the_protocols_built_outside_run_use_the_rule():
    from attnlab.experiments import faithfulness, hand_trace

    assert hand_trace.PROTOCOL.verdict_rule == hand_trace.rule()
    assert faithfulness._protocol({"vit": [1e-3]}).verdict_rule == faithfulness.rule()


class _Stop(Exception):
    pass


@pytest.mark.parametrize("name", ["attention-saliency", "grokking", "induction-heads", "long-range",
                                  "micrograph-saliency", "moe-vs-dense"])
def test_a_full_run_puts_the_rule_in_its_protocol(name, monkeypatch, tmp_path):
    """The protocol a full run hands to its study (and records) carries ``rule()``; the run is stopped there."""
    module = load(name)
    seen = []

    def run_arms(arms, protocol, *args, **kwargs):
        seen.append(protocol.verdict_rule)
        raise _Stop

    monkeypatch.setattr(module, "run_arms", run_arms)
    if name == "long-range":  # measured before the study: not needed here
        monkeypatch.setattr(module, "gradient_to_first_input", lambda arm, k: 0.0)
    if name == "micrograph-saliency":  # 4,000 generated micrographs: not needed to see the protocol
        monkeypatch.setattr(module, "data", lambda s: {})
    if name == "moe-vs-dense":  # any text will do
        text = tmp_path / "text.txt"
        text.write_text("to be or not to be, that is the question\n" * 200)
        monkeypatch.setattr(module, "text_of", lambda given, context: (text.read_text(), {"file": str(text)}))
    with pytest.raises(_Stop):
        module.run(tmp_path / "out")
    assert seen == [module.rule()]


def test_flash_memory_records_the_rule_and_decides_its_parts(tmp_path):
    """Without measuring: fake peaks (eager quadratic, the others linear) through the run's own rule and fit."""
    from attnlab.experiments import flash_memory as fm

    recorded = {}

    def measure(fn, B, H, T, D, budget):
        return {"peak_mib": (T / 256) ** (2 if fn is impls["eager"] else 1), "fwd_bwd_ms": 1.0}

    impls = fm.bench.make_impls(128)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fm.bench, "make_impls", lambda block: impls)
        m.setattr(fm.bench, "measure", measure)
        m.setattr(fm, "_plot", lambda *a: None)
        m.setattr(fm, "write_outputs", lambda *a, protocol, **k: recorded.update(protocol=protocol, outcomes=a[4]))
        fm.run(tmp_path / "unused", quick=True)
    assert recorded["protocol"]["verdict_rule"] == fm.rule()
    assert [o["rule"] for o in recorded["outcomes"]["outcomes"]] == fm.rule()
    assert [o["verdict"] for o in recorded["outcomes"]["outcomes"]] == ["held"] * 3


@pytest.mark.parametrize("name", TRAINED + MEASURED)
def test_an_experiment_takes_device_where_it_trains(name):
    parameters = inspect.signature(load(name).run).parameters
    assert ("device" in parameters) == (name in TRAINED)
    if name in TRAINED:
        assert parameters["device"].default == "cpu"


def _devices(batch) -> set[str]:
    tensors = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, tuple | list) else [batch]
    return {t.device.type for t in tensors}


def _trainers():
    """(module whose ``fit`` trains, a call that trains one tiny model on ``device``), per training function."""
    from attnlab.experiments import chomsky, chomsky_protocol, grokking, induction_heads, long_range, moe_vs_dense
    from attnlab.experiments import placed_digits as pd
    from attnlab.experiments.scaling import char_data

    images, labels = torch.zeros(8, 1, 16, 16), torch.zeros(8, dtype=torch.long)
    chars, vocab = char_data(16, "".join(chr(65 + i * 7 % 26) for i in range(2000)))
    moe = {**moe_vs_dense.QUICK, "steps": 1, "context": 16, "batch": 2}
    formal = {**chomsky_protocol.QUICK, "steps": {"rnn": 1, "lstm": 1, "transformer": 1}}
    return {
        "placed-vit": (pd, lambda device: pd.train_placed_vit(0, 1e-3, 1, images, labels, device=device)),
        "grokking": (grokking, lambda device: grokking.train_one(grokking.QUICK, 1.0, 1e-3, 0, device)),
        "induction-heads": (induction_heads,
                            lambda device: induction_heads.train_one({**induction_heads.QUICK, "steps": 1}, 0, 1e-3,
                                                                     device)),
        "long-range": (long_range, lambda device: long_range.train("transformer", 8, 0, 1e-3, long_range.QUICK,
                                                                   device)),
        "moe-vs-dense": (moe_vs_dense, lambda device: moe_vs_dense.train_arm("moe-4-top1", moe, chars, vocab, 0,
                                                                             1e-3, device)),
        "chomsky-lstm": (chomsky, lambda device: chomsky.train_and_test("parity_check", "lstm", formal, 0, 1e-3,
                                                                        device)),
        "chomsky-from-end": (chomsky, lambda device: chomsky.train_and_test(
            "reverse_string", chomsky_protocol.FROM_END, {**formal, "models": (chomsky_protocol.FROM_END,)}, 0, 1e-3,
            device)),
    }


@pytest.mark.parametrize("trainer", ["placed-vit", "grokking", "induction-heads", "long-range", "moe-vs-dense",
                                     "chomsky-lstm", "chomsky-from-end"])
def test_a_model_trains_on_the_device_it_is_given(trainer, monkeypatch):
    """Without a GPU: on the "meta" device (tensors without data), the model and every batch it is given are
    there when training starts, where a GPU would be; on the CPU, there."""
    module, train = _trainers()[trainer]
    seen: list[tuple[str, set[str]]] = []

    def fit(model, optimizer, batch, forward, *args, **kwargs):
        seen.append((next(model.parameters()).device.type, _devices(batch(0))))
        raise _Stop

    monkeypatch.setattr(module, "fit", fit)
    evaluated: list[set[str]] = []
    if trainer == "induction-heads":  # it evaluates before the first step (values a meta tensor does not have)
        monkeypatch.setattr(module, "copy_losses", lambda model, seqs, kinds: (evaluated.append(
            _devices((next(model.parameters()), seqs, kinds))), (0.0, 0.0))[1])
        monkeypatch.setattr(module, "head_scores", lambda model, probe: (evaluated.append(
            _devices((next(model.parameters()), probe))), {"induction": [[0.0]] * 2, "previous_token": [[0.0]]})[1])
    for device in ("meta", "cpu"):
        with pytest.raises(_Stop):
            train(device)
        assert seen.pop() == (device, {device})
        assert all(d == {device} for d in evaluated) and len(evaluated) == (2 if trainer == "induction-heads" else 0)
        evaluated.clear()


def test_chomsky_reads_the_blanks_and_positions_on_the_inputs_device():
    from attnlab.experiments import chomsky as c
    from attnlab.experiments import chomsky_protocol as p

    task = c.TASKS["reverse_string"]
    net = c.build(p.FROM_END, task, p.QUICK, 64).to("meta")
    seen = []

    def forward(seq, positions=None):  # what the encoder is given (its sinusoids would read the ids' values)
        seen.append((seq.device.type, positions.device.type, positions.tolist() if positions.device.type == "cpu"
                     else None))
        return torch.zeros(*seq.shape, task.n_classes, device=seq.device)

    net.forward = forward
    x = torch.zeros(2, 5, dtype=torch.long, device="meta")
    assert c.output_logits(net, p.FROM_END, x, 5).shape == (2, 5, task.n_classes)
    assert seen.pop() == ("meta", "meta", None)
    assert c.output_logits(net, p.FROM_END, torch.zeros(2, 5, dtype=torch.long), 2).device.type == "cpu"
    assert seen.pop() == ("cpu", "cpu", [6, 5, 4, 3, 2, 1, 0])


def test_the_placed_digits_accuracy_is_taken_where_the_model_is():
    from attnlab.experiments import placed_digits as pd

    torch.manual_seed(0)
    model = pd.placed_vit().eval()
    images, labels = torch.randn(4, 1, 16, 16), torch.arange(4)
    expected = (model(images).logits.argmax(-1) == labels).float().mean().item()
    assert pd.accuracy(model, images, labels) == expected
    with pytest.raises(RuntimeError, match="meta"):  # computed on "meta", where .item() has no value to give
        pd.accuracy(model.to("meta"), images, labels)


def test_an_arm_travels_by_cloudpickle_and_gives_what_it_gives_here():
    cloudpickle = pytest.importorskip("cloudpickle")
    from attnlab.experiments import grokking

    s = {**grokking.QUICK, "p": 7, "steps": 4, "eval_every": 2}
    arm = lambda seed, lr: grokking.train_one(s, 1.0, lr, seed, device="cpu")  # noqa: E731
    assert cloudpickle.loads(cloudpickle.dumps(arm))(0, 1e-3) == arm(0, 1e-3)
