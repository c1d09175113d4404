"""``attnlab lens logit-lens | ablate``: read every layer's prediction, or knock heads out
(``attnlab.inspect.lens``)."""

from __future__ import annotations

import argparse


def _head(text: str) -> tuple[int, int]:
    layer, sep, head = text.partition(".")
    if not sep or not layer.isdigit() or not head.isdigit():
        raise argparse.ArgumentTypeError(f"a head is LAYER.HEAD, e.g. 1.3; got {text!r}")
    return int(layer), int(head)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the lens command (with its logit-lens and ablate actions) to the parser."""
    p = sub.add_parser("lens", help="interpretability lenses on a GPT run: logit-lens, ablate heads")
    actions = p.add_subparsers(dest="lens_action", required=True)
    a = actions.add_parser("logit-lens", help="each layer's next-token prediction (final norm + unembedding)")
    a.add_argument("run_dir")
    a.add_argument("--text", required=True)
    a.add_argument("--k", type=int, default=5, help="top tokens per position (default 5)")
    a.add_argument("--json", default=None, help="write the full report to this file")
    a.set_defaults(func=_cmd_logit_lens)
    a = actions.add_parser("ablate", help="the next-token loss and prediction with heads knocked out")
    a.add_argument("run_dir")
    a.add_argument("--text", required=True)
    a.add_argument("--head", type=_head, action="append", required=True, help="LAYER.HEAD, repeatable")
    a.add_argument("--how", choices=("zero", "mean"), default="zero",
                   help="zero, or the head's mean over the text's positions")
    a.add_argument("--json", default=None, help="write the report to this file")
    a.set_defaults(func=_cmd_ablate)


def _write(report: dict, path: str | None) -> None:
    if path:
        import json
        from pathlib import Path

        from attnlab.core.fileio import atomic_write_text

        atomic_write_text(Path(path), json.dumps(report, indent=1, ensure_ascii=False) + "\n")


def _check_json(path: str | None) -> None:
    from pathlib import Path

    if path and not Path(path).parent.is_dir():
        from attnlab.core.errors import ConfigError

        raise ConfigError(f"--json {path}: its folder does not exist")


def _cmd_logit_lens(args: argparse.Namespace) -> int:
    from attnlab.inspect.lens import lens_report

    _check_json(args.json)
    if args.k < 1:
        from attnlab.core.errors import ConfigError

        raise ConfigError("--k must be >= 1")
    report = lens_report(args.run_dir, args.text, k=args.k)
    for layer in report["layers"]:
        print(f"{layer['name']:>8}  loss {layer['loss']:.4f}  next after the text: {layer['top'][-1]!r}")
    _write(report, args.json)
    return 0


def _cmd_ablate(args: argparse.Namespace) -> int:
    from attnlab.inspect.lens import ablation_report

    _check_json(args.json)
    r = ablation_report(args.run_dir, args.text, args.head, how=args.how)
    print(f"{', '.join(r['heads'])} {args.how}-ablated: loss {r['plain']['loss']:.4f} -> {r['ablated']['loss']:.4f} "
          f"({r['loss_increase']:+.4f} nats)")
    print(f"  next token, plain:   {r['plain']['next']}")
    print(f"  next token, ablated: {r['ablated']['next']}")
    _write(r, args.json)
    return 0
