"""Every option of a GPT, a BERT and a ViT, changed one at a time from each base that exports (GPT-2, GPT-NeoX,
LLaMA; BERT, with and without a head; ViT): the export either refuses in one CheckpointError, or writes a folder
whose logits in transformers are attnlab's. A field added to a family's config fails ``test_every_option_is_tried``
until it is tried here: no option can export silently wrong."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnlab.core.errors import CheckpointError
from attnlab.interop.bert import save_bert
from attnlab.interop.export import architecture
from attnlab.interop.gpt2 import save_gpt2
from attnlab.interop.llama import save_llama
from attnlab.interop.neox import save_neox
from attnlab.interop.vit import save_vit
from attnlab.models import BertConfig, GPTConfig, ViTConfig
from tests.gpt_options import BASES, CHANGES, FIXED, SHAPE, built, change_id

transformers = pytest.importorskip("transformers")
SAVE = {"GPT-2": save_gpt2, "GPT-NeoX": save_neox, "LLaMA": save_llama}


def _built_and_checked(config):
    """(the model, built by ``built``, and the architecture it exports as), or (None, None) where the export refuses
    it in one line; skips an invalid config."""
    model = built(config)
    try:
        return model, architecture(config)
    except CheckpointError as e:
        assert len(str(e).splitlines()) == 1
        return None, None


BERT = {"vocab_size": 50, "block_size": 32, "n_layer": 2, "n_head": 4, "d_model": 32, "norm_position": "post"}
VIT = {"image_size": 16, "patch_size": 4, "in_channels": 1, "n_classes": 3, "n_layer": 2, "n_head": 4, "d_model": 32}
SHARED = [  # the encoder options of both
    {}, {"d_ff": 80}, {"norm_eps": 1e-2}, {"bias": False}, {"n_kv_head": 2}, {"dropout": 0.1}, {"init_std": 0.5},
    *({"activation": a} for a in ("gelu_tanh", "relu", "relu2", "swiglu")), {"norm": "rmsnorm"},
    {"norm_position": "pre"}, {"norm_position": "post"}, {"attn_backend": "eager"}, {"attn_backend": "tiled"},
    {"qk_norm": True}, {"n_layer": 1}, {"n_head": 2}, {"d_model": 48}, {"n_classes": 5}, {"pooling": "mean"},
    *({"positions": p} for p in ("learned", "rope", "sinusoidal", "alibi", "relative", "none")),
]
BERT_CHANGES = [*SHARED, {"tie_embeddings": False}, {"vocab_size": 70}, {"block_size": 40}, {"rope_theta": 500.0},
                {"n_segments": 0}, {"n_segments": 3}, {"n_targets": 2}, {"n_classes": 3, "n_targets": 1},
                {"n_classes": 3, "pooling": "mean"}, {"positions": "rope", "rope_theta": 500.0},
                {"head_type": "token", "n_classes": 5}, {"head_type": "token", "n_classes": 5, "pooling": "mean"},
                {"head_type": "span"}, {"head_type": "span", "pooling": "mean"}, {"head_type": "span", "n_classes": 3}]
VIT_CHANGES = [*SHARED, {"image_size": 20}, {"in_channels": 3}, {"patch_size": 8}]


@pytest.mark.parametrize("config_class, changes", [(GPTConfig, CHANGES), (BertConfig, BERT_CHANGES),
                                                   (ViTConfig, VIT_CHANGES)], ids=["gpt", "bert", "vit"])
def test_every_option_is_tried(config_class, changes):
    tried = {k for change in changes for k in change} | FIXED
    assert {f.name for f in dataclasses.fields(config_class)} == tried


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("change", CHANGES, ids=change_id)
def test_a_changed_option_is_exported_exactly_or_refused(tmp_path, base, change):
    config = GPTConfig(**{**SHAPE, **BASES[base], **change})
    model, arch = _built_and_checked(config)
    if arch is None:
        return
    SAVE[arch](model, tmp_path)
    transformers.logging.set_verbosity_error()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, config.vocab_size, (2, config.block_size))
    with torch.no_grad():
        assert (hf(input_ids=idx).logits - model(idx).logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("change", BERT_CHANGES, ids=change_id)
def test_a_changed_bert_option_is_exported_exactly_or_refused(tmp_path, change):
    """The masked-LM logits through AutoModelForMaskedLM, and a head's through AutoModelForSequenceClassification
    (a regression head's with a target scale folded in: transformers' logits = attnlab's predictions s + mu)."""
    config = BertConfig(**{**BERT, **change})
    model, arch = _built_and_checked(config)
    if arch is None:
        return
    k = config.n_targets
    scale = ([0.5 * i for i in range(k)], [1.0 + i for i in range(k)]) if k else None
    save_bert(model, tmp_path, target_scale=scale)
    transformers.logging.set_verbosity_error()
    ids = torch.randint(0, config.vocab_size, (2, config.block_size))
    mask = torch.ones_like(ids)
    mask[1, config.block_size // 2:] = 0  # padding: the masked positions are not compared
    segments = torch.randint(0, max(config.n_segments, 1), ids.shape)
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}
    with torch.no_grad():
        ours = model(**inputs, with_mlm=True)
        theirs = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()(**inputs).logits
        assert (theirs - ours.mlm_logits)[mask.bool()].abs().max().item() < 1e-4
        if config.head_type == "token":  # BertForTokenClassification: the token classifier's logits
            head = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path).eval()(**inputs).logits
            assert (head - ours.token_logits)[mask.bool()].abs().max().item() < 1e-4
            return
        if config.head_type == "span":  # BertForQuestionAnswering: start and end logits
            span = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path).eval()(**inputs)
            for theirs_, ours_ in ((span.start_logits, ours.start_logits), (span.end_logits, ours.end_logits)):
                assert (theirs_ - ours_)[mask.bool()].abs().max().item() < 1e-4
            return
        if config.n_classes is None and k is None:
            return
        head = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()(**inputs).logits
        expected = ours.logits if k is None else ours.predictions * torch.tensor(scale[1]) + torch.tensor(scale[0])
        assert (head - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize("change", VIT_CHANGES, ids=change_id)
def test_a_changed_vit_option_is_exported_exactly_or_refused(tmp_path, change):
    config = ViTConfig(**{**VIT, **change})
    model, arch = _built_and_checked(config)
    if arch is None:
        return
    save_vit(model, tmp_path, [str(i) for i in range(config.n_classes)])
    transformers.logging.set_verbosity_error()
    x = torch.randn(2, config.in_channels, config.image_size, config.image_size)
    with torch.no_grad():
        theirs = transformers.AutoModelForImageClassification.from_pretrained(tmp_path).eval()(pixel_values=x).logits
        assert (theirs - model(x).logits).abs().max().item() < 1e-4
