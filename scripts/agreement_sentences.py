"""Write word-labelled English sentences for ``attnlab lens probe``: JSON lines {"words", "labels"}
(the grammar and the two labellings: ``attnlab.data.agreement``).

    python scripts/agreement_sentences.py --property number --n 2000 --seed 0 --out number.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.data.agreement import rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--property", choices=("pos", "number"), required=True)
    p.add_argument("--n", type=int, default=2000, help="sentences (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the JSON-lines file to write")
    args = p.parse_args(argv)
    if not 1 <= args.n <= 1_000_000:
        print("agreement_sentences: --n must be in 1..1000000", file=sys.stderr)
        return 2
    out = Path(args.out)
    if not out.parent.is_dir():
        print(f"agreement_sentences: {out.parent} is not a folder", file=sys.stderr)
        return 2
    out.write_text("".join(json.dumps(r) + "\n" for r in rows(args.n, args.seed, args.property)))
    print(f"wrote {args.n} sentences ({args.property}) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
