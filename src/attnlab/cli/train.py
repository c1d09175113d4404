"""``attnlab train | resume | finetune``: start, continue, or fine-tune a run (``training.Trainer``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the train, resume, finetune commands to the parser."""
    p = sub.add_parser("train", help="train a model from a YAML preset plus key=value overrides")
    p.add_argument("config", help="a preset name (e.g. shakespeare-char) or a YAML file")
    p.add_argument("overrides", nargs="*", help="key=value, e.g. data=path.txt max_iters=500 n_layer=6")
    p.add_argument("--profile", action="store_true", help="write a torch profiler trace of 10 steps to RUN/profile/")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("resume", help="continue a run from its newest valid checkpoint")
    p.add_argument("run_dir")
    p.add_argument("overrides", nargs="*", help="run settings as key=value, e.g. max_iters=4000 threads=2 (what the "
                   "run is, its data, tokenizer, task, model and seed, cannot change)")
    p.set_defaults(func=_cmd_resume)

    p = sub.add_parser("finetune", help="fine-tune a pre-trained encoder as a classifier on (text, label) rows")
    p.add_argument("run_dir", help="the pre-trained bert (a run folder, or one written by import-hf)")
    p.add_argument("overrides", nargs="*", help="task=classify data=FILE.csv|jsonl, then any key=value, e.g. "
                   "max_iters=500 lr=5e-5 model.dropout=0.1 classify.test_fraction=0.2")
    p.set_defaults(func=_cmd_finetune)


def _cmd_train(args: argparse.Namespace) -> int:
    from attnlab.training import distributed
    from attnlab.training.runs import load_train_config
    from attnlab.training.trainer import Trainer, TrainingInterrupted

    overrides = [*args.overrides, *(["profile_steps=10"] if getattr(args, "profile", False) else [])]
    cfg = load_train_config(args.config, overrides, dump=getattr(args, "dump", False))  # dump: a run's own file
    trainer = Trainer(cfg, preset=args.config)
    say = trainer.log  # rank 0 only under torchrun
    n_params = trainer.model.num_parameters()
    world = f", {trainer.dist.world_size} processes" if trainer.dist.enabled else ""
    m = cfg.model
    if m.family in ("vit", "cnn"):
        shape = f"{m.n_classes} classes, {m.in_channels}x{m.image_size}x{m.image_size} images"
    elif m.family == "dino":
        shape = (f"{m.in_channels}x{m.image_size}x{m.image_size} images, 2 global + local {m.local_size}px views, "
                 f"{m.out_dim} prototypes")
    elif m.family == "mae":
        shape = f"{m.in_channels}x{m.image_size}x{m.image_size} images, {m.mask_ratio:.0%} of the patches masked"
    elif m.family == "captioner":
        shape = (f"{m.in_channels}x{m.image_size}x{m.image_size} images -> captions of up to {m.block_size} tokens, "
                 f"vocab {m.vocab_size}")
    elif m.family == "mlp":
        shape = f"{m.n_steps} x {m.n_features} inputs"
    elif m.family == "recurrent":
        shape = f"{m.cell}, {m.n_features} features per step"
    elif m.family == "encoder":  # continuous inputs: no vocabulary
        shape = (f"{m.n_features} features per step, up to {m.block_size} steps" if m.inputs == "features"
                 else f"sets of up to {m.block_size} of {m.n_elements} element types")
    else:
        shape = f"vocab {m.vocab_size}, context {m.block_size}"
    say(f"run: {trainer.run_dir}  model: {m.family}, {n_params / 1e6:.2f}M parameters, {shape}{world}")
    start = trainer.step
    try:
        result = trainer.train()
    except TrainingInterrupted as e:
        if trainer.dist.is_main:
            print(f"{e}; continue with: attnlab resume {e.run_dir}", file=sys.stderr)
        return 130
    finally:
        distributed.cleanup(trainer.dist)
    if not trainer.dist.is_main:
        return 0
    if result.step == start:  # resumed at its max_iters: the resume only finished publishing the run
        print(f"done: the run was already at max_iters={result.step}, nothing to train (give max_iters above "
              f"{result.step} to train on); weights, metrics and loss.png in {result.run_dir}")
        return 0
    val = f"{result.val_loss:.4f}" if result.val_loss is not None else "n/a"
    print(f"done: step {result.step}, val loss {val}, {result.wall_time_s:.1f} s; "
          f"weights, metrics and loss.png in {result.run_dir}")
    if result.sample is not None:
        print("--- sample ---")
        print(result.sample)
    return 0

def _cmd_resume(args: argparse.Namespace) -> int:
    """Continue a run: ``attnlab train`` of its config.yaml, or, for a fine-tuning run, ``attnlab finetune``'s."""
    from attnlab.core.errors import ConfigError
    from attnlab.training.finetune import finetuned_from
    from attnlab.training.runs import RUN_CONFIG, check_resume_overrides, load_train_config

    run_dir = Path(args.run_dir)
    pretrained = finetuned_from(run_dir)
    args.config = str(run_dir / RUN_CONFIG)
    if not Path(args.config).is_file():
        if pretrained is not None:  # killed before the Trainer wrote anything
            raise ConfigError(f"{run_dir} is not a run folder (no {RUN_CONFIG}): the fine-tuning stopped before "
                              f"it began, so run attnlab finetune {pretrained} again")
        if not (run_dir / "checkpoints").exists():  # e.g. a train killed before it wrote anything
            raise ConfigError(f"{run_dir} is not a run folder (no {RUN_CONFIG}): nothing of a run was saved "
                              "there, so run the train command again")
        raise ConfigError(f"{run_dir} is not a run folder (no {RUN_CONFIG})")
    check_resume_overrides(run_dir, args.overrides)  # what the run is cannot change (tokenizer=, model.*, ...)
    # quoted as YAML strings: a folder named null, true, 1.50 or #x is that folder, not None, True, 1.5 or ""
    name, out_dir = ("'" + v.replace("'", "''") + "'" for v in (run_dir.name, str(run_dir.parent)))
    args.overrides = [*args.overrides, "resume=true", f"name={name}", f"out_dir={out_dir}"]
    args.dump = True
    if pretrained is None:
        return _cmd_train(args)
    from attnlab.training.finetune import finetuning_trainer

    cfg = load_train_config(args.config, args.overrides, dump=True)
    return _finetune(finetuning_trainer(cfg, pretrained), pretrained)


def _cmd_finetune(args: argparse.Namespace) -> int:
    """Pre-trained encoder + fresh classification head, trained on (text, label) rows through the Trainer."""
    from attnlab.training.finetune import finetune_trainer

    return _finetune(finetune_trainer(args.run_dir, args.overrides), args.run_dir)


def _finetune(trainer, pretrained: str) -> int:
    """Train a fine-tuning run (new or resumed) to its max_iters, then write and print its held-out scores."""
    from attnlab.training.finetune import finetune_report
    from attnlab.training.trainer import TrainingInterrupted

    task, cfg = trainer.task, trainer.cfg
    if cfg.task == "image-classification":
        n_train, n_val, unit = len(task.data["train"]), len(task.data["test"]), "test images"
    else:
        n_train, n_val, unit = len(task.rows["train"]), len(task.rows["val"]), "held-out rows"
    print(f"run: {trainer.run_dir}  fine-tuning {pretrained} ({trainer.model.num_parameters() / 1e6:.2f}M "
          f"parameters) on {cfg.data}: {len(task.classes)} classes, {n_train} train / {n_val} {unit}")
    try:
        result = trainer.train(keep_lock=True)  # held until finetune.json is written too
        r = finetune_report(trainer, pretrained, result.step, result.wall_time_s)
    except TrainingInterrupted as e:
        print(f"{e}; continue with: attnlab resume {e.run_dir}", file=sys.stderr)
        return 130
    finally:
        trainer.release_lock()
    print(f"done: step {result.step}, {result.wall_time_s:.1f} s; held-out accuracy {r['accuracy']:.4f}, "
          f"macro-F1 {r['macro_f1']:.4f} on {r['n']} {unit.split()[-1]} "
          f"(majority-class baseline {r['majority_baseline']:.4f}); "
          f"model in {trainer.run_dir}")
    return 0
