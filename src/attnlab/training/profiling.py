"""``attnlab train ... --profile``: a torch profiler trace of a few training steps.

After 5 warm-up steps (allocations, kernel selection) the next ``steps`` optimisation steps are
recorded; the trace goes to ``<run>/profile/trace.json`` (open it in chrome://tracing or Perfetto)
and the most expensive operators are printed as a table and saved to ``<run>/profile/ops.txt``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from attnlab.core.fileio import atomic_write_text

WARMUP_STEPS = 5


class StepProfiler:
    """Call ``step()`` after every optimisation step and ``close()`` at the end; a no-op when steps = 0."""

    def __init__(self, run_dir: Path, start_step: int, steps: int, say: Callable[[str], None] = print) -> None:
        self.out = Path(run_dir) / "profile"
        self.begin, self.end = start_step + WARMUP_STEPS, start_step + WARMUP_STEPS + steps
        self.say, self.step_count, self._prof = say, start_step, None
        self.enabled = steps > 0

    def step(self) -> None:
        """Mark the end of a training step (the profiler's schedule advances)."""
        if not self.enabled:
            return
        self.step_count += 1
        if self.step_count == self.begin:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self._prof = profile(activities=activities, record_shapes=True, profile_memory=True)
            self._prof.__enter__()
        elif self.step_count == self.end:
            self.close()

    def close(self) -> None:
        """Stop profiling and write the trace."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.enabled = False
        self.out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out / "trace.json"))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
        atomic_write_text(self.out / "ops.txt", table + "\n")
        self.say(f"profile of {self.end - self.begin} steps written to {self.out / 'trace.json'}\n{table}")
