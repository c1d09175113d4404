"""What a "works" case of round three (tests/bad_inputs_round3.py) must have written, checked after it exits 0:
``check(expect, argv)`` knows round two's checks (tests/bad_inputs_round2.py) and these:

    png / jpeg           the --out file is a PNG / JPEG
    text_figures         the --out folder of inspect --text holds attention.json and the figures
    faithfulness         the --faithfulness JSON scores at least one method
    heads_json=N         the --json file lists N heads
    exported             the --out folder holds config.json and model.safetensors
    jsonl_rows=N         the --out JSONL file has N lines, each an object with a prediction
    micrographs=N        the --out folder holds N images under train/ and test/ and defects.jsonl
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.bad_inputs_round2 import check as round2_check


def _arg(argv: list[str], flag: str) -> Path:
    return Path(argv[argv.index(flag) + 1])


def _starts(magic: bytes, what: str):
    def check_file(argv: list[str], _: str) -> str | None:
        return None if _arg(argv, "--out").read_bytes().startswith(magic) else f"--out is not a {what}"
    return check_file


def _text_figures(argv: list[str], _: str) -> str | None:
    out = _arg(argv, "--out")
    pngs = list(out.glob("*.png"))
    return None if (out / "attention.json").is_file() and pngs else f"{out} lacks attention.json or its figures"


def _faithfulness(argv: list[str], _: str) -> str | None:
    record = json.loads(_arg(argv, "--faithfulness").read_text(encoding="utf-8"))
    return None if isinstance(record, dict) and record.get("methods") else "no method scored"


def _heads_json(argv: list[str], n: str) -> str | None:
    heads = json.loads(_arg(argv, "--json").read_text(encoding="utf-8")).get("heads")
    return None if isinstance(heads, list) and len(heads) == int(n) else f"not {n} heads in --json"


def _exported(argv: list[str], _: str) -> str | None:
    out = _arg(argv, "--out")
    return None if (out / "config.json").is_file() and (out / "model.safetensors").is_file() else \
        f"{out} lacks config.json or model.safetensors"


def _jsonl_rows(argv: list[str], n: str) -> str | None:
    rows = [json.loads(line) for line in _arg(argv, "--out").read_text(encoding="utf-8").splitlines()]
    return (f"{len(rows)} rows, not {n}" if len(rows) != int(n) else
            None if all(isinstance(r, dict) and len(r) > 1 for r in rows) else "a row that is not a prediction")


def _micrographs(argv: list[str], n: str) -> str | None:
    out = _arg(argv, "--out")
    images = len(list(out.glob("t*/*/*.png")))
    return None if images == int(n) and (out / "defects.jsonl").is_file() else \
        f"{images} images under train/ and test/ (not {n}), or no defects.jsonl"


CHECKS = {"png": _starts(b"\x89PNG", "PNG"), "jpeg": _starts(b"\xff\xd8", "JPEG"), "text_figures": _text_figures,
          "faithfulness": _faithfulness, "heads_json": _heads_json, "exported": _exported, "jsonl_rows": _jsonl_rows,
          "micrographs": _micrographs}


def check(expect: str, argv: list[str]) -> str | None:
    """What is wrong with the output of a "works:CHECK[=ARG]" case that exited 0 (None: nothing); round two's
    checks too."""
    name, _, arg = expect.removeprefix("works:").partition("=")
    if name not in CHECKS:
        return round2_check(expect, argv)
    try:
        return CHECKS[name](argv, arg)
    except (OSError, ValueError, AttributeError, StopIteration) as e:
        return f"{name}: {type(e).__name__}: {e}"
