"""inspect.fold (and ``attnlab.api.load``'s options): each weight-processing step leaves the predictions as they
were and does what its docstring's algebra says; anything it cannot process exactly is one line."""

from __future__ import annotations

import pytest
import torch

from attnlab.api import load
from attnlab.core.errors import ConfigError
from attnlab.inspect.fold import process_weights
from attnlab.inspect.intervene import run_with_cache
from attnlab.models import GPTConfig, build_model
from tests.helpers import train_tiny_run

STEPS = ("fold_ln", "center_writing", "center_unembedding", "fold_values")


def gpt(**extra):
    torch.manual_seed(0)
    model = build_model(GPTConfig(vocab_size=31, block_size=16, n_layer=2, n_head=4, d_model=32, **extra)).eval()
    with torch.no_grad():  # norms and biases off their init, so that every step has work to do
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    return model


IDX = torch.randint(0, 31, (2, 10), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("step", [*STEPS, "all"])
def test_each_step_leaves_the_predictions(step):
    model = gpt()
    with torch.no_grad():
        before = model(IDX).logits
        process_weights(model, **{s: step in (s, "all") for s in STEPS})
        after = model(IDX).logits
    if step in ("center_unembedding", "all"):  # every logit of a position moves by one constant
        before, after = before.log_softmax(-1), after.log_softmax(-1)
    torch.testing.assert_close(after, before, atol=2e-5, rtol=0)


def test_the_steps_do_what_the_algebra_says():
    model = gpt()
    process_weights(model, *(True,) * 4)
    for norm in (model.blocks[0].norm_mixer, model.blocks[1].norm_ffn, model.norm_f):
        assert torch.equal(norm.weight, torch.ones(32)) and not norm.bias.any()
    assert model.lm_head.weight is not model.tok_emb.weight and model.lm_head.bias is not None
    _, cache = run_with_cache(model, IDX, ["blocks.*.hook_resid_pre", "blocks.*.hook_mixer_out"])
    assert all(t.mean(-1).abs().max() < 1e-5 for t in cache.values())  # the stream has mean 0 over C
    assert model.lm_head.weight.mean(0).abs().max() < 1e-6
    attn = model.blocks[1].mixer
    assert not attn.qkv_proj.bias[64:].any()  # b_V folded
    assert attn.qkv_proj.weight.mean(1).abs().max() < 1e-6  # rows read a mean-0 input: centred


def test_what_cannot_be_processed_exactly_is_one_line():
    with pytest.raises(ConfigError, match="RMSNorm reads the stream's mean"):
        process_weights(gpt(norm="rmsnorm", bias=False), center_writing=True)
    with pytest.raises(ConfigError, match="attention \\+ dense FFN"):
        process_weights(gpt(mixer="ssm", positions="none"), fold_ln=True)
    with pytest.raises(ConfigError, match="soft-capped"):
        process_weights(gpt(logit_softcap=30.0), center_unembedding=True)
    model = gpt(norm="rmsnorm", bias=False)  # RMSNorm folds (no centring): the gains move, nothing else
    with torch.no_grad():
        before = model(IDX).logits
        process_weights(model, fold_ln=True)
        torch.testing.assert_close(model(IDX).logits, before, atol=2e-5, rtol=0)


def test_load_processes_a_run_on_request(tmp_path):
    run = train_tiny_run(tmp_path)
    plain, folded = load(run), load(run, fold_ln=True, center_writing_weights=True, center_unembed=True,
                                    fold_value_biases=True)
    idx = folded.ids("the quick")
    with torch.no_grad():
        torch.testing.assert_close(folded.model(idx).logits.log_softmax(-1), plain.model(idx).logits.log_softmax(-1),
                                   atol=1e-4, rtol=0)
    assert torch.equal(folded.model.blocks[0].norm_mixer.weight, torch.ones_like(folded.model.norm_f.weight))
