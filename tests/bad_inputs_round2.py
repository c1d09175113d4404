"""Round two of the bad inputs (the attack on the commands around ``train``): YAML bombs and deep nesting, huge
integers, audio and image headers that promise gigabytes, absurd sizes and sampling numbers, malformed CSV and
labels, output paths the file system refuses, a held port, broken Hugging Face folders, bad resumes. Shared by
tests/cli/test_bad_inputs_round2.py (a seeded sample, in-process) and ``benchmarks/bad_inputs.py --round 2``
(all of them, each in its own process, timed and measured).

``build_cases(root)`` makes the files under ``root`` (tiny GPT, ViT, BERT and audio runs, transformers folders,
the broken inputs) and returns the cases: (name, argv, expect). ``expect`` is

    "refused"            exit 2, one line "attnlab: error: ...", no traceback, nothing left under root/runs
    "refused:TEXT"       the same, and the line holds TEXT
    "either"             refused as above, or exit 0 without a traceback (both keep the promise)
    "stopped"            exit 2 and one line, part way through: the run folder may stay (it can be resumed)
    "works:CHECK"        exit 0, and ``check(expect, argv)`` finds nothing wrong with what it wrote

``HELD_PORT`` in an argv stands for a port the runner holds open while the case runs. A name ending in
``OWN_PROCESS`` is a case that could block, take gigabytes or set a process limit if its guard broke: it runs
only in a process of its own (the benchmark); ``FSIZE_LIMITS`` gives the RLIMIT_FSIZE of the cases run under one,
and a name holding ``UNPRIVILEGED`` runs without root's permission override.
This module imports no torch at its top (the benchmark's parent process stays small).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import shutil
import struct
import zlib
from pathlib import Path

from tests.bad_inputs_hf import OWN_PROCESS, hf_cases

HELD_PORT = "HELD_PORT"
# a case whose name holds this writes inside a read-only folder: run where permissions bind it, root too
# (``tests.helpers.as_unprivileged``); only in a process of its own
UNPRIVILEGED = "inside a read-only folder"
FSIZE_LIMITS = {f"ulimit -f: {what}{OWN_PROCESS}": size for what, size in (
    ("train", 64 * 1024), ("predict --out", 1024), ("import-hf --out", 16 * 1024), ("export --out", 16 * 1024))}
ROWS = 121  # the rows of every predict input below
NOT_UTF8 = os.fsdecode(b"caf\xe9-\xff")  # a file name that is not valid UTF-8 (surrogate escapes in argv)
LONG = "x" * 300  # a name component over NAME_MAX (255 bytes)


# -- what a "works" case must have written ------------------------------------------------------------------
def _value(argv: list[str], key: str) -> str:
    if key.startswith("--"):
        return argv[argv.index(key) + 1]
    return next(a.split("=", 1)[1] for a in reversed(argv) if a.startswith(f"{key}="))


def _predicted_rows(argv: list[str], n: str) -> str | None:
    out = Path(_value(argv, "--out"))
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    bom = [r for r in rows if any("\ufeff" in str(v) for v in r.values())]
    return (f"{len(rows)} rows predicted, not {n}" if len(rows) != int(n) else
            f"a byte-order mark in {len(bom)} predicted rows" if bom else None)


def _bom_free_vocabulary(argv: list[str], _: str) -> str | None:
    text = (Path(_value(argv, "out_dir")) / _value(argv, "name") / "tokenizer.json").read_text(encoding="utf-8")
    return "the byte-order mark is a token of tokenizer.json" if "\ufeff" in text or "\\ufeff" in text else None


def _finite_metrics(argv: list[str], _: str) -> str | None:
    text = (Path(argv[1]) / "metrics.jsonl").read_text(encoding="utf-8")
    return "metrics.jsonl still holds a non-finite value" if "NaN" in text or "Infinity" in text else None


def _trained(argv: list[str], _: str) -> str | None:
    run = Path(_value(argv, "out_dir")) / _value(argv, "name")
    return None if (run / "manifest.json").is_file() else f"no finished run in {run}"


CHECKS = {"rows": _predicted_rows, "bom_free_vocabulary": _bom_free_vocabulary, "finite_metrics": _finite_metrics,
          "trained": _trained}


def check(expect: str, argv: list[str]) -> str | None:
    """What is wrong with the output of a "works:CHECK[=ARG]" case that exited 0 (None: nothing)."""
    name, _, arg = expect.removeprefix("works:").partition("=")
    try:
        return CHECKS[name](argv, arg)
    except (OSError, ValueError, StopIteration) as e:
        return f"{name}: {type(e).__name__}: {e}"


# -- files ----------------------------------------------------------------------------------------------------
def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(path: Path, width: int, height: int, colour: int = 0, pixels: bytes | None = None) -> Path:
    """A PNG of 8-bit grey (colour 0) or RGB (colour 2) whose header says width x height; ``pixels`` the raw rows
    (default: a few zero bytes, so a huge header comes with a tiny file)."""
    data = pixels if pixels is not None else b"\0" * 64
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0))
                     + _chunk(b"IDAT", zlib.compress(data, 9)) + _chunk(b"IEND", b""))
    return path


def wav(path: Path, rate: int, frames: int, seed: int = 0) -> Path:
    """16-bit mono PCM at ``rate`` Hz (as its header says), ``frames`` samples of noise."""
    data = random.Random(seed).randbytes(2 * frames)
    path.write_bytes(b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
                     + struct.pack("<IHHIIHH", 16, 1, 1, rate, min(2 * rate, 2**32 - 1), 2, 16) + b"data"
                     + struct.pack("<I", len(data)) + data)
    return path


def _texts(n: int = ROWS) -> list[str]:
    rng = random.Random(3)
    words = ["the", "quick", "brown", "fox", "over", "a", "lazy", "dog"]
    return [" ".join(rng.choice(words) for _ in range(4)) for _ in range(n)]


def _write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding, "surrogateescape"))
    return path


def _runs(root: Path) -> dict[str, Path]:
    """The tiny trained runs the cases point at: a char GPT, a ViT on 8x8 digits, a BERT (MLM), an audio encoder."""
    from attnlab.cli import main
    from tests.helpers import train_tiny_run, write_corpus
    from tests.kill_trials import PRETRAIN

    (root / "trained").mkdir(parents=True, exist_ok=True)
    runs = {"gpt": train_tiny_run(root / "trained")}
    tiny = ["max_iters=2", "eval_interval=2", "eval_iters=1", "progress=false", "warmup_iters=1", "sample_tokens=0"]
    small = ["model.n_layer=1", "model.n_head=2", "model.d_model=32"]
    assert main(["train", "vit-digits", f"out_dir={root / 'trained'}", "name=vit", "batch_size=16", *tiny,
                 *small]) == 0
    corpus = write_corpus(root / "bert-corpus.txt", n_chars=4000)
    bert = [f"{k}={v}" for k, v in {**PRETRAIN, "data": corpus, "out_dir": root / "trained", "name": "bert"}.items()]
    assert main(["train", "bert-mlm", *bert]) == 0
    audio = root / "clips"
    for word in ("yes", "no"):
        (audio / word).mkdir(parents=True, exist_ok=True)
        for i in range(4):
            wav(audio / word / f"{i}.wav", 16_000, 16_000, seed=i + 10 * len(word))
    assert main(["train", "speech-words", f"data={audio}", f"out_dir={root / 'trained'}", "name=audio", "batch_size=4",
                 *tiny, *small, "model.d_ff=64"]) == 0
    return {**runs, "vit": root / "trained" / "vit", "bert": root / "trained" / "bert", "audio": root / "trained" /
            "audio", "clips": audio}


def _copy(run: Path, dest: Path) -> Path:
    """A run of its own for a case that may change it (resume, a broken manifest)."""
    shutil.rmtree(dest, ignore_errors=True)
    return Path(shutil.copytree(run, dest))


# -- Hugging Face folders -------------------------------------------------------------------------------------
def build_cases(root: Path) -> list[tuple[str, list[str], str]]:
    """Every case of round two, deterministic order. Outputs are under ``root / "runs"`` (the benchmark gives each
    case a folder of its own there and checks that a refused case left nothing in it)."""
    from tests.helpers import tiny_overrides, write_corpus

    root.mkdir(parents=True, exist_ok=True)
    r, out = _runs(root), root / "runs"
    corpus, gpt, files = write_corpus(root / "corpus.txt"), str(r["gpt"]), root / "files"
    base = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, out, name="bad")]
    light = [f"out_dir={out}", "name=bad", "max_iters=1", f"data={corpus}"]
    quick = ["max_iters=2", "eval_interval=2", "eval_iters=1", "progress=false", "warmup_iters=1", "sample_tokens=0"]
    cases: list[tuple[str, list[str], str]] = []

    # resume: what cannot change on resume, and a NaN already logged
    for kv in ("tokenizer=bpe", "tokenizer=wordpiece", "bpe_vocab_size=300", "block_size=32", "n_layer=3",
               "n_head=4", "d_model=64", "model.family=bert", "task=mlm", f"data={root / 'bert-corpus.txt'}",
               "model.positions=learned"):
        run = _copy(r["gpt"], root / "copies" / f"resume-{len(cases):02d}")
        what = "data=another corpus" if kv.startswith("data=") else kv
        cases.append((f"resume {what} (fixed once trained)", ["resume", str(run), kv], "refused"))
    run = _copy(r["gpt"], root / "copies" / "nan-metrics")
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 10, "train_loss": NaN, "lr": Infinity}\n')
    cases.append(("resume a run with NaN in metrics.jsonl", ["resume", str(run), "max_iters=12"],
                  "works:finite_metrics"))

    # YAML presets and overrides
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    presets = {"billion laughs (~400 bytes)" + OWN_PROCESS: laughs,
               "billion laughs under model:" + OWN_PROCESS: "model:\n  n_layer: 2\n  " + laughs.replace("\n", "\n  "),
               "a recursive alias": "max_iters: &a [*a]\n",
               "an alias of a mapping as the model": "x: &m {n_layer: 2}\nmodel: *m\n",
               "flow lists 10^4 deep": "max_iters: " + "[" * 10_000 + "]" * 10_000 + "\n",
               "flow mappings 10^4 deep": "max_iters: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n",
               "block mappings 500 deep": "".join("  " * i + f"k{i}:\n" for i in range(500)) + "  " * 500 + "1\n",
               "a 5000-digit integer": "max_iters: " + "9" * 5000 + "\n",
               "a 5000-digit float": "lr: 0." + "1" * 5000 + "e" + "9" * 5000 + "\n",
               "a 1 MB unknown key": "k" * 2**20 + ": 1\n", "a 1 MB value": "tokenizer: " + "c" * 2**20 + "\n"}
    for i, (name, text) in enumerate(presets.items()):
        cases.append((f"train preset: {name}", ["train", str(_write(files / f"preset{i}.yaml", text)), *light],
                      "refused"))
    for kv in ("max_iters=" + "9" * 5000, "seed=" + "9" * 5000, "lr=" + "9" * 5000, "n_layer=" + "1" * 5000):
        cases.append((f"train {kv[:12]}... (5000 digits)", [*base, kv], "refused"))
    deep = "[" * 10**5 + "]" * 10**5
    rows = {"deep.jsonl": '{"text": "a", "label": ' + deep + "}\n", "deep-text.jsonl": '{"text": ' + deep + "}\n",
            "big-label.jsonl": "".join(f'{{"text": "t{i}", "label": {"9" * 5000}}}\n' for i in range(20)),
            "big-text.jsonl": '{"text": "a", "extra": ' + "9" * 5000 + "}\n"}
    classify = ["train", "bert-solubility", "task=classify", "tokenizer=wordpiece", "bpe_vocab_size=200",
                "batch_size=8", "model.block_size=32", "model.n_layer=1", "model.n_head=2", "model.d_model=32",
                *quick, f"out_dir={out}", "name=bad"]
    for name, text in rows.items():
        path = str(_write(files / name, text))
        cases += [(f"train classify data={name}", [*classify, f"data={path}"], "refused"),
                  (f"finetune data={name}", ["finetune", str(r["bert"]), f"data={path}", *quick, f"out_dir={out}"],
                   "refused"),
                  (f"predict --data {name}", ["predict", gpt, "--data", path, "--out", str(out / "p.csv")], "refused")]
    cases.append(("train regress data=big-label.jsonl", ["train", "bert-solubility", *classify[3:],
                                                         f"data={files / 'big-label.jsonl'}"], "refused"))
    for fmt in ('"x"', "1e999", "-1", "[1]", "{}", "null", str(2**70), "1.5"):
        run = _copy(r["gpt"], root / "copies" / f"manifest-{len(cases):03d}")
        text = (run / "manifest.json").read_text()
        (run / "manifest.json").write_text(text.replace('"format": 1', f'"format": {fmt}', 1))
        cases.append((f"sample a run whose manifest format is {fmt}", ["sample", str(run), "--max-new-tokens", "2"],
                      "refused"))
    run = _copy(r["gpt"], root / "copies" / "config-digits")
    config = (run / "config.json").read_text()
    (run / "config.json").write_text(config.replace('"n_layer": 2', '"n_layer": ' + "2" * 5000))
    manifest = json.loads((run / "manifest.json").read_text())  # the manifest agrees: the number itself is read
    manifest["files"]["config.json"] = hashlib.sha256((run / "config.json").read_bytes()).hexdigest()
    (run / "manifest.json").write_text(json.dumps(manifest))
    cases += [("sample a run whose config.json has a 5000-digit integer", ["sample", str(run)], "refused"),
              ("eval a run whose config.json has a 5000-digit integer", ["eval", str(run)], "refused")]

    # audio: headers that promise gigabytes, or no header at all
    good = sorted((r["clips"] / "yes").glob("*.wav"))[0]
    bad_audio = {"1 Hz": lambda p: wav(p, 1, 200_000), "10^9 Hz": lambda p: wav(p, 10**9, 16_000),
                 "0 Hz": lambda p: wav(p, 0, 16_000), "an hour at 1 kHz": lambda p: wav(p, 1000, 3_600_000),
                 "a truncated header": lambda p: p.write_bytes(good.read_bytes()[:30])}
    for i, (name, make) in enumerate(bad_audio.items()):
        folder = Path(shutil.copytree(r["clips"], files / f"clips-{i}"))
        make(folder / "no" / "bad.wav")
        clip = str(folder / "no" / "bad.wav")
        for preset in ("speech-words", "lstm-words"):
            cases.append((f"train {preset} on a folder with a WAV of {name}{OWN_PROCESS}",
                          ["train", preset, f"data={folder}", "batch_size=4", *quick, f"out_dir={out}", "name=bad"],
                          "refused"))
        cases += [(f"predict an audio run on a WAV of {name}{OWN_PROCESS}",
                   ["predict", str(r["audio"]), "--data", clip, "--out", str(out / "p.csv")], "refused"),
                  (f"inspect --audio a WAV of {name}{OWN_PROCESS}",
                   ["inspect", str(r["audio"]), "--audio", clip, "--out", str(out / "a.png")], "refused")]

    # images: decompression-bomb headers in tiny files
    digit = png(files / "digit.png", 8, 8, pixels=b"".join(b"\0" + bytes([i * 30] * 8) for i in range(8)))
    for size, colour in ((100_000, 0), (20_000, 2), (12_000, 0)):
        folder = files / f"images-{size}"
        for label in ("0", "1"):
            (folder / label).mkdir(parents=True, exist_ok=True)
            for i in range(3):
                shutil.copy(digit, folder / label / f"{i}.png")
        bomb = str(png(folder / "1" / "bomb.png", size, size, colour))
        what = f"a {size}x{size} PNG header{OWN_PROCESS}"
        cases += [(f"train vit-digits on a folder with {what}", ["train", "vit-digits", f"data={folder}",
                                                                *quick, f"out_dir={out}", "name=bad"], "refused"),
                  (f"train cnn-digits on a folder with {what}", ["train", "cnn-digits", f"data={folder}",
                                                                "model.cnn_width=8", *quick, f"out_dir={out}",
                                                                "name=bad"], "refused"),
                  (f"predict a file: {what}", ["predict", str(r["vit"]), "--data", bomb, "--out", str(out / "p.csv")],
                   "refused"),
                  (f"predict a folder with {what}", ["predict", str(r["vit"]), "--data", str(folder), "--out",
                                                     str(out / "p.csv")], "refused"),
                  (f"inspect --image {what}", ["inspect", str(r["vit"]), "--image", bomb, "--out", str(out / "i.png")],
                   "refused")]

    # sizes and sampling numbers
    cases += [(f"train {kv}{OWN_PROCESS}", [*base, kv], "refused") for kv in (
        f"eval_iters={10**9}", f"eval_iters={10**7}", f"sample_tokens={10**12}", f"sample_tokens={10**8}")]
    cases += [(f"sample --max-new-tokens {n}{OWN_PROCESS}", ["sample", gpt, "--max-new-tokens", str(n)], "refused")
              for n in (10**12, 10**9)]
    cases.append((f"eval --eval-iters {10**9}{OWN_PROCESS}", ["eval", gpt, "--eval-iters", str(10**9)], "refused"))
    sample = ["sample", gpt, "--max-new-tokens", "2"]
    # a tiny temperature or nucleus is greedy decoding: refused in one line, or sampled exactly, never a traceback
    cases += [(f"sample {' '.join(extra)}", [*sample, *extra], "either") for extra in (
        ["--temperature", "1e-300"], ["--temperature", "5e-324"], ["--temperature", "1e-45"], ["--top-p", "1e-300"],
        ["--top-p", "5e-324"], ["--top-p", "1e-45"], ["--repetition-penalty", "1e300"],
        ["--repetition-penalty", "1e-300"], ["--num-beams", "2", "--temperature", "1e-300"])]
    cases.append(("sample --num-beams 2 --num-samples 3 (beams give one sequence)",
                  [*sample, "--num-beams", "2", "--num-samples", "3"], "refused"))

    # predict inputs: CSV quoting, byte-order marks, ragged rows
    texts = _texts()
    table = "text,id\n" + "".join(f"{t},{i}\n" for i, t in enumerate(texts))
    lines = table.splitlines(keepends=True)
    predict_inputs = {
        "unterminated.csv": ("".join(lines[:61]) + '"' + "".join(lines[61:]), "refused::62:"),
        "bom.csv": ("\ufeff" + table, f"works:rows={ROWS}"),
        "bom.tsv": ("\ufeff" + table.replace(",", "\t"), f"works:rows={ROWS}"),
        "bom.jsonl": ("\ufeff" + "".join(json.dumps({"text": t}) + "\n" for t in texts), f"works:rows={ROWS}"),
        "bom.txt": ("\ufeff" + "\n".join(texts) + "\n", f"works:rows={ROWS}"),
        "crlf.csv": (table.replace("\n", "\r\n"), f"works:rows={ROWS}"),
        "ragged-more.csv": ("".join(lines[:40]) + "a,b,c\n" + "".join(lines[40:]), "refused::41:"),
        "ragged-fewer.csv": ("".join(lines[:40]) + "lonely\n" + "".join(lines[40:]), "refused::41:"),
        "nul.csv": ("".join(lines[:10]) + "a\0b,1\n" + "".join(lines[10:]), "refused"),
        "header-only.csv": ("text,id\n", "refused"),
        "no-text-column.csv": (table.replace("text,id", "words,id", 1), "refused")}
    for name, (text, expect) in predict_inputs.items():
        path = str(_write(files / name, text))
        cases.append((f"predict --data {name}", ["predict", gpt, "--data", path, "--out", str(out / "p.csv")], expect))
    path = _write(files / "utf16.csv", "\ufeff" + table, "utf-16-le")
    cases.append(("predict --data utf16.csv", ["predict", gpt, "--data", str(path), "--out", str(out / "p.csv")],
                  "refused"))

    # labels that differ only by case or space, or are empty
    for name, odd in (("trailing space", "pos "), ("leading space", " pos"), ("upper case", "POS"),
                      ("title case", "Pos"), ("empty", ""), ("only spaces", "   ")):
        labels = ["pos" if i % 2 else "neg" for i in range(len(texts))]
        labels[7] = labels[9] = odd
        path = files / f"labels-{name.replace(' ', '-')}.csv"
        with open(path, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([["text", "label"], *zip(texts, labels)])
        cases += [(f"train classify: a label {odd!r} ({name})", [*classify, f"data={path}"], "refused"),
                  (f"finetune: a label {odd!r} ({name})", ["finetune", str(r["bert"]), f"data={path}", *quick,
                                                           f"out_dir={out}"], "refused")]
    path = _write(files / "labels-case.jsonl", "".join(json.dumps({"text": t, "label": ("POS", "pos", "pos ")[i % 3]})
                                                        + "\n" for i, t in enumerate(texts)))
    cases.append(("train classify: labels pos / POS / 'pos ' in JSONL", [*classify, f"data={path}"], "refused"))

    # output paths the file system refuses
    without = [a for a in base if not a.startswith(("out_dir=", "name="))]
    for what, folder in (("a 300-character name", str(out / LONG)), ("a name that is not UTF-8", str(out / NOT_UTF8)),
                         ("a path through a symlink loop", str(root / "loop" / "x"))):
        cases += [(f"train out_dir: {what}", [*without, f"out_dir={folder}", "name=bad"], "refused"),
                  (f"predict --out: {what}", ["predict", gpt, "--data", str(corpus), "--out", folder + ".csv"],
                   "refused"),
                  (f"export --out: {what}", ["export", gpt, "--out", folder], "refused"),
                  (f"import-hf --out: {what}", ["import-hf", str(root / "hf-sources" / "bert"), "--out", folder],
                   "refused"),
                  (f"inspect --out: {what}", ["inspect", gpt, "--text", "the", "--out", folder], "refused"),
                  (f"data micrographs --out: {what}", ["data", "micrographs", "--out", folder, "--n", "4"], "refused")]
    cases += [(f"train name: {what}", [*without, f"out_dir={out}", f"name={name}"], "refused")
              for what, name in (("300 characters", LONG), ("not UTF-8", NOT_UTF8))]
    if not (root / "loop").is_symlink():
        (root / "loop").symlink_to(root / "loop")
    locked = root / "read-only"  # run unprivileged (UNPRIVILEGED): root writes into it all the same
    locked.mkdir(exist_ok=True)
    locked.chmod(0o500)
    cases += [(f"train out_dir: {UNPRIVILEGED}{OWN_PROCESS}", [*without, f"out_dir={locked / 'x'}", "name=bad"],
               "refused"),
              (f"predict --out: {UNPRIVILEGED}{OWN_PROCESS}", ["predict", gpt, "--data", str(corpus), "--out",
                                                               str(locked / "p.csv")], "refused")]
    cases += [(f"ulimit -f: train{OWN_PROCESS}", [*base, "checkpoint_interval=5"], "stopped"),
              (f"ulimit -f: predict --out{OWN_PROCESS}", ["predict", gpt, "--data", str(files / "bom.csv"), "--out",
                                                          str(out / "p.csv")], "refused"),
              (f"ulimit -f: export --out{OWN_PROCESS}", ["export", gpt, "--out", str(out / "exported")], "refused")]

    # the explorer: a port already held, an address that is not this machine's
    cases += [("explore --port (held)", ["explore", gpt, "--port", HELD_PORT], "refused:in use"),
              ("explore --host 127.0.0.1 --port (held)", ["explore", gpt, "--host", "127.0.0.1", "--port", HELD_PORT],
               "refused:in use"),
              ("explore --host 192.0.2.1 (not this machine)", ["explore", gpt, "--host", "192.0.2.1"], "refused"),
              ("explore --host 256.1.1.1", ["explore", gpt, "--host", "256.1.1.1"], "refused")]

    # a byte-order mark at the start of a corpus or a preset is not text
    bom = _write(files / "bom-corpus.txt", "\ufeff" + corpus.read_text(encoding="utf-8"))
    with_bom = [*[a for a in base if not a.startswith(("data=", "max_iters=", "eval_interval="))], f"data={bom}",
                "max_iters=2", "eval_interval=2"]
    cases += [("train a corpus with a BOM (char)", with_bom, "works:bom_free_vocabulary"),
              ("train a corpus with a BOM (bpe)", [*with_bom, "tokenizer=bpe", "bpe_vocab_size=300"],
               "works:bom_free_vocabulary"),
              ("train a preset with a BOM", ["train", str(_write(files / "bom.yaml", "\ufeffmax_iters: 2\n")),
                                             *tiny_overrides(corpus, out, name="bad", max_iters=2, eval_interval=2)],
               "works:trained")]
    return cases + hf_cases(root, out)
