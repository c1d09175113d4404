"""attnlab.inspect.circuits: direct logit attribution adds up to the model's own logit difference (for
every norm, bias, mixer and attention kind), and path patching restores exactly the path it names (on the
planted circuit of tests/inspect/planted.py)."""

from __future__ import annotations

import pytest
import torch

from attnlab.core.errors import ConfigError
from attnlab.inspect.circuits import direct_logit_attribution, path_patch
from attnlab.inspect.intervene import Site, head, logit_difference, patch_recovery, run_with_cache
from attnlab.models import GPTConfig, build_model
from tests.inspect.planted import HALF, V, planted_gpt


def gpt(**extra):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=23, block_size=16, n_layer=3, n_head=4, d_model=32, init_std=0.1, **extra)
    return build_model(cfg).eval()


def tokens(seed: int, B: int = 3, T: int = 10) -> torch.Tensor:
    return torch.randint(0, 23, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("extra", [
    {},  # LayerNorm with biases, learned positions
    {"norm": "rmsnorm", "bias": False, "positions": "rope"},
    {"mixer": "latent", "d_latent": 16, "positions": "none"},  # its own decoupled RoPE
    {"mixer": "ssm", "positions": "none"},
    {"moe_experts": 4, "moe_top_k": 2},
])
def test_the_parts_add_up_to_the_logit_difference(extra):
    model = gpt(**extra)
    idx = tokens(1)
    for wrong in (None, 7):
        for position in (-1, 4):
            a = direct_logit_attribution(model, idx, answer=3, wrong=wrong, position=position)
            total = torch.stack(list(a.parts.values())).sum(0)
            assert torch.allclose(total, a.total, atol=1e-4), (extra, wrong, position)
            assert a.total.abs().max() > 1e-3  # a real difference, not 0 = 0
    names = set(a.parts)
    if extra.get("mixer") == "ssm":
        assert {"L0 mixer", "L2 mixer"} <= names and not any("H" in n for n in names)
    else:
        assert {f"L{layer}H{h}" for layer in range(3) for h in range(4)} <= names
    assert ("final norm bias" in names) == (extra.get("bias", True) and extra.get("norm", "layernorm") == "layernorm")


def test_attribution_refuses_a_model_that_is_not_one_sum():
    with pytest.raises(ConfigError, match="pre-norm gpt"):
        direct_logit_attribution(gpt(residual="hyper", residual_streams=2), tokens(0), answer=1)


def test_attribution_names_the_planted_induction_head():
    model = planted_gpt()
    r = torch.randperm(V - 1, generator=torch.Generator().manual_seed(3))[:HALF] + 1
    seq = torch.cat([torch.zeros(1, dtype=torch.long), r, r])[None, :-1]  # the answer is r[-1]
    a = direct_logit_attribution(model, seq, answer=int(r[-1]))
    (top, value), (_, second) = a.ranked()[:2]
    assert top == "L1H0" and value > 3.0 and abs(second) < 1e-5  # only the induction head writes D


@pytest.fixture(scope="module")
def planted():
    model = planted_gpt()
    r = torch.randperm(V - 1, generator=torch.Generator().manual_seed(3))[:HALF] + 1
    zero = torch.zeros(1, dtype=torch.long)
    other = r.roll(1)
    clean = torch.cat([zero, r, r])[None, :-1]
    corrupted = torch.cat([zero, other, r])[None, :-1]  # the first copy shuffled
    return model, clean, corrupted, logit_difference(correct=int(r[-1]), wrong=int(other[-1]))


def test_path_patching_equals_patching_a_head_whose_only_path_is_that_one(planted):
    """L0H0 writes C, which only L1H0 reads (the LM head reads D, every other part is zero): the path
    L0H0 -> L1H0 is all of L0H0's effect, so path patching it equals activation patching L0H0."""
    model, clean, corrupted, metric = planted
    path = path_patch(model, clean, corrupted, head(0, 0), head(1, 0), metric)
    whole = patch_recovery(model, clean, corrupted, [head(0, 0)], metric)
    assert path.clean - path.corrupted > 2.0
    assert path.patched == pytest.approx(whole.patched, abs=1e-4)
    assert path.recovered == pytest.approx(whole.recovered, abs=1e-5)
    assert abs(path.recovered) > 0.1  # the path carries part of the answer


def test_path_patching_restores_nothing_along_a_path_that_does_not_exist(planted):
    model, clean, corrupted, metric = planted
    for sender, receiver in ((head(0, 1), head(1, 0)), (head(0, 0), head(1, 1))):
        r = path_patch(model, clean, corrupted, sender, receiver, metric)
        assert r.patched == pytest.approx(r.corrupted, abs=1e-5), (sender, receiver)


def test_the_direct_path_is_the_senders_difference_added_to_the_receivers_input():
    """through_mlps=False keeps only the direct path: the receiver's input is the corrupted stream plus
    (z_S^clean - z_S^corrupted) W_O^S, computed here by hand; with the MLPs recomputed the answer differs."""
    from attnlab.inspect.circuits import head_output
    from attnlab.inspect.intervene import patched
    from attnlab.nn.hooks import capture, hooks

    model = gpt()
    clean, corrupted = tokens(1, B=2), tokens(2, B=2)
    metric = logit_difference(correct=3, wrong=5)
    sender, receiver = head(0, 1), head(2, 3)
    direct = path_patch(model, clean, corrupted, sender, receiver, metric, through_mlps=False)
    _, cc = run_with_cache(model, clean, sender.point)
    _, cx = run_with_cache(model, corrupted, sender.point)
    attention = model.blocks[0].mixer
    delta = head_output(attention, cc[sender.point], 1) - head_output(attention, cx[sender.point], 1)
    with torch.no_grad(), capture(model, receiver.point) as seen, \
            hooks(model, {"blocks.2.hook_resid_pre": lambda x, name: x + delta}):
        model(corrupted)
    with torch.no_grad(), patched(model, [receiver], seen):
        by_hand = float(metric(model(corrupted)))
    assert direct.patched == pytest.approx(by_hand, abs=1e-5)
    through = path_patch(model, clean, corrupted, sender, receiver, metric)
    assert abs(through.patched - direct.patched) > 1e-4  # the MLPs of blocks 0 and 1 carry part of it


def test_path_patching_to_a_group_of_receivers(planted):
    """A group is each receiver on its own path, patched together: here only L1H0 reads C, so adding the
    empty L1H1 changes nothing, and receivers in two layers are accepted."""
    model, clean, corrupted, metric = planted
    one = path_patch(model, clean, corrupted, head(0, 0), head(1, 0), metric)
    two = path_patch(model, clean, corrupted, head(0, 0), [head(1, 0), head(1, 1)], metric)
    assert two.patched == pytest.approx(one.patched, abs=1e-5)
    with pytest.raises(ConfigError, match="at least one receiver"):
        path_patch(model, clean, corrupted, head(0, 0), [], metric)


def test_path_patching_from_some_positions_only(planted):
    model, clean, corrupted, metric = planted
    nowhere = path_patch(model, clean, corrupted, Site(head(0, 0).point, 0, (0,)), head(1, 0), metric)
    assert nowhere.patched == pytest.approx(nowhere.corrupted, abs=1e-5)  # position 0 is the same in both


def test_path_patching_refuses_a_backward_path_or_a_site_that_is_not_a_head(planted):
    model, clean, corrupted, metric = planted
    with pytest.raises(ConfigError, match="earlier layer"):
        path_patch(model, clean, corrupted, head(1, 0), head(0, 0), metric)
    with pytest.raises(ConfigError, match="two heads"):
        path_patch(model, clean, corrupted, Site("blocks.0.hook_mixer_out"), head(1, 0), metric)


def test_patching_an_attention_pattern(planted):
    """The pattern of the induction head from the clean run, in the corrupted run: it attends where the
    clean head did; its own run's pattern patched back changes nothing."""
    model, clean, corrupted, metric = planted
    _, own = run_with_cache(model, corrupted, "blocks.*.mixer.hook_pattern")
    same = patch_recovery(model, clean, corrupted, [Site("blocks.1.mixer.hook_pattern", head=0)], metric,
                          clean_cache=None)
    with torch.no_grad():
        base = model(corrupted).logits
    from attnlab.inspect.intervene import patched

    with torch.no_grad(), patched(model, [Site("blocks.1.mixer.hook_pattern", head=0)], own):
        again = model(corrupted).logits
    assert torch.allclose(again, base, atol=1e-5)
    assert same.patched != pytest.approx(same.corrupted, abs=1e-3)  # the clean pattern moves the answer


@pytest.mark.parametrize("family", ["bert", "seq2seq", "vit"])
def test_path_patching_serves_every_family(family):
    """The same sites by name: BERT blocks, a seq2seq decoder's self-attention feeding its cross-attention,
    ViT blocks. A sender whose output the corruption does not change restores nothing; one that it does
    change moves the receiver's output."""
    from attnlab.models import ModelConfig

    torch.manual_seed(0)
    small = dict(n_layer=2, n_head=4, d_model=32, attn_backend="sdpa", init_std=0.2)
    if family == "bert":
        model = build_model(ModelConfig.from_mapping(dict(family="bert", vocab_size=30, block_size=16, **small)))
        clean, corrupted = (tokens(8, T=9) + 5,), (tokens(9, T=9) + 5,)
        sender, receiver, read = head(0, 1), head(1, 2), lambda out: out.hidden_states[:, 0, 0].mean()
    elif family == "seq2seq":
        model = build_model(ModelConfig.from_mapping(dict(family="seq2seq", vocab_size=25, block_size=16, **small)))
        src = tokens(9, T=7) + 2
        clean, corrupted = (src, tokens(10, T=5) + 2), (src, tokens(11, T=5) + 2)
        sender, receiver = head(0, 1, prefix="decoder"), head(1, 3, prefix="decoder", module="cross_attn")
        read = lambda out: out.logits[:, -1, 0].mean()  # noqa: E731
    else:
        model = build_model(ModelConfig.from_mapping(dict(family="vit", n_classes=3, image_size=8, patch_size=4,
                                                          **small)))
        g = torch.Generator().manual_seed(0)
        clean, corrupted = (torch.randn(2, 1, 8, 8, generator=g),), (torch.randn(2, 1, 8, 8, generator=g),)
        sender, receiver = head(0, 1), head(1, 2)
        torch.nn.init.normal_(model.head.weight)
        read = lambda out: out.logits[:, 0].mean()  # noqa: E731
    model.eval()
    same = path_patch(model, corrupted, corrupted, sender, receiver, read)
    assert same.patched == pytest.approx(same.corrupted, abs=1e-6)
    moved = path_patch(model, clean, corrupted, sender, receiver, read)
    assert abs(moved.patched - moved.corrupted) > 1e-6
