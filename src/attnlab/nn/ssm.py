"""Selective state-space model: the Mamba mixer (Gu & Dao 2023, Section 3 and Algorithm 2).

A linear state-space model maps a 1-D signal x(t) to y(t) through a hidden state h(t) in R^N:

    h'(t) = A h(t) + B x(t),        y(t) = C h(t) + D x(t)

Discretised with step Δ by zero-order hold (ZOH):

    Ā = exp(Δ A),                   B̄ = (Δ A)^-1 (exp(Δ A) - I) Δ B  ≈  Δ B

Mamba keeps the exact ZOH for A but uses the simplified first-order (Euler) form B̄ ≈ Δ B, and so
does this module. The discrete recurrence, run independently for every one of the d_inner channels:

    h_t = Ā_t h_{t-1} + B̄_t x_t,     y_t = C_t h_t + D x_t

A is diagonal, stored as (d_inner, d_state): every channel has its own d_state decay rates, all
negative (A = -exp(A_log)) so 0 < Ā <= 1 and the recurrence is stable. What makes it *selective*
is that Δ (B, T, d_inner), B and C (B, T, d_state) are computed from the input at every step, so
the model decides per token what to write into the state (B), what to read (C) and how fast to
forget (Δ: large Δ resets the state and focuses on the current token, small Δ keeps it).

Two ways to evaluate the recurrence give the same numbers (``attnlab.nn.selective_scan``): a
Python loop over time (the specification) and the chunked "SSD" form used for training.

For generation ``SSMState`` holds what the recurrence needs to continue — the last d_conv - 1
conv inputs and h — so a decoding step is O(1) in the sequence length (a KV cache grows with it).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn import roles
from attnlab.nn.mixing import BlockContext
from attnlab.nn.selective_scan import compute_dtype, selective_scan

# ------------------------------------------------------------------------------------- state


class SSMState:
    """The recurrent state of one ``SelectiveSSM`` layer, for incremental decoding.

    ``conv_state`` (B, d_inner, d_conv - 1) holds the last d_conv - 1 inputs of the causal
    convolution (a shift register: each step drops the oldest column and appends the new one);
    ``ssm_state`` (B, d_inner, d_state) is h_t. Both have a fixed size — memory is O(1) in the
    sequence length. ``length`` counts the tokens consumed so far (as ``KVCache.length`` does).
    """

    def __init__(
        self,
        batch_size: int,
        d_inner: int,
        d_state: int,
        d_conv: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.conv_state = torch.zeros(batch_size, d_inner, d_conv - 1, dtype=dtype, device=device)
        self.ssm_state = torch.zeros(batch_size, d_inner, d_state, dtype=dtype, device=device)
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Select/reorder batch rows in place (beam search keeps the surviving beams)."""
        self.conv_state = self.conv_state.index_select(0, index)
        self.ssm_state = self.ssm_state.index_select(0, index)


# ------------------------------------------------------------------------------------- mixer


class SelectiveSSM(nn.Module):
    """The Mamba mixer: a gated, input-selective SSM over a causal depthwise convolution.

        (x, z) = in_proj(u)                                  (B, T, d_inner) each, d_inner = expand * d_model
        x = SiLU(causal depthwise conv1d(x))                 kernel d_conv, left zero padding
        (δ, B, C) = x_proj(x)                                δ low rank (dt_rank), B, C (B, T, d_state)
        Δ = softplus(dt_proj(δ))                             (B, T, d_inner), one step size per channel
        y = selective_scan(x, Δ, A = -exp(A_log), B, C, D)
        out = out_proj(y * SiLU(z))

    Initialised as Mamba: A = -[1, 2, ..., d_state] in every channel (S4D-real), D = 1, the
    dt_proj bias set so softplus(bias) is log-uniform in [dt_min, dt_max], out_proj ~ N(0, 0.02).
    A model that re-initialises every ``nn.Linear`` (GPT's ``_init_weights``) overwrites the
    dt_proj bias: call ``reset_parameters()`` afterwards, or skip parameters flagged
    ``_no_reinit`` (A_log and D have the NO_WEIGHT_DECAY role, as in the reference code).

    ``chunk_size`` defaults to 4: the chunked scan does chunk-times the arithmetic of the sequential
    loop, which on a CPU costs more than the fewer, larger steps save; larger chunks pay off where
    per-step overhead dominates (GPUs). Measured in ``benchmarks/ssm_scan.py``; figures in docs/benchmarks.md.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        dt_rank: int | Literal["auto"] | None = None,
        bias: bool = False,
        conv_bias: bool = True,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        chunk_size: int = 4,
    ) -> None:
        super().__init__()
        if d_conv < 1:
            raise ValueError(f"d_conv must be >= 1, got {d_conv}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = expand * d_model
        self.dt_rank = math.ceil(d_model / 16) if dt_rank in (None, "auto") else int(dt_rank)
        self.dt_min, self.dt_max, self.chunk_size = dt_min, dt_max, chunk_size
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=bias)  # x and the gate z
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, groups=self.d_inner, padding=d_conv - 1,
                                bias=conv_bias)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)  # (δ, B, C)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(self.d_inner, d_state))
        self.D = nn.Parameter(torch.empty(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)
        roles.declare(self, "out_proj.weight", roles.RESIDUAL_OUT)
        roles.declare(self, "A_log", roles.NO_WEIGHT_DECAY)
        roles.declare(self, "D", roles.NO_WEIGHT_DECAY)
        self.dt_proj.bias._no_reinit = True  # type: ignore[attr-defined]
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Mamba's initialisation of the SSM parameters (the projections in/out keep torch's default
        except out_proj ~ N(0, 0.02); scaling it by depth is the caller's business)."""
        A = torch.arange(1, self.d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)  # (d_inner, N)
        self.A_log.copy_(torch.log(A))
        self.D.fill_(1.0)
        std = self.dt_rank**-0.5
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        # Δ_0 log-uniform in [dt_min, dt_max]; bias = softplus^-1(Δ_0) = Δ_0 + log(1 - exp(-Δ_0))
        log_min, log_max = math.log(self.dt_min), math.log(self.dt_max)
        dt = torch.exp(torch.rand(self.d_inner) * (log_max - log_min) + log_min)  # (d_inner,)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        nn.init.normal_(self.out_proj.weight, mean=0.0, std=0.02)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    @property
    def A(self) -> Tensor:
        """The diagonal state matrix A = -exp(A_log) (d_inner, d_state), strictly negative."""
        return -torch.exp(self.A_log.to(compute_dtype(self.A_log.dtype)))

    def new_state(
        self, batch_size: int, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> SSMState:
        """A zero ``SSMState`` (the state before the first token) for this layer.

        The default dtype is the parameters' if float32/float64, else float32: h accumulates over
        the whole sequence and would drift in half precision.
        """
        param = self.A_log
        return SSMState(batch_size, self.d_inner, self.d_state, self.d_conv,
                        dtype=dtype or compute_dtype(param.dtype), device=device or param.device)

    def new_cache(
        self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> SSMState:
        """The token-mixer protocol's cache: the recurrent state (its size does not grow with max_len)."""
        return self.new_state(batch_size, dtype=dtype, device=device)

    def mix(self, x: Tensor, ctx: BlockContext) -> Tensor:
        """The token-mixer protocol (``nn/mixing.py``): causal by construction, so no mask, positions or
        attention weights (a model refuses a padding mask or positions for an SSM layer)."""
        return self(x, state=ctx.cache)

    def _select(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Input-dependent (Δ, B, C) from the conv output x (..., d_inner)."""
        dbc = self.x_proj(x)  # (..., dt_rank + 2N)
        dt, B, C = dbc.split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt))  # (..., d_inner)
        return delta, B, C  # (..., d_inner), (..., N), (..., N)

    def forward(self, x: Tensor, state: SSMState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C).

        With ``state`` the sequence continues from it (a prompt prefill, or T = 1 for one
        generation step) and the state is advanced to the end of x; without, it starts from zeros.
        A single token with a state takes the O(1) recurrent ``step``.
        """
        T = x.size(1)
        if state is not None and T == 1:
            return self.step(x[:, 0], state).unsqueeze(1)  # (B, 1, C)
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, d_inner) each
        xs = xs.transpose(1, 2)  # (B, T, d_inner) -> (B, d_inner, T) for the conv
        if state is None:
            xs = self.conv1d(xs)[..., :T]  # padded both sides by d_conv - 1: keep the causal part
        else:
            window = torch.cat([state.conv_state.to(xs.dtype), xs], dim=-1)  # (B, d_inner, d_conv - 1 + T)
            state.conv_state = window[..., window.size(-1) - (self.d_conv - 1) :].to(state.conv_state.dtype)
            xs = F.conv1d(window, self.conv1d.weight, self.conv1d.bias, groups=self.d_inner)  # (B, d_inner, T)
        xs = F.silu(xs).transpose(1, 2)  # (B, d_inner, T) -> (B, T, d_inner)
        delta, B, C = self._select(xs)
        y, h = self._scan(xs, delta, B, C, None if state is None else state.ssm_state)
        if state is not None:
            state.ssm_state = h.to(state.ssm_state.dtype)
            state.length += T
        return self.out_proj(y * F.silu(z))  # (B, T, C)

    def _scan(self, u: Tensor, delta: Tensor, B: Tensor, C: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        """y = selective_scan(u, Δ, A, B, C, D) (B, T, d_inner) and the final state (B, d_inner, N), in the
        chunked form."""
        return selective_scan(u, delta, self.A, B, C, self.D, chunk_size=self.chunk_size, initial_state=h0,
                              return_final_state=True)

    def step(self, x_t: Tensor, state: SSMState) -> Tensor:
        """One token x_t (B, C) -> (B, C), advancing ``state`` in place: O(1) time and memory."""
        xs, z = self.in_proj(x_t).chunk(2, dim=-1)  # (B, d_inner) each
        window = torch.cat([state.conv_state.to(xs.dtype), xs.unsqueeze(-1)], dim=-1)  # (B, d_inner, d_conv)
        state.conv_state = window[..., 1:].to(state.conv_state.dtype)  # drop the oldest input
        xs = (window * self.conv1d.weight.squeeze(1)).sum(-1)  # depthwise conv at the last position (B, d_inner)
        if self.conv1d.bias is not None:
            xs = xs + self.conv1d.bias
        xs = F.silu(xs)
        delta, B, C = self._select(xs)  # (B, d_inner), (B, N), (B, N)
        dt = compute_dtype(xs.dtype)
        with torch.autocast(xs.device.type, enabled=False):
            u, delta, B, C = xs.to(dt), delta.to(dt), B.to(dt), C.to(dt)
            h = state.ssm_state.to(dt)  # (B, d_inner, N)
            h = torch.exp(delta.unsqueeze(-1) * self.A.to(dt)) * h + (delta * u).unsqueeze(-1) * B.unsqueeze(1)
            y = (h * C.unsqueeze(1)).sum(-1) + u * self.D.to(dt)  # (B, d_inner)
        state.ssm_state = h.to(state.ssm_state.dtype)
        state.length += 1
        return self.out_proj(y.to(xs.dtype) * F.silu(z))  # (B, C)
