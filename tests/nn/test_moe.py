"""Tests for attnlab.nn.moe: the batched mixture-of-experts against a per-token reference, against
FeedForward, the auxiliary losses by hand, capacity and its priority rule, gradients, training."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.models import GPTConfig
from attnlab.nn.ffn import FeedForward
from attnlab.nn.moe import MoEFeedForward, MoEStats

ACTIVATIONS = ["relu", "gelu", "swiglu"]


# ------------------------------------------------------------------------------ the reference


def expert_reference(moe: MoEFeedForward, e: int, v: torch.Tensor) -> torch.Tensor:
    """FFN_e(v) for one token v (C,), written out with the stacked weights."""
    h = v @ moe.w_in[e]
    if moe.b_in is not None:
        h = h + moe.b_in[e]
    if moe.activation == "swiglu":
        gate, up = h.chunk(2)
        h = F.silu(gate) * up
    elif moe.activation == "gelu":
        h = F.gelu(h)
    else:
        h = F.relu(h)
    out = h @ moe.w_out[e]
    return out + moe.b_out[e] if moe.b_out is not None else out


def moe_reference(moe: MoEFeedForward, x: torch.Tensor) -> tuple[torch.Tensor, list[int], int]:
    """Per-token loop: route, apply capacity (rank first, then token position), combine.

    Returns y (same shape as x), the kept assignments per expert, and the number dropped.
    """
    x_flat = x.reshape(-1, x.shape[-1])  # (N, C)
    N, E, k = x_flat.shape[0], moe.n_experts, moe.top_k
    cap = None if moe.capacity_factor is None else min(math.ceil(moe.capacity_factor * N * k / E), N)
    y = torch.zeros_like(x_flat)
    probs = (x_flat @ moe.router.weight.t()).softmax(-1)  # (N, E)
    choices = [probs[t].topk(k) for t in range(N)]
    used, dropped = [0] * E, 0
    for r in range(k):
        for t in range(N):
            p, idx = choices[t]
            e = int(idx[r])
            if cap is not None and used[e] >= cap:
                dropped += 1
                continue
            used[e] += 1
            g = p[r] / p.sum() if moe.normalize_top_k else p[r]
            y[t] = y[t] + g * expert_reference(moe, e, x_flat[t])
    return y.reshape(x.shape), used, dropped


def randomise(moe: MoEFeedForward, seed: int = 0, router_scale: float = 1.0) -> MoEFeedForward:
    """Give every parameter a non-trivial value (biases included) so nothing passes by accident."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            scale = router_scale if name.startswith("router") else 0.5
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return moe


# ------------------------------------------------------------------- batched == per-token loop


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("capacity_factor", [None, 0.5, 1.0])
@pytest.mark.parametrize("normalize_top_k", [True, False])
def test_matches_per_token_reference(activation, top_k, capacity_factor, normalize_top_k):
    torch.manual_seed(0)
    moe = MoEFeedForward(
        12, 10, n_experts=4, top_k=top_k, capacity_factor=capacity_factor, activation=activation,
        normalize_top_k=normalize_top_k,
    )
    randomise(moe, router_scale=2.0)  # a peaked router: uneven loads, so capacity bites
    x = torch.randn(3, 7, 12)  # N = 21 tokens: divisible by neither E nor capacity
    y, stats = moe(x)
    with torch.no_grad():
        y_ref, used, dropped = moe_reference(moe, x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    n_assign = 21 * top_k
    torch.testing.assert_close(stats.expert_load, torch.tensor(used, dtype=torch.float32) / n_assign)
    assert stats.dropped_fraction.item() == pytest.approx(dropped / n_assign)
    if capacity_factor is None:
        assert dropped == 0
    elif capacity_factor == 0.5:
        assert dropped > 0  # the case is built so that the limit really drops assignments


def test_reference_without_bias():
    torch.manual_seed(1)
    moe = randomise(MoEFeedForward(8, 6, n_experts=3, top_k=2, capacity_factor=0.8, bias=False), seed=1)
    assert moe.b_in is None and moe.b_out is None
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        y_ref, _, dropped = moe_reference(moe, x)
    assert dropped > 0
    torch.testing.assert_close(moe(x)[0], y_ref, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------- one expert == FeedForward


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_one_expert_equals_feedforward(activation, bias):
    torch.manual_seed(0)
    ffn = FeedForward(16, 24, activation=activation, bias=bias)
    moe = MoEFeedForward(16, 24, n_experts=1, top_k=1, capacity_factor=None, activation=activation, bias=bias)
    with torch.no_grad():
        moe.w_in.copy_(ffn.fc_in.weight.t().unsqueeze(0))
        moe.w_out.copy_(ffn.fc_out.weight.t().unsqueeze(0))
        if bias:
            moe.b_in.copy_(ffn.fc_in.bias.unsqueeze(0))
            moe.b_out.copy_(ffn.fc_out.bias.unsqueeze(0))
    x = torch.randn(2, 9, 16)
    y, stats = moe(x)
    torch.testing.assert_close(y, ffn(x), atol=1e-6, rtol=1e-5)
    assert stats.dropped_fraction.item() == 0.0
    assert stats.aux_loss.item() == pytest.approx(1.0)


def test_init_like_linear():
    moe = MoEFeedForward(64, 32, n_experts=4, activation="swiglu")
    assert moe.w_in.shape == (4, 64, 64) and moe.b_in.shape == (4, 64)
    assert moe.w_out.shape == (4, 32, 64) and moe.b_out.shape == (4, 64)
    assert moe.router.weight.shape == (4, 64) and moe.router.bias is None
    assert moe.w_in.abs().max() <= 1 / math.sqrt(64) and moe.w_out.abs().max() <= 1 / math.sqrt(32)
    assert moe.w_in.std().item() == pytest.approx(1 / math.sqrt(3 * 64), rel=0.1)  # U(-b, b): std b/sqrt(3)


# ---------------------------------------------------------------------------- capacity


def test_capacity_formula():
    moe = MoEFeedForward(8, 8, n_experts=4, top_k=2, capacity_factor=1.25)
    assert moe.capacity(21) == math.ceil(1.25 * 21 * 2 / 4) == 14
    assert moe.capacity(3) == 2
    assert MoEFeedForward(8, 8, n_experts=2, top_k=2, capacity_factor=4.0).capacity(5) == 5  # never above N
    assert MoEFeedForward(8, 8, n_experts=4, capacity_factor=None).capacity(100) is None


def _steer(moe: MoEFeedForward, first: list[int], second: list[int] | None = None) -> torch.Tensor:
    """Router = identity, tokens one-hot-ish: token t's first choice is first[t], its second second[t]."""
    E = moe.n_experts
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(E, moe.d_model))
    x = torch.zeros(1, len(first), moe.d_model)
    for t, e in enumerate(first):
        x[0, t, e] = 4.0
    for t, e in enumerate(second or []):
        x[0, t, e] = 2.0
    return x


def test_priority_by_token_position():
    """Everyone wants expert 0, capacity 2: the first two tokens are kept, the rest get zero."""
    moe = randomise(MoEFeedForward(4, 6, n_experts=4, top_k=1, capacity_factor=2.0))  # ceil(2*4*1/4) = 2
    x = _steer(moe, [0, 0, 0, 0])
    y, stats = moe(x)
    assert (y[0, :2].abs().sum(-1) > 0).all()
    assert (y[0, 2:] == 0).all()
    assert stats.dropped_fraction.item() == 0.5
    torch.testing.assert_close(stats.expert_load, torch.tensor([0.5, 0.0, 0.0, 0.0]))


def test_priority_first_choices_before_second_choices():
    """Token 0 picks expert 1 second; tokens 1..3 pick expert 1 first and come later, yet win the slots."""
    moe = randomise(MoEFeedForward(4, 6, n_experts=4, top_k=2, capacity_factor=1.0))  # ceil(4*2/4) = 2
    x = _steer(moe, first=[0, 1, 1, 2], second=[1, 0, 3, 3])
    _, used, dropped = moe_reference(moe, x)
    assert used == [2, 2, 1, 2] and dropped == 1  # expert 1: first choices of tokens 1, 2; token 0's dropped
    y, stats = moe(x)
    torch.testing.assert_close(y, moe_reference(moe, x)[0], atol=1e-5, rtol=1e-5)
    # token 0 keeps only its first choice: y_0 = g_00 FFN_0(x_0)
    p = (x[0, 0] @ moe.router.weight.t()).softmax(-1)
    g0 = p[0] / (p[0] + p[1])
    torch.testing.assert_close(y[0, 0], g0 * expert_reference(moe, 0, x[0, 0]), atol=1e-5, rtol=1e-5)
    assert stats.dropped_fraction.item() == pytest.approx(1 / 8)


@pytest.mark.parametrize("top_k", [1, 2])
def test_dropped_fraction_and_expert_load(top_k):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16)
    free = randomise(MoEFeedForward(16, 8, n_experts=4, top_k=top_k, capacity_factor=None), router_scale=2.0)
    _, stats = free(x)
    assert stats.dropped_fraction.item() == 0.0
    assert stats.expert_load.sum().item() == pytest.approx(1.0)
    tight = randomise(MoEFeedForward(16, 8, n_experts=4, top_k=top_k, capacity_factor=0.1), router_scale=2.0)
    _, stats = tight(x)
    assert tight.capacity(32) == math.ceil(0.1 * 32 * top_k / 4)
    assert stats.dropped_fraction.item() > 0.5
    assert stats.expert_load.sum().item() == pytest.approx(1.0 - stats.dropped_fraction.item())
    assert (stats.expert_load <= tight.capacity(32) / (32 * top_k) + 1e-7).all()


# -------------------------------------------------------------------------- auxiliary losses


def test_aux_and_z_loss_by_hand_top1():
    moe = MoEFeedForward(2, 4, n_experts=2, top_k=1, capacity_factor=None)
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(2))
    x = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [1.0, 0.0]]])  # logits = x
    _, stats = moe(x)

    def s(a: float, b: float) -> float:  # softmax of (a, b), first entry
        return math.exp(a) / (math.exp(a) + math.exp(b))

    probs = [(s(2, 0), s(0, 2)), (s(0, 1), s(1, 0)), (s(1, 0), s(0, 1))]  # top-1: 0, 1, 0
    f = (2 / 3, 1 / 3)
    P = [sum(p[i] for p in probs) / 3 for i in range(2)]
    assert stats.aux_loss.item() == pytest.approx(2 * (f[0] * P[0] + f[1] * P[1]), rel=1e-6)
    lse = [math.log(math.exp(a) + math.exp(b)) for a, b in [(2, 0), (0, 1), (1, 0)]]
    assert stats.z_loss.item() == pytest.approx(sum(v * v for v in lse) / 3, rel=1e-6)


def test_aux_loss_by_hand_top2_uses_fraction_of_assignments():
    moe = MoEFeedForward(3, 4, n_experts=3, top_k=2, capacity_factor=None)
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(3))
    logits = [[3.0, 1.0, 0.0], [2.0, 0.0, 1.0], [0.0, 0.5, 3.0]]  # top-2: {0,1}, {0,2}, {2,1}
    _, stats = moe(torch.tensor([logits]))
    f = [2 / 6, 2 / 6, 2 / 6]
    probs = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in logits]
    P = [sum(p[i] for p in probs) / 3 for i in range(3)]
    assert stats.aux_loss.item() == pytest.approx(3 * sum(fi * Pi for fi, Pi in zip(f, P)), rel=1e-6)
    lse = [math.log(sum(math.exp(v) for v in row)) for row in logits]
    assert stats.z_loss.item() == pytest.approx(sum(v * v for v in lse) / 3, rel=1e-6)


@pytest.mark.parametrize("top_k", [1, 2])
def test_aux_loss_is_one_at_uniform_routing(top_k):
    """Balanced one-hot tokens through a symmetric router: f_i = P_i = 1/E, so aux = E * E / E^2 = 1."""
    E = 4
    moe = MoEFeedForward(E, 8, n_experts=E, top_k=top_k, capacity_factor=None)
    with torch.no_grad():
        moe.router.weight.copy_(3.0 * torch.eye(E) + 0.1 * torch.roll(torch.eye(E), 1, dims=1))  # breaks top-2 ties
    x = torch.eye(E).repeat(3, 1).reshape(2, 6, E)  # every expert first choice of 3 tokens
    _, stats = moe(x)
    assert stats.aux_loss.item() == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(stats.expert_load, torch.full((E,), 1 / E))
    # all tokens to one expert: imbalanced, the loss is above its minimum
    _, skewed = moe(torch.zeros(2, 6, E).index_fill_(-1, torch.tensor([0]), 1.0))
    assert skewed.aux_loss.item() > 1.5


# ------------------------------------------------------------------------------- gradients


def test_gradients_reach_router_through_gates_and_losses():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    for top_k, normalize in [(2, True), (1, False)]:
        moe = MoEFeedForward(8, 12, n_experts=4, top_k=top_k, capacity_factor=None, normalize_top_k=normalize)
        y, _ = moe(x)
        (g_out,) = torch.autograd.grad(y.pow(2).sum(), moe.router.weight)
        assert g_out.abs().sum() > 0
    moe = MoEFeedForward(8, 12, n_experts=4, top_k=2)
    for name in ("aux_loss", "z_loss"):
        _, stats = moe(x)
        g_router, g_w_in = torch.autograd.grad(getattr(stats, name), [moe.router.weight, moe.w_in], allow_unused=True)
        assert g_router.abs().sum() > 0
        assert g_w_in is None  # the router losses touch only the router
    y, _ = moe(x)
    y.sum().backward()
    assert all(p.grad is not None for p in moe.parameters())


def test_top1_normalised_gate_is_one():
    """Mixtral-style renormalisation with k = 1 makes the gate 1: y equals the chosen expert's output."""
    torch.manual_seed(0)
    moe = randomise(MoEFeedForward(6, 5, n_experts=3, top_k=1, capacity_factor=None, normalize_top_k=True))
    x = torch.randn(1, 4, 6)
    y, _ = moe(x)
    choice = (x[0] @ moe.router.weight.t()).argmax(-1)
    expected = torch.stack([expert_reference(moe, int(e), x[0, t]) for t, e in enumerate(choice)])
    torch.testing.assert_close(y[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("activation", "top_k", "capacity_factor"),
    [("gelu", 1, None), ("gelu", 2, None), ("swiglu", 1, None), ("swiglu", 2, None), ("gelu", 2, 0.5)],
)
def test_gradcheck_float64(activation, top_k, capacity_factor):
    """Routing is piecewise constant, so away from ties the layer is smooth in x and every weight."""
    torch.manual_seed(0)
    moe = MoEFeedForward(
        4, 3, n_experts=3, top_k=top_k, capacity_factor=capacity_factor, activation=activation,
        normalize_top_k=top_k > 1,
    ).double()
    names = [n for n, _ in moe.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in moe.parameters())
    x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)

    def fn(x, *ps):
        y, stats = torch.func.functional_call(moe, dict(zip(names, ps)), (x,))
        return y, stats.aux_loss, stats.z_loss

    assert torch.autograd.gradcheck(fn, (x, *params), eps=1e-6, atol=1e-5)


# -------------------------------------------------------------------- shapes, modes, arguments


def test_shapes_and_odd_token_counts():
    torch.manual_seed(0)
    moe = MoEFeedForward(16, 32, n_experts=8, top_k=2)
    for shape in [(1, 1, 16), (3, 7, 16), (5, 13, 16), (11, 16)]:
        y, stats = moe(torch.randn(*shape))
        assert y.shape == shape
        assert isinstance(stats, MoEStats) and stats.expert_load.shape == (8,)
        assert stats.aux_loss.ndim == stats.z_loss.ndim == stats.dropped_fraction.ndim == 0


def test_eval_is_deterministic_and_jitter_only_in_training():
    torch.manual_seed(0)
    moe = MoEFeedForward(16, 32, n_experts=4, top_k=2, router_jitter=0.5)
    x = torch.randn(2, 9, 16)
    moe.eval()
    y1, s1 = moe(x)
    y2, s2 = moe(x)
    assert torch.equal(y1, y2) and torch.equal(s1.aux_loss, s2.aux_loss)
    moe.train()
    _, t1 = moe(x)
    _, t2 = moe(x)
    assert not torch.equal(t1.z_loss, t2.z_loss)  # the router saw different noise


def test_dropout_only_in_training():
    torch.manual_seed(0)
    moe = MoEFeedForward(8, 8, n_experts=2, top_k=1, dropout=0.5)
    x = torch.randn(2, 6, 8)
    moe.eval()
    assert torch.equal(moe(x)[0], moe(x)[0])
    moe.train()
    assert (moe(x)[0] == 0).float().mean() > 0.2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(top_k=0), "top_k"),
        (dict(n_experts=2, top_k=3), "top_k"),
        (dict(capacity_factor=0.0), "capacity_factor"),
        (dict(capacity_factor=-1.0), "capacity_factor"),
        (dict(activation="tanh"), "activation"),
        (dict(n_experts=0), "n_experts"),
        (dict(dropout=1.0), "dropout"),
        (dict(router_jitter=-0.1), "router_jitter"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MoEFeedForward(8, 16, **kwargs)


# --------------------------------------------------------------------------------- training


def test_loss_decreases_in_training():
    torch.manual_seed(0)
    moe = MoEFeedForward(8, 16, n_experts=4, top_k=2, capacity_factor=1.25)
    x = torch.randn(4, 16, 8)
    target = torch.tanh(x @ torch.randn(8, 8)) * 2
    opt = torch.optim.Adam(moe.parameters(), lr=1e-2)
    losses = []
    for _ in range(50):
        y, stats = moe(x)
        loss = F.mse_loss(y, target)
        losses.append(loss.item())
        opt.zero_grad()
        (loss + 0.01 * stats.aux_loss + 1e-3 * stats.z_loss).backward()
        opt.step()
    assert losses[-1] < 0.5 * losses[0]


# ------------------------------------------------------------------ inside the GPT and the trainer


def _moe_gpt(**extra):
    from attnlab.models import build_model

    cfg = dict(vocab_size=30, block_size=24, n_layer=2, n_head=2, d_model=32, moe_experts=4, moe_top_k=2)
    torch.manual_seed(0)
    return build_model(GPTConfig(**{**cfg, **extra}))


def test_gpt_with_experts_adds_weighted_aux_losses_to_the_objective():
    model = _moe_gpt(moe_aux_weight=0.01, moe_z_weight=0.001)
    assert sum(isinstance(b.ffn, MoEFeedForward) for b in model.blocks) == 2
    idx = torch.randint(0, 30, (3, 24))
    out = model(idx, idx)
    assert len(out.moe_stats) == 2
    expected = sum(0.01 * s.aux_loss + 0.001 * s.z_loss for s in out.moe_stats)
    torch.testing.assert_close(out.aux_loss, expected)
    torch.testing.assert_close(out.loss, out.lm_loss + expected)
    out.loss.backward()
    assert all(b.ffn.router.weight.grad is not None for b in model.blocks)


def test_moe_every_alternates_dense_and_expert_layers():
    from attnlab.nn.ffn import FeedForward

    model = _moe_gpt(n_layer=4, moe_every=2)
    kinds = [type(b.ffn) for b in model.blocks]
    assert kinds == [FeedForward, MoEFeedForward, FeedForward, MoEFeedForward]


def test_gpt_with_experts_decodes_with_cache_like_the_full_forward():
    from attnlab.generation import SamplingConfig, generate

    model = _moe_gpt(moe_capacity_factor=0.5).eval()  # capacity would drop tokens in training
    prompt = torch.randint(0, 30, (2, 5))
    cfg = dict(max_new_tokens=15, temperature=1.0, seed=3)
    with_cache = generate(model, prompt, SamplingConfig(**cfg, use_cache=True))
    without = generate(model, prompt, SamplingConfig(**cfg, use_cache=False))
    assert torch.equal(with_cache, without)


def test_gpt_with_experts_save_load_roundtrip(tmp_path):
    from attnlab.models import from_pretrained

    model = _moe_gpt().eval()
    model.save_pretrained(tmp_path / "m")
    idx = torch.randint(0, 30, (2, 10))
    assert torch.equal(from_pretrained(tmp_path / "m")(idx).logits, model(idx).logits)


def test_trainer_logs_expert_load(tmp_path):
    from attnlab.training.runs import read_metrics
    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config, write_corpus

    corpus = write_corpus(tmp_path / "c.txt")
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="moe", moe_experts=4, moe_top_k=1,
                                  max_iters=10))
    result = trainer.train()
    logged = [r for r in read_metrics(trainer.run_dir) if "expert_load" in r]
    assert [r["step"] for r in logged] == [5, 10]
    for r in logged:
        assert len(r["expert_load"]) == 2  # two expert layers
        for layer in r["expert_load"]:
            assert len(layer) == 4
        mean_kept = sum(sum(layer) for layer in r["expert_load"]) / 2
        assert abs(mean_kept + r["moe_dropped_fraction"] - 1.0) < 1e-4
        assert r["moe_aux_loss"] >= 1.0 - 1e-4  # its minimum is 1 (perfect balance)
    assert result.val_loss == result.val_loss


def test_top1_experts_in_a_block_gate_with_the_router_probability():
    """With top-1, renormalising would make every gate 1 and starve the router of task gradient."""
    model = _moe_gpt(moe_top_k=1, moe_aux_weight=0.0, moe_z_weight=0.0).train()
    assert all(not b.ffn.normalize_top_k for b in model.blocks)
    idx = torch.randint(0, 30, (2, 12))
    model(idx, idx).loss.backward()
    assert all(b.ffn.router.weight.grad.abs().sum() > 0 for b in model.blocks)
    assert all(b.ffn.normalize_top_k for b in _moe_gpt(moe_top_k=2).blocks)


def test_training_with_capacity_compiles_as_one_graph_and_matches_eager():
    """Dropped assignments go to a spare slot with gate 0 instead of being filtered out, so no shape depends
    on the routing: torch.compile traces the training step without a graph break (filtering broke it five times:
    nonzero, bincount), and outputs, statistics and gradients equal the eager ones. Traced by dynamo and
    AOTAutograd (aot_eager: the graph inductor is given; ``benchmarks/compile_step.py --variants moe`` builds it
    with inductor)."""
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    moe = MoEFeedForward(8, 16, n_experts=4, top_k=2, capacity_factor=0.5).train()
    x = torch.randn(2, 9, 8, requires_grad=True)
    results = []
    for run in (moe, torch.compile(moe, backend="aot_eager")):
        moe.zero_grad()
        x.grad = None
        y, stats = run(x)
        (y.square().sum() + stats.aux_loss + stats.z_loss).backward()
        results.append((y, stats, x.grad.clone(), moe.w_in.grad.clone()))
    (y, stats, gx, gw), (y_c, stats_c, gx_c, gw_c) = results
    assert not torch._dynamo.utils.counters["graph_break"]
    assert float(stats.dropped_fraction) > 0  # the capacity bites
    for eager, compiled in ((y, y_c), (gx, gx_c), (gw, gw_c)):
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    for field in ("aux_loss", "z_loss", "expert_load", "dropped_fraction"):
        torch.testing.assert_close(getattr(stats_c, field), getattr(stats, field), atol=1e-6, rtol=1e-5)
