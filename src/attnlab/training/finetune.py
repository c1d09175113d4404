"""Fine-tuning a pre-trained encoder as a classifier: the pre-trained weights, a fresh head, the Trainer.

    h = Encoder_pretrained(x);   logits = W_c pool(h) + b_c      (W_c, b_c fresh; everything else loaded)

trained with cross-entropy on (text, label) rows for a few hundred steps at a small learning rate.
(``init_from=RUN``, for any family, is ``training/init_from.py``.)

A fine-tuning run records what it starts from in ``RUN/finetuned_from.json`` before anything else of it is
written, so ``attnlab resume RUN`` continues it as a fine-tuning whatever a kill left: while no checkpoint is
complete the pre-trained weights are loaded again (the same run from step 0), and ``finetune.json`` is written
at the end as by an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_write_text
from attnlab.core.killpoints import kill_point
from attnlab.models.base import read_config
from attnlab.models.registry import from_pretrained
from attnlab.training.runs import RUN_CONFIG, claim_new_folder, default_run_name, load_train_config, run_folder
from attnlab.training.trainer import Trainer

# fine-tuning defaults (a few hundred steps at a small learning rate); any key=value overrides them
FINETUNE_DEFAULTS = dict(task="classify", batch_size=32, max_iters=300, lr=1e-4, min_lr=1e-5, warmup_iters=30,
                         weight_decay=0.01, eval_interval=100, eval_iters=1, log_interval=10, sample_tokens=0)
FRESH_HEADS = ("classifier.", "token_classifier.")
# image runs (vit, cnn, or an mae's encoder as a vit): a classifier trained from the pre-trained weights
IMAGE_FINETUNE_DEFAULTS = dict(task="image-classification", batch_size=64, max_iters=1000, lr=5e-4, min_lr=2e-5,
                               warmup_iters=50, weight_decay=0.05, eval_interval=250, eval_iters=10, log_interval=50)
FINETUNED_FROM = "finetuned_from.json"  # {"pretrained": the folder as given to attnlab finetune}
REPORT = "finetune.json"


def image_finetune_config(pretrained: Path, model_cfg, overrides: list[str]):
    """The TrainConfig of a classifier that starts from an image run: a vit (an mae's encoder becomes one: the
    options the two share) or a cnn of the same shape, init_from the run (its head fresh when the classes differ)."""
    from attnlab.models import ViTConfig

    family = "vit" if model_cfg.family in ("mae", "dino") else model_cfg.family
    keep = {f.name for f in dataclasses.fields(ViTConfig)} if family == "vit" else set(dataclasses.asdict(model_cfg))
    model_keys = [f"model.{k}={v}" for k, v in dataclasses.asdict(model_cfg).items()
                  if k in keep and k not in ("family", "n_classes") and v is not None]
    base = [f"{k}={v}" for k, v in IMAGE_FINETUNE_DEFAULTS.items()]
    return load_train_config(None, [*base, f"model.family={family}", *model_keys, f"init_from={pretrained}",
                                    *overrides])


def finetune_config(pretrained: Path, overrides: list[str]):
    """The TrainConfig of fine-tuning ``pretrained``: ``task=classify`` for a bert (its options, the tokenizer from
    it: ``classify.init_from``), ``task=image-classification`` for a vit, cnn, mae or dino run."""
    model_cfg = read_config(pretrained)
    if model_cfg.family in ("vit", "cnn", "mae", "dino"):
        return image_finetune_config(pretrained, model_cfg, overrides)
    if model_cfg.family != "bert":
        raise ConfigError(f"{pretrained} holds a {model_cfg.family} model; finetune needs a bert, vit, cnn, mae or "
                          "dino run")
    base = [f"{k}={v}" for k, v in FINETUNE_DEFAULTS.items()]
    model_keys = [f"model.{k}={json.dumps(v) if v is None else v}" for k, v in model_cfg.changed().items()
                  if k != "n_classes" and v is not None]
    cfg = load_train_config(None, [*base, *model_keys, f"classify.init_from={pretrained}", *overrides])
    if cfg.task != "classify":
        raise ConfigError(f"finetune supports task=classify, got task={cfg.task}")
    return cfg


def finetune_trainer(pretrained: str | Path, overrides: list[str]) -> Trainer:
    """A Trainer for ``task=classify`` whose model is the bert in ``pretrained`` with fresh classifier
    heads, or for ``task=image-classification`` from a vit, cnn or mae run (``image_finetune_config``); its run
    folder records ``pretrained`` (``FINETUNED_FROM``) before the Trainer writes anything there. ``overrides``:
    key=value, data=FILE first."""
    cfg = finetune_config(Path(pretrained), overrides)
    preset = f"finetune-{Path(pretrained).name}"
    if cfg.resume:  # finetune ... resume=true: the run folder already says what it was started from
        return finetuning_trainer(cfg, pretrained, preset)
    made: list[Path] = []  # the folders made for the record, deepest first
    marker = None
    try:
        marker = record_pretrained(cfg, pretrained, preset, made)
        return finetuning_trainer(cfg, pretrained, preset)
    except BaseException:  # bad data, a model that does not fit, Ctrl-C: leave no folder that looks like a run
        if marker is not None and not (marker.parent / RUN_CONFIG).exists():
            marker.unlink(missing_ok=True)
            if made:  # the run's folder, made here: nothing of a run in it (at most the Trainer's lock)
                shutil.rmtree(made[0], ignore_errors=True)
            for folder in made[1:]:  # those above it, left empty
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        raise


def record_pretrained(cfg, pretrained: str | Path, preset: str, made: list[Path]) -> Path | None:
    """Write ``FINETUNED_FROM`` in the run's folder, made (or, for a default name, claimed) first, and set
    ``cfg.name`` to that folder's; returns the file, and adds to ``made`` the folders made for it (the run's,
    where it was new, then any missing above it, deepest first). None (nothing written) for a folder that already
    holds a run (the Trainer refuses it), and on the other processes of a distributed run (rank 0 writes it)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    run_dir = run_folder(cfg.out_dir, cfg.name or default_run_name(preset), check=True)
    if cfg.name is not None and (run_dir / "checkpoints").exists():
        return None
    above = [folder for folder in run_dir.parents if not folder.exists()]
    new = not run_dir.exists()
    if cfg.name is None:  # a folder of its own, as the Trainer would claim it
        run_dir, new = claim_new_folder(run_dir), True
        cfg.name = run_dir.name
    run_dir.mkdir(parents=True, exist_ok=True)
    made.extend([run_dir] if new else [])
    made.extend(above)
    marker = run_dir / FINETUNED_FROM
    atomic_write_text(marker, json.dumps({"pretrained": str(pretrained)}) + "\n")
    return marker


def finetuned_from(run_dir: str | Path) -> str | None:
    """The pre-trained folder a fine-tuning run started from (as given to ``attnlab finetune``), or None for a
    run that is not a fine-tuning (or whose record is unreadable)."""
    try:
        record = json.loads((Path(run_dir) / FINETUNED_FROM).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    source = record.get("pretrained") if isinstance(record, dict) else None
    return source if isinstance(source, str) and source else None


def finetuning_trainer(cfg, pretrained: str | Path, preset: str | None = None) -> Trainer:
    """The Trainer of a fine-tuning run (new, or resumed with ``cfg.resume``). Where it starts at step 0 (a new
    run, or one resumed before its first checkpoint was complete) a bert's encoder (and MLM/NSP/pooler) is loaded
    from ``pretrained``, its classifier heads fresh; an image run's weights come from ``init_from`` (the
    Trainer's). From a checkpoint, everything is the checkpoint's."""
    trainer = Trainer(cfg, preset=preset)
    if trainer.step == 0 and cfg.task == "classify":
        load_encoder(trainer.model, pretrained)
    return trainer


def load_encoder(model, pretrained: str | Path) -> None:
    """Copy every tensor of the bert in ``pretrained`` but its classifier heads into ``model``; ConfigError where
    the two do not fit each other otherwise."""
    state = {k: v for k, v in from_pretrained(pretrained).state_dict().items() if not k.startswith(FRESH_HEADS)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    fresh = sorted({k.split(".")[0] for k in missing})
    if unexpected or fresh != ["classifier", "token_classifier"]:
        raise ConfigError(f"{pretrained} does not fit the fine-tuned model: missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]}")


def finetune_report(trainer: Trainer, pretrained: str | Path, step: int, wall_time_s: float) -> dict:
    """Held-out accuracy and macro-F1 beside the majority-class baseline; written to RUN/finetune.json. For an
    image run the held-out split is the test split."""
    task = trainer.task
    if trainer.cfg.task == "image-classification":
        from attnlab.training.metrics import accuracy, macro_f1

        pred, true = task.predict(trainer.model, "test")
        train_labels = task.data["train"].labels
        scores = {"accuracy": accuracy(true, pred), "macro_f1": macro_f1(true, pred, len(task.classes)),
                  "n": len(true)}
        majority = float((true == train_labels.bincount(minlength=len(task.classes)).argmax()).float().mean())
    else:
        scores = task.scores(trainer.model, "val")
        counts = task.labels[task.rows["train"]].bincount(minlength=len(task.classes))
        majority = float((task.labels[task.rows["val"]] == counts.argmax()).float().mean())
    record = {**scores, "majority_baseline": majority, "steps": step, "wall_time_s": wall_time_s,
              "classes": task.classes, "pretrained": str(pretrained), "data": trainer.cfg.data}
    kill_point("finetune.report")
    atomic_write_text(trainer.run_dir / REPORT, json.dumps(record, indent=2) + "\n")
    return record
