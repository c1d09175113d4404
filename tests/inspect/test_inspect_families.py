"""attnlab.inspect.record on the real families (BERT, seq2seq, ViT) and every backend: outputs stay
bit-identical and the recorded probabilities equal the eager backend's own (its hook points) to 1e-5,
self-attention with padding masks, the decoder's causal self-attention and its cross-attention."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect.record import record
from attnlab.models import ModelConfig, build_model
from attnlab.nn.hooks import capture
from tests.inspect_models import with_backend

BACKENDS = ("eager", "sdpa", "tiled")
SMALL = dict(n_layer=2, n_head=4, d_model=32, block_size=16, dropout=0.0)


def eager_patterns(model, *args, **kwargs) -> dict[str, torch.Tensor]:
    """The attention probabilities of the same weights on the eager backend, by hook point name."""
    eager = with_backend(model, "eager")
    with capture(eager, "*hook_pattern") as seen:
        eager(*args, **kwargs)
    return seen


def build(family: str, backend: str, **extra):
    torch.manual_seed(0)
    small = {k: v for k, v in SMALL.items() if not (family == "vit" and k == "block_size")}
    return build_model(ModelConfig.from_mapping(dict(family=family, attn_backend=backend, **small, **extra))).eval()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bert_with_padding(backend):
    model = build("bert", backend, vocab_size=30, n_classes=3)
    ids = torch.randint(5, 30, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False  # the second sentence is 6 tokens long
    plain = model(ids, attention_mask=mask).hidden_states
    with record(model, what=("probs", "scores")) as rec:
        recorded = model(ids, attention_mask=mask).hidden_states
    assert torch.equal(plain, recorded)
    reference = eager_patterns(model, ids, attention_mask=mask)
    got = rec.stack("self")
    assert got.shape == (2, 2, 4, 9, 9) and len(reference) == 2
    for layer in range(2):
        torch.testing.assert_close(got[layer], reference[f"blocks.{layer}.mixer.hook_pattern"], atol=1e-5, rtol=0)
    assert got[:, 1, :, :, 6:].abs().max() == 0  # padded keys get no attention


@pytest.mark.parametrize("backend", BACKENDS)
def test_seq2seq_encoder_decoder_and_cross_attention(backend):
    model = build("seq2seq", backend, vocab_size=25)
    src = torch.randint(3, 25, (2, 7), generator=torch.Generator().manual_seed(2))
    tgt = torch.randint(3, 25, (2, 5), generator=torch.Generator().manual_seed(3))
    src_mask = torch.ones(2, 7, dtype=torch.bool)
    src_mask[0, 4:] = False
    plain = model(src, tgt, src_mask=src_mask).logits
    with record(model) as rec:
        recorded = model(src, tgt, src_mask=src_mask).logits
    assert torch.equal(plain, recorded)
    ref = eager_patterns(model, src, tgt, src_mask=src_mask)

    def stacked(point: str) -> torch.Tensor:
        return torch.stack([ref[point.format(i)] for i in range(2)])

    torch.testing.assert_close(rec.stack("self", "encoder."), stacked("encoder.{}.mixer.hook_pattern"), atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(rec.stack("self", "decoder."), stacked("decoder.{}.mixer.hook_pattern"), atol=1e-5,
                               rtol=0)
    cross = rec.stack("cross")
    torch.testing.assert_close(cross, stacked("decoder.{}.cross_attn.hook_pattern"), atol=1e-5, rtol=0)
    assert cross.shape == (2, 2, 4, 5, 7) and cross[:, 0, :, :, 4:].abs().max() == 0  # source padding
    assert rec.stack("self", "decoder.")[..., 0, 1:].abs().max() == 0  # causal


@pytest.mark.parametrize("backend", BACKENDS)
def test_vit_cls_and_patches(backend):
    model = build("vit", backend, n_classes=4, image_size=8, patch_size=4, in_channels=1)
    images = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    plain = model(images).logits
    with record(model, heads=[1, 3]) as rec:
        recorded = model(images).logits
    assert torch.equal(plain, recorded)
    reference = eager_patterns(model, images)
    got = rec.stack("self")
    assert got.shape == (2, 2, 2, 5, 5)  # layers, batch, the 2 kept heads, [CLS] + 4 patches
    for layer in range(2):
        torch.testing.assert_close(got[layer], reference[f"blocks.{layer}.mixer.hook_pattern"][:, [1, 3]],
                                   atol=1e-5, rtol=0)
