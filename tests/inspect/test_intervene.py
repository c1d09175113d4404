"""attnlab.inspect.intervene and .lens: interventions are exact where they must be (nothing ablated =
nothing changed; the full clean stream patched in = the clean logits; a mean-ablated head = its output
replaced by the reference mean, by hand), and they respect causality; the same sites work for every family."""

from __future__ import annotations

import pytest
import torch

from attnlab.core.errors import ConfigError
from attnlab.inspect.intervene import (
    Site,
    ablated,
    head,
    logit_difference,
    mlp,
    patch_recovery,
    patched,
    resid,
    residual_patching,
    run_with_cache,
)
from attnlab.inspect.lens import logit_lens
from attnlab.models import GPTConfig, ModelConfig, build_model
from attnlab.nn.hooks import capture


def gpt(n_layer: int = 2, backend: str = "sdpa", **extra):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=23, block_size=16, n_layer=n_layer, n_head=4, d_model=32, attn_backend=backend,
                    init_std=0.1, **extra)
    return build_model(cfg).eval()


def tokens(seed: int, B: int = 3, T: int = 10) -> torch.Tensor:
    return torch.randint(0, 23, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backend", ["eager", "sdpa", "tiled"])
def test_ablating_nothing_changes_nothing(backend):
    model, idx = gpt(backend=backend), tokens(0)
    plain = model(idx).logits
    with ablated(model, [], how="zero"):
        assert torch.equal(model(idx).logits, plain)
    # resampling every head and MLP from the same input writes back what was there: bit-identical too
    sites = [head(layer, h) for layer in range(2) for h in range(4)] + [mlp(0), mlp(1)]
    _, cache = run_with_cache(model, idx)
    with ablated(model, sites, how="resample", reference=cache):
        assert torch.equal(model(idx).logits, plain)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_patching_the_whole_stream_gives_the_clean_logits_exactly(backend):
    model, clean, corrupted = gpt(backend=backend), tokens(1), tokens(2)
    out_clean, cache = run_with_cache(model, clean)
    with patched(model, [resid(0)], cache):
        assert torch.equal(model(corrupted).logits, out_clean.logits)
    metric = logit_difference(correct=3, wrong=7)
    full = patch_recovery(model, clean, corrupted, [resid(0)], metric, clean_cache=cache)
    assert full.recovered == pytest.approx(1.0, abs=1e-6)
    assert patch_recovery(model, clean, corrupted, [], metric, clean_cache=cache).recovered == 0.0


def test_a_mean_ablated_head_outputs_the_reference_mean_by_hand():
    model = gpt(backend="eager").double()
    idx, reference = tokens(3), tokens(4, B=5)
    _, ref = run_with_cache(model, reference, "blocks.1.mixer.hook_z")
    with capture(model, "blocks.1.mixer.hook_z") as seen:
        model(idx)
    z = seen["blocks.1.mixer.hook_z"].clone()  # (B, H, T, D)
    z[:, 2] = ref["blocks.1.mixer.hook_z"][:, 2].mean(dim=(0, 1))  # head 2 <- its mean over batch and positions
    B, H, T, D = z.shape
    attn = model.blocks[1].mixer
    by_hand = attn.out_proj(z.transpose(1, 2).reshape(B, T, H * D))  # (B, T, C): concat_h z_h W_O
    with ablated(model, [head(1, 2)], how="mean", reference=ref), capture(model, "blocks.1.hook_mixer_out") as out:
        model(idx)
    torch.testing.assert_close(out["blocks.1.hook_mixer_out"], by_hand, rtol=0, atol=1e-12)
    with ablated(model, [head(1, 2)], how="zero"), capture(model, "blocks.1.mixer.hook_z") as zeroed:
        model(idx)
    assert zeroed["blocks.1.mixer.hook_z"][:, 2].abs().max() == 0  # only head 2 is touched
    kept = [0, 1, 3]
    torch.testing.assert_close(zeroed["blocks.1.mixer.hook_z"][:, kept], seen["blocks.1.mixer.hook_z"][:, kept])


def test_ablating_a_position_only_changes_that_position_and_later_ones():
    model, idx = gpt(), tokens(5)
    plain = model(idx).logits
    with ablated(model, [resid(1, [4])], how="zero"):
        changed = model(idx).logits
    assert torch.equal(changed[:, :4], plain[:, :4])  # causal: earlier positions cannot see it
    assert not torch.allclose(changed[:, 4], plain[:, 4])


def test_residual_patching_map_and_bad_sites():
    model, clean, corrupted = gpt(), tokens(6, B=1, T=6), tokens(7, B=1, T=6)
    metric = logit_difference(correct=1, wrong=2)
    grid = residual_patching(model, clean, corrupted, metric, n_layer=2, n_positions=6)
    assert grid.shape == (2, 6) and torch.isfinite(grid).all()
    # the last position's stream entering the last block carries all that block sees of the last token
    full = patch_recovery(model, clean, corrupted, [resid(1, list(range(6)))], metric).recovered
    assert full == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="has no head axis"):
        Site("blocks.0.hook_ffn_out", head=1).index()
    with pytest.raises(ValueError, match="needs its activations"), ablated(model, [mlp(0)], how="mean"):
        model(clean)
    with pytest.raises(KeyError, match="no hook point matches"), ablated(model, [Site("blocks.9.hook_ffn_out")]):
        pass


@pytest.mark.parametrize("family", ["bert", "seq2seq", "vit"])
def test_the_same_sites_serve_every_family(family):
    torch.manual_seed(0)
    small = dict(n_layer=2, n_head=4, d_model=32, attn_backend="sdpa")
    if family == "bert":
        model = build_model(ModelConfig.from_mapping(dict(family="bert", vocab_size=30, block_size=16, **small)))
        inputs, site, read = (tokens(8, T=9) + 5,), head(1, 0), lambda out: out.hidden_states
    elif family == "seq2seq":
        model = build_model(ModelConfig.from_mapping(dict(family="seq2seq", vocab_size=25, block_size=16, **small)))
        inputs = (tokens(9, T=7) + 2, tokens(10, T=5) + 2)
        site, read = head(1, 3, prefix="decoder", module="cross_attn"), lambda out: out.logits
    else:
        model = build_model(ModelConfig.from_mapping(dict(family="vit", n_classes=3, image_size=8, patch_size=4,
                                                          **small)))
        inputs = (torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)),)
        site, read = resid(1, positions=[2]), lambda out: out.logits  # a patch token of layer 1's input
        torch.nn.init.normal_(model.head.weight)  # the classifier starts at zero: give it something to read
    model.eval()
    plain = read(model(*inputs))
    with ablated(model, [], how="zero"):
        assert torch.equal(read(model(*inputs)), plain)
    with ablated(model, [site], how="zero"):
        assert not torch.allclose(read(model(*inputs)), plain)


def test_logit_lens_ends_at_the_models_own_logits():
    model, idx = gpt(n_layer=3), tokens(11)
    targets = torch.roll(idx, -1, dims=1)
    lens = logit_lens(model, idx, targets, k=3)
    assert lens.layers == ["embed", "block 0", "block 1", "block 2"] and lens.logits.shape == (4, 3, 10, 23)
    torch.testing.assert_close(lens.logits[-1], model(idx).logits, rtol=0, atol=0)
    assert len(lens.loss) == 4 and lens.top.shape == (4, 3, 10, 3)
    with pytest.raises(ConfigError, match="one residual stream"):
        logit_lens(gpt(residual="hyper"), idx)
