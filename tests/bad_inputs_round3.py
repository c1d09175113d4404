"""Round three of the bad inputs: the commands rounds one and two touched least (inspect, heads, experiment, export,
eval, sample, predict, embed, lens, data, explore, completion, bench, resume on folders that are not runs). Shared by
tests/cli/test_bad_inputs_round3.py (a seeded sample, in-process) and ``benchmarks/bad_inputs.py --round 3`` (all of
them, each in its own process, timed and measured).

``build_cases(root)`` reuses round two's tiny runs (tests/bad_inputs_round2.py: a char GPT, a ViT on 8x8 digits, a
BERT, an audio encoder) and returns the cases in round two's format, (name, argv, expect), with round two's expect
kinds, ``OWN_PROCESS`` and ``HELD_PORT``; ``check`` (tests/bad_inputs_round3_checks.py) knows round two's checks of a
"works" case and round three's. The cases of inspect, heads and experiment are tests/bad_inputs_round3_look.py's.

This module imports no torch at its top (the benchmark's parent process stays small).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from types import SimpleNamespace

from tests.bad_inputs_round2 import (
    FSIZE_LIMITS,
    HELD_PORT,
    OWN_PROCESS,
    UNPRIVILEGED,
    _copy,
    _runs,
    _texts,
    _write,
    png,
)
from tests.bad_inputs_round3_checks import check
from tests.bad_inputs_round3_look import experiment_cases, heads_cases, inspect_cases

MAX_ARGUMENT = 128 * 1024  # bytes in one argument of a new process (Linux's MAX_ARG_STRLEN)
__all__ = ["FSIZE_LIMITS", "HELD_PORT", "OWN_PROCESS", "UNPRIVILEGED", "build_cases", "check"]


# -- files ----------------------------------------------------------------------------------------------------
def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_copies(r: dict[str, Path], root: Path) -> dict[str, Path]:
    """Copies of the GPT run, each damaged one way (for export, eval, explore and resume)."""
    gpt, made = r["gpt"], {}
    manifest = (gpt / "manifest.json").read_text()
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    config = (gpt / "config.yaml").read_text()
    damage = {
        "manifest truncated": ("manifest.json", manifest[:40]), "manifest not JSON": ("manifest.json", "not json\n"),
        "manifest a list": ("manifest.json", "[1, 2]\n"),
        "manifest listing a missing file": ("manifest.json", json.dumps(
            {**json.loads(manifest), "files": {**json.loads(manifest)["files"], "extra.bin": "0" * 64}})),
        "config.yaml truncated": ("config.yaml", config[:300]), "config.yaml a YAML bomb": ("config.yaml", laughs),
        "config.yaml a list": ("config.yaml", "- a\n- b\n"), "config.yaml a number": ("config.yaml", "7\n"),
        "config.yaml 10^4 deep": ("config.yaml", "max_iters: " + "[" * 10_000 + "]" * 10_000 + "\n"),
        "config.yaml with a 5000-digit max_iters": ("config.yaml", config + "max_iters: " + "9" * 5000 + "\n"),
        "config.yaml with an unknown key": ("config.yaml", config + "lerning_rate: 0.1\n"),
        "config.json truncated": ("config.json", (gpt / "config.json").read_text()[:30]),
        "config.yaml empty": ("config.yaml", ""),
        "config.yaml cut after a line": ("config.yaml", "".join(config.splitlines(keepends=True)[:5])),
    }
    for i, (what, (name, text)) in enumerate(damage.items()):
        made[what] = _copy(gpt, root / "copies3" / f"{i:02d}")
        (made[what] / name).write_text(text, encoding="utf-8")
    made["config.yaml not UTF-8"] = _copy(gpt, root / "copies3" / "latin1")
    (made["config.yaml not UTF-8"] / "config.yaml").write_bytes(config.encode() + "caf\xe9: 1\n".encode("latin-1"))
    made["weights changed"] = _copy(gpt, root / "copies3" / "weights")
    weights = bytearray((gpt / "attnlab_model.safetensors").read_bytes())
    weights[-10] ^= 0xFF
    (made["weights changed"] / "attnlab_model.safetensors").write_bytes(bytes(weights))
    made["weights truncated"] = _copy(gpt, root / "copies3" / "weights-cut")
    (made["weights truncated"] / "attnlab_model.safetensors").write_bytes(weights[:100])
    made["no manifest"] = _copy(gpt, root / "copies3" / "no-manifest")
    (made["no manifest"] / "manifest.json").unlink()
    made["no checkpoints"] = _copy(gpt, root / "copies3" / "no-checkpoints")
    shutil.rmtree(made["no checkpoints"] / "checkpoints")
    made["config.yaml a folder"] = _copy(gpt, root / "copies3" / "yaml-folder")
    (made["config.yaml a folder"] / "config.yaml").unlink()
    (made["config.yaml a folder"] / "config.yaml").mkdir()
    return made


# -- the cases ------------------------------------------------------------------------------------------------
def build_cases(root: Path) -> list[tuple[str, list[str], str]]:
    """Every case of round three, deterministic order. Outputs are under ``root / "runs"`` (the benchmark gives each
    case a folder of its own there and checks that a refused case left nothing in it)."""
    from tests.helpers import write_corpus

    root.mkdir(parents=True, exist_ok=True)
    r, out, files = _runs(root), root / "runs", root / "files3"
    gpt, vit, bert, audio = (str(r[k]) for k in ("gpt", "vit", "bert", "audio"))
    corpus = write_corpus(root / "corpus.txt")
    files.mkdir(parents=True, exist_ok=True)
    user = _write(files / "notes.txt", "my own notes\n")  # a user's file no command may take as its output
    mine = files / "my-folder"  # a folder of the user's files
    _write(mine / "keep.txt", "mine\n")
    empty_dir = files / "empty-folder"
    empty_dir.mkdir(exist_ok=True)
    through = str(user / "x")  # a path through a file
    digit = png(files / "digit.png", 8, 8, pixels=b"".join(b"\0" + bytes([i * 30] * 8) for i in range(8)))
    clip = str(sorted((r["clips"] / "yes").glob("*.wav"))[0])
    closed = str(_closed_port())
    cases: list[tuple[str, list[str], str]] = []

    c = SimpleNamespace(r=r, root=root, out=out, files=files, gpt=gpt, vit=vit, bert=bert, audio=audio, corpus=corpus,
                        user=user, mine=mine, empty_dir=empty_dir, through=through, digit=digit, clip=clip,
                        closed=closed)
    cases += inspect_cases(c) + heads_cases(c) + experiment_cases(c)

    # export
    copies = _run_copies(r, root)
    cases += [(f"export --format {fmt!r}", ["export", gpt, "--format", fmt, "--out", str(out / "x")], "refused")
              for fmt in ("onnx", "HF", "", "gguf")]
    once = root / "exported-once"  # a finished export: a second one into it must be refused, the first kept
    if not once.exists():
        from attnlab.cli import main

        assert main(["export", gpt, "--out", str(once)]) == 0
    cases += [("export --out a folder of the user's files", ["export", gpt, "--out", str(mine)], "refused"),
              ("export --out a user's file", ["export", gpt, "--out", str(user)], "refused"),
              ("export --out an earlier export", ["export", gpt, "--out", str(once)], "refused"),
              ("export a missing run", ["export", str(root / "nope"), "--out", str(out / "x")], "refused"),
              ("export a file as the run", ["export", str(user), "--out", str(out / "x")], "refused"),
              ("export an empty folder", ["export", str(empty_dir), "--out", str(out / "x")], "refused"),
              ("export --format sentence-transformers a gpt run", ["export", gpt, "--format", "sentence-transformers",
                                                                   "--out", str(out / "x")], "refused"),
              ("export --format sentence-transformers a vit run", ["export", vit, "--format", "sentence-transformers",
                                                                   "--out", str(out / "x")], "refused"),
              ("export an audio run", ["export", audio, "--out", str(out / "x")], "refused")]
    for what in ("manifest truncated", "manifest not JSON", "manifest a list", "manifest listing a missing file",
                 "weights changed", "weights truncated", "config.json truncated"):
        cases.append((f"export a run with its {what}", ["export", str(copies[what]), "--out", str(out / "x")],
                      "refused"))
    cases += [(f"export --push {repo!r}", ["export", gpt, "--out", str(out / "x"), "--push", repo], "refused")
              for repo in ("not a repo", "a/b/c", "../x", "org/", "", "/name", "org/na me", "x" * 200)]
    cases += [(f"export --license {lic!r}", ["export", gpt, "--out", str(out / "x"), "--license", lic], "refused")
              for lic in ("", "not a licence!", "mit\nlicense: evil", "a" * 100)]
    cases += [("export a gpt run", ["export", gpt, "--out", str(out / "x"), "--license", "apache-2.0"],
               "works:exported"),
              ("export a vit run", ["export", vit, "--out", str(out / "x")], "works:exported"),
              ("export a run without a manifest", ["export", str(copies["no manifest"]), "--out", str(out / "x")],
               "either")]

    # eval
    cases += [(f"eval {' '.join(extra)}", ["eval", gpt, *extra], "refused") for extra in (
        ["--kernels", "bogus"], ["--kernels", "attention,nope"], ["--data", str(empty_dir)],
        ["--data", str(files / "oov.txt")], ["--data", str(files / "short.txt")], ["--data", str(files / "utf16.txt")],
        ["--batch-size", str(10**20)], ["--eval-iters", "1.5"], ["--splits"], ["--splits", "test"])]
    cases += [("eval a vit run on a text file", ["eval", vit, "--data", str(corpus)], "refused"),
              ("eval an audio run on a text file", ["eval", audio, "--data", str(corpus)], "refused"),
              ("eval a run with changed weights", ["eval", str(copies["weights changed"])], "refused"),
              ("eval a run with a truncated manifest", ["eval", str(copies["manifest truncated"])], "refused"),
              ("eval a run with a truncated config.json", ["eval", str(copies["config.json truncated"])], "refused"),
              ("eval --splits train train", ["eval", gpt, "--eval-iters", "1", "--splits", "train", "train"], "either")]

    # sample and translate
    sample = ["sample", gpt, "--max-new-tokens", "2"]
    cases += [(f"sample {flag} {v}", [*sample, flag, v], "refused") for flag, v in (
        ("--min-p", "nan"), ("--min-p", "-1"), ("--min-p", "2"), ("--min-p", "inf"), ("--repetition-penalty", "0"),
        ("--repetition-penalty", "-1"), ("--repetition-penalty", "nan"), ("--repetition-penalty", "inf"),
        ("--num-beams", "0"), ("--num-beams", "-1"), ("--top-k", str(10**23)), ("--top-p", "1.0000001"),
        ("--device", "cuda:99"), ("--device", "mps"), ("--device", ""), ("--device", "gpu"), ("--kernels", "nope"),
        ("--num-samples", "1.5"), ("--max-new-tokens", "1e3"), ("--temperature", "-0.0001"))]
    cases += [(f"sample --num-samples {n}{OWN_PROCESS}", [*sample, "--num-samples", str(n)], "refused:--num-samples")
              for n in (10**9, 10**6)]
    cases += [("sample --num-samples 1000 --max-new-tokens 100000", ["sample", gpt, "--max-new-tokens", "100000",
                                                                      "--num-samples", "1000"],
               "refused:--num-samples"),
              ("sample a vit run", ["sample", vit], "refused"), ("sample a bert run", ["sample", bert], "refused"),
              ("sample an audio run", ["sample", audio], "refused"),
              ("sample a run with changed weights", ["sample", str(copies["weights changed"])], "refused"),
              ("sample --top-k beyond the vocabulary", [*sample, "--top-k", str(10**12)], "either"),
              ("sample --temperature 1e308", [*sample, "--temperature", "1e308"], "either"),
              ("sample --max-new-tokens 0", ["sample", gpt, "--max-new-tokens", "0"], "either"),
              ("sample --prompt of 100,000 characters", [*sample, "--prompt", "the " * 25_000], "either"),
              ("sample --stop of 100,000 characters", [*sample, "--stop", "the " * 25_000], "either"),
              ("sample --prompt outside the vocabulary", [*sample, "--prompt", "\u00e9\u00e9"], "refused"),
              ("translate --length-penalty nan", ["translate", gpt, "--text", "hi", "--length-penalty", "nan"],
               "refused"),
              ("translate --file missing", ["translate", gpt, "--file", str(root / "nope.txt")], "refused"),
              ("translate a vit run", ["translate", vit, "--text", "hi"], "refused")]

    # predict: empty files, header-only, wrong columns, JSONL that is not objects, a huge line
    texts = _texts()
    predict_inputs = {
        "empty.csv": "", "empty.jsonl": "", "newlines.txt": "\n\n\n", "header-only.tsv": "text\tid\n",
        "lists.jsonl": "[1, 2]\n[3]\n", "strings.jsonl": '"the"\n"fox"\n', "nulls.jsonl": "null\nnull\n",
        "no-text-key.jsonl": '{"words": "the"}\n', "text-a-number.jsonl": '{"text": 5}\n',
        "Text-column.csv": "Text,id\nthe fox,1\n", "second-line-broken.jsonl": '{"text": "the fox"}\n{"text": "the"\n',
        "only-commas.csv": ",,\n,,\n", "spaces-only.txt": "   \n \t \n"}
    for name, text in predict_inputs.items():
        cases.append((f"predict --data {name}", ["predict", gpt, "--data", str(_write(files / name, text)), "--out",
                                                 str(out / "p.csv")], "refused"))
    jsonl = _write(files / "rows.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    huge = _write(files / "huge-line.txt", "the quick brown fox " * 500_000 + "\n")
    mixed = files / "mixed-images"
    (mixed / "a").mkdir(parents=True, exist_ok=True)
    shutil.copy(digit, mixed / "a" / "0.png")
    _write(mixed / "a" / "notes.txt", "not an image\n")
    cases += [("predict a vit run on a text file", ["predict", vit, "--data", str(corpus), "--out", str(out / "p.csv")],
               "refused"),
              ("predict a gpt run on a PNG", ["predict", gpt, "--data", str(digit), "--out", str(out / "p.csv")],
               "refused"),
              ("predict an audio run on a PNG", ["predict", audio, "--data", str(digit), "--out", str(out / "p.csv")],
               "refused"),
              ("predict a vit run on a folder without images", ["predict", vit, "--data", str(mine), "--out",
                                                                str(out / "p.csv")], "refused"),
              ("predict a vit run on a 16x16 PNG", ["predict", vit, "--data", str(files / "sixteen.png"), "--out",
                                                    str(out / "p.csv")], "refused"),
              ("predict --data a folder on a gpt run", ["predict", gpt, "--data", str(mine), "--out",
                                                        str(out / "p.csv")], "refused"),
              ("predict --out a folder", ["predict", gpt, "--data", str(jsonl), "--out", str(mine)], "refused"),
              ("predict --out .parquet", ["predict", gpt, "--data", str(jsonl), "--out", str(out / "p.parquet")],
               "refused"),
              ("predict --batch-size 2**70", ["predict", gpt, "--data", str(jsonl), "--out", str(out / "p.csv"),
                                              "--batch-size", str(2**70)], "refused"),
              ("predict --out .jsonl", ["predict", gpt, "--data", str(jsonl), "--out", str(out / "p.jsonl")],
               f"works:jsonl_rows={len(texts)}"),
              ("predict --batch-size beyond the rows", ["predict", gpt, "--data", str(jsonl), "--out",
                                                        str(out / "p.csv"), "--batch-size", str(10**6)],
               f"works:rows={len(texts)}"),
              ("predict a line of 10 MB", ["predict", gpt, "--data", str(huge), "--out", str(out / "p.csv")],
               "either"),
              ("predict a vit run on a 16x16 PNG --resize", ["predict", vit, "--data", str(files / "sixteen.png"),
                                                             "--out", str(out / "p.csv"), "--resize"], "works:rows=1"),
              ("predict a folder with an image and a text file", ["predict", vit, "--data", str(mixed), "--out",
                                                                  str(out / "p.csv")], "works:rows=1")]

    # embed
    cases += [(f"embed {' '.join(extra)}", ["embed", bert, "--text", "the", *extra], "refused") for extra in (
        ["--max-len", "0"], ["--max-len", "-1"], ["--max-len", "x"], ["--max-len", str(2**70)],
        ["--pooling", "bogus"], ["--pooling", "MEAN"])]
    cases += [("embed a vit run", ["embed", vit, "--text", "hi"], "refused"),
              ("embed an audio run", ["embed", audio, "--text", "hi"], "refused"),
              ("embed without --text", ["embed", bert], "refused"),
              ("embed a run with a truncated config.json", ["embed", str(copies["config.json truncated"]), "--text",
                                                            "hi"], "refused"),
              ("embed --max-len beyond the context", ["embed", bert, "--text", "the", "--max-len", str(10**9)],
               "either"),
              ("embed --text of 25,000 words", ["embed", bert, "--text", "the " * 25_000], "either")]

    # lens
    lens = ["lens", "logit-lens", gpt, "--text", "the"]
    patch = ["lens", "patch", gpt, "--clean", "the", "--corrupted", "thx", "--answer", "a", "--wrong", "b"]
    _write(files / "probe.jsonl", '{"words": ["the", "fox"], "labels": ["a", "b"]}\n'
           '{"words": ["the", "dog"], "labels": ["a", "b"]}\n')
    probe = ["lens", "probe", gpt, "--data", str(files / "probe.jsonl")]
    cases += [("lens logit-lens --figure .txt", [*lens, "--figure", str(out / "l.txt")], "refused"),
              ("lens logit-lens --figure through a file", [*lens, "--figure", through + ".png"], "refused"),
              ("lens logit-lens --figure a folder", [*lens, "--figure", str(mine)], "refused"),
              ("lens logit-lens --json a folder", [*lens, "--json", str(mine)], "refused"),
              ("lens logit-lens --k -1", [*lens, "--k", "-1"], "refused"),
              ("lens logit-lens on a vit run", ["lens", "logit-lens", vit, "--text", "the"], "refused"),
              ("lens logit-lens on a bert run", ["lens", "logit-lens", bert, "--text", "the"], "refused"),
              ("lens ablate --head 0.99", ["lens", "ablate", gpt, "--text", "the", "--head", "0.99"], "refused"),
              ("lens ablate --head -1.0", ["lens", "ablate", gpt, "--text", "the", "--head", "-1.0"], "refused"),
              ("lens dla --answer ''", ["lens", "dla", gpt, "--text", "the", "--answer", ""], "refused"),
              ("lens dla --answer outside the vocabulary", ["lens", "dla", gpt, "--text", "the", "--answer", "\u20ac"],
               "refused"),
              ("lens dla --top -1", ["lens", "dla", gpt, "--text", "the", "--answer", "a", "--top", "-1"], "refused"),
              ("lens patch --path 9.0>1.0", [*patch, "--path", "9.0>1.0"], "refused"),
              ("lens patch --path 0.0>0.1 (same layer)", [*patch, "--path", "0.0>0.1"], "refused"),
              ("lens patch --figure .txt", [*patch, "--figure", str(out / "p.txt")], "refused"),
              ("lens probe --seeds 10^9", [*probe, "--seeds", str(10**9)], "refused"),
              ("lens probe --test-fraction inf", [*probe, "--test-fraction", "inf"], "refused"),
              ("lens probe --figure .csv", [*probe, "--figure", str(out / "p.csv")], "refused"),
              ("lens probe on a vit run", ["lens", "probe", vit, "--data", str(files / "probe.jsonl")], "refused"),
              ("lens probe --data a folder", ["lens", "probe", gpt, "--data", str(empty_dir)], "refused"),
              ("lens logit-lens --figure .png", [*lens, "--figure", str(out / "l.png")], "either"),
              ("lens ablate the same head twice", ["lens", "ablate", gpt, "--text", "the", "--head", "0.0", "--head",
                                                   "0.0"], "either")]

    # data
    mg = ["data", "micrographs", "--out", str(out / "m")]
    cases += [(f"data micrographs {' '.join(extra)}", [*mg, *extra], "refused") for extra in (
        ["--size", "31"], ["--size", "513"], ["--n", str(10**20)], ["--test-fraction", "0"],
        ["--test-fraction", "-0.1"], ["--test-fraction", "inf"], ["--n", "2", "--test-fraction", "0.9"],
        ["--task", "DEFECT"], ["--size", "nan"])]
    cases += [("data micrographs --out a user's file", ["data", "micrographs", "--out", str(user), "--n", "4"],
               "refused"),
              ("data micrographs --out a folder of the user's files", ["data", "micrographs", "--out", str(mine),
                                                                       "--n", "4"], "refused"),
              ("data micrographs --out through a file", ["data", "micrographs", "--out", through, "--n", "4"],
               "refused"),
              ("data spoken-words --n 19", ["data", "spoken-words", "--out", str(out / "s"), "--n", "19"], "refused"),
              ("data spoken-words --n 10^20", ["data", "spoken-words", "--out", str(out / "s"), "--n", str(10**20)],
               "refused"),
              ("data spoken-words --out a user's file", ["data", "spoken-words", "--out", str(user)], "refused"),
              ("data spoken-words --out a folder of the user's files", ["data", "spoken-words", "--out", str(mine)],
               "refused"),
              ("data spoken-words --out through a file", ["data", "spoken-words", "--out", through], "refused"),
              ("data with no generator", ["data"], "refused"), ("data micrographs without --out",
                                                                ["data", "micrographs"], "refused"),
              ("data micrographs, 3 images of 32 pixels", [*mg, "--n", "3", "--size", "32", "--test-fraction", "0.4"],
               "works:micrographs=3")]

    # explore (every case is refused: one that served would serve until killed); a free port, so that the run is
    # what is refused
    for what, run in (("a file", str(user)), ("an empty folder", str(empty_dir)),
                      ("a run with a truncated manifest", str(copies["manifest truncated"])),
                      ("a run with changed weights", str(copies["weights changed"])),
                      ("a missing run", str(root / "nope"))):
        cases.append((f"explore {what}{OWN_PROCESS}", ["explore", run, "--port", closed], "refused"))
    cases.append((f"explore a vit run on a port in use{OWN_PROCESS}", ["explore", vit, "--port", HELD_PORT],
                  "refused:in use"))
    cases += [(f"explore --host {host!r}{OWN_PROCESS}", ["explore", gpt, "--host", host], "refused") for host in (
        "", "localhost:8000", "127.0.0.1 ", "127.0.0.1.1", "http://127.0.0.1", "-1", "999.1.1.1")]
    cases += [(f"explore --port {port}", ["explore", gpt, "--port", port], "refused") for port in (
        "8000.0", "65536", str(10**20), "0x1F40", "")]

    # completion and bench
    cases += [(f"completion {' '.join(map(repr, extra))}", ["completion", *extra], "refused") for extra in (
        ["fish"], [""], ["BASH"], ["bash", "extra"], [], ["bash", "--out", "x"])]
    cases += [(f"bench {' '.join(map(repr, extra))}", ["bench", *extra], "refused") for extra in (
        [""], ["../benchmarks/bad_inputs"], ["bad_inputs.py"], ["BAD_INPUTS"], ["_private"], ["--list", "nope"],
        ["--list", "attention", "--quick"])]
    cases += [(f"bench {' '.join(extra)} (the script's own usage error){OWN_PROCESS}", ["bench", *extra], "refused")
              for extra in (["bad_inputs", "--round", "9"], ["bad_inputs", "--jobs", "0"])]  # a child's stderr

    # outputs inside a read-only folder (in a process of their own, where root drops its override: UNPRIVILEGED)
    image, heads = ["inspect", vit, "--image", str(digit)], ["heads", gpt, "--out", str(out / "h")]
    hand = ["experiment", "hand-trace", "--quick"]
    locked = files / "read-only"
    locked.mkdir(exist_ok=True)
    locked.chmod(0o500)
    cases += [(f"{' '.join(argv[:1])} {flag} {UNPRIVILEGED}{OWN_PROCESS}", argv, "refused") for flag, argv in (
        ("--out", [*image, "--out", str(locked / "i.png")]),
        ("--faithfulness", [*image, "--faithfulness", str(locked / "f.json")]),
        ("--out", ["heads", gpt, "--data", str(corpus), "--out", str(locked / "h")]),
        ("--json", [*heads, "--data", str(corpus), "--json", str(locked / "h.json")]),
        ("--out", ["export", gpt, "--out", str(locked / "x")]),
        ("--out", [*hand, "--out", str(locked / "e")]),
        ("--figure", [*lens, "--figure", str(locked / "l.png")]),
        ("--out", ["data", "micrographs", "--out", str(locked / "m"), "--n", "4"]))]

    # resume on folders that are not runs, or whose files are damaged
    cases += [("resume a file", ["resume", str(user)], "refused"),
              ("resume an empty folder", ["resume", str(empty_dir)], "refused"),
              ("resume a folder of the user's files", ["resume", str(mine)], "refused"),
              ("resume an export", ["resume", str(once)], "refused")]
    for what in ("config.yaml truncated", "config.yaml a YAML bomb", "config.yaml a list", "config.yaml a number",
                 "config.yaml 10^4 deep", "config.yaml with a 5000-digit max_iters", "config.yaml with an unknown key",
                 "config.yaml not UTF-8", "config.yaml a folder", "manifest not JSON", "manifest a list"):
        cases.append((f"resume a finished run with its {what}", ["resume", str(copies[what]), "max_iters=12"],
                      "refused"))
    for what in ("config.yaml empty", "config.yaml cut after a line"):  # they read as the defaults' settings
        cases += [(f"resume a finished run with its {what}", ["resume", str(copies[what]), "max_iters=12"],
                   "refused:not a whole run config"),
                  (f"eval a run with its {what}", ["eval", str(copies[what])], "refused:not a whole run config")]
    for what in ("manifest listing a missing file", "no checkpoints", "no manifest"):  # copies of their own: they train
        run = _copy(copies[what], root / "copies3" / f"resume-{what.replace(' ', '-')}")
        cases.append((f"resume a finished run with {what}", ["resume", str(run), "max_iters=12"], "either"))
    cases += [("resume a vit run with an unknown key", ["resume", vit, "max_iters=3", "nonsense=1"], "refused"),
              ("resume a vit run with max_iters below its step", ["resume", vit, "max_iters=1"], "refused")]
    too_long = [name for name, argv, _ in cases if any(len(os.fsencode(a)) >= MAX_ARGUMENT for a in argv)]
    assert not too_long, f"arguments no process can be given: {too_long}"
    return cases
