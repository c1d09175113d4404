"""GPT <-> Hugging Face GPT-2: identical logits through transformers' own model, both directions."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.core.errors import CheckpointError
from attnlab.interop.hf import load_gpt2, save_gpt2
from attnlab.models import GPTConfig, build_model

transformers = pytest.importorskip("transformers")


def _gpt(**extra):
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, block_size=32, n_layer=2, n_head=4, d_model=32, bias=True)
    return build_model(GPTConfig(**{**cfg, **extra})).eval()


def test_export_loads_in_transformers_with_identical_logits(tmp_path):
    model = _gpt()
    save_gpt2(model, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 50, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=idx).logits, model(idx).logits, atol=1e-5, rtol=1e-5)


def test_import_of_a_transformers_gpt2_gives_identical_logits(tmp_path):
    cfg = transformers.GPT2Config(vocab_size=60, n_positions=24, n_embd=48, n_layer=3, n_head=4,
                                  activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(1)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_gpt2(tmp_path / "hf")
    idx = torch.randint(0, 60, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, hf(input_ids=idx).logits, atol=1e-5, rtol=1e-5)
    # and cached greedy generation agrees with HF's generate
    from attnlab.generation import SamplingConfig, generate

    prompt = idx[:1, :5]
    mine = generate(ours, prompt, SamplingConfig(max_new_tokens=12, temperature=0))
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(mine, theirs)


def test_incompatible_models_and_files_give_one_line_errors(tmp_path):
    with pytest.raises(CheckpointError, match="positions='rope'"):
        save_gpt2(_gpt(positions="rope"), tmp_path / "x")
    save_gpt2(_gpt(), tmp_path / "ok")
    cfg = json.loads((tmp_path / "ok" / "config.json").read_text())
    cfg["activation_function"] = "gelu_new"
    (tmp_path / "ok" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="not exact GELU"):
        load_gpt2(tmp_path / "ok")
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_gpt2(tmp_path / "missing")
