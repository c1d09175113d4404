"""Word-labelled English sentences with subject-verb agreement, for probes and attribution studies.

    the [adj] SUBJECT near the [adj] ATTRACTOR [adv] VERB-ed the [adj] OBJECT

Subject, attractor and object are singular or plural at random (independently); the verb is in the
past tense, whose form is the same for both numbers ("saw", "liked"). Two labellings (``rows``):

    "pos"      every word's part of speech (DET ADJ NOUN ADP ADV VERB); some types are both noun and verb
               ("saw", "watch"), so their tag is read from context
    "number"   only the verb is labelled, with the number of its subject (sg / pl): the verb's own form
               carries none, so a model has it there only if it moved it there (past an attractor noun)
"""

from __future__ import annotations

import random

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
    """n sentences {"words": [...], "labels": [...]} labelled for ``prop`` ("pos" or "number"), seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words, tags, verb, number = sentence(rng)
        labels = tags if prop == "pos" else [number if i == verb else None for i in range(len(words))]
        out.append({"words": words, "labels": labels})
    return out
