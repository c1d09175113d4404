"""``attnlab sample | translate``: text from a trained run (``attnlab.generation``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.cli.errors import at_least, finite, kernel_names, seed


def register(sub: argparse._SubParsersAction) -> None:
    """Add the sample, translate commands to the parser."""
    p = sub.add_parser("sample", help="generate text from a trained run (streams tokens)")
    p.add_argument("run_dir")
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max-new-tokens", type=at_least(0), default=300)
    p.add_argument("--temperature", type=finite, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=at_least(1), default=None)
    p.add_argument("--top-p", type=finite, default=None)
    p.add_argument("--min-p", type=finite, default=None, help="keep tokens with p >= min_p * the top token's p")
    p.add_argument("--repetition-penalty", type=finite, default=1.0, help="> 1 discourages repeating tokens")
    p.add_argument("--num-beams", type=at_least(1), default=1, help="> 1: beam search (deterministic)")
    p.add_argument("--stop", action="append", default=None, help="stop after this string (repeatable)")
    p.add_argument("--seed", type=seed, default=None)
    p.add_argument("--num-samples", type=at_least(1), default=1)
    p.add_argument("--no-cache", action="store_true", help="re-run the whole context every step")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (faster after a "
                   "one-off compilation of some seconds)")
    p.add_argument("--device", default="auto", help="auto (a GPU when one is visible), cpu, cuda, cuda:N or mps")
    p.add_argument("--kernels", type=kernel_names, default="none",
                   help="attnlab's C++ kernels on a CPU: all, or some of attention, gelu, linear, scan")
    p.set_defaults(func=_cmd_sample)

    p = sub.add_parser("translate", help="map text to text with a trained seq2seq run (greedy or beam search)")
    p.add_argument("run_dir")
    p.add_argument("--text", action="append", help="a source string (repeatable)")
    p.add_argument("--file", default=None, help="translate every non-empty line of this file")
    p.add_argument("--beam", type=at_least(1), default=1, help="beam size (1 = greedy)")
    p.add_argument("--length-penalty", type=finite, default=0.6, help="GNMT alpha for beam search (0 = none)")
    p.add_argument("--max-len", type=at_least(1), default=None,
                   help="most target tokens (default: the model's context)")
    p.set_defaults(func=_cmd_translate)


def _cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from attnlab.api import check_stops
    from attnlab.core.errors import ConfigError
    from attnlab.generation import SamplingConfig, stream
    from attnlab.models.size import check_fits
    from attnlab.training.distributed import resolve_device
    from attnlab.training.runs import load_model_and_tokenizer, with_kernels

    if args.num_beams > 1 and args.num_samples > 1:  # beam search is deterministic: it gives one best sequence
        raise ConfigError(f"--num-beams {args.num_beams} gives one best sequence, not --num-samples "
                          f"{args.num_samples}; drop one of the two (samples are drawn with --num-beams 1)")
    from attnlab.generation.sampling import MAX_NEW_TOKENS

    # a length beyond its own bound is the sampling config's to refuse; here: the samples, and the tokens in all
    total = args.num_samples * min(args.max_new_tokens, MAX_NEW_TOKENS)
    if args.num_samples > MAX_NEW_TOKENS or total > 10 * MAX_NEW_TOKENS:
        raise ConfigError(f"--num-samples {args.num_samples:,} of --max-new-tokens {args.max_new_tokens:,} is more "
                          f"than one call generates (at most {MAX_NEW_TOKENS:,} samples and "
                          f"{10 * MAX_NEW_TOKENS:,} tokens in all); ask for fewer")
    device = resolve_device(args.device)
    model, tok = load_model_and_tokenizer(args.run_dir)
    family = model.config.family
    if family != "gpt":
        other = {"seq2seq": "attnlab translate", "bert": "attnlab embed or attnlab explore (masked guesses)"}
        raise ConfigError(f"sample continues text with a gpt run; {args.run_dir} holds a {family} model"
                          + (f" (use {other[family]})" if family in other else ""))
    with_kernels(model, args.kernels, device.type).to(device)
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                         repetition_penalty=args.repetition_penalty, num_beams=args.num_beams,
                         use_cache=not args.no_cache, seed=args.seed, compile=args.compile)
    cfg.validate()
    check_stops(args.stop)
    check_fits(model.config, "the model", cfg.num_beams, inference=True,  # the beams are one batch
               advice="use a smaller --num-beams")
    ids = tok.encode(args.prompt)  # raises TokenizerError for characters outside the vocabulary
    if not ids:
        raise ConfigError("the prompt is empty: give at least one character with --prompt")
    block = model.config.block_size
    if len(ids) > block:
        print(f"note: the prompt has {len(ids)} tokens and the model's context is {block}; generating from "
              f"its last {block}", file=sys.stderr)
        ids = ids[-block:]
    if cfg.num_beams > 1:
        from attnlab.api import cut_at_stop
        from attnlab.generation import generate

        out = generate(model, torch.tensor([ids], device=device), cfg)[0, len(ids):].tolist()
        print(args.prompt + cut_at_stop(tok.decode(out), args.stop))
        return 0
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
            if args.stop and any(stop in text for stop in args.stop):
                break
            if not text.endswith("\ufffd"):  # hold back a half-decoded multi-byte character
                sys.stdout.write(text[len(shown):])
                sys.stdout.flush()
                shown = text
        from attnlab.api import cut_at_stop

        print(cut_at_stop(tok.decode(generated), args.stop)[len(shown):])
    return 0


def _cmd_translate(args: argparse.Namespace) -> int:
    """Translate --text (or every line of --file) with a trained seq2seq run: greedy or beam search."""
    from attnlab.core.errors import ConfigError
    from attnlab.core.fileio import check_regular_file
    from attnlab.data.pairs import PairEncoder
    from attnlab.models.size import check_fits
    from attnlab.training.runs import load_model_and_tokenizer
    from attnlab.training.tasks.seq2seq import translate

    model, tok = load_model_and_tokenizer(args.run_dir)
    if model.config.family != "seq2seq":
        raise ConfigError(f"{args.run_dir} holds a {model.config.family} model; translate needs family seq2seq")
    if args.beam < 1 or args.length_penalty < 0:
        raise ConfigError("--beam must be >= 1 and --length-penalty >= 0")
    check_fits(model.config, "the model", args.beam, inference=True, advice="use a smaller --beam")  # one batch
    texts = list(args.text or [])
    if args.file:
        path = Path(args.file)
        check_regular_file(path, "--file", ConfigError)  # missing, a folder, a FIFO or /dev/zero: one line
        try:
            texts += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise ConfigError(f"--file {path} is not UTF-8 text") from None
    if not texts:
        raise ConfigError("nothing to translate: give --text \"...\" or --file FILE")
    outputs = translate(model, PairEncoder(tok, model.config.block_size), texts, args.beam, args.length_penalty,
                        args.max_len)
    for text, out in zip(texts, outputs):
        print(out if len(texts) == 1 else f"{text}\t{out}")
    return 0
