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
