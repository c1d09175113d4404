"""Packaging: a light import, the console script, and presets that validate."""

import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.training.runs import load_train_config

ROOT = Path(__file__).resolve().parents[1]


def test_import_attnlab_is_light():
    code = "import sys, attnlab; heavy = [m for m in ('torch', 'matplotlib', 'tokenizers', 'transformers') " \
           "if m in sys.modules]; print(heavy)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_console_script_help():
    exe = Path(sys.executable).parent / "attnlab"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("train", "resume", "sample", "eval"):
        assert command in out


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_presets_validate(preset):
    load_train_config(ROOT / "configs" / preset)


def test_shakespeare_char_preset_is_nanogpts_recipe():
    cfg = load_train_config(ROOT / "configs" / "shakespeare-char.yaml")
    m = cfg.model
    assert (m.n_layer, m.n_head, m.d_model, m.block_size, m.dropout) == (4, 4, 128, 64, 0.0)
    assert (cfg.batch_size, cfg.max_iters, cfg.lr, cfg.min_lr, cfg.warmup_iters) == (12, 2000, 1e-3, 1e-4, 100)
    assert (cfg.beta2, cfg.grad_clip) == (0.99, 1.0)
    assert m.positions == "rope"  # the one departure from nanoGPT (learned positions), see the README


def test_base_dependencies_leave_torch_to_the_user_and_the_heavy_ones_to_extras():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    torch_spec = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert "==" not in torch_spec and "<3" in torch_spec
    for heavy in ("fastapi", "uvicorn", "captum", "scipy", "scikit-learn", "sacrebleu", "tensorboard"):
        assert heavy not in base
    extras = project["optional-dependencies"]
    assert {"web", "inspect", "experiments", "tensorboard", "all"} <= set(extras)
    assert "corpus" not in extras  # its data packages would pull pandas, transformers ...; setup.sh uses --no-deps
    assert (ROOT / "LICENSE").is_file()


def test_every_file_read_at_run_time_is_package_data():
    """The C++ kernels' sources (built on first use), the web page and the bundled presets are read from the
    installed package: a wheel without them installs, then fails at first use (a kernel's source was once missing)."""
    import tomllib
    from fnmatch import fnmatch

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["attnlab"]
    package = ROOT / "src" / "attnlab"
    needed = [p for ext in ("*.cpp", "*.yaml", "*.html", "*.js", "*.css") for p in package.rglob(ext)]
    assert any(p.suffix == ".cpp" for p in needed)
    missing = [str(p.relative_to(package)) for p in needed
               if not any(fnmatch(str(p.relative_to(package)), pattern) for pattern in patterns)]
    assert missing == []


@pytest.mark.parametrize("argv, module, extra", [
    (["explore", "RUN"], "fastapi", "attnlab[web]"),
    (["probe", "RUN", "data=FILE"], "sklearn", "attnlab[inspect]"),
    (["train", "configs/vit-digits.yaml", "max_iters=1", "out_dir=OUT"], "sklearn", "attnlab[inspect]"),
])
def test_a_missing_extra_is_named_in_one_line(tmp_path, capsys, monkeypatch, argv, module, extra):
    """With the package absent (as in a base install), the command stops before doing any work and
    names the extra to install."""
    from attnlab.cli import main
    from attnlab.data.images import load_digits
    from tests.helpers import train_tiny_run

    run = train_tiny_run(tmp_path, max_iters=1) if "RUN" in argv else None
    load_digits.cache_clear()  # digits another test loaded in this process would need no scikit-learn
    data = tmp_path / "labels.csv"
    data.write_text("text,label\nhello,a\nthere,b\n")
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # "import module" now raises ImportError
    argv = [str(run) if a == "RUN" else str(data) if a == "data=FILE" else a for a in argv]
    argv = [f"data={data}" if a == str(data) else a.replace("OUT", str(tmp_path / "runs")) for a in argv]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert extra in err and len(err.splitlines()) == 1, err


def test_the_speedrun_preset_evaluates_nanogpts_estimate_on_val_alone(tmp_path, capsys):
    """The speed run's one evaluation: val only, batches of 12 x 64 whatever the training batch; QK-norm, Muon and
    dtype=auto (which says what it chose); a short run end to end through the CLI, the preset named by name."""
    from attnlab.cli import main
    from attnlab.training.runs import load_run_config, read_metrics
    from tests.helpers import write_corpus

    corpus = write_corpus(tmp_path / "corpus.txt")
    assert main(["train", "shakespeare-char-speedrun", f"data={corpus}", f"out_dir={tmp_path}", "name=s",
                 "max_iters=4", "eval_interval=4", "eval_iters=2", "log_interval=2", "batch_size=5"]) == 0
    out = capsys.readouterr().out
    assert "dtype=auto: " in out and "mfu against" in out
    evals = [r for r in read_metrics(tmp_path / "s") if "val_loss" in r]
    assert len(evals) == 1 and "train_eval_loss" not in evals[0]
    cfg = load_run_config(tmp_path / "s")
    assert (cfg.eval_batch_size, cfg.eval_train, cfg.batch_size) == (12, False, 5)
    assert cfg.model.qk_norm and cfg.optimizer == "muon" and cfg.dtype == "auto"


def test_the_speedrun_ablation_searches_from_the_presets_own_length():
    """benchmarks/speedrun_ablation.py starts every variant's search at the preset's max_iters, which must lie on
    its grid (a preset changed to an off-grid length would stop the ablation before its first run)."""
    from tests.helpers import load_benchmark

    ablation = load_benchmark("speedrun_ablation")
    assert ablation.preset_steps() == load_train_config("shakespeare-char-speedrun").max_iters
    assert ablation.preset_steps() in ablation.GRID
