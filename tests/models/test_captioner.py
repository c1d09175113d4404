"""The captioner: a ViT memory read by the Seq2Seq decoder's passes; cached decoding equals the uncached reference;
the cross-attention covers [CLS] and every patch; a ViT's weights start its encoder."""

from __future__ import annotations

import pytest
import torch

from attnlab.core.errors import ConfigError
from attnlab.generation import beam_search, greedy_decode
from attnlab.models import ModelConfig, build_model
from attnlab.nn.hooks import capture


def _captioner(**kw):
    cfg = ModelConfig.from_mapping({"family": "captioner", "vocab_size": 23, "image_size": 32, "patch_size": 8,
                                    "n_layer": 2, "n_decoder_layer": 2, "n_head": 2, "d_model": 32, "block_size": 12,
                                    **kw})
    torch.manual_seed(0)
    return build_model(cfg).eval()


def test_teacher_forced_logits_and_cross_attention_over_every_patch():
    model = _captioner()
    images, tgt = torch.randn(3, 1, 32, 32), torch.randint(0, 23, (3, 6))
    with capture(model, "decoder.1.cross_attn.hook_pattern") as seen:
        out = model(images, tgt, labels=tgt)
    assert out.logits.shape == (3, 6, 23) and out.loss.ndim == 0
    p = seen["decoder.1.cross_attn.hook_pattern"]
    assert p.shape == (3, 2, 6, 1 + 16) and torch.allclose(p.sum(-1), torch.ones(3, 2, 6), atol=1e-5)
    other = images.clone()
    other[2] += 1.0  # another image changes only its own captions' logits
    changed = model(other, tgt).logits
    assert torch.allclose(changed[:2], out.logits[:2], atol=1e-5) and not torch.allclose(changed[2], out.logits[2])


def test_cached_greedy_and_beam_decoding_equal_the_uncached_reference():
    model = _captioner()
    images = torch.randn(2, 1, 32, 32)
    cached = greedy_decode(model, images, None, 1, 2, 10)
    plain = greedy_decode(model, images, None, 1, 2, 10, use_cache=False)
    assert cached.tokens == plain.tokens and torch.allclose(torch.tensor(cached.log_probs),
                                                            torch.tensor(plain.log_probs), atol=1e-4)
    beam = beam_search(model, images, None, 1, 2, 10, beam_size=3)
    assert len(beam.tokens) == 2 and max(beam.log_probs) <= 0


def test_a_vit_starts_the_encoder_and_bad_configs_are_refused():
    from attnlab.models.vit import ViT, ViTConfig

    vit = ViT(ViTConfig(n_classes=3, image_size=32, patch_size=8, n_layer=2, n_head=2, d_model=32))
    model = _captioner()
    shared = {k: v for k, v in vit.state_dict().items() if k in model.state_dict()}
    assert set(shared) >= {"patch_emb.proj.weight", "cls_token", "pos_emb", "blocks.1.ffn.fc_out.weight",
                           "norm_f.weight"}
    assert all(model.state_dict()[k].shape == v.shape for k, v in shared.items())
    with pytest.raises(ConfigError, match="patch_size"):
        _captioner(patch_size=5)
    with pytest.raises(ConfigError, match="positions"):
        _captioner(positions="rope")
    with pytest.raises(ValueError, match="images must be"):
        model(torch.randn(1, 1, 16, 16), torch.zeros(1, 2, dtype=torch.long))
