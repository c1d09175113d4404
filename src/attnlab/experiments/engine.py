"""Where a study's runs run: one after another in this process, or as Ray tasks on this machine or a cluster.

A study (``study.run_arms``) is a grid of independent runs, each ``fn(seed, lr) -> result`` for one (arm, rate,
seed). An engine takes a list of such jobs and yields ``(index, result)`` as each finishes:

    InProcess()                       one by one in this process (the default of ``run_arms`` called from Python)
    RayEngine()                       Ray started embedded on this machine, every run a Ray task
    RayEngine(address="HOST:PORT")    a running Ray cluster (``ray start --head``; or the RAY_ADDRESS variable)

Ray schedules the tasks over the cluster's CPUs and GPUs: each asks for ``cpus_per_run`` CPUs (its torch thread
count) and, on a GPU, ``gpus_per_run`` of one GPU (a fraction packs several small runs on one GPU); at most
``max_in_flight`` runs are submitted at a time (``attnlab experiment --workers``; default: as many as the
cluster fits). A worker process that dies mid-run (killed, out of memory, a lost node) is retried by Ray
(``max_retries``); every run seeds itself, so on the same kind of device and thread count the retried result is
the same. An exception raised by the run itself is not retried: it stops the study with its own message, and the
runs finished before it stay kept (``run_arms(keep=...)``).

Embedded Ray, and a cluster joined at a loopback address, take 127.0.0.1 as the node's address (Ray's own
switch, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set before Ray is first imported in this process), its
dashboard off; joining a cluster on another machine uses that cluster's addresses.

``using(engine)`` makes ``engine`` the one ``run_arms`` uses within a block (``attnlab experiment`` sets it);
``current()`` is the engine in force.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from attnlab.core.errors import ConfigError

RunFn = Callable[[Any, float], Any]
Job = tuple[RunFn, Any, float]  # (fn, seed, lr), or (fn, seeds, lr) for seeds trained as one batched model
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def timed(fn: RunFn, seed: int | tuple[int, ...], lr: float, threads: int | None = None) -> Any:
    """``fn(seed, lr)`` as a dict, with its wall seconds as ``seconds`` unless the run reports its own; with
    ``threads``, torch uses that many threads for it. For a tuple of seeds (a batched arm, ``study.Batched``),
    ``fn(seeds, lr)`` returns one result per seed, and each is given its share of the wall time."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    started = time.perf_counter()
    if not isinstance(seed, tuple):
        result = dict(fn(seed, lr))
        result.setdefault("seconds", time.perf_counter() - started)
        return result
    results = [dict(r) for r in fn(list(seed), lr)]
    if len(results) != len(seed):
        raise ValueError(f"a batched arm returned {len(results)} results for {len(seed)} seeds")
    for r in results:
        r.setdefault("seconds", (time.perf_counter() - started) / len(seed))
    return results


class InProcess:
    """Every run in this process, one after another, in the grid's order (``attnlab experiment --in-process``:
    a breakpoint in a run stops there; nothing is started beside this process)."""

    engine = "in-process"

    def __init__(self, keep_root: Path | None = None, device: str = "cpu",
                 context: dict[str, Any] | None = None, threads: int | None = None) -> None:
        self.context = context  # what names this run's kept runs beside each study's protocol (study_folder)
        self.threads = threads  # torch threads per run, as a Ray task's CPUs (None: this process's own)
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.keep_root, self.device = keep_root, device
        self.taken: set[str] = set()  # the folders under keep_root given to studies so far (study.study_folder)

    def __enter__(self) -> InProcess:
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("--device cuda: this machine has no GPU; use --device cpu")
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def describe(self) -> str:
        """The engine in one line (for the log)."""
        return f"every run in this process, one after another, device {self.device}"

    def results(self, jobs: Sequence[Job]) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(index, result)`` of each job, run here in turn (with ``threads``: on that many torch threads, the
        process's own count restored after, so that a run gives what it gives as a Ray task asking for as many CPUs)."""
        import torch

        before = torch.get_num_threads()
        try:
            for i, (fn, seed, lr) in enumerate(jobs):
                yield i, timed(fn, seed, lr, self.threads)
        finally:
            torch.set_num_threads(before)


class RayEngine:
    """Every run a Ray task (see the module docstring); a context manager: Ray is started (or joined) on entry
    and left on exit. ``device`` is "cpu", "cuda" or "auto" (cuda where the cluster has GPUs); ``keep_root``:
    where ``run_arms`` keeps finished runs when a study names no folder of its own (``attnlab experiment``
    sets OUT/.runs)."""

    def __init__(self, address: str | None = None, cpus_per_run: int = 1, gpus_per_run: float | None = None,
                 max_in_flight: int | None = None, device: str = "cpu", num_cpus: int | None = None,
                 max_retries: int = 3, keep_root: Path | None = None, context: dict[str, Any] | None = None) -> None:
        if cpus_per_run < 1:
            raise ConfigError(f"cpus per run must be at least 1, got {cpus_per_run}")
        if max_in_flight is not None and max_in_flight < 1:
            raise ConfigError(f"--workers must be at least 1, got {max_in_flight}")
        if device not in ("cpu", "cuda", "auto"):
            raise ConfigError(f"--device must be cpu, cuda or auto, got {device!r}")
        if gpus_per_run is not None and not (math.isfinite(gpus_per_run) and gpus_per_run > 0
                                             and (gpus_per_run <= 1 or gpus_per_run % 1 == 0)):
            raise ConfigError(f"--gpus-per-run must be a share of one GPU (0 < g <= 1) or a whole number of GPUs, "
                              f"got {gpus_per_run}")
        self.flag = "--address" if address else "RAY_ADDRESS"  # where the address came from, for the messages
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.cpus_per_run, self.gpus_per_run, self.max_in_flight = cpus_per_run, gpus_per_run, max_in_flight
        self.device, self.num_cpus, self.max_retries, self.keep_root = device, num_cpus, max_retries, keep_root
        self.engine = "ray"
        self.context = context  # what names this run's kept runs beside each study's protocol (study_folder)
        self.taken: set[str] = set()  # the folders under keep_root given to studies so far (study.study_folder)
        self._ray: Any = None

    def __enter__(self) -> RayEngine:
        if self.address is None and self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("--device cuda: this machine has no GPU; use --device cpu, or --address of a "
                                  "Ray cluster with GPUs")
        if self.address is not None:
            if self.address != "auto":  # auto: the cluster `ray start` left on this machine, found by Ray
                reachable(self.address, self.flag)
            if os.environ.get("RAY_AUTH_TOKEN") or (Path.home() / ".ray" / "auth_token").is_file():
                # as `ray start` does on the head: a token at hand means the cluster was started with it (Ray's
                # client sends it to an explicit address only when told to)
                os.environ.setdefault("RAY_AUTH_MODE", "token")
        loopback = self.address is None or self.address.rsplit(":", 1)[0].strip("[]") in LOOPBACK
        if loopback:  # Ray's own switch: every server of a local cluster on 127.0.0.1, nothing on other addresses
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        from attnlab.core.extras import require

        ray = require("ray", "the study engine (or run with --in-process)")
        # Ray says on every start that it turned on token authentication for the new cluster (the cluster stays
        # on loopback and keeps it on): its notes are for Ray's own log, not for the study's
        logging.getLogger("ray").setLevel(logging.ERROR)
        self._ray = ray
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if self.address is None:  # a new cluster of this machine, for this process only
            options.update(address="local", _node_ip_address="127.0.0.1", num_cpus=self.num_cpus,
                           object_store_memory=256 * 2**20)
        else:
            options.update(address=self.address)
        try:
            ray.init(**options)
        except (ConnectionError, ValueError, RuntimeError) as e:
            where = "start Ray on this machine" if self.address is None else f"join the Ray cluster at {self.address}"
            raise ConfigError(f"cannot {where}: {str(e).splitlines()[0]}") from None
        try:
            self._check_resources(ray)
        except ConfigError:
            ray.shutdown()
            self._ray = None
            raise
        self.engine = f"ray {ray.__version__}"
        return self

    def _check_resources(self, ray: Any) -> None:
        """Resolve ``auto`` and the GPU share; ConfigError where no node of the cluster could ever run a run
        (Ray would wait for one for ever)."""
        gpus = ray.cluster_resources().get("GPU", 0)
        if self.device == "auto":
            self.device = "cuda" if gpus > 0 else "cpu"
        if self.device == "cuda" and gpus == 0:
            raise ConfigError("--device cuda: the Ray cluster has no GPU; use --device cpu (or auto)")
        if self.gpus_per_run is None:
            self.gpus_per_run = 0.25 if self.device == "cuda" else 0.0  # four small runs share a GPU
        if self.device == "cpu" and self.gpus_per_run:
            raise ConfigError("--gpus-per-run applies to --device cuda")
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        most_cpus = max((n.get("CPU", 0) for n in nodes), default=0)
        most_gpus = max((n.get("GPU", 0) for n in nodes), default=0)
        if self.cpus_per_run > most_cpus:
            raise ConfigError(f"--cpus-per-run {self.cpus_per_run}: no node of the Ray cluster has more than "
                              f"{most_cpus:g} CPUs")
        if self.gpus_per_run > most_gpus:
            raise ConfigError(f"--gpus-per-run {self.gpus_per_run:g}: no node of the Ray cluster has more than "
                              f"{most_gpus:g} GPUs")

    def __exit__(self, *exc: Any) -> None:
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None

    def describe(self) -> str:
        """The cluster in one line (for the log)."""
        r = self._ray.cluster_resources()
        where = "embedded on this machine" if self.address is None else f"at {self.address}"
        return (f"{self.engine} {where}: {r.get('CPU', 0):g} CPUs, {r.get('GPU', 0):g} GPUs; each run asks for "
                f"{self.cpus_per_run} CPU{'s' if self.cpus_per_run > 1 else ''}"
                + (f" and {self.gpus_per_run:g} GPU" if self.gpus_per_run else "") + f", device {self.device}")

    def results(self, jobs: Sequence[Job]) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(index, result)`` of each job as it finishes (not in order)."""
        ray = self._ray
        if ray is None:
            raise RuntimeError("RayEngine.results outside its with-block")
        task = ray.remote(timed).options(num_cpus=self.cpus_per_run, num_gpus=self.gpus_per_run or 0,
                                         max_retries=self.max_retries, retry_exceptions=False)
        shared: dict[int, Any] = {}  # one object per distinct run function (an arm's closure and its data)
        refs = [shared.setdefault(id(fn), ray.put(fn)) for fn, _, _ in jobs]
        limit = self.max_in_flight or len(jobs)
        pending: dict[Any, int] = {}
        submitted = 0
        try:
            while submitted < len(jobs) or pending:
                while submitted < len(jobs) and len(pending) < limit:
                    _, seed, lr = jobs[submitted]
                    pending[task.remote(refs[submitted], seed, lr, self.cpus_per_run)] = submitted
                    submitted += 1
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    index = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:  # the run's own exception, as it was raised
                        raise (e.cause if isinstance(e.cause, BaseException) else e) from None
                    yield index, result
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)


def reachable(address: str, flag: str = "--address", timeout: float = 10.0) -> None:
    """ConfigError unless ``address`` (given by ``flag``) is HOST:PORT and something answers there (Ray itself
    would wait and retry for minutes before it says so)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "/" in address:
        hint = (" (an http:// address is the dashboard's, for `ray job submit`)" if "://" in address else "")
        raise ConfigError(f"{flag} {address!r}: give the Ray cluster's HOST:PORT, as `ray start --head` prints it, "
                          f"or auto for the cluster started on this machine{hint}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(f"{flag} {address}: nothing answers there ({e.strerror or e}); start the cluster with "
                          f"`ray start --head`, or leave the address out to run on this machine") from None


_ENGINE: contextvars.ContextVar[Any] = contextvars.ContextVar("attnlab_study_engine", default=None)


def current() -> Any:
    """The engine ``run_arms`` uses here: the one set by ``using``, else ``InProcess()``."""
    engine = _ENGINE.get()
    return InProcess() if engine is None else engine


@contextlib.contextmanager
def using(engine: Any) -> Iterator[Any]:
    """Within the block, ``run_arms`` runs its runs on ``engine``."""
    token = _ENGINE.set(engine)
    try:
        yield engine
    finally:
        _ENGINE.reset(token)
