"""Fine-tuning a pre-trained encoder as a classifier: the pre-trained weights, a fresh head, the Trainer.

    h = Encoder_pretrained(x);   logits = W_c pool(h) + b_c      (W_c, b_c fresh; everything else loaded)

trained with cross-entropy on (text, label) rows for a few hundred steps at a small learning rate.
(``init_from=RUN``, for any family, is ``training/init_from.py``.)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from attnlab.core.errors import ConfigError
from attnlab.models.base import read_config
from attnlab.models.registry import from_pretrained
from attnlab.training.runs import load_train_config
from attnlab.training.trainer import Trainer

# fine-tuning defaults (a few hundred steps at a small learning rate); any key=value overrides them
FINETUNE_DEFAULTS = dict(task="classify", batch_size=32, max_iters=300, lr=1e-4, min_lr=1e-5, warmup_iters=30,
                         weight_decay=0.01, eval_interval=100, eval_iters=1, log_interval=10, sample_tokens=0)
FRESH_HEADS = ("classifier.", "token_classifier.")
# image runs (vit, cnn, or an mae's encoder as a vit): a classifier trained from the pre-trained weights
IMAGE_FINETUNE_DEFAULTS = dict(task="image-classification", batch_size=64, max_iters=1000, lr=5e-4, min_lr=2e-5,
                               warmup_iters=50, weight_decay=0.05, eval_interval=250, eval_iters=10, log_interval=50)


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


def finetune_trainer(pretrained: str | Path, overrides: list[str]) -> Trainer:
    """A Trainer for ``task=classify`` whose model is the bert in ``pretrained`` with fresh classifier
    heads (on resume, the run's own checkpoint instead), or for ``task=image-classification`` from a vit, cnn or
    mae run (``image_finetune_config``). ``overrides``: key=value, data=FILE first."""
    pretrained = Path(pretrained)
    model_cfg = read_config(pretrained)
    if model_cfg.family in ("vit", "cnn", "mae", "dino"):
        cfg = image_finetune_config(pretrained, model_cfg, overrides)
        return Trainer(cfg, preset=f"finetune-{pretrained.name}")
    if model_cfg.family != "bert":
        raise ConfigError(f"{pretrained} holds a {model_cfg.family} model; finetune needs a bert, vit, cnn, mae or "
                          "dino run")
    base = [f"{k}={v}" for k, v in FINETUNE_DEFAULTS.items()]
    model_keys = [f"model.{k}={json.dumps(v) if v is None else v}" for k, v in model_cfg.changed().items()
                  if k != "n_classes" and v is not None]
    cfg = load_train_config(None, [*base, *model_keys, f"classify.init_from={pretrained}", *overrides])
    if cfg.task != "classify":
        raise ConfigError(f"finetune supports task=classify, got task={cfg.task}")
    trainer = Trainer(cfg, preset=f"finetune-{pretrained.name}")
    if not cfg.resume:  # the encoder (and MLM/NSP/pooler) from the pre-trained model; classifier heads fresh
        state = {k: v for k, v in from_pretrained(pretrained).state_dict().items() if not k.startswith(FRESH_HEADS)}
        missing, unexpected = trainer.model.load_state_dict(state, strict=False)
        fresh = sorted({k.split(".")[0] for k in missing})
        if unexpected or fresh != ["classifier", "token_classifier"]:
            raise ConfigError(f"{pretrained} does not fit the fine-tuned model: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    return trainer


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
    (trainer.run_dir / "finetune.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record
