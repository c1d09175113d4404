"""GPT <-> Hugging Face GPT-2: identical logits through transformers' own model, both directions."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.core.errors import CheckpointError
from attnlab.interop.gpt2 import load_gpt2, save_gpt2
from attnlab.models import GPTConfig, build_model
from attnlab.models.registry import from_pretrained
from attnlab.tokenizers import load_tokenizer

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
    cfg["activation_function"] = "silu"
    (tmp_path / "ok" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'silu' has no attnlab equivalent"):
        load_gpt2(tmp_path / "ok")
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_gpt2(tmp_path / "missing")


def _folder_from(model_class, config, path):
    torch.manual_seed(2)
    model = model_class(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger than the init, so a mapping error cannot hide in small numbers
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("kind", ["gpt2-tanh", "neox", "llama-gqa"])
def test_real_transformers_folders_import_through_the_cli(tmp_path, capsys, kind):
    """Folders written by transformers' own classes: GPT-2 with its tanh GELU (gelu_new), GPT-NeoX
    (sequential residual) and a LLaMA with grouped-query attention, each within 1e-4 of the original."""
    transformers.logging.set_verbosity_error()
    if kind == "gpt2-tanh":
        cfg = transformers.GPT2Config(vocab_size=60, n_positions=24, n_embd=48, n_layer=2, n_head=4,
                                      activation_function="gelu_new")
        hf = _folder_from(transformers.GPT2LMHeadModel, cfg, tmp_path / "hf")
    elif kind == "neox":
        cfg = transformers.GPTNeoXConfig(vocab_size=60, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=96, use_parallel_residual=False, rotary_pct=1.0,
                                         max_position_embeddings=24)
        hf = _folder_from(transformers.GPTNeoXForCausalLM, cfg, tmp_path / "hf")
    else:
        cfg = transformers.LlamaConfig(vocab_size=60, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=80, max_position_embeddings=24)
        hf = _folder_from(transformers.LlamaForCausalLM, cfg, tmp_path / "hf")
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    ours = from_pretrained(tmp_path / "ours")
    idx = torch.randint(0, 60, (2, 24))
    with torch.no_grad():
        assert (ours(idx).logits - hf(input_ids=idx).logits).abs().max().item() < 1e-4
    if kind == "gpt2-tanh":
        assert ours.config.activation == "gelu_tanh"


def test_a_transformers_vit_imports_with_its_classes(tmp_path):
    transformers.logging.set_verbosity_error()
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                 image_size=16, patch_size=4, num_channels=3, id2label={0: "cat", 1: "dog"},
                                 label2id={"cat": 0, "dog": 1})
    hf = _folder_from(transformers.ViTForImageClassification, cfg, tmp_path / "hf")
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    ours = from_pretrained(tmp_path / "ours")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert (ours(x).logits - hf(pixel_values=x).logits).abs().max().item() < 1e-4
    assert json.loads((tmp_path / "ours" / "labels.json").read_text())["classes"] == ["cat", "dog"]


def test_export_then_import_keeps_the_model_and_the_tokenizer(tmp_path):
    from tests.helpers import train_tiny_run

    run = train_tiny_run(tmp_path, max_iters=2)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    a, b = from_pretrained(run), from_pretrained(tmp_path / "back")
    text = "hear me speak"
    assert load_tokenizer(run).encode(text) == load_tokenizer(tmp_path / "back").encode(text)
    idx = torch.tensor([load_tokenizer(run).encode(text)])
    with torch.no_grad():
        assert (a(idx).logits - b(idx).logits).abs().max().item() < 1e-5
