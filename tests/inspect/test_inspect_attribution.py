"""attnlab.inspect.attribution: Captum attributions checked against autograd, completeness and
a manual occlusion loop; rollout checked by hand."""

from __future__ import annotations

import torch

from attnlab.inspect.attribution import attention_rollout, explain, next_token_logits, token_attributions
from tests.inspect_models import tiny_gpt


def test_attributions_match_definitions():
    model = tiny_gpt("sdpa", n_layer=2)
    idx = torch.tensor([[3, 7, 1, 9, 4, 4]])
    forward = next_token_logits(model)
    target = 5
    a = token_attributions(forward, model.tok_emb, idx, target, baseline_id=0, n_steps=200)
    # gradient x input by autograd
    emb = model.tok_emb(idx).detach().requires_grad_(True)
    handle = model.tok_emb.register_forward_hook(lambda m, i, o: emb)
    try:
        model(idx).logits[0, -1, target].backward()
    finally:
        handle.remove()
    torch.testing.assert_close(a["gradient_x_input"], (emb.grad * emb).sum(-1).detach(), atol=1e-5, rtol=1e-4)
    # integrated gradients: completeness, sum_t a_t = f(x) - f(baseline)
    with torch.no_grad():
        gap = forward(idx)[0, target] - forward(torch.zeros_like(idx))[0, target]
    assert abs(a["integrated_gradients"].sum().item() - gap.item()) < 1e-2 * max(1.0, abs(gap.item()))
    assert a["ig_delta"].abs().item() < 1e-2
    # occlusion: f(x) - f(x with token t -> 0), one token at a time
    with torch.no_grad():
        manual = []
        for t in range(idx.size(1)):
            x = idx.clone()
            x[0, t] = 0
            manual.append((forward(idx)[0, target] - forward(x)[0, target]).item())
    torch.testing.assert_close(a["occlusion"][0], torch.tensor(manual), atol=1e-5, rtol=1e-4)


def test_rollout_by_hand():
    # 2 layers, 1 head, T = 2: A = rownorm(P + I); rollout = A2 @ A1
    p1 = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])
    p2 = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]])
    a1 = torch.tensor([[1.0, 0.0], [0.25, 0.75]])
    a2 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    torch.testing.assert_close(attention_rollout([p1, p2])[0], a2 @ a1)
    eye = torch.eye(3).expand(1, 2, 3, 3)
    torch.testing.assert_close(attention_rollout([eye, eye, eye])[0], torch.eye(3))


def test_explain_gpt():
    model = tiny_gpt("tiled", n_layer=2)
    idx = torch.tensor([[1, 2, 3, 4, 5]])
    result = explain(model, idx, model.tok_emb, n_steps=32)
    assert result["target"].item() == model(idx).logits[0, -1].argmax().item()
    for k in ("rollout", "integrated_gradients", "gradient_x_input", "occlusion"):
        assert result[k].shape == (5,)
    torch.testing.assert_close(result["rollout"].sum(), torch.tensor(1.0))  # a row of a row-stochastic product
