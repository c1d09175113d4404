"""Write a text of repeated random strings, the classic setting for induction heads (Olsson et al. 2022).

Each line is ``r r`` for a random string r of 6 to 20 characters drawn without repetition from 300 CJK
ideographs (U+4E00 ...), so a character rarely repeats within a window except as the second copy:
the only way to predict the second copy is to find the first one and read what came next.

    python scripts/repeated_strings.py --out repeated.txt [--chars 600000] [--seed 0]

With the defaults the file is the built-in corpus ``repeated`` (``data=repeated``, attnlab.data.corpora),
which needs no file at all; this script writes other sizes and seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.data.corpora import REPEATED_CHARS, REPEATED_SEED, repeated_strings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--chars", type=int, default=REPEATED_CHARS)
    parser.add_argument("--seed", type=int, default=REPEATED_SEED)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.chars < 1 or not out.parent.is_dir():
        print(f"repeated_strings: --chars must be >= 1 and the folder of {out} must exist", file=sys.stderr)
        return 2
    out.write_text(repeated_strings(args.chars, args.seed), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
