"""Parameter roles: what a weight does, declared by the module that owns it.

A module lists its parameters' roles in ``param_roles`` (local name -> roles), e.g. attention says
its output projection writes into the residual stream. Initialisation, weight-decay groups and FLOP
counting ask for a role (``with_role(model, RESIDUAL_OUT)``) instead of matching parameter names,
so a new mixer or FFN that declares its roles is initialised, decayed and counted correctly.

    RESIDUAL_OUT      y = x + f(x) W_out: W_out's init is scaled by 1/sqrt(2L) (GPT-2)
    EXPERT            one of a mixture's E experts: a token passes through top_k / E of it (the
                      owning module has ``top_k`` and ``n_experts``)
    POSITION_TABLE    a table of position vectors: read by index, no matmul FLOPs
    LOOKUP_TABLE      a memory read by index only (an Engram's n-gram tables): no matmul FLOPs
    NO_WEIGHT_DECAY   never decayed (a state-space layer's A_log and D, the experts' biases)

Roles live on the modules, not on the Parameter objects, so they survive anything that replaces
the parameters (FSDP's sharding, ``load_state_dict(assign=True)``).
"""

from __future__ import annotations

from torch import nn

RESIDUAL_OUT = "residual_out"
EXPERT = "expert"
POSITION_TABLE = "position_table"
LOOKUP_TABLE = "lookup_table"
NO_WEIGHT_DECAY = "no_weight_decay"
ROLES = (RESIDUAL_OUT, EXPERT, POSITION_TABLE, LOOKUP_TABLE, NO_WEIGHT_DECAY)


def declare(module: nn.Module, name: str, *roles: str) -> None:
    """Give ``module``'s parameter ``name`` (a local dotted name such as ``"out_proj.weight"``) roles."""
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"unknown parameter role {unknown[0]!r}; choose from {ROLES}")
    table: dict[str, set[str]] = module.__dict__.setdefault("param_roles", {})
    table.setdefault(name, set()).update(roles)


def with_role(model: nn.Module, role: str) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) for every parameter of ``model`` with ``role``, in ``named_parameters`` order."""
    wanted: set[int] = set()
    for module in model.modules():
        for local, roles in module.__dict__.get("param_roles", {}).items():
            if role in roles:
                wanted.add(id(module.get_parameter(local)))
    return [(name, p) for name, p in model.named_parameters() if id(p) in wanted]
