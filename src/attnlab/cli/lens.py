"""``attnlab lens logit-lens | ablate | dla | patch | probe``: read every layer's prediction, knock heads
out, split a logit into what each head wrote, patch a clean run into a corrupted one, probe the layers
(``attnlab.inspect.lens``, ``attnlab.inspect.probes``)."""

from __future__ import annotations

import argparse

from attnlab.cli.errors import at_least, finite
from attnlab.core.errors import ConfigError


def _head(text: str) -> tuple[int, int]:
    layer, sep, head = text.partition(".")
    if not sep or not layer.isdigit() or not head.isdigit():
        raise argparse.ArgumentTypeError(f"a head is LAYER.HEAD, e.g. 1.3; got {text!r}")
    return int(layer), int(head)


def _path(text: str) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    sender, sep, receivers = text.partition(">")
    if not sep or not receivers:
        raise argparse.ArgumentTypeError(f"a path is SENDER>RECEIVER[,RECEIVER...], e.g. 0.1>1.3 or 0.1>1.2,1.3; "
                                         f"got {text!r}")
    return _head(sender), [_head(r) for r in receivers.split(",")]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the lens command (logit-lens, ablate, dla, patch, probe) to the parser."""
    p = sub.add_parser("lens", help="lenses on a run: logit-lens, ablate, dla, patch (GPT); probe (GPT or BERT)")
    actions = p.add_subparsers(dest="lens_action", required=True)
    a = actions.add_parser("logit-lens", help="each layer's next-token prediction (final norm + unembedding)")
    a.add_argument("run_dir")
    a.add_argument("--text", required=True)
    a.add_argument("--k", type=at_least(1), default=5, help="top tokens per position (default 5)")
    a.add_argument("--json", default=None, help="write the full report to this file")
    a.add_argument("--figure", default=None,
                   help="draw the grid (top token by position and layer) and the loss per layer to this PNG")
    a.set_defaults(func=_cmd_logit_lens)
    a = actions.add_parser("ablate", help="the next-token loss and prediction with heads knocked out")
    a.add_argument("run_dir")
    a.add_argument("--text", required=True)
    a.add_argument("--head", type=_head, action="append", required=True, help="LAYER.HEAD, repeatable")
    a.add_argument("--how", choices=("zero", "mean"), default="zero",
                   help="zero, or the head's mean over the text's positions")
    a.add_argument("--json", default=None, help="write the report to this file")
    a.set_defaults(func=_cmd_ablate)
    a = actions.add_parser("dla", help="direct logit attribution: what each head and MLP adds to the next token")
    a.add_argument("run_dir")
    a.add_argument("--text", required=True)
    a.add_argument("--answer", required=True, help="the next token to explain (one token)")
    a.add_argument("--wrong", default=None, help="explain logit(answer) - logit(wrong) instead")
    a.add_argument("--top", type=at_least(1), default=10, help="parts shown (default 10; --json has all)")
    a.add_argument("--json", default=None, help="write the report to this file")
    a.set_defaults(func=_cmd_dla)
    a = actions.add_parser("patch", help="activation and path patching from a clean text into a corrupted one")
    a.add_argument("run_dir")
    a.add_argument("--clean", required=True)
    a.add_argument("--corrupted", required=True, help="a text of the same token count")
    a.add_argument("--answer", required=True, help="the clean text's next token")
    a.add_argument("--wrong", required=True, help="the corrupted text's next token")
    a.add_argument("--path", type=_path, action="append", default=[],
                   help="SENDER>RECEIVER[,RECEIVER...] heads, e.g. 0.1>1.3 or 0.1>1.2,1.3 (repeatable)")
    a.add_argument("--direct", action="store_true",
                   help="paths skip the MLPs (frozen): only the direct route through the residual stream")
    a.add_argument("--json", default=None, help="write the report to this file")
    a.add_argument("--figure", default=None, help="draw the residual and head maps to this PNG")
    a.set_defaults(func=_cmd_patch)
    a = actions.add_parser("probe", help="linear probes per layer with a control task (GPT or BERT run)")
    a.add_argument("run_dir")
    a.add_argument("--data", required=True, help='JSON lines {"words": [...], "labels": [...]} (null = skip)')
    a.add_argument("--seeds", type=at_least(1), default=3, help="splits and control tasks to average (default 3)")
    a.add_argument("--test-fraction", type=finite, default=0.25, help="held-out sentences (default 0.25)")
    a.add_argument("--json", default=None, help="write the report to this file")
    a.add_argument("--figure", default=None, help="draw probe and control accuracy per layer to this PNG")
    a.set_defaults(func=_cmd_probe)


def _write(report: dict, path: str | None) -> None:
    if path:
        import json
        from pathlib import Path

        from attnlab.core.fileio import atomic_write_text

        atomic_write_text(Path(path), json.dumps(report, indent=1, ensure_ascii=False) + "\n")


def _check_json(path: str | None, figure: str | None = None) -> None:
    """Each output given is a file that can be written, in a folder that exists (before the model is loaded)."""
    from pathlib import Path

    from attnlab.core.fileio import check_writable_file
    from attnlab.inspect.figure_path import check_figure_path

    for flag, value in (("--json", path), ("--figure", figure)):
        if value:
            check_writable_file(Path(value), flag, ConfigError)
    if figure:
        check_figure_path(figure, "--figure")


def _figure(draw: str, report: dict, path: str | None) -> None:
    if path:
        from attnlab.inspect import lens_figures

        print(f"wrote {getattr(lens_figures, draw)(report, path)}")


def _at_least_one(value: int, flag: str) -> None:
    if value < 1:
        raise ConfigError(f"{flag} must be >= 1")


def _cmd_logit_lens(args: argparse.Namespace) -> int:
    from attnlab.inspect.lens import lens_report

    _check_json(args.json, args.figure)
    _at_least_one(args.k, "--k")
    report = lens_report(args.run_dir, args.text, k=args.k)
    for layer in report["layers"]:
        print(f"{layer['name']:>8}  loss {layer['loss']:.4f}  next after the text: {layer['top'][-1]!r}")
    print("\nthe top next token and its probability, by position (rows) and layer (columns):")
    for line in _grid_table(report):
        print(line)
    _write(report, args.json)
    _figure("logit_lens_figure", report, args.figure)
    return 0


def _grid_table(report: dict, width: int = 14) -> list[str]:
    """The lens grid as text: a row per position (its token), a column per layer, cells ``'tok' 0.123``."""
    def cell(text: str) -> str:
        return text if len(text) <= width else text[:width - 1] + "~"

    names = [cell(layer["name"]) for layer in report["layers"]]
    lines = [f"{'position':<{width + 6}}" + "".join(f"{name:>{width + 2}}" for name in names)]
    for t, row in enumerate(report["grid"]):
        head = f"{t:>3} {cell(repr(row['token'])):<{width + 2}}"
        lines.append(head + "".join(f"{cell(repr(c['token'])) + ' ' + format(c['p'], '.2f'):>{width + 2}}"
                                    for c in row["top"]))
    return lines


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


def _cmd_dla(args: argparse.Namespace) -> int:
    from attnlab.inspect.lens import dla_report

    _check_json(args.json)
    _at_least_one(args.top, "--top")
    r = dla_report(args.run_dir, args.text, args.answer, args.wrong, top=args.top)
    what = f"logit({r['answer']!r})" + (f" - logit({r['wrong']!r})" if r["wrong"] is not None else "")
    print(f"{what} after the text = {r['total']:.4f}; the largest direct parts:")
    for part in r["parts"][:r["shown"]]:
        print(f"  {part['name']:>16}  {part['value']:+.4f}")
    _write(r, args.json)
    return 0


def _cmd_patch(args: argparse.Namespace) -> int:
    from attnlab.inspect.lens import patch_report

    _check_json(args.json, args.figure)
    r = patch_report(args.run_dir, args.clean, args.corrupted, args.answer, args.wrong, args.path,
                     through_mlps=not args.direct)
    print(f"logit({args.answer!r}) - logit({args.wrong!r}): clean {r['metric_clean']:.4f}, "
          f"corrupted {r['metric_corrupted']:.4f}; recovered fraction when patched from the clean run:")
    print("residual stream entering each block, by position (" + " ".join(repr(t) for t in r["tokens"]) + "):")
    for layer, row in enumerate(r["resid_pre"]):
        print(f"  block {layer}: " + " ".join(f"{v:+.2f}" for v in row))
    print("heads (rows: layers; last column: all heads of the layer at once):")
    for layer, row in enumerate(r["heads"]):
        print(f"  L{layer}: " + " ".join(f"{v:+.2f}" for v in row) + f"  | {r['all_heads_of_layer'][layer]:+.2f}")
    for p in r["paths"]:
        print(f"path {p['sender']} -> {', '.join(p['receivers'])}: {p['recovered']:+.3f}")
    _write(r, args.json)
    _figure("patching_figure", r, args.figure)
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    from attnlab.inspect.probes import probe_report

    _check_json(args.json, args.figure)
    if not 1 <= args.seeds <= 20:
        raise ConfigError("--seeds must be in 1..20")
    if not 0 < args.test_fraction < 1:
        raise ConfigError(f"--test-fraction must be in (0, 1), got {args.test_fraction}")
    r = probe_report(args.run_dir, args.data, seeds=range(args.seeds), test_fraction=args.test_fraction)
    print(f"{r['words']} labelled words in {r['sentences']} sentences, classes {r['classes']}; "
          f"held-out accuracy, mean +- sd over {args.seeds} seeds (majority class {r['majority']:.3f}):")
    print(f"{'layer':>8}  {'probe':>13}  {'control':>13}  {'selectivity':>13}")
    for p in r["layers"]:
        print(f"{p['layer']:>8}  {p['accuracy']:.3f} +- {p['accuracy_sd']:.3f}  {p['control']:.3f} +- "
              f"{p['control_sd']:.3f}  {p['selectivity']:+.3f} +- {p['selectivity_sd']:.3f}")
    _write(r, args.json)
    _figure("probe_figure", r, args.figure)
    return 0
