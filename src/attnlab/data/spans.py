"""Generated span data: sentences with tagged entities (NER) and passages with questions (extractive QA).

Everything is drawn from the small name lists below by a seeded ``random.Random``, so a seed gives the same
rows on every machine. Each list is cut in two: the names before ``HELD_OUT`` of it appear in the train and val
splits, the rest only in test, so a test score measures entities the model never saw.

    entities   {"tokens": ["Ana", "Rivas", "joined", ...], "tags": ["B-PER", "I-PER", "O", ...]}   BIO tags
               of PER (people), LOC (cities), ORG (companies) and DATE, from templated sentences
    questions  {"context": "...", "question": "...", "answer": {"text": "...", "start": 17}}        SQuAD's
               shape: facts about 2-3 people (born where and when, working for whom), one question each,
               the answer a span of the context starting at character ``start``

``attnlab data entities|questions --out DIR`` writes ``DIR/{train,val,test}.jsonl``; the tasks read such a
folder, one JSONL file, or the names ``generated:entities`` / ``generated:questions`` (made in memory).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from attnlab.core.errors import DataError

FIRST = ["Ana", "Tomas", "Lena", "Marek", "Sofia", "Jonas", "Irene", "Pavel", "Clara", "Mateo", "Nadia", "Oskar",
         "Greta", "Felix", "Hana", "Lukas", "Mira", "Emil", "Rosa", "Viktor", "Alma", "Bruno", "Elsa", "Hugo",
         "Ines", "Karl", "Lidia", "Nils", "Olga", "Rafael", "Selma", "Teo", "Vera", "Anton", "Dora", "Igor",
         "Maja", "Aron", "Beatriz", "Cyril", "Daria", "Enzo", "Frida", "Gustav", "Helga", "Ivo", "Jana", "Kasper",
         "Lotte", "Milan", "Nora", "Otto", "Paula", "Quentin", "Rita", "Stefan", "Tilda", "Ugo", "Vilma", "Walter",
         "Yara", "Zoran", "Agnes", "Boris", "Carmen", "Dmitri", "Edith", "Filip", "Gloria", "Henrik", "Ida", "Jakob"]
LAST = ["Rivas", "Berg", "Novak", "Lind", "Moreau", "Kowal", "Santos", "Weber", "Horvat", "Dahl", "Rossi", "Falk",
        "Ortega", "Brandt", "Varga", "Holm", "Costa", "Keller", "Nemeth", "Strand", "Duarte", "Krause", "Lucas",
        "Marin", "Petrov", "Quist", "Sauer", "Toma", "Ulrich", "Wolff", "Zeller", "Baros", "Eklund", "Ferro",
        "Almeida", "Bianchi", "Castell", "Dvorak", "Engel", "Fontaine", "Gruber", "Haas", "Ilves", "Jansen",
        "Kovacs", "Larsen", "Meyer", "Nieminen", "Olsen", "Pereira", "Radu", "Schmidt", "Takacs", "Urban",
        "Vidal", "Winter", "Yilmaz", "Zajac", "Arnaud", "Blom", "Cruz", "Dumont", "Esteves", "Fischer"]
CITIES = ["Lisbon", "Oslo", "Prague", "Porto", "Vienna", "Krakow", "Lyon", "Bergen", "Turin", "Ghent", "Malmo",
          "Riga", "Leeds", "Basel", "Split", "Graz", "Bilbao", "Aarhus", "Brno", "Tartu", "Cork", "Namur",
          "Linz", "Poznan", "Bremen", "Varna", "Pecs", "Lille", "New Aldor", "Port Elm", "San Caro", "Vesta",
          "Geneva", "Dublin", "Seville", "Utrecht", "Gdansk", "Tampere", "Bologna", "Nantes", "Kaunas", "Ljubljana",
          "Salzburg", "Odense", "Valencia", "Antwerp", "Dresden", "Zadar", "Bristol", "Uppsala", "Genoa", "Plovdiv",
          "Cluj", "Trondheim", "Leipzig", "Coimbra", "Kosice", "Rouen", "Port Tyne", "San Milo"]
ORG_STEMS = ["Halden", "Vantor", "Norvik", "Corval", "Ostra", "Bellin", "Kestrel", "Marlow", "Tessar", "Arden",
             "Brixel", "Dunmore", "Elbrook", "Fennic", "Galvan", "Hollis", "Iverna", "Jasper", "Lorin", "Mendel",
             "Pellar", "Quorra", "Rendal", "Sabre", "Torvik", "Umbra", "Wexley", "Yarrow", "Axon", "Borealis",
             "Cindra", "Delmar", "Everly", "Falcon", "Granit", "Helix", "Ionis", "Juno", "Kappa", "Lumen",
             "Meridian", "Nexa", "Orbis", "Primo", "Quanta", "Rhodia", "Solace", "Titan", "Vireo", "Zephyr"]
ORG_KINDS = ["Bank", "Systems", "Labs", "Energy", "Foods", "Motors", "Media", "Group"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
HELD_OUT = 0.25  # the last quarter of each name list is seen only in the test split
LABELS = ("PER", "LOC", "ORG", "DATE")
SPLIT_SIZES = {"train": 0.8, "val": 0.1, "test": 0.1}  # shares of n
MAX_ROWS = 200_000  # --n beyond this is refused (a few hundred MB of JSON)

ENTITY_TEMPLATES = [
    "{PER} was born in {LOC} on {DATE} .", "{PER} joined {ORG} in {DATE} .", "{ORG} opened an office in {LOC} .",
    "On {DATE} , {PER} visited {LOC} .", "{PER} and {PER} work for {ORG} .", "The meeting in {LOC} was led by {PER} .",
    "{ORG} hired {PER} as its new director .", "{PER} moved from {LOC} to {LOC} in {DATE} .",
    "Shares of {ORG} rose after {DATE} .", "A report by {ORG} names {PER} as its author .",
    "{PER} said the plant in {LOC} will close .", "Since {DATE} the {ORG} team has grown .",
    "Our guide in {LOC} was {PER} .", "{ORG} and {ORG} signed a deal in {LOC} .", "The weather in {LOC} was mild .",
    "Nobody expected the news .", "{PER} met {PER} at the {ORG} stand in {LOC} on {DATE} .",
]
FACTS = {  # a fact about a person: its sentence and the question it answers, {P} the person, {X} the answer
    "city": ("{P} was born in {X}.", "Where was {P} born?"),
    "year": ("{P} was born in the year {X}.", "When was {P} born?"),
    "org": ("{P} works for {X}.", "Who does {P} work for?"),
    "friend": ("{P} is a friend of {X}.", "Who is {P} a friend of?"),
}


def _split_names(names: list[str], split: str) -> list[str]:
    cut = len(names) - max(1, round(HELD_OUT * len(names)))
    return names[cut:] if split == "test" else names[:cut]


class Names:
    """The name lists one split draws from (train and val: the first part of each list; test: the held-out rest)."""

    def __init__(self, split: str) -> None:
        self.first, self.last = _split_names(FIRST, split), _split_names(LAST, split)
        self.cities = _split_names(CITIES, split)
        self.orgs = [f"{s} {k}" for s in _split_names(ORG_STEMS, split) for k in ORG_KINDS]

    def person(self, rng: random.Random) -> str:
        """A first and last name (four times in five), else a first name alone."""
        return f"{rng.choice(self.first)} {rng.choice(self.last)}" if rng.random() < 0.8 else rng.choice(self.first)

    def date(self, rng: random.Random) -> str:
        """"12 March 1998", "March 1998" or "1998", each a third of the time."""
        year, month = rng.randint(1950, 2024), rng.choice(MONTHS)
        form = rng.randrange(3)
        return f"{rng.randint(1, 28)} {month} {year}" if form == 0 else f"{month} {year}" if form == 1 else str(year)

    def entity(self, label: str, rng: random.Random) -> str:
        """A name of type ``label`` (PER, LOC, ORG or DATE)."""
        if label == "PER":
            return self.person(rng)
        if label == "LOC":
            return rng.choice(self.cities)
        if label == "ORG":
            return rng.choice(self.orgs)
        return self.date(rng)


def entity_row(names: Names, rng: random.Random) -> dict[str, list[str]]:
    """One templated sentence: its words and their BIO tags."""
    tokens: list[str] = []
    tags: list[str] = []
    for word in rng.choice(ENTITY_TEMPLATES).split():
        label = word[1:-1] if word.startswith("{") else None
        if label is None:
            tokens.append(word)
            tags.append("O")
            continue
        parts = names.entity(label, rng).split()
        tokens += parts
        tags += [f"B-{label}"] + [f"I-{label}"] * (len(parts) - 1)
    return {"tokens": tokens, "tags": tags}


def _fact(kind: str, names: Names, rng: random.Random, others: list[str]) -> str:
    """The answer of a fact of ``kind``: a city, a year, a company, or one of the ``others`` people."""
    if kind == "city":
        return rng.choice(names.cities)
    if kind == "year":
        return str(rng.randint(1950, 2010))
    return rng.choice(names.orgs) if kind == "org" else rng.choice(others)


def question_row(names: Names, rng: random.Random) -> dict[str, Any]:
    """A passage of facts about 2-3 different people and one question whose answer is a span of it."""
    people: list[str] = []
    count = rng.randint(2, 3)
    while len(people) < count:
        p = names.person(rng)
        if all(p not in q and q not in p for q in people):  # no name inside another: the question is unambiguous
            people.append(p)
    facts = []  # (person, kind, answer)
    for p in people:
        for kind in rng.sample(sorted(FACTS), rng.randint(1, 2)):
            facts.append((p, kind, _fact(kind, names, rng, [q for q in people if q != p])))
    rng.shuffle(facts)
    context, target = "", rng.randrange(len(facts))
    question, text, start = "", "", 0
    for i, (p, kind, answer) in enumerate(facts):
        before, after = FACTS[kind][0].split("{X}")
        sentence_start = len(context) + (1 if context else 0)
        context += (" " if context else "") + before.format(P=p) + answer + after
        if i == target:
            start = sentence_start + len(before.format(P=p))
            question = FACTS[kind][1].format(P=p)
            text = answer
    return {"context": context, "question": question, "answer": {"text": text, "start": start}}


def generate(kind: str, n: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """{split: rows} of ``kind`` ("entities" or "questions"): n rows in all, shared out by ``SPLIT_SIZES``; each
    split from its own generator seeded by (seed, split), its names from its part of the lists."""
    make = {"entities": entity_row, "questions": question_row}[kind]
    sizes = {s: max(1, round(f * n)) for s, f in SPLIT_SIZES.items()}
    out = {}
    for i, split in enumerate(SPLIT_SIZES):
        rng, names = random.Random(f"{kind}/{seed}/{i}"), Names(split)
        out[split] = [make(names, rng) for _ in range(sizes[split])]
    return out


def check_count(n: int, what: str = "--n") -> None:
    """DataError unless ``n`` rows can fill the three splits and fit in memory."""
    if not 10 <= n <= MAX_ROWS:
        raise DataError(f"{what} must be 10 to {MAX_ROWS:,} rows (train, val and test each get some), got {n:,}")


def write_folder(out: str | Path, kind: str, n: int, seed: int = 0) -> dict[str, int]:
    """Write ``out/{train,val,test}.jsonl`` of ``kind`` (a folder made whole or not at all); {split: rows}."""
    from attnlab.core.fileio import check_writable_folder
    from attnlab.core.staging import staged_folder

    out = Path(out)
    check_count(n)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"{out} exists and is not an empty folder; choose a new --out")
    check_writable_folder(out, "--out", DataError)  # before anything is generated
    splits = generate(kind, n, seed)
    with staged_folder(out, DataError) as staging:  # a kill leaves no out or all of it, never a part
        for split, rows in splits.items():
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            (staging / f"{split}.jsonl").write_text(text, encoding="utf-8")
    return {split: len(rows) for split, rows in splits.items()}


# -- reading ------------------------------------------------------------------------------------------------------

GENERATED = {"generated:entities": "entities", "generated:questions": "questions"}
GENERATED_ROWS = 5000  # rows of a generated:... data name (4000 train, 500 val, 500 test)


def _check_entity_row(where: str, row: Any) -> dict[str, list[str]]:
    if not isinstance(row, dict) or not isinstance(row.get("tokens"), list) or not isinstance(row.get("tags"), list):
        raise DataError(f"{where}: each line needs an object with 'tokens' and 'tags' lists")
    tokens, tags = row["tokens"], row["tags"]
    if not tokens or len(tokens) != len(tags):
        raise DataError(f"{where}: 'tokens' and 'tags' must be non-empty lists of the same length, got {len(tokens)} "
                        f"and {len(tags)}")
    if not all(isinstance(t, str) and t.strip() and not any(c.isspace() for c in t) for t in tokens):
        raise DataError(f"{where}: every token must be a non-empty string without spaces")
    bad = [t for t in tags if not isinstance(t, str) or not (t == "O" or (t[:2] in ("B-", "I-") and len(t) > 2))]
    if bad:
        raise DataError(f"{where}: tags are BIO tags (O, B-TYPE, I-TYPE), got {bad[0]!r}")
    return {"tokens": tokens, "tags": tags}


def _check_question_row(where: str, row: Any) -> dict[str, Any]:
    answer = row.get("answer") if isinstance(row, dict) else None
    if not (isinstance(row, dict) and isinstance(row.get("context"), str) and isinstance(row.get("question"), str)
            and isinstance(answer, dict) and isinstance(answer.get("text"), str)
            and isinstance(answer.get("start"), int) and not isinstance(answer.get("start"), bool)):
        raise DataError(f"{where}: each line needs 'context' and 'question' strings and an 'answer' object with "
                        "'text' (a string) and 'start' (its character offset in the context)")
    start, text = answer["start"], answer["text"]
    if not text.strip() or not 0 <= start <= len(row["context"]) - len(text) \
            or row["context"][start:start + len(text)] != text:
        raise DataError(f"{where}: the answer {text[:30]!r} is not the context's text at character {start}")
    if not row["question"].strip():
        raise DataError(f"{where}: the question is empty")
    return {"context": row["context"], "question": row["question"], "answer": {"text": text, "start": start}}


def read_rows(path: str | Path, kind: str) -> list[dict[str, Any]]:
    """The rows of one JSONL file of ``kind``, each checked (DataError naming the file and line)."""
    from attnlab.data.labelled import jsonl_records, read_table_text

    path = Path(path)
    check = _check_entity_row if kind == "entities" else _check_question_row
    rows = [check(f"{path}:{n}", row) for n, row in jsonl_records(path, read_table_text(path, "data file"))]
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def read_splits(data: str, kind: str) -> dict[str, list[dict[str, Any]]]:
    """{split: rows} of a data name: ``generated:entities|questions``, a folder with train.jsonl and val.jsonl
    (test.jsonl too where there is one), or one .jsonl file ({"all": rows}, split by the caller)."""
    if data in GENERATED:
        if GENERATED[data] != kind:
            raise DataError(f"data={data} holds {GENERATED[data]}; this task reads {kind} "
                            f"(data=generated:{kind})")
        return generate(kind, GENERATED_ROWS)
    path = Path(data)
    if path.is_dir():
        missing = [f"{s}.jsonl" for s in ("train", "val") if not (path / f"{s}.jsonl").is_file()]
        if missing:
            raise DataError(f"{path} has no {' or '.join(missing)}; write such a folder with attnlab data {kind} "
                            "--out DIR")
        return {s: read_rows(path / f"{s}.jsonl", kind) for s in SPLIT_SIZES if (path / f"{s}.jsonl").is_file()}
    if path.suffix.lower() != ".jsonl":
        hint = " (a data name starting with generated:)" if data.startswith("generated:") else ""
        raise DataError(f"data={data}: {kind} are read from a folder of train/val/test.jsonl, a .jsonl file or "
                        f"generated:{kind}{hint}")
    return {"all": read_rows(path, kind)}
