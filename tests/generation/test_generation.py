"""Tests for attnlab.generation: filtering, sampling, and cached vs uncached decoding."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.core.errors import ConfigError
from attnlab.core.schema import from_dict
from attnlab.generation import SamplingConfig, filter_logits, generate, next_token, stream
from attnlab.models import GPTConfig, ModelConfig, build_model

VOCAB = 29
POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "relative", "none"]


def make_gpt(seed: int = 0, **overrides):
    cfg = dict(vocab_size=VOCAB, block_size=12, n_layer=2, n_head=4, d_model=32, init_std=0.1)
    cfg.update(overrides)
    torch.manual_seed(seed)
    return build_model(from_dict(ModelConfig, cfg)).eval()


def prompt(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------- cache vs none

SAMPLERS = {
    "greedy": dict(temperature=0.0),
    "sample": dict(temperature=1.0, seed=7),
    "top_k": dict(temperature=1.0, top_k=5, seed=8),
    "top_p": dict(temperature=1.0, top_p=0.9, seed=9),
    "top_k+top_p+temp": dict(temperature=0.7, top_k=10, top_p=0.8, seed=10),
}


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_cache_and_no_cache_generate_identical_tokens(positions, backend, sampler):
    model = make_gpt(positions=positions, attn_backend=backend, n_kv_head=2)
    idx = prompt(2, 4)
    n_new = 6  # stays within block_size (4 + 6 <= 12)
    with_cache = generate(model, idx, SamplingConfig(max_new_tokens=n_new, use_cache=True, **SAMPLERS[sampler]))
    without = generate(model, idx, SamplingConfig(max_new_tokens=n_new, use_cache=False, **SAMPLERS[sampler]))
    assert with_cache.shape == (2, 4 + n_new)
    assert torch.equal(with_cache[:, :4], idx)
    assert torch.equal(with_cache, without)
    assert ((with_cache >= 0) & (with_cache < VOCAB)).all()


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("sampler", ["greedy", "top_p"])
@pytest.mark.parametrize("prompt_len", [1, 5, 7, 8])
def test_generation_past_block_size_slides_the_window(positions, backend, sampler, prompt_len):
    model = make_gpt(positions=positions, attn_backend=backend, block_size=8)
    idx = prompt(2, prompt_len, seed=3)
    n_new = 17 - prompt_len  # ends at 17 > block_size 8: the window slides for several steps
    kw = SAMPLERS[sampler]
    a = generate(model, idx, SamplingConfig(max_new_tokens=n_new, use_cache=True, **kw))
    b = generate(model, idx, SamplingConfig(max_new_tokens=n_new, use_cache=False, **kw))
    assert a.shape == (2, 17)
    assert torch.equal(a, b)


def test_sliding_window_uses_last_block_tokens():
    """Past the context each token depends only on the last block_size tokens (greedy)."""
    model = make_gpt(positions="learned", block_size=6)
    seq = generate(model, prompt(1, 6, seed=4), SamplingConfig(max_new_tokens=5, temperature=0))
    for t in range(6, 11):
        window = seq[:, t - 6 : t]
        expected = model(window).logits[:, -1].argmax(-1)
        assert seq[0, t].item() == expected.item()


def test_greedy_generation_matches_manual_argmax_loop():
    model = make_gpt(positions="rope")
    idx = prompt(2, 3)
    out = generate(model, idx, SamplingConfig(max_new_tokens=5, temperature=0.0))
    seq = idx
    for _ in range(5):
        nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


def test_batched_generation_rows_are_independent():
    model = make_gpt(positions="alibi")
    idx = prompt(3, 4, seed=5)
    cfg = SamplingConfig(max_new_tokens=7, temperature=0.0)
    batched = generate(model, idx, cfg)
    assert batched.shape == (3, 11)
    for b in range(3):
        single = generate(model, idx[b : b + 1], cfg)
        assert torch.equal(batched[b : b + 1], single)


def test_batched_sampling_shape_and_cache_agreement():
    model = make_gpt(positions="learned")
    idx = prompt(3, 2, seed=6)
    a = generate(model, idx, SamplingConfig(max_new_tokens=8, seed=3, top_k=4))
    b = generate(model, idx, SamplingConfig(max_new_tokens=8, seed=3, top_k=4, use_cache=False))
    assert a.shape == (3, 10) and torch.equal(a, b)
    # rows draw their own samples: not every row is the same continuation
    assert not (torch.equal(a[0], a[1]) and torch.equal(a[1], a[2]))


def test_stream_yields_tokens_and_on_token_callback():
    model = make_gpt()
    idx = prompt(2, 3)
    cfg = SamplingConfig(max_new_tokens=4, temperature=0.0)
    streamed = list(stream(model, idx, cfg))
    assert len(streamed) == 4 and all(t.shape == (2, 1) for t in streamed)
    seen = []
    out = generate(model, idx, cfg, on_token=seen.append)
    assert torch.equal(out[:, 3:], torch.cat(streamed, 1))
    assert len(seen) == 4 and torch.equal(torch.cat(seen, 1), out[:, 3:])


def test_zero_new_tokens_returns_prompt():
    model = make_gpt()
    idx = prompt(1, 5)
    assert torch.equal(generate(model, idx, SamplingConfig(max_new_tokens=0)), idx)


def test_prompt_longer_than_block_size_raises():
    model = make_gpt(block_size=8)
    with pytest.raises(ValueError, match="context"):
        generate(model, prompt(1, 9), SamplingConfig(max_new_tokens=1))
    # exactly block_size is fine
    out = generate(model, prompt(1, 8), SamplingConfig(max_new_tokens=2, temperature=0))
    assert out.shape == (1, 10)


def test_empty_prompt_raises():
    model = make_gpt()
    with pytest.raises(ValueError, match="empty"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), SamplingConfig(max_new_tokens=1))


def test_generation_puts_model_in_eval_mode():
    model = make_gpt(dropout=0.5)
    model.train()
    idx = prompt(1, 3)
    a = generate(model, idx, SamplingConfig(max_new_tokens=4, temperature=0))
    b = generate(model, idx, SamplingConfig(max_new_tokens=4, temperature=0, use_cache=False))
    assert not model.training
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------- seeds


def test_same_seed_same_sample_different_seed_differs():
    model = make_gpt(init_std=0.02)  # near-uniform distribution: samples vary a lot
    idx = prompt(2, 3)
    runs = {s: generate(model, idx, SamplingConfig(max_new_tokens=10, seed=s)) for s in (0, 0, 1, 2)}
    again = generate(model, idx, SamplingConfig(max_new_tokens=10, seed=0))
    assert torch.equal(runs[0], again)
    assert not torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[1], runs[2])


def test_seed_is_independent_of_global_rng():
    model = make_gpt(init_std=0.02)
    idx = prompt(1, 3)
    torch.manual_seed(100)
    a = generate(model, idx, SamplingConfig(max_new_tokens=8, seed=5))
    torch.manual_seed(200)
    b = generate(model, idx, SamplingConfig(max_new_tokens=8, seed=5))
    assert torch.equal(a, b)


def test_next_token_same_generator_seed_same_draws():
    logits = torch.zeros(4, 50)
    cfg = SamplingConfig(temperature=1.0)
    a = next_token(logits, cfg, torch.Generator().manual_seed(1))
    b = next_token(logits, cfg, torch.Generator().manual_seed(1))
    c = next_token(logits, cfg, torch.Generator().manual_seed(2))
    assert a.shape == (4, 1) and torch.equal(a, b)
    assert not torch.equal(a, c)


# ---------------------------------------------------------------------- filtering / sampling


@pytest.mark.parametrize("k", [1, 2, 5, 9])
def test_top_k_keeps_exactly_k(k):
    torch.manual_seed(0)
    logits = torch.randn(3, 10)
    out = filter_logits(logits, top_k=k)
    kept = torch.isfinite(out)
    assert (kept.sum(-1) == k).all()
    top = logits.topk(k, dim=-1).indices
    assert kept.gather(-1, top).all()
    assert torch.equal(out[kept], logits[kept])  # kept logits are unchanged
    assert (out[~kept] == float("-inf")).all()


@pytest.mark.parametrize("k", [10, 20])
def test_top_k_at_least_vocab_is_noop(k):
    logits = torch.randn(2, 10)
    assert torch.equal(filter_logits(logits, top_k=k), logits)


def test_top_k_hand_example():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    out = filter_logits(logits, top_k=2)
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False]]


PROBS = [0.5, 0.3, 0.15, 0.05]


@pytest.mark.parametrize(
    "top_p,kept",
    [(0.8, 2), (0.81, 3), (0.5, 1), (0.3, 1), (0.51, 2), (0.94, 3), (0.96, 4), (1.0, 4)],
)
def test_top_p_keeps_smallest_nucleus(top_p, kept):
    logits = torch.tensor([PROBS]).log()
    out = filter_logits(logits, top_p=top_p)
    assert torch.isfinite(out).tolist() == [[i < kept for i in range(4)]]
    # shuffled vocabulary: the same tokens (by probability) survive
    perm = torch.tensor([2, 0, 3, 1])
    out_perm = filter_logits(logits[:, perm], top_p=top_p)
    assert torch.equal(torch.isfinite(out_perm), torch.isfinite(out)[:, perm])


@pytest.mark.parametrize("top_p,kept", [(0.79, 2), (0.81, 3), (0.2, 1), (0.97, 4)])
def test_top_p_float64_away_from_boundaries(top_p, kept):
    logits = torch.tensor([PROBS], dtype=torch.float64).log()
    assert torch.isfinite(filter_logits(logits, top_p=top_p)).sum().item() == kept


def test_top_p_per_row():
    logits = torch.tensor([PROBS, [0.05, 0.15, 0.3, 0.5], [0.25, 0.25, 0.25, 0.25]]).log()
    kept = torch.isfinite(filter_logits(logits, top_p=0.7))
    assert kept.tolist() == [
        [True, True, False, False],
        [False, False, True, True],
        [True, True, True, False],
    ]


@pytest.mark.parametrize(
    "top_k,top_p,kept",
    [(3, 0.85, [1, 1, 1, 0]), (3, 0.99, [1, 1, 1, 0]), (2, 0.3, [1, 0, 0, 0]), (1, 0.99, [1, 0, 0, 0])],
)
def test_top_k_and_top_p_together(top_k, top_p, kept):
    logits = torch.tensor([PROBS]).log()
    out = filter_logits(logits, top_k=top_k, top_p=top_p)
    assert torch.isfinite(out).int().tolist() == [kept]


def test_sampling_respects_filters():
    logits = torch.tensor([PROBS]).log().expand(2000, 4)
    g = torch.Generator().manual_seed(0)
    draws = next_token(logits, SamplingConfig(top_p=0.8), g)
    assert set(draws.unique().tolist()) == {0, 1}
    frac0 = (draws == 0).float().mean().item()
    assert frac0 == pytest.approx(0.5 / 0.8, abs=0.04)  # renormalised within the nucleus
    draws_k = next_token(logits, SamplingConfig(top_k=3), g)
    assert set(draws_k.unique().tolist()) == {0, 1, 2}


def test_sampling_frequencies_follow_softmax_with_temperature():
    logits = torch.tensor([[0.0, math.log(3.0)]]).expand(4000, 2)
    g = torch.Generator().manual_seed(0)
    draws = next_token(logits, SamplingConfig(temperature=1.0), g)
    assert (draws == 1).float().mean().item() == pytest.approx(0.75, abs=0.03)
    draws_hot = next_token(logits, SamplingConfig(temperature=2.0), g)
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    assert (draws_hot == 1).float().mean().item() == pytest.approx(p1, abs=0.03)


def test_temperature_zero_is_argmax():
    torch.manual_seed(0)
    logits = torch.randn(5, 17)
    tok = next_token(logits, SamplingConfig(temperature=0.0, top_k=3, top_p=0.5))
    assert tok.shape == (5, 1)
    assert torch.equal(tok[:, 0], logits.argmax(-1))


def test_tiny_temperature_approaches_argmax():
    torch.manual_seed(0)
    logits = torch.randn(50, 11)
    tok = next_token(logits, SamplingConfig(temperature=1e-3), torch.Generator().manual_seed(0))
    assert torch.equal(tok[:, 0], logits.argmax(-1))


# -------------------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=-3), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-0.1), "top_p"),
    ],
)
def test_sampling_config_validate_rejects(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SamplingConfig(**kwargs).validate()


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(temperature=0.0), dict(top_k=1), dict(top_p=1.0), dict(top_p=0.01), dict(max_new_tokens=0)],
)
def test_sampling_config_validate_accepts(kwargs):
    SamplingConfig(**kwargs).validate()


def test_sampling_config_from_dict():
    cfg = from_dict(SamplingConfig, {"temperature": "0.5", "top_k": 4})
    assert cfg.temperature == 0.5 and cfg.top_k == 4
    with pytest.raises(ConfigError, match="top_p"):
        from_dict(SamplingConfig, {"top_p": 2})


def test_compiled_decode_step_gives_the_same_tokens_as_eager():
    """compile=True runs the one-token step through torch.compile: same greedy tokens, and with a
    seed the same samples, as the eager step (the prefill is compiled too)."""
    torch.manual_seed(0)
    model = build_model(GPTConfig(vocab_size=17, block_size=24, n_layer=1, n_head=2, d_model=16)).eval()
    prompt = torch.randint(0, 17, (2, 5))
    for temperature in (0.0, 0.9):
        eager = SamplingConfig(max_new_tokens=12, temperature=temperature, top_k=8, seed=3)
        compiled = SamplingConfig(max_new_tokens=12, temperature=temperature, top_k=8, seed=3, compile=True)
        assert torch.equal(generate(model, prompt, eager), generate(model, prompt, compiled))


@pytest.fixture
def traced_decode(monkeypatch):
    """compile=True's step traced by dynamo and AOTAutograd only (the aot_eager backend): the graphs, guards and
    recompiles the tests using it are about, without inductor's C++ build of each graph (several seconds each;
    test_compiled_decode_step_gives_the_same_tokens_as_eager builds inductor's, as a user's compile=True does)."""
    from attnlab.generation import sampling

    step = torch.compile(sampling._decode_step, dynamic=True, backend="aot_eager")
    monkeypatch.setattr(sampling, "_compiled_decode_step", step)


def test_compiled_decode_with_relative_positions_gives_the_eager_tokens(traced_decode):
    """Relative positions evaluate their score term on each step's q and k (a callable bias): the compiled
    stream still gives the eager tokens, past the context into the sliding window, and the step takes no
    graph break (the term's distance range comes from the shapes, not from reading the positions)."""
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = build_model(GPTConfig(vocab_size=17, block_size=10, n_layer=1, n_head=2, d_model=16,
                                    positions="relative")).eval()
    prompt = torch.randint(0, 17, (2, 3))
    eager = SamplingConfig(max_new_tokens=12, temperature=0)
    assert torch.equal(generate(model, prompt, eager), generate(model, prompt, SamplingConfig(
        max_new_tokens=12, temperature=0, compile=True)))
    assert not torch._dynamo.utils.counters["graph_break"]


def test_compiled_stream_stays_exact_across_prompts_models_and_the_window(traced_decode):
    """The compiled graphs are shared by every model in the process (dynamo picks one by its guards):
    prompts of 1 and 2 tokens (cache lengths 0 and 1 are specialised), two models of different widths
    alternating, and streams that run past the context into the sliding window all give the eager tokens."""
    torch.manual_seed(0)
    small = build_model(GPTConfig(vocab_size=17, block_size=12, n_layer=1, n_head=2, d_model=16)).eval()
    wide = build_model(GPTConfig(vocab_size=17, block_size=12, n_layer=2, n_head=2, d_model=24)).eval()
    for model, length in ((small, 1), (wide, 1), (small, 2), (wide, 3), (small, 5), (wide, 2)):
        prompt = torch.randint(0, 17, (1, length))
        eager = SamplingConfig(max_new_tokens=14, temperature=0)  # runs 3-6 tokens past block_size 12
        compiled = SamplingConfig(max_new_tokens=14, temperature=0, compile=True)
        assert torch.equal(generate(model, prompt, eager), generate(model, prompt, compiled)), (length, model)
