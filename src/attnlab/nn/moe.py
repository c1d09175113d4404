"""Mixture-of-experts feed-forward: a top-k router over E FeedForward experts, with capacity.

Each token x_t (a row of the flattened (N, C) input, N = B T) is routed to k of E experts:

    logits_t = x_t W_r                       W_r: (C, E), no bias
    p_t      = softmax(logits_t)             (E,)
    S_t      = top-k indices of p_t          k = 1 Switch (Fedus et al. 2021), k = 2 Mixtral (Jiang et al. 2024)
    g_ti     = p_ti / sum_{j in S_t} p_tj    when normalize_top_k (Mixtral), else g_ti = p_ti (Switch)
    y_t      = sum_{i in S_t, kept} g_ti FFN_i(x_t)

where FFN_i computes exactly what ``attnlab.nn.blocks.FeedForward`` computes (relu/gelu/swiglu), with
its own weights. In training, ``router_jitter`` = eps multiplies the router input by noise drawn from
U(1 - eps, 1 + eps) (Switch), so x_t W_r above becomes (x_t * u_t) W_r; the experts see the clean x_t.

Capacity. Each expert takes at most

    capacity = ceil(capacity_factor * N * k / E)

token-assignments; the rest are dropped and contribute 0 (the residual connection outside the layer
carries such a token unchanged). Priority, as in GShard / Switch: all first choices come before all
second choices (and so on for rank k), and within a rank earlier token positions (in the flattened
B T order) come first. ``capacity_factor=None`` drops nothing, and neither does eval mode: capacity is a
training-time budget, and at inference a token's output must not depend on the other tokens in the batch.

Auxiliary losses (returned in ``MoEStats``; the caller weights and adds them to the training loss):

    aux_loss = E * sum_i f_i P_i             load balancing (Switch eq. 4)
    z_loss   = mean_t (logsumexp_i logits_ti)^2      router z-loss (ST-MoE, Zoph et al. 2022)

P_i = mean_t p_ti is the mean router probability of expert i (differentiable). f_i is the fraction of
routed assignments sent to expert i *before* capacity: for k = 1 the fraction of tokens whose top-1
choice is i (Switch); for k > 1 the count of (token, rank) assignments with expert i divided by N k,
so that sum_i f_i = 1 for every k and perfectly uniform routing (f_i = P_i = 1/E) gives aux_loss = 1.
f_i is piecewise constant (an argmax): gradients reach the router through P_i only.

Implementation: batched, no Python loop over tokens. The k N assignments, ordered (rank, token), get a
one-hot (k N, E) matrix; its cumulative sum down the rows gives each assignment's slot in its expert's
buffer, and slot < capacity keeps it. Kept tokens are scattered (index_put) into an (E, capacity, C)
buffer, every expert runs at once with one ``torch.baddbmm`` per layer on stacked weights, and the
outputs are gathered back, weighted by the gates and summed per token with ``index_add``. A dropped
assignment is not filtered out (a shape that depends on the routing breaks a compiled graph): it writes
to a spare slot past the capacity, which no expert reads, and its gate is 0.

Initialisation: every expert, and the router, is initialised like ``nn.Linear`` (weights and biases
U(-1/sqrt(fan_in), 1/sqrt(fan_in))), so one expert is distributed like a fresh FeedForward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn import roles
from attnlab.nn.activations import Activation


@dataclass
class MoEStats:
    """What one forward produced, for the training loss and for logging.

    aux_loss          E * sum_i f_i P_i (scalar; minimum 1 at uniform routing)
    z_loss            mean_t (logsumexp_i logits_ti)^2 (scalar)
    expert_load       (E,) fraction of the N k token-assignments each expert processed, after capacity;
                      expert_load.sum() == 1 - dropped_fraction
    dropped_fraction  fraction of the N k token-assignments dropped by the capacity limit (scalar)
    """

    aux_loss: Tensor
    z_loss: Tensor
    expert_load: Tensor
    dropped_fraction: Tensor


class MoEFeedForward(nn.Module):
    """Top-k routed mixture of E FeedForward experts; ``forward`` returns (y, MoEStats).

    Parameters (stacked over experts; ``n_in`` = 2 d_ff for swiglu, else d_ff):
        router.weight  (E, C)            w_in  (E, C, n_in)    b_in  (E, n_in)
                                         w_out (E, d_ff, C)    b_out (E, C)
    Expert i equals a FeedForward with fc_in.weight = w_in[i].T, fc_in.bias = b_in[i],
    fc_out.weight = w_out[i].T, fc_out.bias = b_out[i]. Dropout, when set, acts on the combined output.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int = 8,
        top_k: int = 2,
        capacity_factor: float | None = 1.25,
        activation: str = "gelu",
        bias: bool = True,
        dropout: float = 0.0,
        router_jitter: float = 0.0,
        normalize_top_k: bool = True,
    ) -> None:
        super().__init__()
        if n_experts < 1:
            raise ValueError(f"n_experts must be >= 1, got {n_experts}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be between 1 and n_experts={n_experts}, got {top_k}")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0 or None, got {capacity_factor}")
        self.act = Activation(activation)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if not 0.0 <= router_jitter < 1.0:
            raise ValueError(f"router_jitter must be in [0, 1), got {router_jitter}")
        self.d_model = d_model
        self.d_ff = d_ff
        self.n_experts = n_experts
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.activation = activation
        self.dropout = dropout
        self.router_jitter = router_jitter
        self.normalize_top_k = normalize_top_k

        n_in = 2 * d_ff if activation == "swiglu" else d_ff
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.w_in = nn.Parameter(torch.empty(n_experts, d_model, n_in))
        self.w_out = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.b_in = nn.Parameter(torch.empty(n_experts, n_in)) if bias else None
        self.b_out = nn.Parameter(torch.empty(n_experts, d_model)) if bias else None
        roles.declare(self, "w_in", roles.EXPERT)
        roles.declare(self, "w_out", roles.EXPERT, roles.RESIDUAL_OUT)
        if bias:  # (n_experts, n) biases are 2-D: without the role they would be weight-decayed
            roles.declare(self, "b_in", roles.EXPERT, roles.NO_WEIGHT_DECAY)
            roles.declare(self, "b_out", roles.EXPERT, roles.NO_WEIGHT_DECAY)
        self.reset_parameters()

    def init_like_dense(self, std: float) -> None:
        """Initialise every expert like the dense FFN it replaces: weights ~ N(0, std), biases 0."""
        for p in (self.w_in, self.w_out):
            nn.init.normal_(p, mean=0.0, std=std)
        for p in (self.b_in, self.b_out):
            if p is not None:
                nn.init.zeros_(p)

    def reset_parameters(self) -> None:
        """nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases."""
        self.router.reset_parameters()
        for w, b, fan_in in ((self.w_in, self.b_in, self.d_model), (self.w_out, self.b_out, self.d_ff)):
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(w, -bound, bound)
            if b is not None:
                nn.init.uniform_(b, -bound, bound)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_ff={self.d_ff}, n_experts={self.n_experts}, top_k={self.top_k}, "
            f"capacity_factor={self.capacity_factor}, activation={self.activation!r}, "
            f"normalize_top_k={self.normalize_top_k}"
        )

    def capacity(self, n_tokens: int) -> int | None:
        """ceil(capacity_factor * N * k / E), at most N (no expert can get more); None = unlimited."""
        if self.capacity_factor is None:
            return None
        cap = math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts)
        return min(cap, n_tokens)

    def router_logits(self, x: Tensor) -> Tensor:
        """x (..., C) -> logits (..., E), in at least float32 (autocast off: the softmax is sensitive)."""
        if self.training and self.router_jitter > 0:
            noise = torch.empty_like(x).uniform_(1.0 - self.router_jitter, 1.0 + self.router_jitter)
            x = x * noise
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.linear(x.to(dtype), self.router.weight.to(dtype))

    def experts(self, buffer: Tensor) -> Tensor:
        """Run every expert on its own slots: buffer (E, S, C) -> (E, S, C), one batched matmul per layer."""
        if self.b_in is None:
            h = torch.bmm(buffer, self.w_in)  # (E, S, n_in)
        else:
            h = torch.baddbmm(self.b_in.unsqueeze(1), buffer, self.w_in)  # (E, S, n_in)
        h = self.act(h)  # (E, S, d_ff)
        if self.b_out is None:
            return torch.bmm(h, self.w_out)  # (E, S, C)
        return torch.baddbmm(self.b_out.unsqueeze(1), h, self.w_out)  # (E, S, C)

    def forward(self, x: Tensor) -> tuple[Tensor, MoEStats]:
        """x (B, T, C) (or any (..., C)) -> y of the same shape, and the routing statistics."""
        shape = x.shape
        E, k = self.n_experts, self.top_k
        x_flat = x.reshape(-1, shape[-1])  # (N, C)
        N = x_flat.shape[0]

        # ---- router
        logits = self.router_logits(x_flat)  # (N, E)
        probs = logits.softmax(dim=-1)  # (N, E)
        top_p, top_i = probs.topk(k, dim=-1)  # (N, k), (N, k); rank 0 = first choice
        gates = top_p / top_p.sum(dim=-1, keepdim=True) if self.normalize_top_k else top_p  # (N, k)

        # ---- assignments ordered (rank, token): all first choices, then all second choices, ...
        expert_idx = top_i.t().reshape(-1)  # (k N,)
        token_idx = torch.arange(N, device=x.device).repeat(k)  # (k N,)
        gate = gates.t().reshape(-1)  # (k N,)
        one_hot = F.one_hot(expert_idx, E)  # (k N, E)
        slot = one_hot.cumsum(dim=0).gather(1, expert_idx.unsqueeze(1)).squeeze(1) - 1  # (k N,)
        counts = one_hot.sum(dim=0)  # (E,) assignments per expert before capacity
        # capacity is a training-time compute budget; at inference every token reaches its experts,
        # so decoding token by token (with a KV cache) routes exactly like the full sequence
        capacity = self.capacity(N) if self.training else None
        if capacity is None:  # every assignment is kept: the smallest buffer that holds them all
            capacity = int(counts.max()) if N > 0 else 0
            keep = torch.ones_like(slot, dtype=torch.bool)  # (k N,)
        else:  # dropped assignments write to a spare slot S and are weighted 0 (shapes fixed by N alone)
            keep = slot < capacity  # (k N,)
            slot = torch.where(keep, slot, capacity)
            gate = torch.where(keep, gate, 0)

        # ---- dispatch, run all experts, combine
        buffer = x_flat.new_zeros(E, capacity + 1, shape[-1])  # (E, S + 1, C): slot S is the spare
        buffer = buffer.index_put((expert_idx, slot), x_flat[token_idx])  # (E, S + 1, C)
        out = self.experts(buffer[:, :capacity])  # (E, S, C)
        y_assign = out[expert_idx, slot.clamp(max=capacity - 1)] * gate.to(out.dtype).unsqueeze(1)  # (k N, C)
        y = out.new_zeros(N, shape[-1]).index_add(0, token_idx, y_assign)  # (N, C)
        if self.dropout > 0:
            y = F.dropout(y, self.dropout, self.training)

        # ---- statistics
        n_assign = max(N * k, 1)
        f = counts.to(probs.dtype) / n_assign  # (E,) pre-capacity fraction of assignments
        P = probs.mean(dim=0)  # (E,)
        aux_loss = E * (f * P).sum()
        z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
        kept = (one_hot * keep.unsqueeze(1)).sum(dim=0)  # (E,) assignments each expert processed
        expert_load = kept.to(probs.dtype) / n_assign  # (E,)
        dropped_fraction = (~keep).sum().to(probs.dtype) / n_assign
        stats = MoEStats(aux_loss=aux_loss, z_loss=z_loss, expert_load=expert_load, dropped_fraction=dropped_fraction)
        return y.reshape(shape), stats  # (B, T, C)
