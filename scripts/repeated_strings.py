"""Write a text of repeated random strings, the classic setting for induction heads (Olsson et al. 2022).

Each line is ``r r`` for a random string r of 6 to 20 characters drawn without repetition from 300 CJK
ideographs (U+4E00 ...), so a character rarely repeats within a window except as the second copy:
the only way to predict the second copy is to find the first one and read what came next.

    python scripts/repeated_strings.py --out repeated.txt [--chars 600000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ALPHABET = [chr(0x4E00 + k) for k in range(300)]


def repeated_strings(n_chars: int, seed: int = 0, low: int = 6, high: int = 20) -> str:
    """Lines "r r" until the text has at least ``n_chars`` characters."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        r = "".join(rng.sample(ALPHABET, rng.randint(low, high)))
        lines.append(f"{r} {r}")
        size += 2 * len(r) + 2
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--chars", type=int, default=600_000)
    parser.add_argument("--seed", type=int, default=0)
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
