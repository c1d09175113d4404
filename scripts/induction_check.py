"""How much of a run's prediction of repeated text goes through given heads: the next-token loss on the
first copies and on the second copies of ``r r`` lines (the built-in corpus ``repeated``, or a file that
scripts/repeated_strings.py wrote), with and without the heads mean-ablated (their mean over the same
windows; attnlab.inspect.intervene).

    python scripts/induction_check.py RUN --data repeated --heads 1.0 1.2 [--windows 256] [--json out.json]

"Second copy" counts the tokens that can be predicted by copying: the second character of the second copy
onwards (the first one follows the space, which every line has).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from attnlab.core.errors import AttnlabError
from attnlab.inspect.intervene import ablated, head, run_with_cache
from attnlab.training.runs import load_run_with_text


def copy_labels(text: str) -> torch.Tensor:
    """Per character: 1 first copy, 2 copyable part of the second copy, 0 otherwise (separators, the
    first character of a second copy)."""
    labels = []
    for line in text.split("\n"):
        if " " in line:
            r = line.split(" ")[0]
            labels += [1] * len(r) + [0, 0] + [2] * (len(r) - 1)
        else:
            labels += [0] * len(line)
        labels.append(0)  # the newline
    return torch.tensor(labels[: len(text)])


def losses(model, windows: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1), reduction="none")
    target = labels[:, 1:].reshape(-1)
    return {"first_copy": nll[target == 1].mean().item(), "second_copy": nll[target == 2].mean().item()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--data", required=True, help="'repeated' (built-in) or a file of 'r r' lines")
    p.add_argument("--heads", nargs="+", required=True, help="LAYER.HEAD ...")
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    try:
        heads = [tuple(int(x) for x in h.split(".")) for h in args.heads]
        assert all(len(h) == 2 for h in heads)
    except (ValueError, AssertionError):
        print(f"induction_check: --heads takes LAYER.HEAD values, got {args.heads}", file=sys.stderr)
        return 2
    try:
        model, tok, text = load_run_with_text(args.run, args.data)
    except AttnlabError as err:
        print(f"induction_check: {err}", file=sys.stderr)
        return 2
    ids, labels = torch.tensor(tok.encode(text)), copy_labels(text)
    T = model.config.block_size + 1
    g = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, ids.numel() - T, (args.windows,), generator=g).tolist()
    windows = torch.stack([ids[s:s + T] for s in starts])
    window_labels = torch.stack([labels[s:s + T] for s in starts])
    plain = losses(model, windows, window_labels)
    _, cache = run_with_cache(model, windows[:, :-1], "blocks.*.mixer.hook_z")
    with ablated(model, [head(layer, h) for layer, h in heads], how="mean", reference=cache):
        cut = losses(model, windows, window_labels)
    report = {"heads": [f"L{layer}H{h}" for layer, h in heads], "plain": plain, "ablated": cut,
              "increase": {k: cut[k] - plain[k] for k in plain}}
    print(f"{', '.join(report['heads'])} mean-ablated on {args.windows} windows:")
    for k in plain:
        print(f"  {k:>11}: loss {plain[k]:.4f} -> {cut[k]:.4f}  ({cut[k] - plain[k]:+.4f} nats)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
