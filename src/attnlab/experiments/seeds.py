"""Many seeds of one arm trained as one batched model, each seed's trajectory equal to its solo run.

An arm's solo run for seed s is what the experiments' ``train_one`` functions do:

    torch.manual_seed(s); model = build(s); batch = batches(s)      weights and data, under the seed's RNG
    opt = torch.optim.AdamW(model.parameters(), lr, betas, eps, weight_decay)
    fit(model, opt, batch, lambda b: loss(model, b), steps, lr=schedule, grad_clip=clip)

``fit_seeds`` runs N seeds at once. Each parameter p is stacked over the seeds, theta_p (N, *p.shape), and one
forward, ``torch.func.vmap`` over the model reparametrised with one lane of the stack, maps the stacked batches
(N, *batch shape) to the losses L (N,). The lanes share nothing, so the gradient of sum_n L_n with respect to
theta_p is g_p (N, *p.shape), lane n holding seed n's own gradient. Per seed n, as ``train_step`` and
torch's single-tensor AdamW compute it (k_{n,p} the seed's own step count, lr = schedule(t)):

    nu_n = || (||g_{n,p}||_2)_p ||_2                      the seed's global norm over its parameters p
    g_n <- g_n * min(1, clip / (nu_n + 1e-6))             with grad_clip (clip_grad_norm_'s coefficient)
    if L_n and nu_n are finite (else the seed skips the step: theta_n, m_n, v_n, k_n unchanged):
        k <- k + 1;  theta <- theta (1 - lr wd_p)
        m <- m + (1 - b1)(g - m);  v <- b2 v + (1 - b2) g^2
        theta <- theta - (lr / (1 - b1^k)) m / (sqrt(v) / sqrt(1 - b2^k) + eps)

with the per-seed (N,) factors broadcast over (N, *p.shape) (torch's foreach ops with scalar factors while every
seed has taken every step).

Randomness. Each seed keeps its own global-RNG state (CPU, and the device's on a GPU), where its solo run would
have it: its batches are drawn under it, and every ``F.dropout(x, p)`` of the forward draws the seed's mask
``F.dropout(ones(x.shape), p)`` under it in the forward's call order (it consumes the generator as
``F.dropout(x, p)`` does and x * mask equals ``F.dropout(x, p)``; the lane multiplies by its own mask). A forward
that draws from the global RNG any other way (dropout inside an SDPA kernel, a random op in the loss) is refused
with a ValueError, as are batch norm and dropout modules other than nn.Dropout. ``F.scaled_dot_product_attention``
runs once on the seeds' batches flattened together (vmap has no batching rule for the CPU kernel), and the
functions whose batching rule rounds otherwise than their kernel (layer norm, convolutions, the losses) run once per
seed, so that on a CPU the batched step is bitwise the solo one; all are intercepted by a TorchFunctionMode while
the batched forward runs (not thread-safe).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.stateless import _reparametrize_module
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

_DROPOUT = F.dropout
_SDPA = F.scaled_dot_product_attention
# functions whose vmap batching rule rounds otherwise than their kernel does on one seed: run once per lane
_PER_LANE = {F.layer_norm, F.group_norm, F.conv1d, F.conv2d, F.conv3d, F.cross_entropy, F.nll_loss,
             F.binary_cross_entropy, F.binary_cross_entropy_with_logits}


@dataclass
class SeedRun:
    """One seed's run: fit's per-step losses and skipped (non-finite) steps; ``model``, the module ``build(seed)``
    returned, holding the seed's final weights (in training mode, as ``fit`` leaves it); and the global RNG state
    (CPU, and CUDA on a GPU) where the solo run would have left it, to continue as it would."""

    seed: int
    model: nn.Module
    losses: list[float] = field(default_factory=list)
    skipped: int = 0
    rng_state: Tensor | None = None
    cuda_rng_state: Tensor | None = None


def fit_seeds(
    build: Callable[[int], nn.Module],
    seeds: Sequence[int],
    batches: Callable[[int], Callable[[int], Any]],
    loss: Callable[[nn.Module, Any], Any],
    steps: int,
    *,
    lr: float,
    schedule: Callable[[int], float] | None = None,
    weight_decay: float | Callable[[str, nn.Parameter], float] = 1e-2,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    grad_clip: float | None = None,
    every: int = 0,
    evaluate: Callable[[int, int, nn.Module], bool | None] | None = None,
    evaluate_first: bool = False,
) -> list[SeedRun]:
    """Train one arm's ``seeds`` as one batched model; each ``SeedRun`` equals that seed's solo run.

    ``build(seed)`` makes the solo model (called after ``torch.manual_seed(seed)``); ``batches(seed)``, called
    next under the same RNG, returns the solo run's ``batch(step)`` (its own generator, as the solo code makes
    it); ``loss(model, batch)`` returns the output (with ``.loss``) or the loss, as fit's ``forward``.
    AdamW's ``lr``, ``betas``, ``eps`` and ``weight_decay`` (a number, or ``weight_decay(name, param)`` for
    per-parameter groups) are torch's; ``schedule(step)`` the learning rate of each step (fit's ``lr=``),
    ``grad_clip`` fit's. ``evaluate(done, seed, model)`` runs after every ``every``-th step (and before the first
    with ``evaluate_first``) on each seed's module holding its current weights, under the seed's RNG; a True
    return ends that seed's run there (fit's ``after_step``). The caller's global RNG state is restored."""
    runs: list[SeedRun] = []
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else ()):
        models, fns, states = [], [], []
        for seed in seeds:
            torch.manual_seed(seed)
            models.append(build(seed).train())  # as fit does
            fns.append(batches(seed))
            states.append(_rng_state(next(models[-1].parameters()).device))
            runs.append(SeedRun(seed, models[-1]))
        if not runs:
            return runs
        trainer = _Batched(models, fns, states, loss, weight_decay, betas, eps, grad_clip)
        if evaluate is not None and evaluate_first:
            trainer.evaluate(0, runs, evaluate)
        for step in range(steps):
            if not trainer.lanes:
                break
            trainer.step(step, schedule(step) if schedule else lr, runs)
            if evaluate is not None and every and (step + 1) % every == 0:
                trainer.evaluate(step + 1, runs, evaluate)
        trainer.finish(runs)
    return runs


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    """The global RNG's state: the CPU's, and the device's on a GPU."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _refuse(model: nn.Module) -> None:
    """ValueError for what cannot be batched per seed exactly."""
    for name, m in model.named_modules():
        where, why = f"{name or 'the model'} ({type(m).__name__})", None
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            why = "is batch norm, whose statistics mix the samples of a batch (use layer norm, or solo runs)"
        elif isinstance(m, nn.modules.dropout._DropoutNd) and type(m) is not nn.Dropout and m.p > 0:
            why = "drops channels or alpha-dropout; only element-wise dropout (nn.Dropout, F.dropout) is per seed"
        elif isinstance(m, nn.RNNBase) and m.dropout > 0:
            why = "draws its dropout inside the recurrent kernel"
        elif getattr(m, "dropout", 0) and getattr(m, "backend", "eager") != "eager":
            why = f"drops attention probabilities inside the {m.backend!r} kernel: build it with attn_backend='eager'"
        if why:
            raise ValueError(f"fit_seeds: {where} {why}; batched seeds cannot reproduce it")


class _Batched:
    """The stacked parameters, AdamW state and per-seed RNG states of the seeds still training (its lanes)."""

    def __init__(self, models: list[nn.Module], fns: list[Callable[[int], Any]], states: list[Any],
                 loss: Callable[[nn.Module, Any], Any], weight_decay: Any, betas: tuple[float, float], eps: float,
                 clip: float | None) -> None:
        _refuse(models[0])
        shapes = [[(n, p.shape, p.dtype, p.device) for n, p in m.named_parameters()] for m in models]
        if any(s != shapes[0] for s in shapes):
            raise ValueError("fit_seeds: build(seed) must give every seed the same parameters (names, shapes)")
        self.base = copy.deepcopy(models[0])
        self.device = next(self.base.parameters()).device
        self.params = {n: torch.stack([m.get_parameter(n).detach() for m in models]).requires_grad_(p.requires_grad)
                       for n, p in self.base.named_parameters()}
        self.buffers = {}  # buffers that differ between the seeds (others stay the base's own)
        for n, b in self.base.named_buffers():
            if any(not torch.equal(m.get_buffer(n), b) for m in models):
                self.buffers[n] = torch.stack([m.get_buffer(n) for m in models])
        self.decay = {n: float(weight_decay(n, p) if callable(weight_decay) else weight_decay)
                      for n, p in self.base.named_parameters()}
        self.m, self.v = {}, {}  # AdamW's moments per parameter, (N, *shape) each
        self.count: dict[str, list[int]] = {}  # AdamW's step count per parameter and lane
        self.lanes = list(range(len(models)))  # lane j trains run self.lanes[j]
        self.models, self.fns, self.states = models, fns, states
        self.loss, self.betas, self.eps, self.clip = loss, betas, eps, clip
        self.lane_ids: Tensor | None = None

    @contextlib.contextmanager
    def seeded(self, j: int) -> Iterator[None]:
        """The global RNG set to lane j's state while inside; its state afterwards kept as the lane's."""
        outer = _rng_state(self.device)
        _set_rng_state(self.states[j], self.device)
        try:
            yield
        finally:
            self.states[j] = _rng_state(self.device)
            _set_rng_state(outer, self.device)

    def dropout(self, x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
        """F.dropout inside the batched forward: lane j's mask drawn under lane j's RNG state."""
        if not training or p == 0:
            return x
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"fit_seeds: dropout is drawn per seed on cpu and cuda, not {self.device.type}")
        masks = []  # (N, *x.shape), lane j's drawn under its RNG state
        for j in range(len(self.lanes)):
            with self.seeded(j):
                masks.append(_DROPOUT(torch.ones(x.shape, dtype=x.dtype, device=x.device), p, True))
        mask = torch.stack(masks)[self.lane_ids]  # lane_ids: the vmapped lane index: each lane reads its own
        return x.mul_(mask) if inplace else x * mask

    def forward(self, step: int) -> Tensor:
        """Each lane's batch of ``step`` (drawn under its RNG), and the lanes' losses (N,), with autograd."""
        drawn = []
        for j, run in enumerate(self.lanes):
            with self.seeded(j):
                drawn.append(pytree.tree_flatten(self.fns[run](step)))
        spec = drawn[0][1]
        if any(s != spec for _, s in drawn):
            raise ValueError("fit_seeds: every seed's batch must have the same structure")
        first, stacked = drawn[0][0], []
        for i, leaf in enumerate(first):
            if isinstance(leaf, Tensor):
                stacked.append(torch.stack([leaves[i] for leaves, _ in drawn]))
            elif any(leaves[i] != leaf for leaves, _ in drawn):
                raise ValueError(f"fit_seeds: the seeds' batches differ in a non-tensor part ({leaf!r})")

        def lane_loss(params, buffers, tensors, lane):  # one lane: its parameters, buffers, batch and index
            self.lane_ids, it = lane, iter(tensors)
            batch = pytree.tree_unflatten([next(it) if isinstance(x, Tensor) else x for x in first], spec)
            with _reparametrize_module(self.base, {**params, **buffers}, tie_weights=True):
                out = self.loss(self.base, batch)
            return out if isinstance(out, Tensor) else out.loss

        before = _rng_state(self.device)
        lanes = torch.arange(len(self.lanes), device=self.device)
        with _Intercept(self):
            losses = torch.func.vmap(lane_loss, randomness="same")(self.params, self.buffers, stacked, lanes)
        after = _rng_state(self.device)
        if any(a is not None and not torch.equal(a, b) for a, b in zip(after, before)):
            raise ValueError("fit_seeds: the forward draws from the global RNG other than through F.dropout (a "
                             "random op, or dropout inside a fused kernel); its seeds cannot be reproduced batched")
        return losses

    def step(self, step: int, lr: float, runs: list[SeedRun]) -> None:
        """One step of every lane: forward, backward, per-seed clipping, skipping and AdamW."""
        losses = self.forward(step)
        losses.sum().backward()  # d(sum_n L_n) / d theta: lane n gets its own seed's gradient
        names = [n for n, p in self.params.items() if p.grad is not None]
        grads = [self.params[n].grad for n in names]
        n = len(self.lanes)
        norms = [torch.linalg.vector_norm(g.reshape(n, -1), 2, dim=1) for g in grads]  # (N,) per parameter
        total = torch.linalg.vector_norm(torch.stack(norms, dim=1), 2, dim=1) if grads else losses.new_zeros(n)
        if self.clip is not None:
            coef = torch.clamp(self.clip / (total + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
        values, norm_values = torch.stack([losses.detach(), total.to(losses.dtype)]).tolist()
        ok = [math.isfinite(a) and math.isfinite(b) for a, b in zip(values, norm_values)]
        for j, run in enumerate(self.lanes):
            runs[run].losses.append(values[j])
            runs[run].skipped += not ok[j]
        with torch.no_grad():
            self.adamw(names, lr, ok)
        for p in self.params.values():
            p.grad = None

    def adamw(self, names: list[str], lr: float, ok: list[bool]) -> None:
        """torch's AdamW step for every lane whose ``ok`` is True (the others keep their weights and state)."""
        (b1, b2), eps = self.betas, self.eps
        fast: dict[int, list[str]] = {}
        for name in names:
            p = self.params[name]
            if name not in self.m:
                self.m[name], self.v[name] = torch.zeros_like(p), torch.zeros_like(p)
                self.count[name] = [0] * len(self.lanes)
            self.count[name] = [c + k for c, k in zip(self.count[name], ok)]
            if all(ok) and len(set(self.count[name])) == 1:
                fast.setdefault(self.count[name][0], []).append(name)
            else:
                self._adamw_lanes(name, lr, ok)
        for k, group in fast.items():  # every lane at step count k: torch's arithmetic with scalar factors
            params, ms, vs = [self.params[n] for n in group], [self.m[n] for n in group], [self.v[n] for n in group]
            gs = [p.grad for p in params]
            for wd in {self.decay[n] for n in group} - {0.0}:
                torch._foreach_mul_([self.params[n] for n in group if self.decay[n] == wd], 1 - lr * wd)
            torch._foreach_lerp_(ms, gs, 1 - b1)
            torch._foreach_mul_(vs, b2)
            torch._foreach_addcmul_(vs, gs, gs, 1 - b2)
            step_size = lr / (1 - b1**k)
            denom = torch._foreach_sqrt(vs)
            torch._foreach_div_(denom, (1 - b2**k) ** 0.5)
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(params, ms, denom, -step_size)

    def _adamw_lanes(self, name: str, lr: float, ok: list[bool]) -> None:
        """One parameter's step with per-lane factors (the lanes' step counts differ, or some skip)."""
        (b1, b2), eps = self.betas, self.eps
        p, g, m, v = self.params[name], self.params[name].grad, self.m[name], self.v[name]
        shape = (-1, *[1] * (p.dim() - 1))
        k = [max(c, 1) for c in self.count[name]]
        keep = torch.tensor(ok, device=p.device).view(shape)
        neg_step = torch.tensor([-(lr / (1 - b1**c)) for c in k], dtype=p.dtype, device=p.device).view(shape)
        bc2 = torch.tensor([(1 - b2**c) ** 0.5 for c in k], dtype=p.dtype, device=p.device).view(shape)
        wd = self.decay[name]
        new_p = p * (1 - lr * wd) if wd != 0 else p
        new_m = m.lerp(g, 1 - b1)
        new_v = (v * b2).addcmul_(g, g, value=1 - b2)
        new_p = new_p + (neg_step * new_m) / (new_v.sqrt() / bc2).add_(eps)
        p.copy_(torch.where(keep, new_p, p))
        m.copy_(torch.where(keep, new_m, m))
        v.copy_(torch.where(keep, new_v, v))

    def write(self, j: int) -> None:
        """Lane j's current weights into its run's module."""
        model = self.models[self.lanes[j]]
        with torch.no_grad():
            for name, t in self.params.items():
                model.get_parameter(name).copy_(t[j])
            for name, t in self.buffers.items():
                model.get_buffer(name).copy_(t[j])

    def evaluate(self, done: int, runs: list[SeedRun], fn: Callable[[int, int, nn.Module], bool | None]) -> None:
        """``fn(done, seed, model)`` for every lane; lanes whose call returns True stop (their weights kept)."""
        keep = []
        for j, run in enumerate(self.lanes):
            self.write(j)
            with self.seeded(j):
                stop = fn(done, runs[run].seed, self.models[run]) is True
            if stop:
                runs[run].rng_state, runs[run].cuda_rng_state = self.states[j]
            else:
                keep.append(j)
        if len(keep) < len(self.lanes):
            self._keep(keep)

    def _keep(self, keep: list[int]) -> None:
        """Only lanes ``keep`` train on."""
        index = torch.tensor(keep, device=self.device)
        self.params = {n: p.detach()[index].requires_grad_(p.requires_grad) for n, p in self.params.items()}
        self.buffers = {n: b[index] for n, b in self.buffers.items()}
        self.m = {n: t[index] for n, t in self.m.items()}
        self.v = {n: t[index] for n, t in self.v.items()}
        self.count = {n: [c[j] for j in keep] for n, c in self.count.items()}
        self.lanes = [self.lanes[j] for j in keep]
        self.states = [self.states[j] for j in keep]

    def finish(self, runs: list[SeedRun]) -> None:
        """The lanes' final weights into their modules, and their RNG states into their runs."""
        for j, run in enumerate(self.lanes):
            self.write(j)
            runs[run].rng_state, runs[run].cuda_rng_state = self.states[j]


class _Intercept(TorchFunctionMode):
    """While the batched forward runs: F.dropout drawn per seed; SDPA on the lanes flattened into its batch; the
    functions of ``_PER_LANE`` once per lane."""

    def __init__(self, trainer: _Batched) -> None:
        super().__init__()
        self.trainer = trainer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}  # (inside, this mode is off: the calls below run as they are)
        if func is _DROPOUT:
            return self.trainer.dropout(*args, **kwargs)
        if func is not _SDPA and func not in _PER_LANE:
            return func(*args, **kwargs)
        if func is _SDPA and kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0) > 0:
            raise ValueError("fit_seeds: dropout inside F.scaled_dot_product_attention cannot be drawn per seed; "
                             "build the model with attn_backend='eager'")
        leaves, spec = pytree.tree_flatten((args, kwargs))
        at = [i for i, x in enumerate(leaves) if isinstance(x, Tensor)]

        def call(*tensors):
            full = list(leaves)
            for i, t in zip(at, tensors):
                full[i] = t
            a, k = pytree.tree_unflatten(full, spec)
            return func(*a, **k)
        return _Lanes.apply(call, func is _SDPA and len(at) == 3, *[leaves[i] for i in at])  # SDPA without a mask


class _Lanes(torch.autograd.Function):
    """``call(*tensors)`` whose vmap rule runs it once per lane and stacks the results or, with ``flat``, once on
    the lanes flattened into the leading (batch) dim that tensors of 3 or more dims share."""

    @staticmethod
    def forward(call, flat, *tensors):
        return call(*tensors)

    @staticmethod
    def setup_context(ctx, inputs, output):  # autograd records the calls of the vmap rule, never this one's
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("fit_seeds: an intercepted function is meant for the batched forward only")

    @staticmethod
    def vmap(info, in_dims, call, flat, *tensors):
        n = info.batch_size
        ts = [t.movedim(d, 0) if d is not None else t.expand(n, *t.shape) for t, d in zip(tensors, in_dims[2:])]
        if flat and all(t.dim() >= 4 for t in ts) and len({t.shape[1] for t in ts}) == 1:
            out = call(*[t.reshape(-1, *t.shape[2:]) for t in ts])  # (N * B, ...)
            return out.view(n, -1, *out.shape[1:]), 0
        return torch.stack([call(*lane) for lane in zip(*[t.unbind(0) for t in ts])]), 0
