"""nn/attention/kernels.py: the one table of attention routes, each against the eager reference, and the one rule
that picks a route per call."""

from __future__ import annotations

import pytest
import torch

from attnlab.core.errors import ConfigError
from attnlab.nn.attention import kernels
from attnlab.nn.attention.kernels import ROUTES, Route, attend, check_route, route_for
from attnlab.nn.attention.reference import causal_mask, combine_masks, scaled_dot_product_attention


def _reference(q, k, v, mask, bias, is_causal):
    """The specification, with grouped key/value heads repeated and the causal mask aligned to the end."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    if is_causal:
        mask = combine_masks(mask, causal_mask(q.size(-2), k.size(-2)))
    return scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)[0]


# (what, H_kv, T, S, D, dtype, with_mask, with_bias, is_causal, needs_grad): one call each route serves
CALLS = {
    "eager": ("padding mask, grouped heads", 2, 5, 7, 16, torch.float32, True, False, False, False),
    "sdpa": ("bias, causal", 4, 6, 6, 16, torch.float32, False, True, True, True),
    "tiled": ("mask and bias, causal", 4, 70, 70, 16, torch.float32, True, True, True, True),
    "bmm": ("bf16 training, short", 4, 16, 16, 32, torch.bfloat16, False, False, True, True),
    "sdpa-fp32": ("bf16, heads under 64, a mask", 4, 9, 9, 32, torch.bfloat16, True, False, False, False),
    "gqa-decode": ("one decoding query, grouped heads", 2, 1, 12, 16, torch.float32, False, False, True, False),
}


def _call(H_kv, T, S, D, dtype, with_mask, with_bias, is_causal, needs_grad, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, H = 2, 4
    q = torch.randn(B, H, T, D, generator=g).to(dtype).requires_grad_(needs_grad)
    k = torch.randn(B, H_kv, S, D, generator=g).to(dtype).requires_grad_(needs_grad)
    v = torch.randn(B, H_kv, S, D, generator=g).to(dtype).requires_grad_(needs_grad)
    mask = torch.rand(B, 1, T, S, generator=g) > 0.3 if with_mask else None
    bias = torch.randn(1, H, T, S, generator=g).to(dtype) if with_bias else None
    return q, k, v, mask, bias, None, 0.0, is_causal, H_kv != H


def test_every_route_of_the_table_has_a_call_here():
    nn_routes = {name for name, route in ROUTES.items() if route.function.__module__ == kernels.__name__}
    assert nn_routes == set(CALLS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_route_serves_its_call_and_agrees_with_the_reference(name):
    what, *shape = CALLS[name]
    call = _call(*shape)
    route = ROUTES[name]
    assert route.serves(*call), what
    q, k, v, mask, bias, _, _, is_causal, _ = call
    out = route.function(*call)
    ref = _reference(q.double(), k.double(), v.double(), mask, None if bias is None else bias.double(), is_causal)
    tol = 2e-2 if q.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    if q.requires_grad:  # and the backward pass
        grad = torch.randn_like(out)
        ours = torch.autograd.grad(out, (q, k, v), grad)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = _reference(q64, k64, v64, mask, None if bias is None else bias.double(), is_causal)
        theirs = torch.autograd.grad(ref, (q64, k64, v64), grad.double())
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a.double(), b, atol=10 * tol, rtol=10 * tol)


def test_the_rule_takes_a_stand_in_where_it_serves_the_call_else_the_route_asked_for():
    assert route_for("sdpa", *_call(*CALLS["bmm"][1:])) is ROUTES["bmm"]
    assert route_for("sdpa", *_call(*CALLS["sdpa-fp32"][1:])) is ROUTES["sdpa-fp32"]
    assert route_for("sdpa", *_call(*CALLS["gqa-decode"][1:])) is ROUTES["gqa-decode"]
    assert route_for("sdpa", *_call(*CALLS["sdpa"][1:])) is ROUTES["sdpa"]
    assert route_for("tiled", *_call(*CALLS["bmm"][1:])) is ROUTES["tiled"]  # stand-ins are sdpa's only
    assert route_for("eager", *_call(*CALLS["gqa-decode"][1:])) is ROUTES["eager"]


def test_a_registered_route_joins_the_table_and_hands_what_it_does_not_serve_to_its_instead(monkeypatch):
    monkeypatch.setattr(kernels, "ROUTES", dict(ROUTES))
    calls = []

    def doubled(*call):
        calls.append(call)
        return 2 * ROUTES["sdpa"].function(*call)

    kernels.register("doubled", Route(doubled, lambda *call: call[7], supports=frozenset(), instead="sdpa"))
    causal = _call(*CALLS["sdpa"][1:])
    assert torch.equal(attend("doubled", *causal), 2 * attend("sdpa", *causal)) and len(calls) == 1
    not_causal = _call(*CALLS["eager"][1:])
    assert torch.equal(attend("doubled", *not_causal), attend("sdpa", *not_causal)) and len(calls) == 1


def test_asking_a_route_for_what_it_does_not_compute_is_one_line_naming_the_routes_that_do():
    check_route("tiled", {"mask": "family=bert", "bias": "positions=alibi"}, 32, "model.attn_backend=tiled")
    with pytest.raises(ConfigError, match=r"^model\.attn_backend=tiled: the tiled route does not compute multi-head "
                                          r"latent attention \(mixer=latent\); routes that do: eager, sdpa$"):
        check_route("tiled", {"latent": "mixer=latent"}, 32, "model.attn_backend=tiled")
