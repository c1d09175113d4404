"""``attnlab eval``: loss, perplexity or accuracy of a run on its data (``training.loop.evaluate_model``);
``attnlab predict``: a prediction and its probability for each new input (``training.predict``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli.errors import at_least, between, kernel_names

MAX_EVAL_ITERS = 100_000  # as train's eval_iters (training/config.py; here without importing torch for --help)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the eval command to the parser."""
    p = sub.add_parser("eval", help="loss, perplexity or accuracy of a run on its data (or --data)")
    p.add_argument("run_dir")
    p.add_argument("--data", default=None)
    p.add_argument("--eval-iters", type=between(1, MAX_EVAL_ITERS), default=100,
                   help="batches per split (tasks with a small finite split evaluate all of it)")
    p.add_argument("--batch-size", type=at_least(1), default=32)
    p.add_argument("--splits", nargs="+", default=None, help="default: the task's, e.g. train val")
    p.add_argument("--kernels", type=kernel_names, default="none",
                   help="attnlab's C++ kernels on a CPU: all, or some of attention, gelu, linear, scan")
    p.set_defaults(func=_cmd_eval)
    p = sub.add_parser("predict", help="predict each input of a file or folder with a trained run (CSV or JSONL)")
    p.add_argument("run_dir")
    p.add_argument("--data", required=True, help="texts (.txt/.csv/.tsv/.jsonl), rows (.csv/.npz), an image "
                   "or a folder of images, {question, context} rows (.jsonl) for a question-answering run, as the "
                   "run's task reads")
    p.add_argument("--out", required=True, help="a new .csv or .jsonl file (never overwritten)")
    p.add_argument("--batch-size", type=at_least(1), default=64)
    p.add_argument("--resize", action="store_true", help="resize images of another size to the model's")
    p.set_defaults(func=_cmd_predict)


def _cmd_eval(args: argparse.Namespace) -> int:
    """Loss (and the task's metrics, e.g. accuracy) of a trained run on its data or on --data."""
    import math

    from attnlab.models.registry import from_pretrained
    from attnlab.models.size import check_fits
    from attnlab.training.loop import evaluate_model
    from attnlab.training.runs import load_run_config, with_kernels
    from attnlab.training.tasks import build_task

    run_dir = Path(args.run_dir)
    cfg = load_run_config(run_dir)
    if args.data:
        cfg.data = args.data
    model = with_kernels(from_pretrained(run_dir), args.kernels, "cpu")  # evaluate_model runs on the CPU
    check_fits(model.config, "the model", args.batch_size, inference=True)  # before any batch is drawn
    task = build_task(cfg, assets=run_dir)  # the run's tokenizer / class names
    splits = tuple(args.splits or task.splits)
    unknown = [s for s in splits if s not in task.splits]
    if unknown:
        from attnlab.core.errors import ConfigError

        raise ConfigError(f"this run's data has no split '{unknown[0]}'; choose from {', '.join(task.splits)}")
    print(f"{run_dir}: {model.num_parameters() / 1e6:.2f}M parameters, data {cfg.data}")
    results = evaluate_model(model, task, splits, args.batch_size, args.eval_iters, cfg.seed)
    for split in splits:
        loss = results[split]
        extra = "".join(f"  {k[len(split) + 1:]} {v:.4f}" for k, v in results.items() if k.startswith(split + "_"))
        ppl = f"  perplexity {math.exp(min(loss, 50)):.2f}" if task.unit == "tokens" else ""
        print(f"{split:>5} loss {loss:.4f}{ppl}{extra}")
    if callable(getattr(task, "scores", None)) and "val" in task.splits:  # exact, over every held-out row
        exact = task.scores(model, "val")
        values = ", ".join(f"{k} {v:.4f}" for k, v in exact.items() if k != "n" and isinstance(v, float))
        print(f"held-out, all {exact['n']} rows: {values}")
    for path in task.eval_report(model, run_dir):
        print(f"wrote {path}")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    """Write one row per input: the prediction and its probability (or the regressed value)."""
    from attnlab.core.errors import ConfigError
    from attnlab.core.fileio import check_writable_file
    from attnlab.training.predict import predict, write_predictions

    out = Path(args.out)
    if out.suffix.lower() not in (".csv", ".jsonl"):
        raise ConfigError(f"--out must be a .csv or .jsonl file, got {out.name}")
    if out.exists():
        raise ConfigError(f"{out} exists; choose a new --out (predictions never overwrite a file)")
    check_writable_file(out, "--out", ConfigError)  # before any prediction is made
    if not Path(args.run_dir).is_dir():
        raise ConfigError(f"run folder not found: {args.run_dir}")
    rows = predict(args.run_dir, args.data, args.batch_size, args.resize)
    write_predictions(rows, out)
    print(f"wrote {len(rows)} predictions to {out}")
    return 0
