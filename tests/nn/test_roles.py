"""Parameters by role: every projection that writes into the residual stream starts at init_std/sqrt(2L),
whatever the mixer, feed-forward and residual scheme; roles drive weight decay and FLOP counts."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from attnlab.models import GPTConfig, build_model
from attnlab.nn import roles
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.attention.latent import MultiHeadLatentAttention
from attnlab.nn.ffn import FeedForward
from attnlab.nn.moe import MoEFeedForward
from attnlab.nn.ssm import SelectiveSSM

MIXERS = ("attention", "latent", "ssm", "hybrid")
FFNS = ("dense", "moe")
RESIDUALS = ("standard", "hyper", "mhc", "attnres")
# the projection each module writes into the residual stream with (the equations' W_O / W_2 / W_out)
WRITERS = {MultiHeadAttention: "out_proj", MultiHeadLatentAttention: "w_o", SelectiveSSM: "out_proj",
           FeedForward: "fc_out", MoEFeedForward: "w_out"}


def _gpt(mixer: str, ffn: str, residual: str, n_layer: int = 4, d_model: int = 256):
    positions = "none" if mixer in ("latent", "ssm", "hybrid") else "learned"
    cfg = GPTConfig(family="gpt", vocab_size=50, block_size=16, n_layer=n_layer, n_head=4, d_model=d_model,
                      mixer=mixer, positions=positions, residual=residual, residual_streams=2,
                      moe_experts=4 if ffn == "moe" else 0, moe_top_k=1)
    torch.manual_seed(0)
    return build_model(cfg)


def _writers(model) -> list[torch.Tensor]:
    found = []
    for module in model.modules():
        for kind, attr in WRITERS.items():
            if isinstance(module, kind):
                p = getattr(module, attr)
                found.append(p.weight if isinstance(p, torch.nn.Linear) else p)
    return found


@pytest.mark.parametrize("mixer,ffn,residual", list(itertools.product(MIXERS, FFNS, RESIDUALS)))
def test_every_residual_writing_projection_has_the_scaled_init(mixer, ffn, residual):
    model = _gpt(mixer, ffn, residual)
    writers = _writers(model)
    by_role = {id(p) for _, p in roles.with_role(model, roles.RESIDUAL_OUT)}
    assert len(writers) == 2 * model.config.n_layer  # one mixer and one FFN per layer
    assert {id(p) for p in writers} == by_role  # the role finds exactly the writers
    want = model.config.init_std / math.sqrt(2 * model.config.n_layer)  # 0.02 / sqrt(8) = 0.00707
    for p in writers:
        assert abs(p.detach().std().item() - want) < 0.12 * want, (mixer, ffn, residual, p.shape)


def test_latent_attention_output_projection_is_scaled():
    """The bug that started this: with mixer=latent, W_O kept std 0.02 instead of 0.02/sqrt(2L)."""
    model = _gpt("latent", "dense", "standard", n_layer=8)
    w_o = model.blocks[0].mixer.w_o.weight
    assert abs(w_o.std().item() - 0.02 / 4) < 0.001


def test_weight_decay_and_flops_follow_the_roles():
    from attnlab.training.config import TrainConfig
    from attnlab.training.mfu import active_parameters
    from attnlab.training.optim import make_optimizer

    model = _gpt("hybrid", "moe", "standard")
    decayed = {id(p) for p in make_optimizer(model, TrainConfig(), fused=False).param_groups[0]["params"]}
    exempt = roles.with_role(model, roles.NO_WEIGHT_DECAY)
    names = {name.rsplit(".", 1)[-1] for name, _ in exempt}
    assert names == {"A_log", "D", "b_in", "b_out"}  # the SSM's state matrix and skip, the experts' biases
    assert not decayed & {id(p) for _, p in exempt}
    moe = next(m for m in model.modules() if isinstance(m, MoEFeedForward))
    expert_numel = sum(p.numel() for _, p in roles.with_role(model, roles.EXPERT))
    total = model.num_parameters()
    assert active_parameters(model) == total - expert_numel + expert_numel * moe.top_k // moe.n_experts


def test_a_role_must_be_known():
    with pytest.raises(ValueError, match="unknown parameter role"):
        roles.declare(torch.nn.Linear(2, 2), "weight", "residual")
