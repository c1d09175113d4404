"""The command line: ``attnlab train | resume | sample | eval | inspect | explore | bench | experiment |
import-hf | embed | probe | finetune``.

Every user error (bad config, missing file, unknown character, corrupt checkpoint) ends with one
line on stderr and exit status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_train(args: argparse.Namespace) -> int:
    from attnlab.training import distributed
    from attnlab.training.runs import load_train_config
    from attnlab.training.trainer import Trainer, TrainingInterrupted

    overrides = [*args.overrides, *(["profile_steps=10"] if getattr(args, "profile", False) else [])]
    cfg = load_train_config(args.config, overrides)
    trainer = Trainer(cfg, preset=args.config)
    say = trainer.log  # rank 0 only under torchrun
    n_params = trainer.model.num_parameters()
    world = f", {trainer.dist.world_size} processes" if trainer.dist.enabled else ""
    m = cfg.model
    if m.family in ("vit", "cnn"):
        shape = f"{m.n_classes} classes, {m.in_channels}x{m.image_size}x{m.image_size} images"
    elif m.family == "encoder":  # continuous inputs: no vocabulary
        shape = (f"{m.n_features} features per step, up to {m.block_size} steps" if m.inputs == "features"
                 else f"sets of up to {m.block_size} of {m.n_elements} element types")
    else:
        shape = f"vocab {m.vocab_size}, context {m.block_size}"
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
    from attnlab.training.runs import RUN_CONFIG

    args.config = str(run_dir / RUN_CONFIG)
    if not Path(args.config).is_file():
        from attnlab.core.errors import ConfigError

        raise ConfigError(f"{run_dir} is not a run folder (no {RUN_CONFIG})")
    args.overrides = [*args.overrides, "resume=true", f"name={run_dir.name}", f"out_dir={run_dir.parent}"]
    return _cmd_train(args)


def _cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from attnlab.core.errors import ConfigError
    from attnlab.generation import SamplingConfig, stream
    from attnlab.training.distributed import resolve_device
    from attnlab.training.runs import load_model_and_tokenizer

    device = resolve_device(args.device)
    model, tok = load_model_and_tokenizer(args.run_dir)
    model.to(device)
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, use_cache=not args.no_cache, seed=args.seed,
                         compile=args.compile)
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
        for token in stream(model, torch.tensor([ids], device=device), cfg):
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
    from attnlab.training.runs import load_run_config
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
        from attnlab.core.errors import ConfigError

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
    """Look inside a trained run on one input: --text (attention figures + a JSON dump of the
    probabilities) or --image (a ViT's [CLS] attention per layer/head and rollout, as a PNG)."""
    from attnlab.core.errors import ConfigError

    if (args.text is None) == (args.image is None):
        raise ConfigError("give one input to inspect: --text \"...\" or --image path.png")
    if args.image is not None:
        from attnlab.inspect.saliency import inspect_image

        result = inspect_image(args.run_dir, args.image, args.out or "saliency.png", resize=args.resize)
        print(f"{args.image}: {result['class']} ({result['probability']:.1%}); rollout peaks at patch "
              f"(row, col) {result['rollout_peak']}; wrote {result['out']}")
        return 0
    from attnlab.inspect.report import inspect_text

    out = args.out or "inspect"
    paths = inspect_text(args.run_dir, args.text, out, layer=args.layer, head=args.head)
    print(f"wrote {len(paths)} files to {out}: " + ", ".join(p.name for p in paths))
    return 0


def _cmd_heads(args: argparse.Namespace) -> int:
    """Per-head statistics (entropy, distance, previous-token / first-token / induction / uniform)."""
    from attnlab.inspect.report import head_report, summary

    report = head_report(args.run_dir, args.data, args.out, n_batches=args.n_batches, batch_size=args.batch_size,
                         seed=args.seed)
    print(f"{len(report.rows)} heads measured on {report.n_windows} windows of {args.data}")
    for line in summary(report.rows):
        print(line)
    print(f"table and figure in {args.out}: " + ", ".join(p.name for p in report.paths))
    return 0


# -- encoders (BERT): import Hugging Face weights, embed sentences, probe, fine-tune --------------------


def _cmd_import_hf(args: argparse.Namespace) -> int:
    from attnlab.interop.hf import import_hf

    model, missing, has_tokenizer = import_hf(args.directory, args.out)
    c = model.config
    print(f"imported {args.directory} -> {args.out}: {c.family}, {c.n_layer} layers, d_model {c.d_model}, "
          f"vocab {c.vocab_size}, {model.num_parameters() / 1e6:.2f}M parameters"
          + ("" if has_tokenizer else " (no tokenizer.json/vocab.txt found: none written)"))
    if missing:
        print(f"note: the source has no {', '.join(sorted({m.split('.')[0] for m in missing}))} weights; "
              "those heads keep a fresh init")
    return 0


def _load_encoder(run_dir: str):
    from attnlab.core.errors import ConfigError
    from attnlab.models.bert import Bert
    from attnlab.training.runs import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(run_dir)
    if not isinstance(model, Bert):
        raise ConfigError(f"{run_dir} holds a {model.config.family} model; this command needs a bert encoder")
    return model, tokenizer


def _cmd_embed(args: argparse.Namespace) -> int:
    import json

    from attnlab.inspect.encoders import embed_texts, nearest_neighbours

    model, tokenizer = _load_encoder(args.run_dir)
    emb = embed_texts(model, tokenizer, args.text, max_len=args.max_len, pooling=args.pooling)
    if args.vectors or len(args.text) == 1:
        for text, e in zip(args.text, emb, strict=True):
            print(json.dumps({"text": text, "embedding": [round(float(x), 6) for x in e]}))
        return 0
    print(f"{len(args.text)} sentences, {emb.size(1)}-d {args.pooling}-pooled, L2-normalised; nearest neighbour:")
    for i, (j, sim) in enumerate(nearest_neighbours(emb)):
        print(f"  [{i}] {args.text[i][:60]!r}\n      -> [{j}] {args.text[j][:60]!r}  cosine {sim:.4f}")
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    import time

    from attnlab.core.schema import apply_overrides, from_dict
    from attnlab.data.labelled import read_labelled
    from attnlab.inspect.encoders import embed_texts, linear_probe
    from attnlab.training.config import ProbeOptions

    opts = from_dict(ProbeOptions, apply_overrides(ProbeOptions, {}, list(args.overrides)))  # validated
    model, tokenizer = _load_encoder(args.run_dir)
    data = read_labelled(opts.data)
    t0 = time.perf_counter()
    features = embed_texts(model, tokenizer, data.texts, max_len=opts.max_len, pooling=opts.pooling)
    t_embed = time.perf_counter() - t0
    numeric = data.numeric_labels() if opts.kind in ("auto", "ridge") else None
    if opts.kind == "ridge" and numeric is None:
        from attnlab.core.errors import DataError

        raise DataError(f"{opts.data}: kind=ridge needs numeric labels")
    r = linear_probe(features, data.labels, opts.test_fraction, opts.seed, numeric=numeric)
    print(f"frozen {args.run_dir}: {len(data)} rows -> {features.size(1)}-d {opts.pooling}-pooled features "
          f"({t_embed:.1f} s); {r.kind} probe, {r.n_train} train / {r.n_test} held-out")
    if r.metric == "accuracy":
        print(f"held-out accuracy {r.score:.4f}  macro-F1 {r.macro_f1:.4f}  (train {r.train_score:.4f}, "
              f"majority-class baseline {r.majority_baseline:.4f}, {len(data.classes)} classes)")
    else:
        print(f"held-out R^2 {r.score:.4f}  (train {r.train_score:.4f})")
    return 0


# fine-tuning defaults (a few hundred steps at a small learning rate); any key=value overrides them
FINETUNE_DEFAULTS = dict(task="classify", batch_size=32, max_iters=300, lr=1e-4, min_lr=1e-5, warmup_iters=30,
                         weight_decay=0.01, eval_interval=100, eval_iters=1, log_interval=10, sample_tokens=0)


def _cmd_finetune(args: argparse.Namespace) -> int:
    """Pre-trained encoder + fresh classification head, trained on (text, label) rows through the Trainer."""
    import dataclasses
    import json

    from attnlab.core.errors import ConfigError
    from attnlab.models.base import read_config
    from attnlab.models.registry import from_pretrained
    from attnlab.training.runs import load_train_config
    from attnlab.training.trainer import Trainer, TrainingInterrupted

    pretrained = Path(args.run_dir)
    model_cfg = read_config(pretrained)
    if model_cfg.family != "bert":
        raise ConfigError(f"{pretrained} holds a {model_cfg.family} model; finetune needs a bert encoder")
    base = [f"{k}={v}" for k, v in FINETUNE_DEFAULTS.items()]
    model_keys = [f"model.{k}={json.dumps(v) if v is None else v}" for k, v in dataclasses.asdict(model_cfg).items()
                  if k != "n_classes" and v is not None]
    cfg = load_train_config(None, [*base, *model_keys, f"classify.init_from={pretrained}", *args.overrides])
    if cfg.task != "classify":
        raise ConfigError(f"finetune supports task=classify, got task={cfg.task}")
    if cfg.name is None:
        from attnlab.training.trainer import default_run_name

        cfg.name = default_run_name(f"finetune-{pretrained.name}")
    trainer = Trainer(cfg, preset=f"finetune-{pretrained.name}")
    task = trainer.task
    if not cfg.resume:  # the encoder (and MLM/NSP/pooler) from the pre-trained model; classifier heads fresh
        state = {k: v for k, v in from_pretrained(pretrained).state_dict().items()
                 if not k.startswith(("classifier.", "token_classifier."))}
        missing, unexpected = trainer.model.load_state_dict(state, strict=False)
        fresh = sorted({k.split(".")[0] for k in missing})
        if unexpected or fresh != ["classifier", "token_classifier"]:
            raise ConfigError(f"{pretrained} does not fit the fine-tuned model: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    n_train, n_val = len(task.rows["train"]), len(task.rows["val"])
    print(f"run: {trainer.run_dir}  fine-tuning {pretrained} ({trainer.model.num_parameters() / 1e6:.2f}M parameters) "
          f"on {cfg.data}: {len(task.classes)} classes, {n_train} train / {n_val} held-out rows")
    try:
        result = trainer.train()
    except TrainingInterrupted as e:
        print(f"{e}; continue with: attnlab resume {e.run_dir}", file=sys.stderr)
        return 130
    scores = task.scores(trainer.model, "val")
    counts = task.labels[task.rows["train"]].bincount(minlength=len(task.classes))
    majority = float((task.labels[task.rows["val"]] == counts.argmax()).float().mean())
    record = {**scores, "majority_baseline": majority, "steps": result.step, "wall_time_s": result.wall_time_s,
              "classes": task.classes, "pretrained": str(pretrained), "data": cfg.data}
    (trainer.run_dir / "finetune.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"done: step {result.step}, {result.wall_time_s:.1f} s; held-out accuracy {scores['accuracy']:.4f}, "
          f"macro-F1 {scores['macro_f1']:.4f} on {scores['n']} rows (majority-class baseline {majority:.4f}); "
          f"model in {trainer.run_dir}")
    return 0


def _cmd_translate(args: argparse.Namespace) -> int:
    """Translate --text (or every line of --file) with a trained seq2seq run: greedy or beam search."""
    from attnlab.core.errors import ConfigError
    from attnlab.data.pairs import PairEncoder
    from attnlab.training.runs import load_model_and_tokenizer
    from attnlab.training.tasks.seq2seq import translate

    model, tok = load_model_and_tokenizer(args.run_dir)
    if model.config.family != "seq2seq":
        raise ConfigError(f"{args.run_dir} holds a {model.config.family} model; translate needs family seq2seq")
    if args.beam < 1 or args.length_penalty < 0:
        raise ConfigError("--beam must be >= 1 and --length-penalty >= 0")
    texts = list(args.text or [])
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise ConfigError(f"--file not found: {path}")
        texts += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ConfigError("nothing to translate: give --text \"...\" or --file FILE")
    outputs = translate(model, PairEncoder(tok, model.config.block_size), texts, args.beam, args.length_penalty,
                        args.max_len)
    for text, out in zip(texts, outputs):
        print(out if len(texts) == 1 else f"{text}\t{out}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the full usage stays available with --help)."""

    def error(self, message: str):
        self.exit(2, f"attnlab: error: {message} (see '{self.prog} --help')\n")


def _unknown_name(kind: str, name: str, options: list[str]):
    """A one-line error for a misspelt benchmark/experiment name, with the closest match."""
    from attnlab.core.errors import ConfigError
    from attnlab.core.schema import did_you_mean

    hint = did_you_mean(name, options) or f"; choose one of {', '.join(options)}"
    return ConfigError(f"unknown {kind} '{name}'{hint}")


def _benchmarks_dir() -> Path:
    """benchmarks/ of the checkout: the current folder's, else the one beside the installed sources."""
    import attnlab

    for root in (Path.cwd(), Path(attnlab.__file__).resolve().parents[2]):
        if (root / "benchmarks").is_dir():
            return root / "benchmarks"
    from attnlab.core.errors import ConfigError

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


def _cmd_explore(args: argparse.Namespace) -> int:
    from attnlab.web.server import serve

    serve(args.run_dir, host=args.host, port=args.port)
    return 0


def _cmd_experiment(args: argparse.Namespace) -> int:
    from attnlab.experiments import EXPERIMENTS, load

    if args.list or not args.name:
        for name in EXPERIMENTS:
            print(f"{name:<20} {load(name).CLAIM}")
        return 0
    if args.name not in EXPERIMENTS:
        raise _unknown_name("experiment", args.name, list(EXPERIMENTS))
    out = Path(args.out) if args.out else Path("runs") / "experiments" / args.name
    module = load(args.name)
    if args.resume:
        import inspect

        from attnlab.core.errors import ConfigError

        if "resume" not in inspect.signature(module.run).parameters:
            raise ConfigError(f"experiment {args.name!r} cannot resume; run it again without --resume")
        record = module.run(out, quick=args.quick, resume=True)
    else:
        record = module.run(out, quick=args.quick)
    verdict = "held" if record["claim_held"] else "did NOT hold"
    print(f"{args.name}: the claim {verdict} ({record['wall_time_s']} s); report, results.json and plots in {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnlab", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model from a YAML preset plus key=value overrides")
    p.add_argument("config", help="a preset name (e.g. shakespeare-char) or a YAML file")
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
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (faster after a "
                   "one-off compilation of some seconds)")
    p.add_argument("--device", default="auto", help="auto (a GPU when one is visible), cpu, cuda, cuda:N or mps")
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
    p.add_argument("--resume", action="store_true", help="keep the finished runs in OUT/results.json and "
                   "run only what is missing (chomsky)")
    p.set_defaults(func=_cmd_experiment)

    p = sub.add_parser("eval", help="loss, perplexity or accuracy of a run on its data (or --data)")
    p.add_argument("run_dir")
    p.add_argument("--data", default=None)
    p.add_argument("--eval-iters", type=int, default=100, help="batches per split (tasks with a small "
                   "finite split evaluate all of it)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--splits", nargs="+", default=None, help="default: the task's, e.g. train val")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("explore", help="the offline web explorer: attention maps, toy example, conv vs attention")
    p.add_argument("run_dir")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only); anything "
                   "else makes the unauthenticated explorer reachable from the network")
    p.set_defaults(func=_cmd_explore)

    p = sub.add_parser("inspect", help="attention figures for one input: --text (any family) or --image (ViT)")
    p.add_argument("run_dir")
    p.add_argument("--text", default=None, help="the text to run through the model")
    p.add_argument("--image", default=None, help="an image file (png, jpg, ...) for a vit run")
    p.add_argument("--resize", action="store_true", help="resize an image of another size to the model's")
    p.add_argument("--layer", type=int, default=None, help="layer of the single-head figure (default: last)")
    p.add_argument("--head", type=int, default=None, help="head of the single-head figure (default: 0)")
    p.add_argument("--out", default=None, help="output: a folder for --text (default ./inspect), a PNG for "
                   "--image (default saliency.png)")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("heads", help="per-head statistics and head types (previous-token, induction, ...)")
    p.add_argument("run_dir")
    p.add_argument("--data", required=True, help="text file (or 'shakespeare') to measure the heads on")
    p.add_argument("--n-batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="heads", help="output folder (default ./heads)")
    p.set_defaults(func=_cmd_heads)

    p = sub.add_parser("import-hf", help="convert a Hugging Face BERT/GPT-2 folder into an attnlab model folder")
    p.add_argument("directory", help="folder with config.json + model.safetensors (or pytorch_model.bin)")
    p.add_argument("--out", required=True, help="attnlab folder to write (config.json, model.safetensors, "
                   "tokenizer.json)")
    p.set_defaults(func=_cmd_import_hf)

    p = sub.add_parser("embed", help="sentence embeddings of an encoder (nearest neighbours among the texts)")
    p.add_argument("run_dir")
    p.add_argument("--text", action="append", required=True, help="a sentence; repeat for several")
    p.add_argument("--pooling", choices=("mean", "cls"), default="mean")
    p.add_argument("--max-len", type=int, default=None, help="tokens per sentence (default: the model's context)")
    p.add_argument("--vectors", action="store_true", help="print the embeddings as JSON lines")
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser("probe", help="linear probe on a frozen encoder: data=file.csv|jsonl (text,label)")
    p.add_argument("run_dir")
    p.add_argument("overrides", nargs="*", help="data=FILE (required), pooling=mean|cls, test_fraction=0.2, "
                   "seed=0, max_len=128, kind=auto|logistic|ridge")
    p.set_defaults(func=_cmd_probe)

    p = sub.add_parser("finetune", help="fine-tune a pre-trained encoder as a classifier on (text, label) rows")
    p.add_argument("run_dir", help="the pre-trained bert (a run folder, or one written by import-hf)")
    p.add_argument("overrides", nargs="*", help="task=classify data=FILE.csv|jsonl, then any key=value, e.g. "
                   "max_iters=500 lr=5e-5 model.dropout=0.1 classify.test_fraction=0.2")
    p.set_defaults(func=_cmd_finetune)

    p = sub.add_parser("translate", help="map text to text with a trained seq2seq run (greedy or beam search)")
    p.add_argument("run_dir")
    p.add_argument("--text", action="append", help="a source string (repeatable)")
    p.add_argument("--file", default=None, help="translate every non-empty line of this file")
    p.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=0.6, help="GNMT alpha for beam search (0 = none)")
    p.add_argument("--max-len", type=int, default=None, help="most target tokens (default: the model's context)")
    p.set_defaults(func=_cmd_translate)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed on one line
        return int(e.code or 0)
    from attnlab.core.errors import AttnlabError

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
