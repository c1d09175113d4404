"""The selective scan: the recurrence of a selective state-space layer (Mamba), evaluated two ways.

For every channel, with per-step decays Ā_t = exp(Δ_t A) and inputs B̄_t x_t = Δ_t B_t x_t:

    h_t = Ā_t h_{t-1} + B̄_t x_t,     y_t = C_t h_t + D x_t

Two ways to evaluate the recurrence give the same numbers:

- ``selective_scan_reference``: a Python loop over time, the specification;
- ``selective_scan``: the chunked ("SSD") form for training, many chunks at a time.
  Inside a chunk the state has the closed form

      h_t = exp(L_t - L_0) h_0 + sum_{s <= t} exp(L_t - L_s) B̄_s x_s,    L_t = sum_{r <= t} Δ_r A

  where L is a cumulative sum of the log-decays (Ā = exp(Δ A), so products of Ā are sums in
  log space) and h_0 the state carried in from the previous chunk. The exponents of the
  (chunk x chunk) "segment-sum" matrix L_t - L_s are clamped to <= 0 *before* the exponential and
  its upper triangle (s > t) zeroed after it, so no positive exponent is ever evaluated: nothing
  overflows, however large Δ is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
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

    L is non-increasing within a chunk, so L_t - L_s <= 0 for s <= t, and only the upper triangle
    (s > t) holds positive exponents, which could overflow: exponents are clamped to at most 0
    *before* the exponential, so no positive one is ever evaluated, and the upper triangle is
    zeroed after it. They are clamped from below at 0.9 log(smallest normal float) too: exp of
    anything that lands among the subnormals is ~5x slower on CPUs (a microcode assist per
    element), and the clamp changes a weight by at most ~1e-34 (float32) / ~1e-277 (float64).
    """
    l = cum.size(1)
    upper = torch.ones(l, l, dtype=torch.bool, device=cum.device).triu(1)[:, :, None]  # (l_t, l_s, 1): s > t
    floor = 0.9 * math.log(torch.finfo(cum.dtype).tiny)  # exp(floor) ~ 1e-34 (fp32), 1e-277 (fp64): normal
    segsum = cum.unsqueeze(2) - cum.unsqueeze(1)  # L_t - L_s (R, l_t, l_s, K)
    return segsum.clamp_(min=floor, max=0.0).exp_().masked_fill_(upper, 0.0)


def _blocks(rows: int, l: int, cols: int) -> list[tuple[slice, slice]]:
    """(row, column) slices of an (R, l, K) tensor whose decay matrices fit the block budget.

    Under ``torch.compile`` one block covers everything, and a loop of blocks would only be unrolled
    into a graph that takes minutes to compile. Inductor fuses the decay matrix's pointwise ops into
    the reductions that consume it, so the compiled pass keeps a fraction of the memory the matrices
    stored whole would take (``benchmarks/ssm_scan.py --compiled``; docs/benchmarks.md).
    """
    if torch.compiler.is_compiling():
        return [(slice(None), slice(None))]
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


def _linear_scan(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """x_c = a_c x_{c-1} + b_c from x_{-1} = 0 along dim 1, in log2(n) steps; returns (x, a_0 ... a_c).

    Composing step i then step j gives the step (a_i a_j, a_j b_i + b_j), an associative
    operation, so an inclusive (Hillis-Steele) scan doubles the span of every prefix per step.
    Products of decays in [0, 1] only shrink: nothing overflows.
    """
    n, k = a.size(1), 1
    while k < n:  # b_c <- a_c b_{c-k} + b_c, a_c <- a_{c-k} a_c, for c >= k
        b = torch.cat([b[:, :k], a[:, k:] * b[:, :-k] + b[:, k:]], dim=1)
        a = torch.cat([a[:, :k], a[:, :-k] * a[:, k:]], dim=1)
        k *= 2
    return b, a


class _Carry(torch.autograd.Function):
    """The states entering the chunks: H_{c-1} for c = 0 .. n-1, where H_c = a_c H_{c-1} + b_c, H_{-1} = h_0.

    a_c = exp(Λ_c) is chunk c's whole decay, from its log-decay Λ_c = L at the chunk's last step,
    and b_c its last state from a zero start, both (B, n, d, N); h_0 (B, d, N), or None for zeros.
    Forward: x = ``_linear_scan(a, b)`` is H with h_0 = 0 and P_c = a_0 ... a_c its products, so
    H_c = x_c + P_c h_0. Backward, with g_c the gradient of entering_c = H_{c-1}: the gradient
    reaching H_c runs back through the same kind of recurrence, G_c = a_{c+1} G_{c+1} + g_{c+1}
    (G_{n-1} = g_n = 0), scanned in reverse; then

        db_c = G_c,     dΛ_c = a_c G_c H_{c-1},     dh_0 = g_0 + a_0 G_0

    Only Λ (a view of L, which the intra-chunk scan keeps anyway) and the output are saved:
    autograd through the scan's steps would keep ~2 log2(n) tensors of this size.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, log_a: Tensor, b: Tensor, h0: Tensor | None) -> Tensor:
        x, products = _linear_scan(log_a.exp(), b)
        h = x if h0 is None else x + products * h0.unsqueeze(1)  # H_c (B, n, d, N)
        start = torch.zeros_like(b[:, :1]) if h0 is None else h0.unsqueeze(1)  # H_{-1}
        entering = torch.cat([start, h[:, :-1]], dim=1)  # H_{c-1} (B, n, d, N)
        ctx.save_for_backward(log_a, entering)
        ctx.with_h0 = h0 is not None
        return entering

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        log_a, entering = ctx.saved_tensors
        a = log_a.exp()
        after = torch.zeros_like(g[:, :1])
        coef = torch.cat([a[:, 1:], after], dim=1)  # a_{c+1}, 0 past the end
        direct = torch.cat([g[:, 1:], after], dim=1)  # g_{c+1}: what H_c feeds directly
        G = _linear_scan(coef.flip(1), direct.flip(1))[0].flip(1)  # G_c = a_{c+1} G_{c+1} + g_{c+1}
        grad_h0 = g[:, 0] + a[:, 0] * G[:, 0] if ctx.with_h0 else None
        return G * entering * a, G, grad_h0


def _scan_chunks(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
    """n chunks of l steps at once, from the state h0 (zeros if None): y (B, n, l, d) and the last state (B, d, N).

    x, delta (B, n, l, d); A (d, N); B, C (B, n, l, N). See ``selective_scan`` for the equations.
    """
    cum = delta.cumsum(2).unsqueeze(-1) * A  # L_t = (sum_{r <= t} Δ_r) A (B, n, l, d, N)
    write = (delta * x).unsqueeze(-1) * B.unsqueeze(3)  # B̄_s x_s (B, n, l, d, N)
    states = _IntraChunkScan.apply(cum.flatten(0, 1), write.flatten(0, 1)).view(cum.shape)  # from zero
    if cum.size(1) > 1:
        entering = _Carry.apply(cum[:, :, -1], states[:, :, -1], h0)  # H_{c-1} (B, n, d, N)
        states = states + cum.exp() * entering.unsqueeze(2)  # + exp(L_t) H_{c-1}: h_t (B, n, l, d, N)
    elif h0 is not None:  # one chunk: h_0 enters it
        states = states + cum.exp() * h0[:, None, None]  # h_t (B, 1, l, d, N)
    return (states * C.unsqueeze(3)).sum(-1), states[:, -1, -1]  # y_t = C_t h_t (B, n, l, d), H_{n-1}


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

    Same inputs and outputs as ``selective_scan_reference``. The sequence is cut into n chunks of
    ``chunk_size`` steps (the last padded with Δ = 0, x = 0: steps that keep the state and are
    dropped from y). Within chunk c, with log-decays a_r = Δ_r A (<= 0) and their cumulative sum
    L_t = a_1 + ... + a_t (restarted at every chunk, which keeps the values whose differences are
    taken small: less cancellation in float32), all steps at once:

        h_t = exp(L_t) H_{c-1} + sum_{s <= t} exp(L_t - L_s) B̄_s x_s,      y_t = C_t h_t + D x_t

    The sum (the state from a zero start) is computed for all chunks at once (``_IntraChunkScan``);
    its segment sums L_t - L_s = a_{s+1} + ... + a_t form a (chunk x chunk) lower-triangular matrix
    per (batch, chunk, channel, state), its exponents clamped to <= 0 before the exponential and the
    upper triangle zeroed after it (``_decay_matrix``). H_{c-1}, the state entering chunk c (h_0
    for the first), comes from the chunks' last states by a scan over chunks in log2(n) steps
    (``_Carry``).

    Eagerly, a Python loop runs over groups of chunks, each group one decay block in size, the
    state carried from group to group: on a CPU the scan is bound by memory traffic, and a group
    that stays in cache runs faster than all chunks at once. Under ``torch.compile`` one group holds
    every chunk and inductor fuses the passes instead: the graph has a fixed size whatever T (a loop
    over chunks and blocks, unrolled, takes minutes to compile). Figures: docs/benchmarks.md.

    Cost and memory. A is diagonal per (channel, state), not one scalar per head as in Mamba-2,
    so the decay matrix cannot be shared across the state dimension: a chunk needs
    B · d_inner · d_state · chunk² decay weights — chunk times the arithmetic of the sequential
    scan. Those matrices are built in cache-sized blocks and recomputed in the backward
    (``_IntraChunkScan``), so what autograd keeps is O(B · T · d_inner · d_state), as for the
    sequential scan, and the peak extra memory is one block. On a CPU, small chunks (4-16) are
    fastest.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out_dtype, dt = u.dtype, compute_dtype(u.dtype)
    with torch.autocast(u.device.type, enabled=False):
        u, delta, A, B, C = u.to(dt), delta.to(dt), A.to(dt), B.to(dt), C.to(dt)
        batch, T, d = u.shape
        h = None if initial_state is None else initial_state.to(dt)  # (B, d, N)
        l = max(1, min(chunk_size, T))  # the chunk: at most T
        n = -(-T // l)  # chunks
        pad = n * l - T  # steps appended to the last chunk: Δ = 0 keeps the state, x = 0 writes nothing
        xs, dts, Bs, Cs = ((F.pad(t, (0, 0, 0, pad)) if pad else t).reshape(batch, n, l, -1) for t in (u, delta, B, C))
        group = n if torch.compiler.is_compiling() else max(1, _DECAY_BLOCK_ELEMENTS // (batch * l * A.numel()))
        ys = []
        # groups of chunks, each the size of a decay block: cache-resident. (split, not slicing: the backward
        # of a slice writes its gradient into zeros of the whole tensor, once per group)
        for x_g, dt_g, B_g, C_g in zip(*(t.split(group, dim=1) for t in (xs, dts, Bs, Cs))):
            y_g, h = _scan_chunks(x_g, dt_g, A, B_g, C_g, h)
            ys.append(y_g)
        y = torch.cat(ys, dim=1).view(batch, n * l, d)[:, :T] if ys else u.new_zeros(batch, 0, d)  # (B, T, d)
        if h is None:
            h = u.new_zeros(batch, d, A.size(-1))  # T = 0: the state is h_0 = 0
        if D is not None:
            y = y + u * D.to(dt)
    y = y.to(out_dtype)
    return (y, h) if return_final_state else y
