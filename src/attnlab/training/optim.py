"""The optimiser: AdamW with decoupled weight decay on weight matrices only, or (``optimizer=muon``)
Muon for the hidden weight matrices with AdamW for the rest (``training/muon.py``).

    theta <- theta - lr * (m_hat / (sqrt(v_hat) + eps) + wd * theta)      (Loshchilov & Hutter 2019)

Biases, norm gains and parameters with the NO_WEIGHT_DECAY role (an SSM's A_log, D) are not decayed.
"""

from __future__ import annotations

import torch

from attnlab.nn import roles
from attnlab.training.config import TrainConfig


def hidden_matrices(model: torch.nn.Module) -> set[int]:
    """ids of the weights Muon updates: every ``nn.Linear`` weight but the output head's (embeddings,
    position tables, norms, biases, convolutions and 3-D expert banks are not linear layers' weights)."""
    head = getattr(model, "lm_head", None)
    return {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head
            and not (head is not None and m.weight is head.weight)}


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, fused: bool = True,
                   compute_dtype: str = "float32") -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices (dim >= 2) only: not on biases, norms' gains, nor on
    parameters whose module gives them the NO_WEIGHT_DECAY role (an SSM's A_log, experts' biases).
    ``fused``: one kernel for all parameters (the foreach path is used for FSDP's sharded DTensor parameters).
    ``compute_dtype``: what the run computes in ("float32" or "bfloat16"); Muon's Newton-Schulz runs in it."""
    exempt = {id(p) for _, p in roles.with_role(model, roles.NO_WEIGHT_DECAY)}
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2 and id(p) not in exempt]
    no_decay = [p for p in params if p.dim() < 2 or id(p) in exempt]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if cfg.optimizer == "muon":
        from attnlab.training.muon import MuonWithAdamW

        hidden = hidden_matrices(model)
        groups = [{"params": [p for p in decay if id(p) in hidden], "weight_decay": cfg.weight_decay, "muon": True,
                   "lr_ratio": cfg.muon_lr / cfg.lr},
                  {"params": [p for p in decay if id(p) not in hidden], "weight_decay": cfg.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return MuonWithAdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             ns_dtype=torch.bfloat16 if compute_dtype == "bfloat16" else torch.float32)
    kernel = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **kernel)


@torch.no_grad()
def state_is_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Every weight and every floating-point optimiser state (Adam's moments) is finite: one host sync.
    Under FSDP this rank's shards only (DTensor.to_local); the trainer combines the ranks' answers.
    The states may sit on two devices (torch's AdamW keeps its float ``step`` counter on the CPU while the
    moments are on the GPU), so each tensor's flag is brought to the first tensor's device before they meet."""
    tensors = [*model.parameters()] + [v for st in optimizer.state.values() for v in st.values()
                                       if torch.is_tensor(v) and v.is_floating_point()]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    if not local:
        return True
    device = local[0].device
    return bool(torch.stack([t.isfinite().all().to(device, non_blocking=True) for t in local]).all())
