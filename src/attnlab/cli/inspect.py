"""``attnlab inspect | heads``: look inside a trained run (``attnlab.inspect``)."""

from __future__ import annotations

import argparse

from attnlab.cli.errors import at_least, seed


def register(sub: argparse._SubParsersAction) -> None:
    """Add the inspect, heads commands to the parser."""
    p = sub.add_parser("inspect", help="attention figures for one input: --text (any family), --image "
                       "(ViT attention, CNN Grad-CAM) or --audio (an encoder's attention over time)")
    p.add_argument("run_dir")
    p.add_argument("--text", default=None, help="the text to run through the model")
    p.add_argument("--image", default=None, help="an image file (png, jpg, ...) for a vit run (attention and "
                   "rollout) or a cnn run (Grad-CAM)")
    p.add_argument("--audio", default=None, help="a sound file (wav, flac, ogg) for an encoder run trained on audio: "
                   "waveform, log-mel frames and the [CLS] attention over time")
    p.add_argument("--resize", action="store_true", help="resize an image of another size to the model's")
    p.add_argument("--layer", type=at_least(0), default=None, help="layer of the single-head figure (default: last)")
    p.add_argument("--head", type=at_least(0), default=None, help="head of the single-head figure (default: 0)")
    p.add_argument("--out", default=None, help="output: a folder for --text (default ./inspect), a PNG for "
                   "--image or --audio (default saliency.png / attention-over-time.png)")
    p.add_argument("--faithfulness", default=None, metavar="JSON",
                   help="instead: score attention, rollout, gradient x input, integrated gradients, occlusion, LIME, "
                   "KernelSHAP and a random order by deletion/insertion AUC on this input; write them to JSON")
    p.add_argument("--samples", type=at_least(10), default=None,
                   help="with --faithfulness: model calls for LIME and KernelSHAP (default 200)")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("heads", help="per-head statistics and head types (previous-token, induction, ...)")
    p.add_argument("run_dir")
    p.add_argument("--data", required=True,
                   help="text file (or a built-in corpus: 'shakespeare', 'repeated') to measure the heads on")
    p.add_argument("--n-batches", type=at_least(1), default=8)
    p.add_argument("--batch-size", type=at_least(1), default=16)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--out", default="heads", help="output folder (default ./heads)")
    p.add_argument("--json", default=None, help='also write {"heads": [...]} (layer, head, previous_token, '
                   "induction, duplicate_token, ablation_loss_increase) to this file")
    p.set_defaults(func=_cmd_heads)


def _cmd_inspect(args: argparse.Namespace) -> int:
    """Look inside a trained run on one input: --text (attention figures + a JSON dump of the
    probabilities) or --image (a ViT's [CLS] attention per layer/head and rollout, or a CNN's Grad-CAM, as a PNG)."""
    _require_captum(args)  # before anything is loaded or written
    from attnlab.core.errors import ConfigError

    if sum(x is not None for x in (args.text, args.image, args.audio)) != 1:
        raise ConfigError("give one input to inspect: --text \"...\", --image path.png or --audio clip.wav")
    _refuse_unused(args)
    from pathlib import Path

    from attnlab.core.fileio import check_writable_file, check_writable_folder

    if args.faithfulness is None:  # before the model is loaded
        if args.text is not None:
            from attnlab.inspect.report import check_text_out

            check_writable_folder(Path(args.out or "inspect"), "--out", ConfigError)
            check_text_out(Path(args.out or "inspect"))
        else:
            check_writable_file(Path(args.out or ("saliency.png" if args.image else "attention-over-time.png")),
                                "--out", ConfigError, create=True)
    if args.audio is not None:
        if args.faithfulness is not None:
            raise ConfigError("--faithfulness scores --text or --image inputs, not --audio")
        from attnlab.inspect.audio import inspect_audio

        r = inspect_audio(args.run_dir, args.audio, args.out or "attention-over-time.png")
        print(f"{args.audio}: {r['class']} ({r['probability']:.1%}); rollout peaks at {r['rollout_peak_s']:.2f} s; "
              f"wrote {r['out']}")
        return 0
    if args.faithfulness is not None:
        return _faithfulness(args)
    if args.image is not None:
        from attnlab.inspect.saliency import inspect_image

        result = inspect_image(args.run_dir, args.image, args.out or "saliency.png", resize=args.resize)
        peak = (f"rollout peaks at patch (row, col) {result['rollout_peak']}" if "rollout_peak" in result else
                f"Grad-CAM peaks at cell (row, col) {result['gradcam_peak']} of the last block")
        print(f"{args.image}: {result['class']} ({result['probability']:.1%}); {peak}; wrote {result['out']}")
        return 0
    from attnlab.inspect.report import inspect_text

    out = args.out or "inspect"
    paths = inspect_text(args.run_dir, args.text, out, layer=args.layer, head=args.head)
    print(f"wrote {len(paths)} files to {out}: " + ", ".join(p.name for p in paths))
    return 0


def _refuse_unused(args: argparse.Namespace) -> None:
    """ConfigError for an option this inspect would ignore: --layer/--head draw the single-head figure of --text,
    --samples sets --faithfulness's model calls, --resize fits an --image."""
    from attnlab.core.errors import ConfigError

    figure = args.text is not None and args.faithfulness is None
    unused = [flag for flag, given, used in (("--layer", args.layer is not None, figure),
                                             ("--head", args.head is not None, figure),
                                             ("--samples", args.samples is not None, args.faithfulness is not None),
                                             ("--resize", args.resize, args.image is not None)) if given and not used]
    if unused:
        raise ConfigError(f"{' and '.join(unused)} would be ignored here: --layer and --head choose the figure of "
                          "--text (without --faithfulness), --samples applies to --faithfulness, --resize to --image")


def _require_captum(args: argparse.Namespace) -> None:
    """MissingExtraError (one line, exit 2) where this inspect would need captum and it is not installed: every
    --faithfulness, a GPT's attribution figure for --text, a CNN's Grad-CAM for --image."""
    from pathlib import Path

    from attnlab.core.extras import require
    from attnlab.models.base import CONFIG_NAME, read_config

    if args.audio is not None:
        return
    if args.faithfulness is not None:
        require("captum", "inspect --faithfulness")
    elif (Path(args.run_dir) / CONFIG_NAME).is_file():  # else the run folder's own error comes later
        family = read_config(args.run_dir).family
        if args.text is not None and family == "gpt":
            require("captum", "the attribution figure of inspect --text")
        elif args.image is not None and family == "cnn":
            require("captum", "Grad-CAM (inspect --image on a cnn run)")


def _faithfulness(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from attnlab.core.errors import ConfigError
    from attnlab.core.fileio import atomic_write_text, check_writable_file
    from attnlab.inspect.faithfulness import run_report

    check_writable_file(Path(args.faithfulness), "--faithfulness", ConfigError)
    samples = 200 if args.samples is None else args.samples
    if not 10 <= samples <= 100_000:
        raise ConfigError("--samples must be in 10..100000")
    r = run_report(args.run_dir, text=args.text, image=args.image, resize=args.resize, n_samples=samples)
    print(f"explaining {r['explained']} (p = {r['probability']:.3f}) over {len(r['features'])} features; "
          "most faithful first (deletion AUC: lower is better; insertion AUC: higher is better):")
    for row in r["methods"]:
        print(f"  {row['method']:>21}  deletion {row['deletion_auc']:.3f}  insertion {row['insertion_auc']:.3f}  "
              f"top {row['top']}")
    atomic_write_text(Path(args.faithfulness), json.dumps(r, indent=1, ensure_ascii=False) + "\n")
    return 0


def _cmd_heads(args: argparse.Namespace) -> int:
    """Per-head statistics (entropy, distance, previous-token / first-token / induction / duplicate-token /
    uniform) and, for a GPT, each head's causal effect (the loss rise when it is mean-ablated)."""
    import json
    from pathlib import Path

    from attnlab.core.errors import ConfigError
    from attnlab.core.fileio import atomic_write_text, check_writable_file, check_writable_folder
    from attnlab.inspect.report import check_heads_out, head_report, heads_json, summary

    if args.json:
        check_writable_file(Path(args.json), "--json", ConfigError)
    check_writable_folder(Path(args.out), "--out", ConfigError)  # both before the model is loaded
    check_heads_out(Path(args.out))
    report = head_report(args.run_dir, args.data, args.out, n_batches=args.n_batches, batch_size=args.batch_size,
                         seed=args.seed)
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(heads_json(report.rows), indent=1) + "\n")
    print(f"{len(report.rows)} heads measured on {report.n_windows} windows of {args.data}")
    for line in summary(report.rows):
        print(line)
    print(f"table and figure in {args.out}: " + ", ".join(p.name for p in report.paths)
          + (f"; JSON in {args.json}" if args.json else ""))
    return 0
