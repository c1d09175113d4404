"""Stopping a run cleanly: SIGINT/SIGTERM ask the loop to stop after the current step.

    with StopRequest() as stop:
        while training:
            ...one step...
            if stop.requested: save a checkpoint and leave

A second SIGINT while a stop is pending raises KeyboardInterrupt at once (the last checkpoint is
kept). Outside the main thread signals cannot be caught, so ``requested`` stays None there.
"""

from __future__ import annotations

import signal
import threading


class StopRequest:
    """Context manager that installs the handlers and restores the previous ones on exit."""

    def __init__(self) -> None:
        self.requested: str | None = None  # the name of the signal that asked ("SIGTERM"), or None
        self._old: dict[int, object] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: stop now
        self.requested = signal.Signals(signum).name

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}
