"""The command line: ``attnlab train | resume | sample | eval | inspect | bench | experiment``.

Every user error (bad config, missing file, unknown character, corrupt checkpoint) ends with one
line on stderr and exit status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_train(args: argparse.Namespace) -> int:
    from attnlab.runs import load_train_config
    from attnlab.training import distributed
    from attnlab.training.trainer import Trainer, TrainingInterrupted

    overrides = [*args.overrides, *(["profile_steps=10"] if getattr(args, "profile", False) else [])]
    cfg = load_train_config(args.config, overrides)
    trainer = Trainer(cfg, preset=args.config)
    say = trainer.log  # rank 0 only under torchrun
    n_params = trainer.model.num_parameters()
    world = f", {trainer.dist.world_size} processes" if trainer.dist.enabled else ""
    m = cfg.model
    shape = (f"vocab {m.vocab_size}, context {m.block_size}" if m.family not in ("vit", "cnn")
             else f"{m.n_classes} classes, {m.in_channels}x{m.image_size}x{m.image_size} images")
    say(f"run: {trainer.run_dir}  model: {m.family}, {n_params / 1e6:.2f}M parameters, {shape}{world}")
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
    val = f"{result.val_loss:.4f}" if result.val_loss is not None else "n/a"
    print(f"done: step {result.step}, val loss {val}, {result.wall_time_s:.1f} s; "
          f"weights, metrics and loss.png in {result.run_dir}")
    if result.sample is not None:
        print("--- sample ---")
        print(result.sample)
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    from attnlab.runs import RUN_CONFIG

    args.config = str(run_dir / RUN_CONFIG)
    if not Path(args.config).is_file():
        from attnlab.errors import ConfigError

        raise ConfigError(f"{run_dir} is not a run folder (no {RUN_CONFIG})")
    args.overrides = [*args.overrides, "resume=true", f"name={run_dir.name}", f"out_dir={run_dir.parent}"]
    return _cmd_train(args)


def _cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from attnlab.errors import ConfigError
    from attnlab.generation import SamplingConfig, stream
    from attnlab.runs import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(args.run_dir)
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, use_cache=not args.no_cache, seed=args.seed)
    cfg.validate()
    ids = tok.encode(args.prompt)  # raises TokenizerError for characters outside the vocabulary
    if not ids:
        raise ConfigError("the prompt is empty: give at least one character with --prompt")
    if len(ids) > model.config.block_size:
        raise ConfigError(f"the prompt has {len(ids)} tokens, more than the model's context of "
                          f"{model.config.block_size}; shorten it")
    for n in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {n + 1} ---")
        if cfg.seed is not None:
            cfg.seed = args.seed + n
        sys.stdout.write(args.prompt)
        generated: list[int] = []
        shown = ""
        for token in stream(model, torch.tensor([ids]), cfg):
            generated.append(int(token))
            text = tok.decode(generated)
            if not text.endswith("\ufffd"):  # hold back a half-decoded multi-byte character
                sys.stdout.write(text[len(shown):])
                sys.stdout.flush()
                shown = text
        print(tok.decode(generated)[len(shown):])
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    """Loss (and the task's metrics, e.g. accuracy) of a trained run on its data or on --data."""
    import math

    from attnlab.models.registry import from_pretrained
    from attnlab.runs import load_run_config
    from attnlab.training.tasks import build_task
    from attnlab.training.trainer import evaluate_model

    run_dir = Path(args.run_dir)
    cfg = load_run_config(run_dir)
    if args.data:
        cfg.data = args.data
    model = from_pretrained(run_dir)
    task = build_task(cfg, assets=run_dir)  # the run's tokenizer / class names
    splits = tuple(args.splits or task.splits)
    unknown = [s for s in splits if s not in task.splits]
    if unknown:
        from attnlab.errors import ConfigError

        raise ConfigError(f"this run's data has no split '{unknown[0]}'; choose from {', '.join(task.splits)}")
    print(f"{run_dir}: {model.num_parameters() / 1e6:.2f}M parameters, data {cfg.data}")
    results = evaluate_model(model, task, splits, args.batch_size, args.eval_iters, cfg.seed)
    for split in splits:
        loss = results[split]
        extra = "".join(f"  {k[len(split) + 1:]} {v:.4f}" for k, v in results.items() if k.startswith(split + "_"))
        ppl = f"  perplexity {math.exp(min(loss, 50)):.2f}" if task.unit == "tokens" else ""
        print(f"{split:>5} loss {loss:.4f}{ppl}{extra}")
    for path in task.eval_report(model, run_dir):
        print(f"wrote {path}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    """Saliency of a trained ViT on one image: [CLS] attention per layer/head and rollout, as a PNG."""
    from attnlab.errors import ConfigError
    from attnlab.inspect.saliency import inspect_image

    if not args.image:
        raise ConfigError("give an input to inspect, e.g. --image path.png")
    result = inspect_image(args.run_dir, args.image, args.out, resize=args.resize)
    print(f"{args.image}: {result['class']} ({result['probability']:.1%}); rollout peaks at patch "
          f"(row, col) {result['rollout_peak']}; wrote {result['out']}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the full usage stays available with --help)."""

    def error(self, message: str):
        self.exit(2, f"attnlab: error: {message} (see '{self.prog} --help')\n")


def _unknown_name(kind: str, name: str, options: list[str]):
    """A one-line error for a misspelt benchmark/experiment name, with the closest match."""
    from attnlab.errors import ConfigError
    from attnlab.schema import did_you_mean

    hint = did_you_mean(name, options) or f"; choose one of {', '.join(options)}"
    return ConfigError(f"unknown {kind} '{name}'{hint}")


def _benchmarks_dir() -> Path:
    """benchmarks/ of the checkout: the current folder's, else the one beside the installed sources."""
    import attnlab

    for root in (Path.cwd(), Path(attnlab.__file__).resolve().parents[2]):
        if (root / "benchmarks").is_dir():
            return root / "benchmarks"
    from attnlab.errors import ConfigError

    raise ConfigError("no benchmarks/ folder found: run attnlab bench from the attnlab checkout")


def _cmd_bench(args: argparse.Namespace) -> int:
    import ast
    import subprocess

    folder = _benchmarks_dir()
    scripts = {p.stem: p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")}
    if args.list or not args.name:
        for name, path in scripts.items():
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            print(f"{name:<20} {doc.splitlines()[0] if doc else ''}")
        return 0
    if args.name not in scripts:
        raise _unknown_name("benchmark", args.name, list(scripts))
    return subprocess.call([sys.executable, str(scripts[args.name]), *args.args])


def _cmd_experiment(args: argparse.Namespace) -> int:
    from attnlab.experiments import EXPERIMENTS, load

    if args.list or not args.name:
        for name in EXPERIMENTS:
            print(f"{name:<20} {load(name).CLAIM}")
        return 0
    if args.name not in EXPERIMENTS:
        raise _unknown_name("experiment", args.name, list(EXPERIMENTS))
    out = Path(args.out) if args.out else Path("runs") / "experiments" / args.name
    record = load(args.name).run(out, quick=args.quick)
    verdict = "held" if record["claim_held"] else "did NOT hold"
    print(f"{args.name}: the claim {verdict} ({record['wall_time_s']} s); report, results.json and plots in {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnlab", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model from a YAML preset plus key=value overrides")
    p.add_argument("config", help="YAML preset, e.g. configs/shakespeare-char.yaml")
    p.add_argument("overrides", nargs="*", help="key=value, e.g. data=path.txt max_iters=500 n_layer=6")
    p.add_argument("--profile", action="store_true", help="write a torch profiler trace of 10 steps to RUN/profile/")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("resume", help="continue a run from its newest valid checkpoint")
    p.add_argument("run_dir")
    p.add_argument("overrides", nargs="*", help="key=value, e.g. max_iters=4000")
    p.set_defaults(func=_cmd_resume)

    p = sub.add_parser("sample", help="generate text from a trained run (streams tokens)")
    p.add_argument("run_dir")
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max-new-tokens", type=int, default=300)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--no-cache", action="store_true", help="re-run the whole context every step")
    p.set_defaults(func=_cmd_sample)

    p = sub.add_parser("bench", help="run a benchmark from benchmarks/ (prints a table, writes JSON)")
    p.add_argument("name", nargs="?", help="e.g. train_throughput, attention, generation_cache")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark, e.g. --quick")
    p.add_argument("--list", action="store_true", help="list the benchmarks")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("experiment", help="run an experiment that tests one of the course's claims")
    p.add_argument("name", nargs="?", help="see --list")
    p.add_argument("--list", action="store_true", help="list the experiments and their claims")
    p.add_argument("--quick", action="store_true", help="a small version (minutes on 2 cores)")
    p.add_argument("--out", default=None, help="output folder (default runs/experiments/NAME)")
    p.set_defaults(func=_cmd_experiment)

    p = sub.add_parser("eval", help="loss, perplexity or accuracy of a run on its data (or --data)")
    p.add_argument("run_dir")
    p.add_argument("--data", default=None)
    p.add_argument("--eval-iters", type=int, default=100, help="batches per split (tasks with a small "
                   "finite split evaluate all of it)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--splits", nargs="+", default=None, help="default: the task's, e.g. train val")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("inspect", help="saliency map of a trained model on an input (ViT: --image)")
    p.add_argument("run_dir")
    p.add_argument("--image", default=None, help="an image file (png, jpg, ...) for a vit run")
    p.add_argument("--resize", action="store_true", help="resize an image of another size to the model's")
    p.add_argument("--out", default="saliency.png", help="output PNG (default saliency.png)")
    p.set_defaults(func=_cmd_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed on one line
        return int(e.code or 0)
    from attnlab.errors import AttnlabError

    try:
        return args.func(args)
    except AttnlabError as e:
        if args.debug:
            raise
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"attnlab: error: {type(e).__name__}: {msg} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
