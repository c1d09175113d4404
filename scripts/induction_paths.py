"""Trace the induction circuit of a 2-layer run with path patching (attnlab.inspect.circuits), averaged over
probe inputs drawn from ``r r`` lines (the built-in corpus ``repeated``, or a file of scripts/repeated_strings.py).

Each probe: clean = "r r[:k]" (the answer is r[k], found by copying); corrupted = the same text with the
first copy's r[k-1] replaced by a character r does not use, so the second copy's last character has no
earlier match (the wrong answer: r[k+1]). For the previous-token head S given, the recovered fraction of
logit(answer) - logit(wrong) when patched from the clean run:

    S alone                    activation patching of S's output
    S -> layer 1               path patching into every head of layer 1 (the MLPs recomputed)
    S -> layer 1, direct       the same with the MLPs frozen: only the direct route through the stream
    S -> L1Hh                  path patching into one head of layer 1

    python scripts/induction_paths.py RUN --data repeated --sender 0.1 [--probes 50] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch

from attnlab.core.errors import AttnlabError
from attnlab.inspect.circuits import path_patch
from attnlab.inspect.intervene import head, logit_difference, patch_recovery
from attnlab.training.runs import load_run_with_text


def probes(lines: list[str], alphabet: list[str], n: int, seed: int, max_tokens: int = 10**9
           ) -> list[tuple[str, str, str, str]]:
    """(clean, corrupted, answer, wrong) for n lines "r r" with len(r) >= 5 whose longest probe, 2 len(r) - 1
    characters, fits in ``max_tokens`` (a character a token)."""
    rng = random.Random(seed)
    pool = [r for line in lines if " " in line and len(r := line.split(" ")[0]) >= 5 and 2 * len(r) - 1 <= max_tokens]
    out = []
    for r in rng.sample(pool, min(n, len(pool))):
        k = rng.randint(2, len(r) - 2)  # the second copy ends with r[k-1]; the answer r[k]; wrong r[k+1]
        x = rng.choice([c for c in alphabet if c not in r])
        first = r[:k - 1] + x + r[k:]
        out.append((f"{r} {r[:k]}", f"{first} {r[:k]}", r[k], r[k + 1]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run")
    p.add_argument("--data", required=True, help="'repeated' (built-in) or a file of 'r r' lines")
    p.add_argument("--sender", required=True, help="the previous-token head, LAYER.HEAD in layer 0")
    p.add_argument("--probes", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    layer, _, h = args.sender.partition(".")
    if layer != "0" or not h.isdigit():
        print("induction_paths: --sender is a head of layer 0, e.g. 0.1", file=sys.stderr)
        return 2
    if not 1 <= args.probes <= 10_000:
        print("induction_paths: --probes must be in 1..10000", file=sys.stderr)
        return 2
    try:
        model, tok, text = load_run_with_text(args.run, args.data)
    except AttnlabError as err:
        print(f"induction_paths: {err}", file=sys.stderr)
        return 2
    c = model.config
    if c.family != "gpt" or c.n_layer != 2 or int(h) >= c.n_head:
        print(f"induction_paths: needs a 2-layer gpt with head {h} in layer 0", file=sys.stderr)
        return 2
    alphabet = sorted({ch for ch in text if ch not in " \n"})
    sender, layer1 = head(0, int(h)), [head(1, j) for j in range(c.n_head)]
    rows: dict[str, list[float]] = {}
    cases = probes(text.splitlines(), alphabet, args.probes, args.seed, max_tokens=c.block_size)
    if not cases:
        print(f"induction_paths: no line 'r r' of {args.data} fits the run's context of {c.block_size} tokens",
              file=sys.stderr)
        return 2
    for clean, corrupted, answer, wrong in cases:
        x_clean, x_corr = torch.tensor([tok.encode(clean)]), torch.tensor([tok.encode(corrupted)])
        metric = logit_difference(tok.encode(answer)[0], tok.encode(wrong)[0])
        found = {"S alone": patch_recovery(model, x_clean, x_corr, [sender], metric).recovered,
                 "S -> layer 1": path_patch(model, x_clean, x_corr, sender, layer1, metric).recovered,
                 "S -> layer 1, direct": path_patch(model, x_clean, x_corr, sender, layer1, metric,
                                                    through_mlps=False).recovered}
        for j, r in enumerate(layer1):
            found[f"S -> L1H{j}"] = path_patch(model, x_clean, x_corr, sender, r, metric).recovered
        for k, v in found.items():
            rows.setdefault(k, []).append(v)
    summary = {k: {"mean": statistics.fmean(v), "sd": statistics.stdev(v) if len(v) > 1 else 0.0, "n": len(v)}
               for k, v in rows.items()}
    print(f"{args.run}: S = L0H{h}; recovered fraction over {len(rows['S alone'])} probes (mean +- sd)")
    for k, s in summary.items():
        print(f"  {k:>22}  {s['mean']:+.3f} +- {s['sd']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"run": args.run, "sender": args.sender, "paths": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
