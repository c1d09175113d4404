"""What every import checks before it writes anything, so that no imported model has non-finite logits, a
tokenizer whose ids fall outside its embedding, or a read that never ends:

    files       each file read is a regular file (a link is followed only to one) of bounded size: a FIFO
                blocks a reader forever, /dev/zero never ends
    numbers     the config's sizes are counts, its epsilons, RoPE bases and init scales finite and positive,
                a ViT's pixel mean finite and its std > 0, one value per channel
    weights     every tensor of the imported model finite, as the model holds it (after the cast to its dtype:
                float64 -> float32 can overflow to inf)
    tokenizer   ids 0..n-1, each once, and n <= the model's vocabulary (the rows of its embedding)

Each failure is one CheckpointError line naming the file and the value or tensor at fault.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import torch

from attnlab.core.errors import CheckpointError, ConfigError

JSON_LIMIT = 16 * 2**20  # bytes: a config.json, preprocessor_config.json or modules.json
TOKENIZER_LIMIT = 256 * 2**20  # bytes: tokenizer.json, vocab.txt
MAX_SIZE = 2**31 - 1  # the largest count a config may give (a tensor dimension beyond it is no model)


# ------------------------------------------------------------------------------------------------- files

def _regular(info: os.stat_result, path: Path, what: str, limit: int | None, error: type[Exception]) -> None:
    """Raise unless ``info`` (of ``path``, links followed) is a regular file of at most ``limit`` bytes."""
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{what} {path} is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{what} {path} is not a regular file (a FIFO, device or socket); attnlab reads files only")
    if limit is not None and info.st_size > limit:
        raise error(f"{what} {path} is {info.st_size / 2**20:,.0f} MB, more than the {limit // 2**20} MB "
                    f"such a file can be")


def file_present(path: Path, what: str, limit: int | None = None, error: type[Exception] = CheckpointError) -> bool:
    """Whether anything is at ``path``: False for nothing at all; True for a regular file (or a link to one) of
    at most ``limit`` bytes; ``error`` for anything else there (a FIFO, a device, a folder, a broken link)."""
    path = Path(path)
    if not os.path.lexists(path):
        return False
    try:
        info = os.stat(path)
    except OSError as e:
        raise error(f"{what} {path} cannot be read ({e.strerror or e}: a broken link?)") from None
    _regular(info, path, what, limit, error)
    return True


def read_bytes(path: Path, what: str, limit: int, error: type[Exception] = CheckpointError) -> bytes:
    """The content of the regular file ``path`` (at most ``limit`` bytes), or ``error`` in one line. Opened
    without blocking and checked again on the open descriptor, so a file swapped for a FIFO cannot hang it."""
    path = Path(path)
    if not file_present(path, what, limit, error):
        raise error(f"no {path.name} in {path.parent}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise error(f"cannot read {what} {path} ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        _regular(os.fstat(fd), path, what, limit, error)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise error(f"{what} {path} is more than the {limit // 2**20} MB such a file can be")
    return data


def read_text(path: Path, what: str, limit: int, error: type[Exception] = CheckpointError) -> str:
    """``read_bytes`` as UTF-8 text."""
    try:
        return read_bytes(path, what, limit, error).decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not UTF-8 text") from None


def read_json(path: Path, what: str, error: type[Exception] = CheckpointError, limit: int = JSON_LIMIT) -> Any:
    """The parsed JSON of the regular file ``path``, or ``error`` in one line."""
    text = read_text(path, what, limit, error)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise error(f"{path} is not valid JSON: {e}") from None


# ----------------------------------------------------------------------------------------------- numbers

def count(value: Any, key: str, where: Path, minimum: int = 1) -> int:
    """``value`` as a count in [minimum, MAX_SIZE]; CheckpointError naming ``key`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_SIZE:
        raise CheckpointError(f"{where}: {key}={value!r} is not a whole number from {minimum} to {MAX_SIZE:,}")
    return value


def number(value: Any, key: str, where: Path, low: float = 0.0, high: float = math.inf) -> float:
    """``value`` as a finite number in (low, high]; CheckpointError naming ``key`` otherwise (NaN, Infinity, a
    string, a bool, zero or a negative number where a positive one is needed)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        and low < value <= high
    if not ok:
        bound = f"a finite number > {low:g}" + (f" and <= {high:g}" if math.isfinite(high) else "")
        raise CheckpointError(f"{where}: {key}={value!r} must be {bound}")
    return float(value)


def check_config_numbers(cfg: dict, where: Path, sizes: tuple[str, ...] = (), eps: tuple[str, ...] = (),
                         positive: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> None:
    """Check the numbers a transformers ``config.json`` gives, where it gives them (an absent or null key takes
    the importer's default): ``sizes`` counts >= 1; ``eps`` finite in (0, 1] (an epsilon under a square root);
    ``positive`` finite and > 0 (RoPE bases, init scales); ``flags`` true or false."""
    given = {k: cfg[k] for k in (*sizes, *eps, *positive, *flags) if cfg.get(k) is not None}
    for key in sizes:
        if key in given:
            count(given[key], key, where)
    for key in eps:
        if key in given:
            number(given[key], key, where, 0.0, 1.0)
    for key in positive:
        if key in given:
            number(given[key], key, where)
    for key in flags:
        if key in given and not isinstance(given[key], bool):
            raise CheckpointError(f"{where}: {key}={given[key]!r} must be true or false")


def check_model_config(config, where: Path) -> None:
    """The attnlab config an import built: its own rules (heads dividing d_model, ...), the finiteness of its
    floats, and that the model fits in this machine's memory, all before any weight is read."""
    from attnlab.models.size import check_fits

    for key in ("norm_eps", "rope_theta", "init_std"):
        if hasattr(config, key):
            number(getattr(config, key), f"model.{key}", where)
    try:
        config.validate()
    except ConfigError as e:
        raise CheckpointError(f"{where}: {e}") from None
    check_fits(config, f"{where}: the model")


def image_normalisation(processor: dict, channels: int, where: Path) -> tuple[list[float], list[float]]:
    """The per-channel (mean, std) of a ``preprocessor_config.json``: x' = (x/255 - mean) / std must be finite,
    so the mean is finite and the std finite and > 0, one value per channel (a single number is every
    channel's); absent, ViTImageProcessor's default 0.5."""
    out = []
    for key, low in (("image_mean", -math.inf), ("image_std", 0.0)):
        value = processor.get(key, 0.5)
        values = [value] * channels if isinstance(value, int | float) and not isinstance(value, bool) else value
        if not isinstance(values, list) or len(values) != channels:
            raise CheckpointError(f"{where}: {key}={value!r} must be a number or a list of {channels} "
                                  f"(the model's channels)")
        out.append([number(v, f"{key}[{i}]", where, low) for i, v in enumerate(values)])
    return out[0], out[1]


# ----------------------------------------------------------------------------------------------- weights

def check_finite_weights(model: torch.nn.Module, where: Path) -> None:
    """Every parameter and buffer of ``model`` finite, as the model holds them; CheckpointError naming the first
    that is not (an fp32 model from float64 weights above 3.4e38 holds inf, though the file held none)."""
    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            kind = "NaN" if bool(torch.isnan(t).any()) else "infinite"
            raise CheckpointError(f"{where}: the weights make {name} {kind} (as {str(t.dtype).removeprefix('torch.')}"
                                  "); attnlab imports finite weights only")


# --------------------------------------------------------------------------------------------- tokenizer

def _json_ids(payload: Any, file: Path) -> list[int]:
    """Every id a ``tokenizers`` JSON gives: its model's vocabulary (a dict, or Unigram's list) and its added
    tokens; CheckpointError for a malformed entry or an id given to two different tokens."""
    model = payload.get("model") if isinstance(payload, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, list):  # Unigram: [[token, score], ...], id = position
        ids = list(range(len(vocab)))
        names = {i: entry[0] if isinstance(entry, list) and entry else entry for i, entry in enumerate(vocab)}
    elif isinstance(vocab, dict):
        names = {}
        for token, i in vocab.items():
            if isinstance(i, bool) or not isinstance(i, int):
                raise CheckpointError(f"{file}: token {token!r} has id {i!r}, not a whole number")
            if i in names:
                raise CheckpointError(f"{file}: id {i} is given to both {names[i]!r} and {token!r}")
            names[i] = token
        ids = list(names)
    else:
        raise CheckpointError(f"{file}: no model vocabulary (model.vocab)")
    for entry in payload.get("added_tokens") or []:
        i = entry.get("id") if isinstance(entry, dict) else None
        if isinstance(i, bool) or not isinstance(i, int):
            raise CheckpointError(f"{file}: an added token has id {i!r}, not a whole number")
        if i in names and names[i] != entry.get("content"):
            raise CheckpointError(f"{file}: id {i} is given to both {names[i]!r} and {entry.get('content')!r}")
        if i not in names:
            names[i] = entry.get("content")
            ids.append(i)
    return ids


def _vocab_txt_ids(text: str, file: Path) -> list[int]:
    """Ids of a BERT vocab.txt (id = line number, empty lines skipped); CheckpointError for a repeated token."""
    first: dict[str, int] = {}
    ids = []
    for i, token in enumerate(text.splitlines()):
        if not token:
            continue
        if token in first:
            raise CheckpointError(f"{file}: line {i + 1} repeats the token {token!r} of line {first[token] + 1}; "
                                  "each token needs one id")
        first[token] = i
        ids.append(i)
    return ids


def _check_ids(ids: list[int], rows: int, file: Path) -> None:
    """Ids 0..n-1, every one used, and n <= ``rows``, the model's vocabulary."""
    if not ids:
        return
    top, bottom = max(ids), min(ids)
    if bottom < 0:
        raise CheckpointError(f"{file}: id {bottom} is negative")
    if len(ids) > rows or top >= rows:
        raise CheckpointError(f"{file}: the tokenizer has {len(ids):,} tokens (ids up to {top:,}), more than the "
                              f"model's vocabulary of {rows:,}; its ids would index past the embedding")
    if top + 1 != len(ids):
        gap = min(set(range(top + 1)) - set(ids))
        raise CheckpointError(f"{file}: no token has id {gap} (ids run to {top:,} over {len(ids):,} tokens: a "
                              "repeated token?); a tokenizer numbers its tokens 0..n-1")


def check_tokenizer_source(directory: Path, rows: int) -> bool:
    """Check the tokenizer file ``load_tokenizer(directory)`` reads (tokenizer.json, else vocab.txt with its
    tokenizer_config.json) against a model of ``rows`` token embeddings; whether the folder has one."""
    json_file, vocab_file = directory / "tokenizer.json", directory / "vocab.txt"
    if file_present(json_file, "tokenizer file", TOKENIZER_LIMIT):
        payload = read_json(json_file, "tokenizer file", limit=TOKENIZER_LIMIT)
        _check_ids(_json_ids(payload, json_file), rows, json_file)
        return True
    if file_present(vocab_file, "tokenizer file", TOKENIZER_LIMIT):
        file_present(directory / "tokenizer_config.json", "tokenizer config", JSON_LIMIT)
        text = read_text(vocab_file, "tokenizer file", TOKENIZER_LIMIT)
        _check_ids(_vocab_txt_ids(text, vocab_file), rows, vocab_file)
        return True
    return False


def check_tokenizer_fits(tokenizer, rows: int, directory: Path) -> None:
    """The loaded tokenizer's ids all index the model's ``rows`` token embeddings."""
    if tokenizer.vocab_size > rows:
        raise CheckpointError(f"{directory}: the tokenizer has {tokenizer.vocab_size:,} tokens, more than the "
                              f"model's vocabulary of {rows:,}")
