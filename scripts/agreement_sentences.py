"""Write word-labelled English sentences for ``attnlab lens probe``: JSON lines {"words", "labels"}.

    the [adj] SUBJECT near the [adj] ATTRACTOR [adv] VERB-ed the [adj] OBJECT

Subject, attractor and object are singular or plural at random (independently); the verb is in the
past tense, whose form is the same for both numbers ("saw", "liked"). Two properties:

    --property pos      every word's part of speech (DET ADJ NOUN ADP ADV VERB); some types are both noun
                        and verb ("saw", "watch"), so their tag is read from context
    --property number   only the verb is labelled, with the number of its subject (sg / pl): the verb's own
                        form carries none, so a probe can read it only where the model moved it there
                        (past an attractor noun of random number)

    python scripts/agreement_sentences.py --property number --n 2000 --seed 0 --out number.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

NOUNS = [("dog", "dogs"), ("cat", "cats"), ("teacher", "teachers"), ("bird", "birds"), ("farmer", "farmers"),
         ("child", "children"), ("doctor", "doctors"), ("horse", "horses"), ("student", "students"),
         ("duck", "ducks"), ("watch", "watches"), ("saw", "saws"), ("fly", "flies"), ("key", "keys"),
         ("box", "boxes"), ("girl", "girls"), ("boy", "boys"), ("friend", "friends")]
ADJECTIVES = ["old", "small", "quiet", "green", "happy", "tall", "young", "brown", "loud", "clever"]
PREPOSITIONS = ["near", "behind", "with", "beside", "under"]
ADVERBS = ["quietly", "often", "never", "suddenly"]
VERBS = ["saw", "liked", "found", "watched", "followed", "heard", "helped", "chased", "visited", "called"]


def noun_phrase(rng: random.Random) -> tuple[list[str], list[str], str]:
    """(words, tags, number) of "the [adj] noun"."""
    number = rng.choice(["sg", "pl"])
    noun = rng.choice(NOUNS)[0 if number == "sg" else 1]
    if rng.random() < 0.5:
        return ["the", rng.choice(ADJECTIVES), noun], ["DET", "ADJ", "NOUN"], number
    return ["the", noun], ["DET", "NOUN"], number


def sentence(rng: random.Random) -> tuple[list[str], list[str], int, str]:
    """(words, tags, index of the verb, the subject's number)."""
    subj, subj_tags, number = noun_phrase(rng)
    attr, attr_tags, _ = noun_phrase(rng)
    words, tags = [*subj, rng.choice(PREPOSITIONS), *attr], [*subj_tags, "ADP", *attr_tags]
    if rng.random() < 0.3:
        words.append(rng.choice(ADVERBS))
        tags.append("ADV")
    verb = len(words)
    words.append(rng.choice(VERBS))
    tags.append("VERB")
    obj, obj_tags, _ = noun_phrase(rng)
    return words + obj, tags + obj_tags, verb, number


def rows(n: int, seed: int, prop: str) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words, tags, verb, number = sentence(rng)
        labels = tags if prop == "pos" else [number if i == verb else None for i in range(len(words))]
        out.append({"words": words, "labels": labels})
    return out


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
