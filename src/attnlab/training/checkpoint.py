"""Checkpoints: weights as safetensors, trainer state as a weights-only torch file, written atomically.

A checkpoint is a folder ``<run>/checkpoints/step-0000500/`` holding

    config.json, attnlab_model.safetensors,   the model, loadable by ``from_pretrained``
    tokenizer.json                            (+ whatever else the task saves, e.g. labels.json)
    trainer_state.pt                          optimiser moments, step, RNG states (tensors
                                              and plain Python values only)
    manifest.json                             step + SHA-256 of every file, written last

It is built under a temporary name and renamed into place, so a crash leaves either a complete
checkpoint or none; ``latest_checkpoint`` also re-checks the hashes. The newest ``keep`` are kept,
and the one with the lowest val loss is also kept as ``checkpoints/best/``. The newest checkpoint is
mirrored at the top of the run folder so ``attnlab sample runs/NAME`` works mid-run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.core.fileio import atomic_path
from attnlab.core.killpoints import kill_point
from attnlab.core.manifest import MANIFEST_NAME, REQUIRED, read_manifest, verify_manifest, write_manifest

CHECKPOINTS = "checkpoints"
STATE_NAME = "trainer_state.pt"
BEST = "best"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    run_dir: Path, step: int, model, assets, trainer_state: dict[str, Any], keep: int = 2,
    is_best: bool = False,
) -> Path:
    """Write ``<run_dir>/checkpoints/step-NNNNNNN`` atomically and prune to the newest ``keep``.

    With ``is_best`` the checkpoint is also kept as ``checkpoints/best`` (hard links, no copy).
    If the disk fills up (or any write fails) the half-written folder is removed and a
    CheckpointError is raised; the previous checkpoints are untouched and stay loadable.
    """
    root = Path(run_dir) / CHECKPOINTS
    refuse_links(run_dir)
    final = root / f"step-{step:07d}"
    tmp = root / f".tmp-step-{step:07d}-{os.getpid()}"
    staged: list[tuple[Path, Path]] = []
    complete = False
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        kill_point("checkpoint.writing")
        assets.save(tmp)  # the task's: tokenizer.json, class names, ...
        with atomic_path(tmp / STATE_NAME) as f:
            torch.save(trainer_state, f)
        write_manifest(tmp, step, best=is_best)  # last: a folder with a manifest is complete
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        complete = True
        kill_point("checkpoint.renamed")
        _publish(Path(run_dir), final, step, is_best, staged)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        for src, _ in staged:
            src.unlink(missing_ok=True)
        reason = e.strerror or str(e)
        if complete:
            raise CheckpointError(f"checkpoint {final} is complete, but the copy at the top of {run_dir} could "
                                  f"not be updated ({reason}); load or resume from {final}") from None
        raise CheckpointError(
            f"cannot write checkpoint {final} ({reason}); the previous checkpoint is kept"
        ) from None
    for old in list_checkpoints(run_dir)[:-keep]:
        kill_point("prune")
        shutil.rmtree(old, ignore_errors=True)
    return final


def _publish(run_dir: Path, final: Path, step: int, is_best: bool, staged: list[tuple[Path, Path]]) -> None:
    """After ``final`` is in place: link it as best/ (``is_best``), then mirror it at the top of the run
    folder: every file is copied beside its place first (a full disk stops here, with the top level
    untouched, ``staged`` lists the copies to clean up), then all are renamed in, then the manifest
    that vouches for them."""
    if is_best:
        _replace_dir_with_links(final, run_dir / CHECKPOINTS / BEST)
    mirrored = tuple(f.name for f in sorted(final.iterdir()) if f.name not in (STATE_NAME, MANIFEST_NAME))
    for name in mirrored:
        staged.append((run_dir / f".{name}.mirror.tmp", run_dir / name))
        shutil.copyfile(final / name, staged[-1][0])
    kill_point("mirror.staged")
    for src, dst in staged:
        os.replace(src, dst)
        kill_point("mirror.renaming")
    kill_point("mirror.manifest")
    write_manifest(run_dir, step, mirrored)


def finish_publishing(run_dir: Path, checkpoint: Path) -> None:
    """A kill after ``checkpoint`` was renamed into place but before best/ or the top-level copy caught up
    with it (its last step, or a best/ that no later evaluation replaces, would be lost): do that now."""
    manifest, best = read_manifest(checkpoint) or {}, read_manifest(Path(run_dir) / CHECKPOINTS / BEST) or {}
    step = manifest.get("step")
    relink = bool(manifest.get("best")) and best.get("step") != step
    if relink or (read_manifest(Path(run_dir)) or {}).get("step") != step:
        staged: list[tuple[Path, Path]] = []
        try:
            _publish(Path(run_dir), checkpoint, step, relink, staged)
        except OSError as e:
            for src, _ in staged:
                src.unlink(missing_ok=True)
            raise CheckpointError(f"cannot update {run_dir} from {checkpoint} ({e.strerror or e})") from None


def _replace_dir_with_links(src: Path, dst: Path) -> None:
    """Make ``dst`` a hard-linked copy of ``src``, swapped in with renames (never half-built)."""
    tmp = dst.with_name(f".tmp-{dst.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for file in src.iterdir():
        os.link(file, tmp / file.name)
    old = dst.with_name(f".old-{dst.name}-{os.getpid()}")
    if dst.exists():
        os.replace(dst, old)
        kill_point("best.swap")
    os.replace(tmp, dst)
    shutil.rmtree(old, ignore_errors=True)


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete what a killed writer left behind: ``.tmp-*`` folders and ``.*.tmp`` files."""
    run_dir = Path(run_dir)
    root = run_dir / CHECKPOINTS
    if not (root / BEST).exists():  # killed between the two renames that swap best/ in: put one back
        for candidate in sorted(root.glob(f".tmp-{BEST}-*")) + sorted(root.glob(f".old-{BEST}-*")):
            try:
                verify_checkpoint(candidate)
            except CheckpointError:
                continue
            os.replace(candidate, root / BEST)
            break
    for path in [*root.glob(".tmp-*"), *root.glob(".old-*")]:
        shutil.rmtree(path, ignore_errors=True)
    for path in run_dir.glob(".*.tmp"):
        path.unlink(missing_ok=True)


def refuse_links(run_dir: Path) -> None:
    """A run folder whose checkpoints/ (or a checkpoint in it) or metrics.jsonl is a symbolic link is
    refused: pruning deletes folders there and training appends there, never outside the run."""
    root = Path(run_dir) / CHECKPOINTS
    inside = root.iterdir() if root.is_dir() and not root.is_symlink() else ()
    links = [p for p in [root, Path(run_dir) / "metrics.jsonl", *inside] if p.is_symlink()]
    if links:
        raise CheckpointError(f"{links[0]} is a symbolic link; a run folder's checkpoints must be inside it")


def resume_point(run_dir: Path, run_config: str, main: bool = True, max_iters: int | None = None) -> Path | None:
    """Where ``resume`` starts: the newest checkpoint that verifies (after tidying what a killed writer
    left, ``remove_stale_temporaries``; then its best/ and top-level copies are brought up to it,
    ``finish_publishing``; both only where ``main``, rank 0 of a distributed run). None when the run
    stopped before its first checkpoint was complete (its ``run_config`` file is there, no checkpoint
    is): training it again from step 0 with the same seeds is the same run. A CheckpointError when the
    folder is not a run, or every checkpoint is damaged; a ConfigError when ``max_iters`` lies below the
    newest checkpoint's step (the run cannot train backwards: it used to report "done" at its old step,
    exit 0)."""
    refuse_links(run_dir)
    if main:  # one process of a distributed run tidies and publishes; the others only read
        remove_stale_temporaries(run_dir)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None and (list_checkpoints(run_dir) or not (Path(run_dir) / run_config).is_file()):
        raise CheckpointError(f"resume=true but {run_dir} has no valid checkpoint")
    if checkpoint is not None and main:
        finish_publishing(run_dir, checkpoint)
    step = int(checkpoint.name.removeprefix("step-")) if checkpoint is not None else 0  # verified: the name's
    if max_iters is not None and max_iters < step:
        raise ConfigError(f"max_iters={max_iters} is below step {step}, where {run_dir} resumes: a run cannot "
                          f"train backwards; give max_iters above {step} to train on")
    return checkpoint


def best_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint with the lowest val loss so far, if it verifies."""
    path = Path(run_dir) / CHECKPOINTS / BEST
    if not (path / MANIFEST_NAME).is_file():
        return None
    try:
        verify_checkpoint(path)
    except CheckpointError:
        return None
    return path


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders (with a manifest), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / MANIFEST_NAME).is_file())


def verify_checkpoint(path: Path) -> int:
    """Return the checkpoint's step if every file matches its manifest hash and the step matches the
    folder's name, else raise CheckpointError."""
    if read_manifest(path) is None:
        raise CheckpointError(f"{path} has no {MANIFEST_NAME}: an incomplete checkpoint")
    step = verify_manifest(path, required=(*REQUIRED, STATE_NAME))
    if step is None or (path.name.startswith("step-") and path.name != f"step-{step:07d}"):
        raise CheckpointError(f"{path / MANIFEST_NAME} says step {step}, which is not the folder's")
    return step


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint whose files verify; corrupt ones are skipped with a warning."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as e:
            print(f"warning: skipping checkpoint {path.name}: {e}")
    return None


def load_trainer_state(path: Path) -> dict[str, Any]:
    """Load trainer_state.pt without unpickling arbitrary objects (weights_only=True)."""
    file = Path(path) / STATE_NAME
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"no {STATE_NAME} in {path}") from None
    except Exception as e:  # pickle.UnpicklingError, RuntimeError (truncated zip), ...
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot load {file} safely: {line}") from None


def check_trainer_state(state: Any, optimizer: torch.optim.Optimizer, checkpoint: Path) -> None:
    """Validate a loaded trainer state against the optimiser it will be loaded into, before any
    ``load_state_dict`` (a crafted state with wrong-shaped moments used to crash the process): the step
    is the checkpoint's; every saved moment is a floating tensor of its parameter's shape; RNG states are
    byte tensors of the right size. One CheckpointError line naming the file otherwise."""
    # the checkpoint's hashes and step were verified when resume chose it: read the step, hash nothing again
    file, step = checkpoint / STATE_NAME, (read_manifest(checkpoint) or {}).get("step")

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{file} does not fit this run: {why}")

    if not isinstance(state, dict) or not isinstance(state.get("optimizer"), dict):
        raise bad("no optimizer state")
    if state.get("step") != step:
        raise bad(f"its step {state.get('step')!r} is not the checkpoint's {step}")
    saved, groups = state["optimizer"].get("state"), state["optimizer"].get("param_groups")
    ours = [p for g in optimizer.param_groups for p in g["params"]]
    if not isinstance(saved, dict) or not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        raise bad("its optimizer has another layout")
    indices = [i for g in groups for i in (g.get("params") if isinstance(g, dict) else None) or []]
    if sorted(indices) != list(range(len(ours))):
        raise bad(f"its optimizer covers {len(indices)} parameters, this model has {len(ours)}")
    for index, moments in saved.items():
        if not isinstance(moments, dict) or index not in range(len(ours)):
            raise bad(f"optimizer state entry {index!r}")
        shape = tuple(ours[index].shape)
        for name, t in moments.items():
            if not torch.is_tensor(t) or (t.dim() > 0 and (tuple(t.shape) != shape or not t.is_floating_point())):
                raise bad(f"{name} of parameter {index} is {getattr(t, 'shape', type(t).__name__)}, not {shape}")
    size = torch.Generator().get_state().numel()
    for key in ("batch_rng", "torch_rng"):
        for rng in state.get(f"{key}_per_rank") or [state.get(key)]:
            if not torch.is_tensor(rng) or rng.dtype != torch.uint8 or rng.dim() != 1 or (
                    key == "batch_rng" and rng.numel() != size):
                raise bad(f"{key} is not a random-generator state")
