"""Run folders: ``runs/<name>/`` holds config.yaml, metrics.jsonl, checkpoints, the model files
(config.json, attnlab_model.safetensors, tokenizer.json), samples and plots. Everything reloadable."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from attnlab.core import jsonsafe, yamlsafe
from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.core.fileio import atomic_write_text, check_writable_folder
from attnlab.core.schema import apply_overrides, from_dict, load_yaml

RUN_CONFIG = "config.yaml"
METRICS = "metrics.jsonl"


# keys every run's config.yaml has held since the first version, and a preset written by hand does not need
DUMP_KEYS = frozenset({"name", "out_dir", "resume", "progress", "mfu", "model"})


def load_train_config(path: str | Path | None, overrides: list[str] = (), dump: bool = False):
    """Read a YAML preset (or defaults when ``path`` is None), apply ``key=value`` overrides, validate.
    ``dump``: the file is a run's config.yaml, which attnlab wrote (``dumped_run_config``); a file holding every
    one of ``DUMP_KEYS`` is taken for one (``attnlab train runs/NAME/config.yaml`` trains that run's config again)."""
    from attnlab import presets
    from attnlab.training.config import TrainConfig

    data = load_yaml(presets.resolve(path)) if path is not None else {}
    if dump or set(data) >= DUMP_KEYS:
        data = dumped_run_config(data)
    refuse_kernel_options(data.get("model"), list(overrides))
    data = apply_overrides(TrainConfig, data, list(overrides))
    return from_dict(TrainConfig, data)


def refuse_kernel_options(section: Any, overrides: list[str]) -> None:
    """ConfigError naming ``kernels=`` where a new file's model section or an override still chooses a kernel the
    way earlier versions did (``linear_backend=cpu-fused``): kernels are a run setting, not a model option."""
    from attnlab.core import legacy
    from attnlab.core.schema import parse_override

    given = list(section.items()) if isinstance(section, dict) else []
    given += [(key.split(".")[-1], value) for key, value in map(parse_override, overrides)]
    for key, value in given:
        if key in legacy.KERNEL_OPTIONS and (key != "attn_backend" or value == legacy.KERNEL_VALUE):
            raise ConfigError(f"{key}={value}: attnlab's C++ kernels are a run setting, not a model option; use "
                              f"kernels={legacy.KERNEL_OPTIONS[key]} (or kernels=all)")


def dumped_run_config(data: dict[str, Any]) -> dict[str, Any]:
    """A run's config.yaml as a new file would say it. It lists every model option (those of earlier versions, of
    every family); the model section keeps the options away from their defaults, and the kernel options of
    earlier versions become the run's ``kernels`` (``core/legacy.py``)."""
    from attnlab.core import legacy
    from attnlab.models.config import ModelConfig

    section = data.get("model")
    if not isinstance(section, dict):
        return data  # the schema reports it
    section, kernels = legacy.split_kernel_options(section)
    data = {**data, "model": ModelConfig.from_mapping(section, dump=True).changed()}
    if kernels:
        data["kernels"] = ",".join(kernels)
    return data


def save_train_config(run_dir: Path, cfg: Any) -> None:
    """Write the resolved config as ``config.yaml`` in the run folder (atomically)."""
    atomic_write_text(run_dir / RUN_CONFIG, yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))


# what a run is: its data and split, tokenizer, task, model, seed, optimiser and task options. A resume continues
# that run (its tokenizer, class names and weights come from the checkpoint), so an override of these is refused:
# it used to be ignored, or to train another run from step 0, and was written into config.yaml either way
FIXED_ON_RESUME = ("task", "data", "tokenizer", "bpe_vocab_size", "val_fraction", "init_from", "seed", "optimizer",
                   "model", "images", "mlm", "classify", "seq2seq", "continuous")
SET_BY_RESUME = ("name", "out_dir", "resume")  # the run folder is resume's argument


def check_resume_overrides(run_dir: str | Path, overrides: list[str]) -> None:
    """Refuse, in one ConfigError line and before any work, the ``key=value`` overrides of ``attnlab resume
    RUN`` that would change what the run is (``FIXED_ON_RESUME``: ``tokenizer=bpe``, ``model.n_layer=4``,
    ``data=...``) or name another folder (``SET_BY_RESUME``). Run settings (max_iters, lr, intervals, threads,
    device, ...) may change; an override equal to the run's value is accepted."""
    from attnlab.core.schema import parse_override

    for text in overrides:
        key = parse_override(text)[0]
        if key in SET_BY_RESUME:
            raise ConfigError(f"{key}= is not an option of resume: the run folder is its argument (attnlab resume "
                              f"{run_dir})")
    run_dir = Path(run_dir)
    before = dataclasses.asdict(load_run_config(run_dir))
    after = dataclasses.asdict(load_train_config(run_dir / RUN_CONFIG, overrides, dump=True))
    for key in FIXED_ON_RESUME:
        old, new = before[key], after[key]
        if old == new:
            continue
        if isinstance(old, dict):  # a section: name the option
            field = next(f for f in {**old, **new} if old.get(f) != new.get(f))
            key, old, new = f"{key}.{field}", old.get(field), new.get(field)
        raise ConfigError(f"{key}={new} cannot change on resume: {run_dir} is a run with {key}={old}; start a "
                          "new run to train with it")


def load_run_config(run_dir: str | Path):
    """The TrainConfig a run folder was trained with (its config.yaml)."""
    run_dir = Path(run_dir)
    if not (run_dir / RUN_CONFIG).is_file():
        raise ConfigError(f"{run_dir} is not a run folder (no {RUN_CONFIG})")
    missing = DUMP_KEYS - set(load_yaml(run_dir / RUN_CONFIG))  # an emptied or cut file would read as the defaults
    if missing:
        raise ConfigError(f"{run_dir / RUN_CONFIG} is not a whole run config (it lacks {', '.join(sorted(missing))}): "
                          "it was emptied or cut short; the run's settings cannot be read from it")
    return load_train_config(run_dir / RUN_CONFIG, dump=True)


LATEST = "latest"  # ``runs/latest``: the newest finished run under ``runs/``


def resolve_run_dir(path: str | Path) -> Path:
    """The run folder ``path`` names. ``DIR/latest`` (a bare ``latest``: ``runs/latest``, under the default
    ``out_dir``), where no such folder exists, is the newest finished run in ``DIR``: of the folders whose model is
    at their config's ``max_iters`` (``finished``), the one whose top-level manifest, written as its model is
    published, is the most recent. A name, not a link: nothing is written, so it works on any file system. Any
    other path is returned as it is; a ``latest`` with no finished run behind it is a one-line ConfigError."""
    path = Path(path)
    if path.name != LATEST or path.exists():
        return path
    from attnlab.core.manifest import MANIFEST_NAME

    root = path.parent if path.parent != Path() else Path("runs")
    try:
        runs = [f for f in (sorted(root.iterdir()) if root.is_dir() else []) if not f.name.startswith(".")
                and finished(f)]
    except OSError as e:
        raise ConfigError(f"{path}: cannot list {root}/ ({e.strerror})") from None
    if not runs:
        raise ConfigError(f"{path}: no finished run in {root}/ yet (a run is finished when it reaches its "
                          "max_iters); train one first, or give a run folder")
    return max(runs, key=lambda f: ((f / MANIFEST_NAME).stat().st_mtime_ns, f.name))


def finished(folder: Path) -> bool:
    """Whether ``folder`` holds a finished model: a top-level manifest whose step is the ``max_iters`` of the
    folder's config.yaml, or, in a folder without one (``import-hf``, ``export``), any manifest."""
    from attnlab.core.manifest import read_manifest

    try:
        manifest = read_manifest(folder)
    except CheckpointError:  # damaged: not a run to pick
        return False
    if manifest is None:
        return False
    if not (folder / RUN_CONFIG).is_file():
        return True
    try:
        config = yamlsafe.safe_load((folder / RUN_CONFIG).read_text(encoding="utf-8"))  # no aliases, bounded
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    target = config.get("max_iters") if isinstance(config, dict) else None
    step = manifest.get("step")
    return isinstance(target, int) and isinstance(step, int) and step >= target


def load_model_and_tokenizer(path: str | Path):
    """The model and tokenizer saved in a run folder (or any from_pretrained folder); ``runs/latest`` is the
    newest finished run (``resolve_run_dir``)."""
    from attnlab.models.registry import from_pretrained
    from attnlab.tokenizers import load_tokenizer

    path = resolve_run_dir(path)
    if not path.is_dir():
        raise CheckpointError(f"run folder not found: {path}")
    return from_pretrained(path), load_tokenizer(path)


def with_kernels(model: Any, kernels: str, device_type: str) -> Any:
    """``model`` with attnlab's C++ kernels ``kernels`` (none, all, or some of attention, gelu, linear, scan) swapped
    in for float32 passes on ``device_type`` (``sample --kernels``, ``eval --kernels``), after the checks a run's
    ``kernels`` setting gets: one line each where a kernel has nothing to compute or never runs here."""
    from attnlab.cpu import accelerate, parse_kernels
    from attnlab.training.config import check_kernels

    names = parse_kernels(kernels)
    check_kernels(names, model.config)
    accelerate(model, names, device_type, "float32")
    return model


def load_run_with_text(path: str | Path, data: str):
    """The model (in eval mode) and tokenizer of the run folder ``path`` and the text of ``data`` (a file or a
    built-in corpus), the text read first: a one-line AttnlabError for either, before any work."""
    from attnlab.data.text import read_text, resolve_text_source

    text = read_text(resolve_text_source(data))
    model, tok = load_model_and_tokenizer(path)
    return model.eval(), tok, text


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float in it (at any depth of lists and dicts) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list | tuple):
        return any(map(_has_nonfinite, value))
    return isinstance(value, dict) and any(map(_has_nonfinite, value.values()))


def strict_record(record: dict[str, Any]) -> dict[str, Any]:
    """A metrics record that strict JSON readers accept: a non-finite number becomes null and its key is
    listed under "nonfinite" (with its value as text: "nan", "inf", "-inf"; a list or mapping holding one
    becomes the same with nulls, its text "[0.5, nan]"). A record already carrying "nonfinite" keeps what it lists."""
    bad = {k: str(v) for k, v in record.items() if k != "nonfinite" and _has_nonfinite(v)}
    if not bad:
        return record
    kept = record.get("nonfinite") if isinstance(record.get("nonfinite"), dict) else {}
    return {**{k: _finite(v) if k in bad else v for k, v in record.items()}, "nonfinite": {**kept, **bad}}


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one record to ``metrics.jsonl`` as strict JSON (``strict_record``; NaN is never written).
    A symbolic link in its place is refused: the run never writes outside its folder."""
    path = run_dir / METRICS
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        what = "is a symbolic link" if path.is_symlink() else f"cannot be written ({e.strerror})"
        raise CheckpointError(f"{path} {what}; refusing to write metrics outside the run") from None
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(strict_record(record), allow_nan=False) + "\n")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl (a line cut short by a crash is skipped)."""
    file = Path(run_dir) / METRICS
    if not file.is_file():
        return []
    records = []
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            record = jsonsafe.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash (or edited past what JSON can be read as)
        if isinstance(record, dict):  # anything else is no record of the run's
            records.append(record)
    return records


def _logged_by(record: dict[str, Any], last_step: int) -> bool:
    """Whether ``record`` was logged at or before ``last_step``: its step is an integer up to it, or it has none."""
    step = record.get("step", 0)
    return isinstance(step, int) and not isinstance(step, bool) and step <= last_step


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Keep the records logged up to ``last_step`` (``_logged_by``: those after the checkpoint a run resumes from
    are dropped), rewritten as strict JSON: a NaN or infinity the file holds (written by hand or by an earlier
    version) becomes null (``strict_record``), never a bare NaN that strict JSON readers refuse."""
    kept = [strict_record(r) for r in read_metrics(run_dir) if _logged_by(r, last_step)]
    atomic_write_text(Path(run_dir) / METRICS, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept))


def default_run_name(preset: str | None) -> str:
    """``<preset stem>-YYYYmmdd-HHMMSS`` (``run-...`` without a preset)."""
    stem = Path(preset).stem if preset else "run"
    return f"{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def make_run_folder(run_dir: Path, claim: bool) -> Path:
    """Make the run's folder: with ``claim`` (a default name) one of its own (``claim_new_folder``), else
    ``run_dir`` itself, which may exist (a resumed run; a folder that holds a run and is not resumed was
    refused before any work)."""
    if claim:
        return claim_new_folder(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def claim_new_folder(run_dir: Path) -> Path:
    """Make ``run_dir``, or, where another process made it first, ``run_dir-2``, ``run_dir-3``, ...: each
    attempt an atomic mkdir, so two runs that took the same default name (started in the same second) never
    share a folder, its metrics or its checkpoints."""
    candidate, k = run_dir, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            k += 1
            candidate = run_dir.with_name(f"{run_dir.name}-{k}")


def hold_run(run_dir: Path, resume: bool):
    """The lock of the folder ``run_dir`` (``RUN/.lock``), held by the one process that writes the run while it
    trains: a second train, resume or finetune of the same folder is refused in one line naming the holder. Taken,
    the folder is checked again: a run that another process finished meanwhile is never trained over."""
    from attnlab.core.locks import hold

    lock = hold(run_dir, what="run folder")
    if not resume and (run_dir / "checkpoints").exists():
        lock.release()
        raise ConfigError(f"run folder {run_dir} already holds a run; pass resume=true or another name=")
    return lock


def run_folder(out_dir: str | Path, name: str, check: bool) -> Path:
    """``out_dir/name``. With ``check`` (the process that writes the run), ``out_dir`` must be a folder this
    process can write in (or make) and ``name`` in it a folder or nothing: a one-line ConfigError before the
    data, the model or any step, never a failed save at the end."""
    run_dir = Path(out_dir) / name
    if check:
        check_writable_folder(Path(out_dir), "out_dir", ConfigError)
        if run_dir.exists() and not run_dir.is_dir():
            raise ConfigError(f"run folder {run_dir} exists and is not a folder; pass another name=")
    return run_dir
