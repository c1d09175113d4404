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

Two ways to evaluate the recurrence give the same numbers:

- ``selective_scan_reference``: a Python loop over time, the specification;
- ``selective_scan``: the chunked ("SSD") form for training, a loop over T / chunk_size chunks.
  Inside a chunk the state has the closed form

      h_t = exp(L_t - L_0) h_0 + sum_{s <= t} exp(L_t - L_s) B̄_s x_s,    L_t = sum_{r <= t} Δ_r A

  where L is a cumulative sum of the log-decays (Ā = exp(Δ A), so products of Ā are sums in
  log space) and h_0 the state carried in from the previous chunk. The (chunk x chunk)
  "segment-sum" matrix L_t - L_s is masked to s <= t with -inf *before* the exponential, so every
  exponent that is evaluated is <= 0: nothing overflows, however large Δ is.

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


# ------------------------------------------------------------------------------------- scans


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The scan runs in at least float32: cumulative sums and exponentials in fp16/bf16 drift."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def selective_scan_reference(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    return_final_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The selective scan as a sequential loop over time — the specification.

        h_t = exp(Δ_t A) h_{t-1} + (Δ_t B_t) x_t,      y_t = C_t h_t + D x_t

    Shapes: u, delta (B, T, d); A (d, N); B, C (B, T, N); D (d,); initial_state h_0 (B, d, N),
    zeros if omitted. Returns y (B, T, d) in u's dtype, and with ``return_final_state`` also
    h_T (B, d, N) in the compute dtype (float32 or float64).
    """
    out_dtype, dt = u.dtype, _compute_dtype(u.dtype)
    with torch.autocast(u.device.type, enabled=False):
        u, delta, A, B, C = u.to(dt), delta.to(dt), A.to(dt), B.to(dt), C.to(dt)
        batch, T, d = u.shape
        h = u.new_zeros(batch, d, A.size(-1)) if initial_state is None else initial_state.to(dt)  # (B, d, N)
        ys = []
        for t in range(T):
            decay = torch.exp(delta[:, t, :, None] * A)  # Ā_t (B, d, N)
            write = (delta[:, t] * u[:, t])[:, :, None] * B[:, t, None, :]  # B̄_t x_t (B, d, N)
            h = decay * h + write
            ys.append((h * C[:, t, None, :]).sum(-1))  # C_t h_t (B, d)
        y = torch.stack(ys, dim=1) if ys else u.new_zeros(batch, 0, d)  # (B, T, d)
        if D is not None:
            y = y + u * D.to(dt)
    y = y.to(out_dtype)
    return (y, h) if return_final_state else y


# Elements in one block of (chunk x chunk) decay matrices. The matrices are built, used and
# dropped block by block: peak memory stays bounded however long the sequence, and a block small
# enough to stay in cache (1 MiB in float32) makes the several passes over it cheap — on CPU the
# scan is bound by memory traffic, not arithmetic.
_DECAY_BLOCK_ELEMENTS = 1 << 18


def _decay_matrix(cum: Tensor) -> Tensor:
    """exp(L_t - L_s) for s <= t, else 0: cum L (R, l, K) -> (R, l_t, l_s, K).

    The upper triangle is filled with -inf *before* the exponential, so no positive exponent is
    ever evaluated (L is non-increasing within a chunk). Exponents are then clamped from below at
    0.9 log(smallest normal float) and the masked entries zeroed after the exponential: exp of -inf
    or of anything that lands among the subnormals is ~5x slower on CPUs (a microcode assist per
    element), and the clamp changes a weight by at most ~1e-34 (float32) / ~1e-277 (float64).
    """
    l = cum.size(1)
    upper = torch.ones(l, l, dtype=torch.bool, device=cum.device).triu(1)[:, :, None]  # (l_t, l_s, 1): s > t
    floor = 0.9 * math.log(torch.finfo(cum.dtype).tiny)  # exp(floor) ~ 1e-34 (fp32), 1e-277 (fp64): normal
    segsum = cum.unsqueeze(2) - cum.unsqueeze(1)  # L_t - L_s (R, l_t, l_s, K)
    segsum = segsum.masked_fill_(upper, float("-inf")).clamp_(min=floor)
    return segsum.exp_().masked_fill_(upper, 0.0)


def _blocks(rows: int, l: int, cols: int) -> list[tuple[slice, slice]]:
    """(row, column) slices of an (R, l, K) tensor whose decay matrices fit the block budget."""
    col_step = max(1, min(cols, _DECAY_BLOCK_ELEMENTS // (l * l)))
    row_step = max(1, _DECAY_BLOCK_ELEMENTS // (l * l * col_step))
    return [(slice(r, r + row_step), slice(k, k + col_step))
            for r in range(0, rows, row_step) for k in range(0, cols, col_step)]


class _IntraChunkScan(torch.autograd.Function):
    """states_t = sum_{s <= t} exp(L_t - L_s) w_s within one chunk, with a recompute backward.

    cum L and w (B, l, d, N) -> states (B, l, d, N). Each (batch, channel, state) is an
    independent (l x l) problem; the decay matrices are built block by block (at most
    ``_DECAY_BLOCK_ELEMENTS`` at a time) and never stored: the backward rebuilds them. With
    g = dLoss/dstates, per (batch, channel, state):

        dw_s = sum_{t >= s} exp(L_t - L_s) g_t,      dL_t = g_t states_t - w_t dw_t

    (L_t enters its own row of the matrix with + and its own column with -), so only L, w and the
    output are saved: O(B · l · d · N) like the sequential scan, not O(B · l² · d · N).
    Not twice differentiable.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, cum: Tensor, write: Tensor) -> Tensor:
        shape = cum.shape
        cum = cum.reshape(shape[0], shape[1], -1)  # (B, l, d, N) -> (B, l, K = d*N)
        write = write.reshape(cum.shape)  # (B, l, K)
        states = torch.empty_like(write)
        for rows, cols in _blocks(*cum.shape):
            decay = _decay_matrix(cum[rows, :, cols])  # (R, l_t, l_s, K)
            states[rows, :, cols] = decay.mul_(write[rows, None, :, cols]).sum(2)  # sum over s
        ctx.save_for_backward(cum, write, states)
        return states.view(shape)  # (B, l, K) -> (B, l, d, N)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, Tensor]:
        cum, write, states = ctx.saved_tensors
        shape = grad.shape
        grad = grad.reshape(cum.shape)  # (B, l, d, N) -> (B, l, K)
        grad_write = torch.empty_like(write)
        for rows, cols in _blocks(*cum.shape):
            decay = _decay_matrix(cum[rows, :, cols])  # (R, l_t, l_s, K)
            grad_write[rows, :, cols] = decay.mul_(grad[rows, :, None, cols]).sum(1)  # sum over t
        grad_cum = grad * states - write * grad_write
        return grad_cum.view(shape), grad_write.view(shape)  # (B, l, K) -> (B, l, d, N)


def selective_scan(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    return_final_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The selective scan in chunks (Mamba-2's SSD "chunked" algorithm with a diagonal A).

    Same inputs and outputs as ``selective_scan_reference``. The sequence is cut into chunks of
    ``chunk_size`` steps (the last may be shorter) and a Python loop runs over the T / chunk_size
    chunks, never over time steps. Within a chunk, with log-decays a_r = Δ_r A (<= 0) and their
    cumulative sum L_t = a_1 + ... + a_t (restarted at every chunk, which keeps the values whose
    differences are taken small: less cancellation in float32), all steps at once:

        h_t = exp(L_t) h_0 + sum_{s <= t} exp(L_t - L_s) B̄_s x_s,      y_t = C_t h_t + D x_t

    where h_0 is the state carried in from the previous chunk (its last h_t). The segment sums
    L_t - L_s = a_{s+1} + ... + a_t form a (chunk x chunk) lower-triangular matrix per (batch,
    channel, state), masked with -inf above the diagonal before the exponential (``_decay_matrix``).

    Cost and memory. A is diagonal per (channel, state), not one scalar per head as in Mamba-2,
    so the decay matrix cannot be shared across the state dimension: a chunk needs
    B · d_inner · d_state · chunk² decay weights — chunk times the arithmetic of the sequential
    scan, traded for T / chunk Python iterations instead of T. Those matrices are built in
    cache-sized blocks and recomputed in the backward (``_IntraChunkScan``), so what autograd
    keeps is O(B · T · d_inner · d_state), as for the sequential scan, and the peak extra memory
    is one block. On a CPU, small chunks (4-16) are fastest; the chunk trades Python overhead,
    which dominates on a GPU, against arithmetic.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out_dtype, dt = u.dtype, _compute_dtype(u.dtype)
    with torch.autocast(u.device.type, enabled=False):
        u, delta, A, B, C = u.to(dt), delta.to(dt), A.to(dt), B.to(dt), C.to(dt)
        batch, _, d = u.shape
        h = u.new_zeros(batch, d, A.size(-1)) if initial_state is None else initial_state.to(dt)  # (B, d, N)
        ys = []
        for u_c, delta_c, B_c, C_c in zip(*(t.split(chunk_size, dim=1) for t in (u, delta, B, C))):
            cum = (delta_c.unsqueeze(-1) * A).cumsum(1)  # L_t = sum_{r <= t} Δ_r A (B, l, d, N)
            write = (delta_c * u_c).unsqueeze(-1) * B_c.unsqueeze(2)  # B̄_s x_s (B, l, d, N)
            states = _IntraChunkScan.apply(cum, write)  # sum_{s <= t} exp(L_t - L_s) B̄_s x_s (B, l, d, N)
            states = states + cum.exp() * h.unsqueeze(1)  # + exp(L_t) h_0: h_t (B, l, d, N)
            ys.append((states * C_c.unsqueeze(2)).sum(-1))  # C_t h_t (B, l, d)
            h = states[:, -1]  # carried into the next chunk (B, d, N)
        y = torch.cat(ys, dim=1) if ys else u.new_zeros(batch, 0, d)  # (B, T, d)
        if D is not None:
            y = y + u * D.to(dt)
    y = y.to(out_dtype)
    return (y, h) if return_final_state else y


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
    loop, and on a 2-core CPU (B=8, T=256, d_model=128, forward+backward) it measured 331 ms at chunk 4
    vs 354 ms for the loop and 2.6 s at chunk 64; larger chunks pay off where per-step overhead
    dominates (GPUs).
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
        return -torch.exp(self.A_log.to(_compute_dtype(self.A_log.dtype)))

    def new_state(
        self, batch_size: int, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> SSMState:
        """A zero ``SSMState`` (the state before the first token) for this layer.

        The default dtype is the parameters' if float32/float64, else float32: h accumulates over
        the whole sequence and would drift in half precision.
        """
        param = self.A_log
        return SSMState(batch_size, self.d_inner, self.d_state, self.d_conv,
                        dtype=dtype or _compute_dtype(param.dtype), device=device or param.device)

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
        y, h = selective_scan(
            xs, delta, self.A, B, C, self.D, chunk_size=self.chunk_size,
            initial_state=None if state is None else state.ssm_state, return_final_state=True,
        )
        if state is not None:
            state.ssm_state = h.to(state.ssm_state.dtype)
            state.length += T
        return self.out_proj(y * F.silu(z))  # (B, T, C)

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
        dt = _compute_dtype(xs.dtype)
        with torch.autocast(xs.device.type, enabled=False):
            u, delta, B, C = xs.to(dt), delta.to(dt), B.to(dt), C.to(dt)
            h = state.ssm_state.to(dt)  # (B, d_inner, N)
            h = torch.exp(delta.unsqueeze(-1) * self.A.to(dt)) * h + (delta * u).unsqueeze(-1) * B.unsqueeze(1)
            y = (h * C.unsqueeze(1)).sum(-1) + u * self.D.to(dt)  # (B, d_inner)
        state.ssm_state = h.to(state.ssm_state.dtype)
        state.length += 1
        return self.out_proj(y.to(xs.dtype) * F.silu(z))  # (B, C)
