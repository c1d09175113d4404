"""Round three's cases for the commands that look inside a run or run a study: ``inspect`` (wrong family, outputs
that are a user's file or folder or go through a file, --layer/--head/--samples/--resize, images empty, tiny, huge or
not images, WAV headers that lie), ``heads`` (text that is no text, absurd sizes, outputs) and ``experiment`` (names,
--out holding other work, --resume with nothing to resume, engine options, --data, --address). Used by
tests/bad_inputs_round3.py, which makes the files and runs they name (``c``: its namespace of them); imports no
torch."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests.bad_inputs_round2 import OWN_PROCESS, _write, png, wav


def _wav_header(path: Path, channels: int, rate: int, bits: int, data_bytes: int, fmt: int = 1,
                riff_bytes: int | None = None) -> Path:
    """A WAV whose header says what it is given, with 4,000 bytes of samples whatever it says."""
    block = min(max(1, channels * bits // 8), 0xFFFF)
    path.write_bytes(b"RIFF" + (riff_bytes or min(36 + data_bytes, 2**32 - 1)).to_bytes(4, "little")
                     + b"WAVEfmt " + (16).to_bytes(4, "little") + fmt.to_bytes(2, "little")
                     + channels.to_bytes(2, "little") + rate.to_bytes(4, "little")
                     + min(rate * block, 2**32 - 1).to_bytes(4, "little") + block.to_bytes(2, "little")
                     + bits.to_bytes(2, "little") + b"data" + data_bytes.to_bytes(4, "little") + bytes(4000))
    return path


def inspect_cases(c: SimpleNamespace) -> list[tuple[str, list[str], str]]:
    """inspect: wrong family, outputs, options that do not apply, broken images and sounds."""
    root, out, files, gpt, vit, bert = c.root, c.out, c.files, c.gpt, c.vit, c.bert
    audio, user, mine, empty_dir, through, digit = c.audio, c.user, c.mine, c.empty_dir, c.through, c.digit
    clip = c.clip
    cases: list[tuple[str, list[str], str]] = []

    # inspect: wrong family
    for run, family in ((gpt, "gpt"), (bert, "bert"), (audio, "audio")):
        cases.append((f"inspect --image a valid PNG on a {family} run", ["inspect", run, "--image", str(digit),
                                                                        "--out", str(out / "i.png")], "refused"))
    for run, family in ((gpt, "gpt"), (vit, "vit"), (bert, "bert")):
        cases.append((f"inspect --audio a valid WAV on a {family} run", ["inspect", run, "--audio", clip, "--out",
                                                                        str(out / "a.png")], "refused"))
    cases += [("inspect --text on a vit run", ["inspect", vit, "--text", "the", "--out", str(out / "t")], "refused"),
              ("inspect --text on an audio run", ["inspect", audio, "--text", "the", "--out", str(out / "t")],
               "refused"),
              ("inspect --audio --faithfulness", ["inspect", audio, "--audio", clip, "--faithfulness",
                                                  str(out / "f.json")], "refused")]
    # inspect: --out a user's file, a folder of the user's files, a path through a file, a suffix that is no figure
    image = ["inspect", vit, "--image", str(digit)]
    cases += [("inspect --text --out a user's file", ["inspect", gpt, "--text", "the", "--out", str(user)], "refused"),
              ("inspect --text --out a folder of the user's files", ["inspect", gpt, "--text", "the", "--out",
                                                                     str(mine)], "refused"),
              ("inspect --image --out a user's .txt file", [*image, "--out", str(user)], "refused"),
              ("inspect --image --out a .csv path", [*image, "--out", str(out / "i.csv")], "refused"),
              ("inspect --audio --out a .txt path", ["inspect", audio, "--audio", clip, "--out", str(out / "a.txt")],
               "refused"),
              ("inspect --image --out a folder of the user's files", [*image, "--out", str(mine)], "refused"),
              ("inspect --image --out through a file", [*image, "--out", through + ".png"], "refused"),
              ("inspect --audio --out through a file", ["inspect", audio, "--audio", clip, "--out", through + ".png"],
               "refused"),
              ("inspect --faithfulness through a file", [*image, "--faithfulness", through + ".json"], "refused"),
              ("inspect --faithfulness a folder", [*image, "--faithfulness", str(mine)], "refused"),
              ("inspect --image --out a missing folder", [*image, "--out", str(root / "nope" / "deep" / "i.png")],
               "either"),
              ("inspect --image --out .jpg", [*image, "--out", str(out / "i.jpg")], "works:jpeg"),
              ("inspect --image --out .png", [*image, "--out", str(out / "i.png")], "works:png")]
    # inspect: --layer / --head / --samples / --resize that do not apply or are out of range
    cases += [(f"inspect --image {flag} {v} (a ViT's figure has no single head)", [*image, flag, v, "--out",
                                                                                  str(out / "i.png")], "refused")
              for flag, v in (("--layer", "99"), ("--head", "99"))]
    cases += [("inspect --audio --layer 99", ["inspect", audio, "--audio", clip, "--layer", "99", "--out",
                                              str(out / "a.png")], "refused"),
              ("inspect --text --samples without --faithfulness", ["inspect", gpt, "--text", "the", "--samples", "50",
                                                                   "--out", str(out / "t")], "refused"),
              ("inspect --text --resize (no image)", ["inspect", gpt, "--text", "the", "--resize", "--out",
                                                      str(out / "t")], "refused")]
    cases += [(f"inspect --text {flag} {v}", ["inspect", gpt, "--text", "the", flag, v, "--out", str(out / "t")],
               "refused") for flag, v in (("--layer", "-1"), ("--layer", str(2**70)), ("--head", "x"),
                                          ("--head", "nan"), ("--layer", "1.5"), ("--head", "2"))]
    faith = ["inspect", gpt, "--text", "the", "--faithfulness", str(out / "f.json")]
    cases += [(f"inspect --faithfulness --samples {v}", [*faith, "--samples", v], "refused")
              for v in (str(10**12), str(100_001), "9", "-5", "x", "1e3")]
    cases += [("inspect --text --out a new folder", ["inspect", gpt, "--text", "the", "--out", str(out / "t")],
               "works:text_figures"),
              ("inspect --image --faithfulness --samples 10", [*image, "--faithfulness", str(out / "f.json"),
                                                                "--samples", "10"], "works:faithfulness")]
    # inspect: images empty, tiny, huge, not images; --resize
    sixteen = png(files / "sixteen.png", 16, 16, pixels=b"".join(b"\0" + bytes([i * 10] * 16) for i in range(16)))
    big = png(files / "big.png", 3000, 3000, pixels=b"".join(b"\0" + bytes(3000) for _ in range(3000)))
    images = {"an empty file": _write(files / "empty.png", ""),
              "a 1x1 PNG": png(files / "one.png", 1, 1, pixels=b"\0\0"),
              "a 0x0 PNG header": png(files / "zero.png", 0, 0), "a text file named .png": _write(files / "text.png",
                                                                                                   "not an image\n"),
              "a real 3000x3000 PNG": big, "a 16x16 PNG (without --resize)": sixteen,
              "a PNG cut in half": files / "half.png", "a folder": empty_dir}
    (files / "half.png").write_bytes(digit.read_bytes()[: len(digit.read_bytes()) // 2])
    for what, path in images.items():
        cases.append((f"inspect --image {what}", [*image[:2], "--image", str(path), "--out", str(out / "i.png")],
                      "refused"))
    cases += [(f"inspect --image /dev/zero{OWN_PROCESS}", [*image[:2], "--image", "/dev/zero", "--out",
                                                          str(out / "i.png")], "refused"),
              ("inspect --image a real 3000x3000 PNG --resize", [*image[:2], "--image", str(big), "--resize", "--out",
                                                                 str(out / "i.png")], "works:png"),
              ("inspect --image a 16x16 PNG --resize", [*image[:2], "--image", str(sixteen), "--resize", "--out",
                                                        str(out / "i.png")], "works:png")]
    # inspect --audio: WAV headers that lie
    lies = {"0 channels": dict(channels=0, rate=16_000, bits=16, data_bytes=4000),
            "65535 channels": dict(channels=65535, rate=16_000, bits=16, data_bytes=4000),
            "0 bits a sample": dict(channels=1, rate=16_000, bits=0, data_bytes=4000),
            "7 bits a sample": dict(channels=1, rate=16_000, bits=7, data_bytes=4000),
            "a data chunk of 4 GB": dict(channels=1, rate=16_000, bits=16, data_bytes=2**32 - 2),
            "a RIFF size of 4 GB": dict(channels=1, rate=16_000, bits=16, data_bytes=4000, riff_bytes=2**32 - 1),
            "format tag 0x55 (MP3)": dict(channels=1, rate=16_000, bits=16, data_bytes=4000, fmt=0x55),
            "float samples of 16 bits": dict(channels=1, rate=16_000, bits=16, data_bytes=4000, fmt=3)}
    readable = ("7 bits a sample", "a data chunk of 4 GB", "a RIFF size of 4 GB")  # read as far as the file goes
    for i, (what, header) in enumerate(lies.items()):
        path = _wav_header(files / f"lie-{i}.wav", **header)
        cases.append((f"inspect --audio a WAV with {what}{OWN_PROCESS}", ["inspect", audio, "--audio", str(path),
                                                                          "--out", str(out / "a.png")],
                      "either" if what in readable else "refused"))
    cases += [("inspect --audio an empty file", ["inspect", audio, "--audio", str(_write(files / "empty.wav", "")),
                                                 "--out", str(out / "a.png")], "refused"),
              ("inspect --audio a text file named .wav", ["inspect", audio, "--audio",
                                                          str(_write(files / "text.wav", "hello\n")), "--out",
                                                          str(out / "a.png")], "refused"),
              ("inspect --audio a folder", ["inspect", audio, "--audio", str(empty_dir), "--out", str(out / "a.png")],
               "refused"),
              ("inspect --audio a valid 8 kHz WAV", ["inspect", audio, "--audio",
                                                     str(wav(files / "8k.wav", 8000, 8000)), "--out",
                                                     str(out / "a.png")], "either"),
              ("inspect --audio a valid WAV", ["inspect", audio, "--audio", clip, "--out", str(out / "a.png")],
               "works:png")]

    return cases


def heads_cases(c: SimpleNamespace) -> list[tuple[str, list[str], str]]:
    """heads: data that is no text for the run, absurd sizes, outputs that cannot be written."""
    root, out, files, gpt, vit, audio = c.root, c.out, c.files, c.gpt, c.vit, c.audio
    corpus, user, mine, empty_dir, through = c.corpus, c.user, c.mine, c.empty_dir, c.through
    cases: list[tuple[str, list[str], str]] = []

    # heads
    heads = ["heads", gpt, "--out", str(out / "h")]
    texts = {"a folder": empty_dir, "UTF-16 text": files / "utf16.txt", "characters outside the vocabulary":
             _write(files / "oov.txt", "€" * 200 + "\n"), "3 characters": _write(files / "short.txt", "the"),
             "a built-in name misspelt": Path("repeatedd")}
    (files / "utf16.txt").write_bytes(("the quick brown fox " * 200).encode("utf-16"))
    for what, path in texts.items():
        cases.append((f"heads --data {what}", [*heads, "--data", str(path)], "refused"))
    cases += [(f"heads --data /dev/zero{OWN_PROCESS}", [*heads, "--data", "/dev/zero"], "refused"),
              (f"heads --n-batches {10**6}{OWN_PROCESS}", [*heads, "--data", str(corpus), "--n-batches", str(10**6)],
               "refused")]
    cases += [(f"heads {flag} {v}", [*heads, "--data", str(corpus), flag, v], "refused") for flag, v in (
        ("--batch-size", str(10**9)), ("--n-batches", str(2**70)), ("--batch-size", "nan"), ("--n-batches", "1e3"),
        ("--seed", "x"), ("--seed", str(2**70)))]
    cases += [("heads --json into a missing folder", [*heads, "--data", str(corpus), "--json",
                                                      str(root / "nope" / "x" / "h.json")], "refused"),
              ("heads --json a folder", [*heads, "--data", str(corpus), "--json", str(mine)], "refused"),
              ("heads --json through a file", [*heads, "--data", str(corpus), "--json", through], "refused"),
              ("heads --out a folder of the user's files", ["heads", gpt, "--data", str(corpus), "--out", str(mine)],
               "refused"),
              ("heads --out a user's file", ["heads", gpt, "--data", str(corpus), "--out", str(user)], "refused"),
              ("heads --out through a file", ["heads", gpt, "--data", str(corpus), "--out", through], "refused"),
              ("heads on a vit run", ["heads", vit, "--data", str(corpus), "--out", str(out / "h")], "refused"),
              ("heads on an audio run", ["heads", audio, "--data", str(corpus), "--out", str(out / "h")], "refused"),
              ("heads --json, one batch of two", [*heads, "--data", str(corpus), "--n-batches", "1", "--batch-size",
                                                  "2", "--json", str(out / "h.json")], "works:heads_json=4")]

    return cases


def experiment_cases(c: SimpleNamespace) -> list[tuple[str, list[str], str]]:
    """experiment: names, --out holding other work, --resume, engine options, --data, --address."""
    root, out, files, corpus, user, empty_dir = c.root, c.out, c.files, c.corpus, c.user, c.empty_dir
    through, closed = c.through, c.closed
    cases: list[tuple[str, list[str], str]] = []

    # experiment
    eout = str(out / "e")
    for name in ("Hand-Trace", "hand_trace", "hand-trace.py", " hand-trace", "hand-trace/", ""):
        cases.append((f"experiment {name!r}", ["experiment", name], "refused"))
    foreign = files / "grokking-results"
    _write(foreign / "results.json", json.dumps({"experiment": "grokking", "quick": True}))
    full = files / "full-run"
    _write(full / "results.json", json.dumps({"experiment": "hand-trace", "quick": False}))
    full_partial = files / "full-partial"
    _write(full_partial / "partial.json", json.dumps({"experiment": "hand-trace", "quick": False, "parts": {}}))
    broken = files / "broken-results"
    _write(broken / "results.json", "{not json")
    runs_file = files / "runs-inside"
    _write(runs_file / ".runs" / "a" / "one.json", "{}")
    hand = ["experiment", "hand-trace", "--quick"]
    cases += [("experiment --out holding another experiment's results", [*hand, "--out", str(foreign)],
               "refused:another experiment"),
              ("experiment --quick over a full run", [*hand, "--out", str(full)], "refused:full run"),
              ("experiment --quick --resume over a full run", [*hand, "--resume", "--out", str(full_partial)],
               "refused:full run"),
              ("experiment --out holding an unreadable results.json", [*hand, "--out", str(broken)], "refused"),
              ("experiment --out holding kept single runs", [*hand, "--out", str(runs_file)], "refused"),
              ("experiment --out a user's file", [*hand, "--out", str(user)], "refused"),
              ("experiment --out through a file", [*hand, "--out", through], "refused"),
              ("experiment --resume into a new folder", [*hand, "--resume", "--out", eout], "refused:no unfinished"),
              ("experiment --resume into an empty folder", [*hand, "--resume", "--out", str(empty_dir)],
               "refused:no unfinished")]
    grok = ["experiment", "grokking", "--quick", "--out", eout]
    cases += [(f"experiment {' '.join(extra)}", [*grok, *extra], "refused") for extra in (
        ["--workers", "-1"], ["--workers", str(10**6)], ["--workers", "x"], ["--cpus-per-run", "0"],
        ["--cpus-per-run", "64"], ["--gpus-per-run", "0.5"], ["--device", "cuda", "--gpus-per-run", "nan"],
        ["--device", "cuda", "--gpus-per-run", "-1"], ["--device", "cuda", "--gpus-per-run", "inf"],
        ["--device", "tpu"], ["--in-process", "--workers", "2"], ["--in-process", "--cpus-per-run", "2"],
        ["--address", "nohost"], ["--address", "127.0.0.1:"], ["--address", ":6379"], ["--address", "127.0.0.1:99999"],
        ["--address", "http://127.0.0.1:6379"], ["--address", "127.0.0.1:6379 "], ["--address", "[::1]"],
        ["--address", "127.0.0.1:x"], ["--in-process", "--address", "127.0.0.1:6379"])]
    cases += [(f"experiment grokking --address 127.0.0.1:(closed){OWN_PROCESS}",
               [*grok, "--address", f"127.0.0.1:{closed}"], "refused:nothing answers"),
              ("experiment hand-trace --address 127.0.0.1:(closed) (it runs nothing on Ray)",
               [*hand, "--out", eout, "--address", f"127.0.0.1:{closed}"], "refused"),
              ("experiment hand-trace --workers 2 (it runs nothing on Ray)", [*hand, "--out", eout, "--workers", "2"],
               "refused"),
              ("experiment hand-trace --device cuda", [*hand, "--out", eout, "--device", "cuda"], "refused"),
              ("experiment scaling --data missing", ["experiment", "scaling", "--quick", "--out", eout, "--data",
                                                     str(root / "nope.txt")], "refused"),
              ("experiment scaling --data a folder", ["experiment", "scaling", "--quick", "--out", eout, "--data",
                                                      str(empty_dir)], "refused"),
              ("experiment hand-trace --data (it makes its own)", [*hand, "--out", eout, "--data", str(corpus)],
               "refused"),
              ("experiment --list --quick", ["experiment", "--list", "--quick"], "refused"),
              ("experiment --list --out", ["experiment", "--list", "--out", eout], "refused"),
              ("experiment nope --list", ["experiment", "nope", "--list"], "refused")]

    return cases
