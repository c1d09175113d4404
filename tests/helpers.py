"""Shared test helpers: a small text corpus, a tiny run config, a quick experiment run read back, a benchmark
script run in this process."""

from __future__ import annotations

import importlib.util
import json
import random
import runpy
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from attnlab.training.runs import load_train_config

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards",
         "box", "and", "quartz", "glows"]


def write_corpus(path: Path, n_chars: int = 20_000, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))).capitalize() + ".\n"
        lines.append(line)
        size += len(line)
    path.write_text("".join(lines), encoding="utf-8")
    return path


# the experiments that train on tinyshakespeare read it from ../shared/data (the project's machines have it)
SHAKESPEARE = Path("../shared/data/tinyshakespeare.txt")
needs_shakespeare = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="needs ../shared/data/tinyshakespeare.txt")

# bit-identical resume on a GPU needs deterministic kernels (a CPU run is deterministic anyway)
EXACT = {"deterministic": "true"} if torch.cuda.is_available() else {}


def load_benchmark(name: str):
    """``benchmarks/NAME.py`` imported as a module, its ``main`` not run, registered in ``sys.modules`` as
    ``NAME_benchmark`` (its dataclasses look their module up there)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def bench_here(name: str, *argv: str) -> int:
    """``python benchmarks/NAME.py ARGV`` run in this process; its exit status. ``attnlab bench`` starts a new
    interpreter for the script, and that start (an import of torch, ~2 s) is much of what a short run costs, so
    the benchmark tests run their scripts here; ``tests/cli/test_cli.py`` checks ``attnlab bench`` itself."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    path = [str(script.parent), *sys.path]  # as `python script.py` sets it; a script may add to it
    with mock.patch.object(sys, "argv", [str(script), *argv]), mock.patch.object(sys, "path", path):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def tiny_overrides(data: Path, out_dir: Path, **extra) -> list[str]:
    base = dict(
        data=str(data), out_dir=str(out_dir), batch_size=4, max_iters=20, eval_interval=10,
        eval_iters=2, log_interval=5, warmup_iters=4, progress=False, sample_tokens=0,
        block_size=16, n_layer=2, n_head=2, d_model=32,
    )
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def tiny_config(data: Path, out_dir: Path, **extra):
    return load_train_config(None, tiny_overrides(data, out_dir, **extra))


def run_quick_experiment(name: str, out: Path) -> tuple[dict, dict]:
    """``attnlab experiment NAME --quick --in-process --out OUT``; checks what every experiment writes (results.json,
    report.md whose verdict agrees with it, non-empty plots) and returns (record, its results)."""
    from attnlab.cli import main

    assert main(["experiment", name, "--quick", "--in-process", "--out", str(out)]) == 0  # Ray: test_engine.py
    return read_quick_experiment(name, out)


def read_quick_experiment(name: str, out: Path) -> tuple[dict, dict]:
    """The checks of ``run_quick_experiment`` on a quick run already in ``out``; (record, its results)."""
    record = json.loads((out / "results.json").read_text())
    assert record["experiment"] == name and record["quick"] is True
    report = (out / "report.md").read_text()
    assert ("The claim held" in report) == record["claim_held"]
    # it opens with the claim, the verdict and the first figure
    first = sorted(f.name for f in out.glob("*.png"))[0]
    assert report.startswith(f"# {name}\n\n**Claim.** {record['claim']}\n\n**Verdict: {record['verdict']}.**")
    assert report.index(f"![{first}]({first})") < report.index("\n\n", report.index("**Verdict:")) + 4
    assert "**Regime.**" in report  # where the run's regime differs from the paper's or the lecture's
    assert list(out.glob("*.png")) and all(p.stat().st_size > 1000 for p in out.glob("*.png"))
    return record, record["results"]


def with_patterns(model, *args, points: str = "*hook_pattern", **kwargs):
    """``model(*args, **kwargs)`` with its attention patterns captured: (output, [probs per hook point,
    in the order they ran]) (the hook points of ``attnlab.nn.hooks``)."""
    from attnlab.nn.hooks import capture

    with capture(model, points) as seen:
        out = model(*args, **kwargs)
    return out, list(seen.values())


def train_tiny_run(tmp: Path, name: str = "r", **extra) -> Path:
    """A tiny shakespeare-char run (10 steps unless ``extra`` says otherwise) trained in ``tmp`` through
    the CLI; returns its run folder (the corpus is ``tmp / "corpus.txt"``)."""
    from attnlab.cli import main

    corpus = write_corpus(tmp / "corpus.txt")
    extra = {"max_iters": 10, **extra}
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp / "runs", name=name, **extra)]
    assert main(argv) == 0
    return tmp / "runs" / name


def verdicts_follow_their_intervals(record: dict, r: dict) -> None:
    """Every rule outcome of a study agrees with its own interval, and the experiment's verdict with its outcomes."""
    from attnlab.experiments.study import verdict_of

    for o in r["outcomes"]:
        low, high = o["interval"]
        assert low <= o.get("mean", o.get("difference")) <= high
    assert record["verdict"] == verdict_of(r["outcomes"])
    assert len(record["protocol"]["seeds"]) >= 3 and record["protocol"]["verdict_rule"]


def assert_trains_the_same(forwards, x, y, loss_tol: float, grad_tol: float) -> None:
    """Each (forward, model) of ``forwards`` gives the first one's loss on (x, y) within ``loss_tol`` and its
    gradients within ``grad_tol`` (models that compute the same function by different kernels)."""
    import torch

    results = []
    for forward, model in forwards:
        loss = forward(idx=x, targets=y).loss
        results.append((loss.item(), torch.autograd.grad(loss, list(model.parameters()))))
    for loss, grads in results[1:]:
        assert abs(loss - results[0][0]) < loss_tol
        assert max((a - b).abs().max().item() for a, b in zip(grads, results[0][1])) < grad_tol


def micrograph_folder(root, n: int = 60, size: int = 32):
    """``n`` micrograph-type images (data/micrographs.py, the runs' own generated data) as a folder of class
    sub-folders of PNGs: the probe reads them in place of ``data=generated:micrograph-types``, which would generate
    6,000 images (~10 s) for it."""
    from PIL import Image

    from attnlab.data.micrographs import TASKS, generate

    images, labels, _, _ = generate("type", n, size)
    for i, (image, label) in enumerate(zip(images, labels)):
        (root / TASKS["type"][label]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0]).save(root / TASKS["type"][label] / f"{i}.png")
    return root


def as_unprivileged(argv: list[str]) -> list[str] | None:
    """``argv`` run so that file permissions bind it: as it is for a user, and for root (who writes into a
    read-only folder all the same) through ``setpriv`` without the capabilities that override them; None where
    root has no ``setpriv`` (a permission case cannot be tried)."""
    import os
    import shutil

    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        return None
    drop = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", "--", *argv]
