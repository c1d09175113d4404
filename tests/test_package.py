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
