"""The selective scan: the recurrence of a selective state-space layer (Mamba), evaluated two ways.

For every channel, with per-step decays Ā_t = exp(Δ_t A) and inputs B̄_t x_t = Δ_t B_t x_t:

    h_t = Ā_t h_{t-1} + B̄_t x_t,     y_t = C_t h_t + D x_t

Two ways to evaluate the recurrence give the same numbers:

- ``selective_scan_reference``: a Python loop over time, the specification;
- ``selective_scan``: the chunked ("SSD") form for training, a loop over T / chunk_size chunks.
  Inside a chunk the state has the closed form

      h_t = exp(L_t - L_0) h_0 + sum_{s <= t} exp(L_t - L_s) B̄_s x_s,    L_t = sum_{r <= t} Δ_r A

  where L is a cumulative sum of the log-decays (Ā = exp(Δ A), so products of Ā are sums in
  log space) and h_0 the state carried in from the previous chunk. The (chunk x chunk)
  "segment-sum" matrix L_t - L_s is masked to s <= t with -inf *before* the exponential, so every
  exponent that is evaluated is <= 0: nothing overflows, however large Δ is.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
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
    out_dtype, dt = u.dtype, compute_dtype(u.dtype)
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
    out_dtype, dt = u.dtype, compute_dtype(u.dtype)
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
