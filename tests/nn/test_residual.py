"""Tests for attnlab.nn.residual: the standard residual exactly, HC/mHC at init against it, Sinkhorn,
mHC's conserved stream mean, AttnRes weights by hand (full and block), position-wise (KV-cache) equality,
shapes, gradients to every parameter, and a tiny training run per scheme."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models import GPTConfig
from attnlab.nn.norms import LayerNorm
from attnlab.nn.residual import RESIDUALS, ResidualScheme, StandardResidual, build_residual
from attnlab.nn.residual.attnres import AttentionResiduals, DepthHistory
from attnlab.nn.residual.hyper import HyperConnections, ManifoldHyperConnections, sinkhorn

B, T, C, N_STREAMS = 2, 5, 16, 4

SCHEMES: dict[str, Callable[[int, int], ResidualScheme]] = {
    "standard": lambda d, L: StandardResidual(),
    "hyper": lambda d, L: HyperConnections(d, L, N_STREAMS),
    "hyper-static": lambda d, L: HyperConnections(d, L, N_STREAMS, dynamic=False),
    "mhc": lambda d, L: ManifoldHyperConnections(d, L, N_STREAMS),
    "mhc-static": lambda d, L: ManifoldHyperConnections(d, L, N_STREAMS, dynamic=False),
    "attnres": lambda d, L: AttentionResiduals(d, L),
    "attnres-block2": lambda d, L: AttentionResiduals(d, L, block_size=2),
}
WITH_PARAMS = [k for k in SCHEMES if k != "standard"]


# ----------------------------------------------------------------------------------- the toy stack


class ToyStack(nn.Module):
    """n pre-norm sub-layers f_i(norm_i(h)) (position-wise), driven through a residual scheme."""

    def __init__(self, scheme: ResidualScheme, n: int, d: int = C, hidden: int | None = None) -> None:
        super().__init__()
        self.scheme = scheme
        self.norms = nn.ModuleList(LayerNorm(d) for _ in range(n))
        if hidden is None:
            self.fs = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        else:
            self.fs = nn.ModuleList(nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
                                    for _ in range(n))

    def forward(self, x: Tensor, record: list[Tensor] | None = None) -> Tensor:
        state = self.scheme.expand(x)
        for i, (norm, f) in enumerate(zip(self.norms, self.fs)):
            h = self.scheme.layer_input(state, i)
            if record is not None:
                record.append(h)
            state = self.scheme.add(state, f(norm(h)), i)
        return self.scheme.collapse(state)


def randomise(module: nn.Module, seed: int = 0, scale: float = 0.3) -> nn.Module:
    """Perturb every parameter away from its init so no term vanishes by accident."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return module


def make(kind: str, n: int, seed: int = 0, random_scheme: bool = False) -> ToyStack:
    torch.manual_seed(seed)
    stack = ToyStack(SCHEMES[kind](C, n), n)
    if random_scheme:
        randomise(stack.scheme, seed)
    return stack


# ---------------------------------------------------------------------------------------- standard


def test_standard_is_exactly_prenorm_residual():
    stack = make("standard", 3)
    x = torch.randn(B, T, C)
    ref = x
    for norm, f in zip(stack.norms, stack.fs):
        ref = ref + f(norm(ref))
    assert torch.equal(stack(x), ref)
    assert list(stack.scheme.parameters()) == []


@pytest.mark.parametrize("kind", list(SCHEMES))
def test_forward_runs_the_same_loop(kind):
    stack = make(kind, 4, random_scheme=kind != "standard")
    x = torch.randn(B, T, C)
    subs = [lambda h, n=n, f=f: f(n(h)) for n, f in zip(stack.norms, stack.fs)]
    assert torch.equal(stack.scheme(x, subs), stack(x))
    if stack.scheme.n_sublayers is not None:
        with pytest.raises(ValueError, match="sub-layers"):
            stack.scheme(x, subs[:-1])


# -------------------------------------------------------------------------------------- HC at init


@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("n_streams", [1, 2, 4])
def test_hyper_at_init_is_the_standard_residual(dynamic, n_streams):
    """Paper init (a = e_{i mod n}, A = I, b = 1, W = 0): inputs exactly standard, collapse = n x standard."""
    L = 6
    torch.manual_seed(0)
    std = ToyStack(StandardResidual(), L)
    hc = ToyStack(HyperConnections(C, L, n_streams, dynamic=dynamic), L)
    hc.load_state_dict(std.state_dict(), strict=False)
    x = torch.randn(B, T, C)
    rec_std, rec_hc = [], []
    out_std, out_hc = std(x, rec_std), hc(x, rec_hc)
    for a, b in zip(rec_std, rec_hc):
        assert torch.equal(a, b)
    torch.testing.assert_close(out_hc, n_streams * out_std, rtol=1e-6, atol=1e-6)


def test_hyper_init_values():
    hc = HyperConnections(C, 6, 4)
    assert torch.equal(hc.width.argmax(-1), torch.tensor([0, 1, 2, 3, 0, 1]))
    assert torch.equal(hc.width.sum(-1), torch.ones(6))
    assert torch.equal(hc.mix, torch.eye(4).expand(6, 4, 4))
    assert torch.equal(hc.depth, torch.ones(6, 4))
    assert torch.equal(hc.alpha_scale, torch.full((6,), 0.01))
    assert hc.width_proj.abs().sum() == 0 and hc.mix_proj.abs().sum() == 0 and hc.depth_proj.abs().sum() == 0


def test_hyper_dynamic_weights_depend_on_the_token():
    hc = randomise(HyperConnections(C, 2, 4))
    H = torch.randn(B, T, 4, C)
    a = hc.width_connection(H, 0)
    b, A = hc.depth_and_mix(H, 0)
    assert a.shape == (B, T, 4) and b.shape == (B, T, 4) and A.shape == (B, T, 4, 4)
    assert not torch.allclose(a[0, 0], a[0, 1])


# ------------------------------------------------------------------------------------- mHC at init


@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("n_streams", [2, 4])
def test_mhc_at_init_is_the_standard_residual(dynamic, n_streams):
    """pre = 1/n, post = 1, R row-stochastic: streams stay equal; inputs and collapse = standard (~1e-6)."""
    L = 6
    torch.manual_seed(0)
    std = ToyStack(StandardResidual(), L)
    mhc = ToyStack(ManifoldHyperConnections(C, L, n_streams, dynamic=dynamic), L)
    mhc.load_state_dict(std.state_dict(), strict=False)
    x = torch.randn(B, T, C)
    rec_std, rec_mhc = [], []
    out_std, out_mhc = std(x, rec_std), mhc(x, rec_mhc)
    for a, b in zip(rec_std, rec_mhc):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_mhc, out_std, rtol=1e-5, atol=1e-5)
    pre = mhc.scheme.read_weights(mhc.scheme.expand(x), 0)
    post, R = mhc.scheme.write_and_mix(mhc.scheme.expand(x), 0)
    torch.testing.assert_close(pre, torch.full_like(pre, 1 / n_streams))
    torch.testing.assert_close(post, torch.ones_like(post))
    torch.testing.assert_close(R.diagonal(dim1=-2, dim2=-1), torch.full_like(post, 0.7))
    torch.testing.assert_close(R.sum(-1), torch.ones_like(post))


# ---------------------------------------------------------------------------------------- Sinkhorn


def sinkhorn_reference(logits: Tensor, iters: int) -> Tensor:
    """The textbook iteration on exp(logits): divide rows by their sums, then columns."""
    m = logits.exp()
    for _ in range(iters):
        m = m / m.sum(-1, keepdim=True)
        m = m / m.sum(-2, keepdim=True)
    return m


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sinkhorn_is_doubly_stochastic(n):
    torch.manual_seed(n)
    logits = torch.randn(32, n, n) * 0.5
    m = sinkhorn(logits, 20)
    assert (m > 0).all()
    torch.testing.assert_close(m.sum(-1), torch.ones(32, n), rtol=0, atol=1e-4)
    torch.testing.assert_close(m.sum(-2), torch.ones(32, n), rtol=0, atol=1e-4)
    torch.testing.assert_close(m, sinkhorn_reference(logits, 20), rtol=1e-5, atol=1e-6)
    # a shift of a whole row or column of the logits is a diagonal scaling: same projection
    shifted = logits + torch.randn(32, n, 1) + torch.randn(32, 1, n)
    torch.testing.assert_close(sinkhorn(shifted, 20), m, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sinkhorn_sharp_logits_columns_exact_rows_need_iterations(n):
    """Documented limit: 20 iterations leave row errors for sharp logits; columns are exact; more converge."""
    torch.manual_seed(n)
    logits = torch.randn(32, n, n) * 2
    m = sinkhorn(logits, 20)
    assert (m > 0).all()
    torch.testing.assert_close(m.sum(-2), torch.ones(32, n), rtol=0, atol=1e-5)
    m = sinkhorn(logits, 500)
    torch.testing.assert_close(m.sum(-1), torch.ones(32, n), rtol=0, atol=1e-4)
    torch.testing.assert_close(m.sum(-2), torch.ones(32, n), rtol=0, atol=1e-5)


def test_sinkhorn_extreme_logits_stay_finite():
    logits = torch.tensor([[200.0, -200.0], [-200.0, 200.0]])
    m = sinkhorn(logits, 20)
    assert torch.isfinite(m).all()
    torch.testing.assert_close(m.sum(-2), torch.ones(2))


def test_sinkhorn_is_differentiable():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: sinkhorn(z, 5), (logits,))
    (sinkhorn(logits, 20) * torch.randn(3, 4, 4, dtype=torch.float64)).sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="iters"):
        sinkhorn(logits, 0)


@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("n_streams", [2, 4, 8])
def test_mhc_mappings_are_constrained_for_random_parameters(dynamic, n_streams):
    """Moderate random parameters: R doubly stochastic to 1e-4 at the default 20 iterations. Strongly
    random ones (sharp logits): still positive with exact columns (rows: see the sinkhorn docstring)."""
    H = torch.randn(B, T, n_streams, C)
    for scale, row_atol in ((0.1, 1e-4), (1.0, None)):
        mhc = randomise(ManifoldHyperConnections(C, 3, n_streams, dynamic=dynamic), seed=n_streams, scale=scale)
        for i in range(3):
            pre = mhc.read_weights(H, i)
            post, R = mhc.write_and_mix(H, i)
            assert ((pre >= 0) & (pre <= 1)).all() and ((post >= 0) & (post <= 2)).all()  # saturate in fp32
            assert (R > 0).all() if row_atol is not None else (R >= 0).all()  # exp underflows when sharp
            ones = torch.ones(R.shape[:-1])
            torch.testing.assert_close(R.sum(-2), ones, rtol=0, atol=1e-5)
            if row_atol is not None:
                torch.testing.assert_close(R.sum(-1), ones, rtol=0, atol=row_atol)
            if dynamic:
                assert R.shape == (B, T, n_streams, n_streams) and not torch.allclose(R[0, 0], R[1, 3])


def test_mhc_conserves_the_stream_mean_and_never_amplifies():
    """f = 0: collapse(expand(x)) through every sub-layer is x (any parameters), and ||H|| never grows."""
    L = 8
    x = torch.randn(B, T, C)
    spread = torch.randn(B, T, 4, C)
    spread = spread - spread.mean(-2, keepdim=True)  # make the streams differ, so R really mixes something
    for scale in (0.1, 1.0):
        mhc = randomise(ManifoldHyperConnections(C, L, 4), scale=scale)
        state = mhc.expand(x) + spread
        for i in range(L):
            new = mhc.add(state, torch.zeros(B, T, C), i)
            torch.testing.assert_close(new.mean(-2), x, rtol=0, atol=1e-5)
            if scale == 0.1:  # rows exact to ~1e-7 here, so ||R||_2 <= 1
                assert (new.norm(dim=(-2, -1)) <= state.norm(dim=(-2, -1)) * (1 + 1e-5)).all()
            state = new
        torch.testing.assert_close(mhc.collapse(state), x, rtol=0, atol=1e-5)
    # with an output y: the mean moves by mean_k(post_k) y exactly
    y1 = torch.randn(B, T, C)
    post, _ = mhc.write_and_mix(state, 0)
    torch.testing.assert_close(mhc.add(state, y1, 0).mean(-2), x + post.mean(-1, keepdim=True) * y1,
                               rtol=0, atol=1e-5)
    # HC's unconstrained mixing does not conserve it (the test is not vacuous)
    hc = randomise(HyperConnections(C, L, 4), scale=1.0)
    assert not torch.allclose(hc.add(hc.expand(x) + spread, torch.zeros(B, T, C), 0).mean(-2), x, atol=1e-3)


# ------------------------------------------------------------------------------------------ AttnRes


def uniform_mean(vs: list[Tensor]) -> Tensor:
    return torch.stack(vs).mean(0)


def test_attnres_zero_queries_read_the_uniform_mean():
    L = 4
    ar = AttentionResiduals(C, L)
    assert torch.equal(ar.queries, torch.zeros(L, C))
    x, ys = torch.randn(B, T, C), [torch.randn(B, T, C) for _ in range(L)]
    state = ar.expand(x)
    for i in range(L):
        torch.testing.assert_close(ar.layer_input(state, i), uniform_mean([x, *ys[:i]]))
        w = ar.depth_weights(state, i)
        torch.testing.assert_close(w, torch.full((B, T, i + 1), 1 / (i + 1)))
        state = ar.add(state, ys[i], i)
    torch.testing.assert_close(ar.collapse(state), uniform_mean([x, *ys]))
    assert len(state.values) == L + 1 and state.partial is None


def test_attnres_block_sums_outputs_inside_a_block():
    L = 5
    ar = AttentionResiduals(C, L, block_size=2)
    x, y = torch.randn(B, T, C), [torch.randn(B, T, C) for _ in range(L)]
    b0, b1 = y[0] + y[1], y[2] + y[3]
    expected = [x, uniform_mean([x, y[0]]), uniform_mean([x, b0]), uniform_mean([x, b0, y[2]]),
                uniform_mean([x, b0, b1])]
    state = ar.expand(x)
    for i in range(L):
        torch.testing.assert_close(ar.layer_input(state, i), expected[i])
        state = ar.add(state, y[i], i)
    torch.testing.assert_close(ar.collapse(state), uniform_mean([x, b0, b1, y[4]]))
    assert len(state.values) == 3 and state.partial is not None  # x, b0, b1 + the unfinished y4


def test_attnres_weights_by_hand():
    L, eps = 3, 1e-5
    ar = randomise(AttentionResiduals(C, L, eps=eps), scale=1.0)
    x, ys = torch.randn(B, T, C), [torch.randn(B, T, C) * (j + 1) for j in range(L)]
    state = ar.expand(x)
    for y_i, i in zip(ys, range(L)):
        state = ar.add(state, y_i, i)
    srcs = [x, *ys]
    b, t = 1, 3
    q = ar.queries[L - 1]  # the collapse's query
    logits = torch.stack([q @ (v[b, t] / torch.sqrt(v[b, t].pow(2).mean() + eps)) for v in srcs])
    w = torch.softmax(logits, 0)
    got_w = ar.depth_weights(state, L)
    torch.testing.assert_close(got_w[b, t], w)
    torch.testing.assert_close(got_w.sum(-1), torch.ones(B, T))
    torch.testing.assert_close(ar.collapse(state)[b, t], sum(w[j] * srcs[j][b, t] for j in range(L + 1)))


def test_attnres_gradients_reach_the_queries_at_init():
    stack = make("attnres", 4)
    stack(torch.randn(B, T, C)).pow(2).sum().backward()
    g = stack.scheme.queries.grad
    assert g is not None and (g.abs().sum(-1) > 0).all()


# ----------------------------------------------------------------------------------- every scheme


@pytest.mark.parametrize("kind", list(SCHEMES))
def test_position_wise_token_by_token_equals_full_sequence(kind):
    """What KV-cache decoding needs: T = 1 at a time gives the full-sequence result."""
    stack = make(kind, 4, random_scheme=kind != "standard")
    x = torch.randn(B, T, C)
    full = stack(x)
    steps = torch.cat([stack(x[:, t : t + 1]) for t in range(T)], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", list(SCHEMES))
def test_shapes(kind):
    L = 4
    scheme = SCHEMES[kind](C, L)
    x = torch.randn(B, T, C)
    state = scheme.expand(x)
    if isinstance(scheme, HyperConnections | ManifoldHyperConnections):
        assert state.shape == (B, T, N_STREAMS, C)
    elif isinstance(scheme, AttentionResiduals):
        assert isinstance(state, DepthHistory)
    else:
        assert state.shape == (B, T, C)
    for i in range(L):
        h = scheme.layer_input(state, i)
        assert h.shape == (B, T, C)
        before = [v.clone() for v in state.values] if isinstance(state, DepthHistory) else state.clone()
        new = scheme.add(state, torch.randn(B, T, C), i)
        if isinstance(state, DepthHistory):  # states are never modified in place
            assert all(torch.equal(a, b) for a, b in zip(before, state.values))
        else:
            assert torch.equal(before, state)
        state = new
    assert scheme.collapse(state).shape == (B, T, C)


@pytest.mark.parametrize("kind", WITH_PARAMS)
def test_every_parameter_gets_a_gradient(kind):
    """Connected at init (grad not None); away from init, nonzero for every sub-layer's slice."""
    L = 4
    for random_scheme in (False, True):
        stack = make(kind, L, random_scheme=random_scheme)
        x = torch.randn(B, T, C)
        (stack(x) * torch.randn(B, T, C)).sum().backward()
        for name, p in stack.scheme.named_parameters():
            assert p.grad is not None, name
            if random_scheme:
                per_slice = p.grad.reshape(L, -1).abs().sum(-1) if p.shape[0] == L else p.grad.abs().sum()
                assert (per_slice > 0).all(), name


@pytest.mark.parametrize("kind", list(SCHEMES))
def test_tiny_training_run_reduces_the_loss(kind):
    L, d = 4, 8
    torch.manual_seed(0)
    stack = ToyStack(SCHEMES[kind](d, L), L, d=d, hidden=16)
    final_norm, head = LayerNorm(d), nn.Linear(d, d)
    params = [*stack.parameters(), *final_norm.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-2)
    x = torch.randn(16, 4, d)
    target = torch.sin(x @ torch.randn(d, d)) + 0.5 * x
    losses = []
    for _ in range(100):
        loss = F.mse_loss(head(final_norm(stack(x))), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])


# ---------------------------------------------------------------------------------- build / errors


def test_build_residual():
    expected = {"standard": StandardResidual, "hyper": HyperConnections, "mhc": ManifoldHyperConnections,
                "attnres": AttentionResiduals}
    assert set(expected) == set(RESIDUALS)
    for kind, cls in expected.items():
        assert type(build_residual(kind, C, 4)) is cls
    assert build_residual("hyper", C, 4, n_streams=2).n_streams == 2
    assert build_residual("mhc", C, 4, n_streams=3).res_bias.shape == (4, 3, 3)
    with pytest.raises(ValueError, match=r"standard.*hyper.*mhc.*attnres"):
        build_residual("highway", C, 4)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_streams"):
        ManifoldHyperConnections(C, 4, n_streams=1)
    with pytest.raises(ValueError, match="sinkhorn_iters"):
        ManifoldHyperConnections(C, 4, sinkhorn_iters=0)
    with pytest.raises(ValueError, match="res_diag_init"):
        ManifoldHyperConnections(C, 4, res_diag_init=1.0)
    with pytest.raises(ValueError, match="block_size"):
        AttentionResiduals(C, 4, block_size=0)
    with pytest.raises(ValueError, match="n_streams"):
        HyperConnections(C, 4, n_streams=0)


# ------------------------------------------------------------------ as ModelConfig.residual in the GPT


def _gpt(residual: str, **extra):
    from attnlab.models import build_model

    torch.manual_seed(0)
    cfg = dict(vocab_size=20, block_size=24, n_layer=3, n_head=4, d_model=32, residual=residual)
    return build_model(GPTConfig(**{**cfg, **extra})).eval()


@pytest.mark.parametrize("residual", ["hyper", "mhc", "attnres"])
def test_gpt_residual_scheme_is_used_and_decodes_with_cache(residual):
    from attnlab.generation import SamplingConfig, generate

    model = _gpt(residual)
    assert model.residual is not None and model.residual.n_sublayers == 6
    idx = torch.randint(0, 20, (2, 24))
    full = model(idx).logits
    cache = model.new_cache(2)
    steps = [model(idx[:, :10], cache=cache).logits]
    steps += [model(idx[:, t : t + 1], cache=cache).logits for t in range(10, 24)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    prompt = idx[:, :5]
    cfg = dict(max_new_tokens=25, temperature=1.0, seed=2)
    assert torch.equal(generate(model, prompt, SamplingConfig(**cfg)),
                       generate(model, prompt, SamplingConfig(**cfg, use_cache=False)))


@pytest.mark.parametrize("residual", ["hyper", "mhc", "attnres"])
def test_gpt_residual_scheme_gets_gradients_and_round_trips(residual, tmp_path):
    from attnlab.models import from_pretrained

    model = _gpt(residual).train()
    idx = torch.randint(0, 20, (2, 12))
    model(idx, idx).loss.backward()
    assert all(p.grad is not None for p in model.residual.parameters())
    model.eval().save_pretrained(tmp_path / "m")
    assert torch.equal(from_pretrained(tmp_path / "m")(idx).logits, model(idx).logits)


def test_standard_residual_keeps_the_plain_path():
    assert _gpt("standard").residual is None


def test_residual_scheme_needs_pre_norm():
    from attnlab.core.errors import ConfigError
    from attnlab.core.schema import from_dict
    from attnlab.models import ModelConfig

    with pytest.raises(ConfigError, match="needs norm_position=pre"):
        from_dict(ModelConfig, dict(residual="hyper", norm_position="post"))
    with pytest.raises(ConfigError, match="residual_streams"):
        from_dict(ModelConfig, dict(residual="mhc", residual_streams=1))
