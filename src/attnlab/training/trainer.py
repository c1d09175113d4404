"""The run around the training loop: folder, checkpoints, logging, resume, distribution, MFU.

Each step is ``training.loop.train_step`` (accumulation, clipping, the skipped non-finite step), or with
``batch_threads`` its batch-parts form (``parts_step.PartsStep``), with AdamW (weight decay on 2-D weights only,
``training/optim.py``) at the warmup + cosine rate lr(t) (``training/schedule.py``); evaluation is
``training.loop.evaluate_model``. ``kernels`` swaps attnlab's C++ kernels into the built model (``cpu.accelerate``).

Everything random (batch windows, dropout) is drawn from generators whose states are saved in
each checkpoint, so a run resumed from step k logs exactly what the uninterrupted run logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.core import runtime
from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.training import checkpoint as ckpt
from attnlab.training import distributed, runs, threaded
from attnlab.training.compiling import compile_forward
from attnlab.training.config import TrainConfig
from attnlab.training.init_from import check_init_from, init_weights_line
from attnlab.training.loggers import RunLog, evaluation_keys
from attnlab.training.loop import evaluate_model, train_step
from attnlab.training.mfu import MFUMeter
from attnlab.training.moe_log import MoELog
from attnlab.training.optim import make_optimizer, state_is_finite
from attnlab.training.outcomes import TrainingDiverged, TrainingInterrupted, TrainResult
from attnlab.training.parts_step import PartsStep
from attnlab.training.profiling import StepProfiler
from attnlab.training.runs import RUN_CONFIG, save_train_config, truncate_metrics
from attnlab.training.schedule import lr_at
from attnlab.training.signals import StopRequest


class Trainer:
    """Builds the task (data, tokenizer) and model from a TrainConfig, then trains, evaluates and saves."""

    def __init__(self, cfg: TrainConfig, preset: str | None = None, log=print) -> None:
        from attnlab.cpu import accelerate, describe, parse_kernels
        from attnlab.models.registry import build_model
        from attnlab.models.size import check_fits
        from attnlab.training.tasks import build_task

        self.device = distributed.resolve_device(cfg.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the current GPU: new tensors, the MFU peak's device name
        self.dist = distributed.setup(self.device)  # rank 0 of 1 unless launched by torchrun
        self.cfg = cfg
        self.log = log if self.dist.is_main else (lambda *a, **k: None)
        # process-wide settings for the run (restored when train() returns)
        wanted = runtime.RuntimeState(runtime.intra_op_threads(cfg.threads), cfg.deterministic,
                                      cfg.flush_denormal and self.device.type == "cpu")
        self._runtime_before = runtime.apply(wanted, self.log)
        self.dtype = runtime.resolve_dtype(cfg.dtype, self.device.type)  # what the run computes in
        if cfg.dtype == "auto":
            self.log(f"dtype=auto: {self.dtype} (native bfloat16 on {self.device.type}: {self.dtype == 'bfloat16'})")
        if (slow := runtime.slow_bfloat16_warning(self.device.type, self.dtype)) is not None:
            self.log(slow)
        self.run_dir = runs.run_folder(cfg.out_dir, cfg.name or runs.default_run_name(preset), self.dist.is_main)
        named = self.dist.is_main and cfg.name and self.run_dir.is_dir()  # a default name claims a folder later
        self.lock = runs.hold_run(self.run_dir, cfg.resume) if named else None
        checkpoint = (ckpt.resume_point(self.run_dir, RUN_CONFIG, self.dist.is_main, cfg.max_iters)
                      if cfg.resume else None)
        if cfg.resume and checkpoint is None:
            self.log(f"{self.run_dir} stopped before its first checkpoint was complete; training it from step 0")
        if not cfg.resume and (self.run_dir / "checkpoints").exists():
            raise ConfigError(f"run folder {self.run_dir} already holds a run; pass resume=true or another name=")
        check_fits(cfg.model, "the model", batch_size=cfg.batch_size)  # before the data and the tokenizer
        if cfg.init_from and checkpoint is None:
            check_init_from(cfg.init_from, cfg.model.family)  # before any data is read
        # data, tokenizer/class names (from the checkpoint when resuming); fills vocab_size etc.
        self.task = build_task(cfg, assets=checkpoint, world_size=self.dist.world_size)
        self.tokenizer = getattr(self.task, "tokenizer", None)
        cfg.model.validate()
        check_fits(cfg.model, "the model", batch_size=cfg.batch_size)  # sizes before allocation, now with the vocab
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model).to(self.device)
        if took := accelerate(self.model, parse_kernels(cfg.kernels), self.device.type, self.dtype):  # attnlab.cpu
            self.log(describe(took))
        self.batch_gen = torch.Generator().manual_seed(cfg.seed)  # the same on every process (global batches)
        torch.manual_seed(cfg.seed + self.dist.rank)  # dropout differs between replicas
        threaded.check(cfg.batch_threads, self.device, self.dist.world_size, self.model, lambda: self.task.batch(
            "train", cfg.batch_size // cfg.batch_threads, torch.Generator().manual_seed(0)))
        self.train_step = train_step if cfg.batch_threads == 1 else PartsStep(cfg.batch_threads)
        self.step = 0
        self.best_val: float | None = None  # the lowest validation loss so far
        state = self._restore_weights(checkpoint) if checkpoint is not None else None
        if cfg.init_from and checkpoint is None:
            self.log(init_weights_line(self.model, cfg.init_from))
        self.ddp: torch.nn.Module | None = None
        self.sharded = self.dist.enabled and cfg.parallel == "fsdp"
        if self.sharded:  # each process keeps 1/N of the weights, gradients and moments
            from attnlab.nn.blocks import Block
            distributed.shard_model(self.model, (Block,), self.device)
        elif self.dist.enabled:  # full replicas; gradients are all-reduced during backward
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)
        self.optimizer = make_optimizer(self.model, cfg, fused=not self.sharded, compute_dtype=self.dtype)
        if state is not None:
            ckpt.check_trainer_state(state, self.optimizer, checkpoint)
            self._restore_state(state)
        net = self.ddp or self.model
        self.forward = compile_forward(net, self.device.type) if cfg.compile else net
        self.flops_per_unit = self.task.flops_per_unit(self.model)
        # the peak is measured once per machine and cached; here, so it never pauses the training loop
        self.meter = (MFUMeter(self.flops_per_unit, self.dtype, self.device.type)
                      if cfg.mfu and self.flops_per_unit is not None else None)
        if self.meter is not None:
            self.log(self.meter.describe())
        self.records: RunLog | None = None  # metrics.jsonl (+ TensorBoard), on the main process
        if self.dist.is_main:
            self.run_dir = runs.make_run_folder(self.run_dir, claim=not cfg.name)  # a default name: a folder of its own
            self.lock = self.lock or runs.hold_run(self.run_dir, cfg.resume)  # one writer per run folder
            save_train_config(self.run_dir, cfg)
            if cfg.resume and checkpoint is None:
                truncate_metrics(self.run_dir, 0)
            self.records = RunLog(self.run_dir, cfg.logger, self.step)
        distributed.barrier(self.dist)

    # -- state -------------------------------------------------------------------------------

    def _trainer_state(self) -> dict[str, Any]:
        """Everything but the weights; RNG states of every process, so an N-process run resumes exactly with N
        processes (and approximately, with fresh data order, with any other N)."""
        cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None  # GPU dropout
        rngs = distributed.gather_objects((self.batch_gen.get_state(), torch.get_rng_state(), cuda_rng), self.dist)
        return {
            "step": self.step,
            "optimizer": distributed.optimizer_state(self.model, self.optimizer),  # collective under FSDP
            "batch_rng": rngs[0][0], "torch_rng": rngs[0][1], "world_size": self.dist.world_size,
            "batch_rng_per_rank": [r[0] for r in rngs], "torch_rng_per_rank": [r[1] for r in rngs],
            "cuda_rng_per_rank": [r[2] for r in rngs], "best_val": self.best_val,
        }

    def _restore_weights(self, checkpoint: Path) -> dict[str, Any]:
        """Load the checkpoint's weights (before any wrapping) and return its trainer state."""
        loaded = type(self.model).from_pretrained(checkpoint)
        if loaded.config != self.model.config:
            theirs, ours = dataclasses.asdict(loaded.config), dataclasses.asdict(self.model.config)
            diff = ", ".join(f"{k}={theirs[k]!r} (config says {ours[k]!r})" for k in ours if theirs[k] != ours[k])
            raise CheckpointError(f"{checkpoint} was trained with a different model: {diff}")
        self.model.load_state_dict(loaded.state_dict())
        return ckpt.load_trainer_state(checkpoint)

    def _restore_state(self, state: dict[str, Any]) -> None:
        """Optimiser moments, step, best val loss and RNG states (after the model is wrapped)."""
        distributed.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.step = int(state["step"])
        self.best_val = state.get("best_val")
        saved_world = int(state.get("world_size", 1))
        if saved_world == self.dist.world_size:
            per_rank = state.get("batch_rng_per_rank") or [state["batch_rng"]]
            torch_per_rank = state.get("torch_rng_per_rank") or [state["torch_rng"]]
            self.batch_gen.set_state(per_rank[self.dist.rank])
            torch.set_rng_state(torch_per_rank[self.dist.rank])
            cuda_rng = (state.get("cuda_rng_per_rank") or [None] * saved_world)[self.dist.rank]
            if cuda_rng is not None and self.device.type == "cuda":
                torch.cuda.set_rng_state(cuda_rng, self.device)
        else:  # weights and optimiser carry over; the data order starts afresh for the new world size
            self.batch_gen.manual_seed(self.cfg.seed + 7919 * self.step)
            torch.manual_seed(self.cfg.seed + self.dist.rank + 7919 * self.step)
            self.log(f"note: checkpoint from {saved_world} process(es) resumed with {self.dist.world_size}: "
                     "same weights and optimiser state, new data order")
        if self.dist.is_main:
            truncate_metrics(self.run_dir, self.step)
        self.log(f"resumed {self.run_dir} from step {self.step}")

    def save(self, is_best: bool = False) -> Path | None:
        """Write a checkpoint (rank 0 only; every process contributes its RNG states)."""
        state = self._trainer_state()  # collective: every rank takes part
        model = self.plain_model()  # collective under FSDP
        path = None
        if self.dist.is_main:
            path = ckpt.save_checkpoint(self.run_dir, self.step, model, self.task, state,
                                   keep=self.cfg.keep_checkpoints, is_best=is_best)
        distributed.barrier(self.dist)
        return path

    def plain_model(self) -> torch.nn.Module | None:
        """The model with full (unsharded) weights: itself, or under FSDP a gathered copy on rank 0 (None on the
        other ranks). Collective under FSDP: every rank must call it."""
        if not self.sharded:
            return self.model
        from attnlab.models.registry import build_model

        full = distributed.full_model_state(self.model)
        if not self.dist.is_main:
            return None
        copy = build_model(self.cfg.model)
        copy.load_state_dict(full)
        return copy.to(self.device)

    # -- evaluation ----------------------------------------------------------------------------

    def autocast(self):
        """The autocast context of the run's dtype (bfloat16 autocast, or nothing for float32)."""
        if self.dtype == "bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def batch(self, split: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """A batch of the task (keyword arguments of the model's forward), on the device."""
        shard = (self.dist.rank, self.dist.world_size) if split == "train" else (0, 1)
        batch = self.task.batch(split, self.cfg.batch_size, generator, shard)
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _train_batches(self, drawn: list):  # drawn one at a time as the step asks for them, each kept in ``drawn``
        while True:
            drawn.append(self.batch("train", self.batch_gen))
            yield drawn[-1]

    def _micro_sync(self, last: bool):  # all-reduce gradients on the last micro-batch only (DDP's no_sync; FSDP's)
        if self.sharded:
            self.model.set_requires_gradient_sync(last)
        return self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()

    def evaluate(self, splits: tuple[str, ...] | None = None) -> dict[str, float]:
        """Loss and task metrics per split on the same batches at every evaluation (see evaluate_model)."""
        # under FSDP every rank runs every batch (each forward gathers weights collectively)
        cfg = self.cfg
        splits = splits or tuple(s for s in self.task.splits if s != "train" or cfg.eval_train)
        return evaluate_model(self.model, self.task, splits, cfg.eval_batch_size or cfg.batch_size,
                              cfg.eval_iters, cfg.seed, self.device, self.autocast,
                              None if self.sharded else self.dist)

    # -- the loop ------------------------------------------------------------------------------

    def train(self, keep_lock: bool = False) -> TrainResult:
        """Train to max_iters; the process's thread count and kernel modes are restored afterwards, and the run
        folder's lock (held from the Trainer's making) released, unless ``keep_lock``: the caller writes more
        into the folder first (finetune's report) and then calls ``release_lock``."""
        try:
            with StopRequest() as self._stop:
                return self._train()
        finally:
            runtime.apply(self._runtime_before, self.log)
            if not keep_lock:
                self.release_lock()

    def release_lock(self) -> None:
        """Let another process write this run folder (a second call does nothing)."""
        if self.lock is not None:
            self.lock.release()

    def _train(self) -> TrainResult:
        from tqdm import tqdm

        cfg = self.cfg
        decay_iters = cfg.lr_decay_iters or cfg.max_iters
        ckpt_every = cfg.checkpoint_interval or cfg.eval_interval
        self.model.train()
        show = cfg.progress and self.dist.is_main and sys.stderr.isatty()  # a bar only on a terminal
        bar = tqdm(total=cfg.max_iters, initial=self.step, disable=not show, unit="step", dynamic_ncols=True,
                   mininterval=0.5)
        say = bar.write if show else self.log
        t_start = t_log = time.perf_counter()
        units_since_log, last_train, last_val, last_tps = 0, None, None, None
        bad_steps = 0  # consecutive steps with a non-finite loss or gradient
        profiler = StepProfiler(self.run_dir, self.step, cfg.profile_steps, say) if self.dist.is_main else None
        moe_log = MoELog()
        pause_time = 0.0  # evaluation and checkpoint time, left out of tokens/s
        pause_total = 0.0
        try:
            while self.step < cfg.max_iters:
                lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup_iters, decay_iters, cfg.lr_schedule,
                           cfg.cooldown_fraction)
                drawn: list[dict[str, torch.Tensor]] = []
                result = self.train_step(
                    self.model, self.optimizer, self._train_batches(drawn), lambda batch: self.forward(**batch),
                    accum=cfg.grad_accum, lr=lr, grad_clip=cfg.grad_clip, autocast=self.autocast,
                    reported_loss=self.task.reported_loss, micro_sync=self._micro_sync,
                    agree=distributed.agreement(self.device, self.dist))
                units_since_log += sum(self.task.count(b) for b in drawn) * self.dist.world_size
                for stats in result.moe_stats:
                    moe_log.add(stats)
                loss_sum = result.loss
                if result.applied:
                    bad_steps = 0
                else:
                    bad_steps += 1
                    self._skip_step(result.objective, result.grad_norm, bad_steps, say)
                self.step += 1
                if profiler is not None:
                    profiler.step()
                bar.update(1)
                done = self.step == cfg.max_iters
                if self.step % cfg.log_interval == 0 or done:
                    now = time.perf_counter()
                    last_tps = units_since_log / max(now - t_log - pause_time, 1e-9)
                    last_train = distributed.mean(loss_sum, self.dist).item()  # one host sync per log interval
                    utilisation = self.mfu(last_tps / self.dist.world_size)  # per replica vs one device's peak
                    self._append_metrics({
                        "step": self.step, "train_loss": last_train, "lr": lr, f"{self.task.unit}_per_s": last_tps,
                        **({"mfu": utilisation, "peak_flops": self.meter.peak} if utilisation is not None else {}),
                        **moe_log.flush(),
                    })
                    line = (f"train loss {last_train:.4f}, lr {lr:.3g}, {last_tps:,.0f} {self.task.unit}/s"
                            + (f", mfu {utilisation:.1%}" if utilisation is not None else ""))
                    if show:
                        bar.set_postfix_str(line)
                    else:  # piped, or progress=false: one plain line per log interval, no carriage returns
                        say(f"step {self.step}: {line}")
                    t_log, units_since_log, pause_time = now, 0, 0.0
                improved = False
                evaluating = self.step % cfg.eval_interval == 0 or done
                stop = distributed.any_true(self._stop.requested is not None, self.device, self.dist)
                if evaluating or self.step % ckpt_every == 0 or stop:
                    self._check_finite()  # nothing non-finite is evaluated, saved or called good
                if evaluating:
                    t_eval = time.perf_counter()
                    losses = self.evaluate()
                    last_val = losses["val"]
                    if not all(math.isfinite(v) for v in losses.values()):
                        self._diverged(f"the evaluation after step {self.step} is not finite ({losses})")
                    improved = self.best_val is None or last_val < self.best_val
                    self.best_val = last_val if improved else self.best_val
                    keyed = evaluation_keys(losses, self.task.splits)  # the names metrics.jsonl and the line use
                    self._append_metrics({"step": self.step, **keyed, "lr": lr,
                                          f"{self.task.unit}_per_s": last_tps, "elapsed_s": t_eval - t_start})
                    shown = "".join(f", {k.replace('_', ' ')} {v:.4f}" for k, v in keyed.items()
                                    if k not in ("train_eval_loss", "val_loss"))
                    train_part = f"train loss {losses['train']:.4f}, " if "train" in losses else ""
                    say(f"step {self.step}: {train_part}val loss {last_val:.4f}{shown}")
                    pause_time += time.perf_counter() - t_eval
                    pause_total += time.perf_counter() - t_eval
                if self.step % ckpt_every == 0 or done or stop:
                    t_save = time.perf_counter()
                    self.save(is_best=improved)
                    pause_time += time.perf_counter() - t_save
                    pause_total += time.perf_counter() - t_save
                if stop and not done:
                    raise TrainingInterrupted(self.step, self.run_dir)
        finally:
            bar.close()
            if self.records is not None:
                self.records.close()
            if profiler is not None:
                profiler.close()
        wall = time.perf_counter() - t_start
        sample = None
        model = self.plain_model()  # collective under FSDP
        if self.dist.is_main:
            if model is not None:
                sample = self.task.write_samples(model, self.run_dir)
                model.train()
            self.records.plot()
            self.records.finish()  # logger=mlflow: the plots and config.yaml as artifacts
        distributed.barrier(self.dist)
        return TrainResult(self.run_dir, self.step, last_train, last_val, wall, sample, wall - pause_total)

    def _append_metrics(self, record: dict[str, Any]) -> None:
        if self.records is not None:
            self.records.write(record)

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilisation of the current throughput (None when cfg.mfu is off)."""
        return None if self.meter is None else self.meter(tokens_per_s)

    def _skip_step(self, loss: torch.Tensor, grad_norm: torch.Tensor, bad_steps: int, say) -> None:
        """Record a skipped update; stop once the limit of consecutive bad steps is reached."""
        what = "loss" if not torch.isfinite(loss) else "gradient norm"
        self._append_metrics({"step": self.step + 1, "skipped": f"non-finite {what}",
                              "loss": loss.item(), "grad_norm": grad_norm.item()})
        say(f"step {self.step + 1}: non-finite {what}; update skipped ({bad_steps} in a row)")
        limit = 1 if self.cfg.on_nonfinite == "stop" else self.cfg.max_nonfinite_steps
        if bad_steps >= limit:
            self._diverged(f"non-finite {what} in {bad_steps} consecutive step(s), last at step {self.step + 1}")

    def _check_finite(self) -> None:
        """Stop (``_diverged``) when a weight or optimiser moment is not finite, before it is evaluated or saved."""
        if distributed.any_true(not state_is_finite(self.model, self.optimizer), self.device, self.dist):
            self._diverged(f"the weights or optimiser state are not finite after step {self.step}")

    def _diverged(self, reason: str) -> None:
        """Stop without saving: only finite states are saved, so the newest checkpoint is the last good one."""
        good = ckpt.list_checkpoints(self.run_dir)
        kept = f"the last good checkpoint is {good[-1]}" if good else "no checkpoint had been written yet"
        raise TrainingDiverged(f"{reason}; training stopped and {kept}")
