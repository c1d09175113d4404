"""Bad inputs across every subcommand (issue 21): each must end in one line on stderr, exit status 2, no
traceback, no hang, no partial run folder. Shared by tests/cli/test_bad_inputs.py (a seeded sample,
in-process) and benchmarks/bad_inputs.py (all of them, each in its own process, timed and measured).

``build_cases(root)`` makes the files the cases need under ``root`` (a tiny trained GPT run, a corpus, a
FIFO, binary / Latin-1 / empty files, broken images, malformed label files, Hugging Face configs) and
returns the cases: (name, argv). ``RUN`` in an argv stands for the run folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers import tiny_overrides, train_tiny_run, write_corpus

NON_FINITE = ["nan", "inf", "-inf", "1e999", "abc", "[1, 2]"]
BAD_INTS = ["0", "-1", "1.5", "x", "nan", str(2**70)]
FLOAT_KEYS = ["lr", "min_lr", "weight_decay", "grad_clip", "dropout", "val_fraction", "model.norm_eps",
              "model.rope_theta", "beta1", "beta2"]
INT_KEYS = ["max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval",
            "keep_checkpoints", "n_layer", "n_head", "d_model", "block_size", "bpe_vocab_size"]


def _files(root: Path) -> dict[str, Path]:
    (root / "trained").mkdir(parents=True, exist_ok=True)
    f = {"corpus": write_corpus(root / "corpus.txt"), "run": train_tiny_run(root / "trained")}
    f["binary"] = root / "binary.txt"
    f["binary"].write_bytes(bytes(range(256)) * 40)
    f["latin1"] = root / "latin1.txt"
    f["latin1"].write_bytes("caf\xe9 cr\xe8me ".encode("latin-1") * 200)
    f["empty"] = root / "empty.txt"
    f["empty"].write_text("")
    f["fifo"] = root / "fifo"
    if not f["fifo"].exists():
        os.mkfifo(f["fifo"])
    f["broken_png"] = root / "broken.png"
    f["broken_png"].write_bytes(b"\x89PNG not really")
    f["bad_jsonl"] = root / "bad.jsonl"
    f["bad_jsonl"].write_text('{"words": ["a"], "labels": ["x", "y"]}\n')
    f["one_class"] = root / "one.jsonl"
    f["one_class"].write_text('{"words": ["a", "b"], "labels": ["x", "x"]}\n')
    f["occupied"] = root / "occupied"
    f["occupied"].mkdir(exist_ok=True)
    (f["occupied"] / "keep.txt").write_text("mine")
    f["hf_huge"] = root / "hf-huge"
    f["hf_huge"].mkdir(exist_ok=True)
    (f["hf_huge"] / "config.json").write_text(json.dumps({
        "model_type": "bert", "num_hidden_layers": 100_000_000, "hidden_size": 768, "num_attention_heads": 12,
        "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}))
    (f["hf_huge"] / "model.safetensors").write_bytes(b"")
    f["hf_bad_json"] = root / "hf-bad"
    f["hf_bad_json"].mkdir(exist_ok=True)
    (f["hf_bad_json"] / "config.json").write_text("{not json")
    f["not_a_run"] = root / "not-a-run"
    f["not_a_run"].mkdir(exist_ok=True)
    return f


def build_cases(root: Path) -> list[tuple[str, list[str]]]:
    """Every bad input, deterministic order."""
    f = _files(root)
    out = root / "runs"
    base = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(f["corpus"], out, name="bad")]
    cases: list[tuple[str, list[str]]] = []
    for key in FLOAT_KEYS:
        cases += [(f"train {key}={v}", [*base, f"{key}={v}"]) for v in NON_FINITE]
    for key in INT_KEYS:
        cases += [(f"train {key}={v}", [*base, f"{key}={v}"]) for v in BAD_INTS]
    for key in ("warmup_iters", "sample_tokens", "threads", "checkpoint_interval", "max_nonfinite_steps",
                "profile_steps", "lr_decay_iters"):
        cases += [(f"train {key}={v}", [*base, f"{key}={v}"]) for v in ("-1", "x", "1.5", str(2**70))]
    cases += [(f"train seed={v}", [*base, f"seed={v}"]) for v in ("x", "1.5", str(2**70), str(-(2**64)))]
    cases += [("train threads above the CPU cores", [*base, "threads=100000"])]
    cases += [("train lr_decay_iters=0 (the rate would sit at min_lr)", [*base, "lr_decay_iters=0"])]
    cases += [("train min_len=1 (a seq2seq option, unused by a language model)", [*base, "min_len=1"]),
              ("train mlm.mask_prob=0.3 on a language model", [*base, "mlm.mask_prob=0.3"]),
              ("train images.shift=3 on a language model", [*base, "images.shift=3"])]
    for key, values in (("lr", ["-1", "0"]), ("min_lr", ["-1"]), ("val_fraction", ["0", "1", "-0.5"]),
                        ("grad_clip", ["-1"]), ("model.norm_eps", ["0", "-1"]), ("model.rope_theta", ["0", "-5"]),
                        ("dropout", ["-0.1", "1.5"]), ("beta1", ["-0.1", "1.5"]), ("beta2", ["1", "2"])):
        cases += [(f"train {key}={v}", [*base, f"{key}={v}"]) for v in values]
    light = [f"out_dir={out}", "name=bad", "max_iters=1"]  # no model keys: the preset's own must fail
    for i, text in enumerate(["max_iters: [", "- a\n- b\n", "model: 3\n", "model:\n  n_layer: x\n",
                              "\tmax_iters: 1\n", "max_iters: 1\nnonsense_key: 2\n", "model:\n  family: cnnn\n",
                              "images:\n  shift: -1\n", "data: 7\n", "tokenizer: bytes\n"]):
        preset = root / f"preset{i}.yaml"
        preset.write_text(text)
        data = [] if text.startswith("data") else [f"data={f['corpus']}"]
        cases.append((f"train preset {text.strip()[:20]!r}", ["train", str(preset), *light, *data]))
    cases += [(f"train vit-digits {kv} (a ViT reads no text)", ["train", "vit-digits", *light, kv])
              for kv in ("tokenizer=bpe", "bpe_vocab_size=500")]
    cases += [(f"train preset {name}", ["train", str(f[name]), *light, f"data={f['corpus']}"])
              for name in ("fifo", "binary", "latin1")]
    cases.append(("train preset missing", ["train", str(root / "nope.yaml")]))
    cases += [(f"train n_layer=100000 d_model={d}", [*base, "n_layer=100000", f"d_model={d}"]) for d in (512, 2048)]
    for name in ("fifo", "binary", "latin1", "empty"):
        cases.append((f"train data={name}", [*[a for a in base if not a.startswith("data=")], f"data={f[name]}"]))
    cases += [("train data=/dev/zero", [*[a for a in base if not a.startswith("data=")], "data=/dev/zero"]),
              ("train data=missing", [*[a for a in base if not a.startswith("data=")], "data=/nonexistent/x.txt"]),
              ("train unknown key", [*base, "lerning_rate=1e-3"]), ("train model typo", [*base, "model.n_layers=2"]),
              ("train foreign option", [*base, "model.cnn_width=4"]), ("train mixer", [*base, "mixer=lstm"]),
              ("train sample_prompt", [*base, "sample_tokens=5", "sample_prompt=€"]),
              ("train heads", [*base, "n_head=3", "d_model=32"]), ("train bpe huge", [*base, "tokenizer=bpe",
                                                                                   "bpe_vocab_size=1000000000"]),
              ("train bpe below its bytes", [*base, "tokenizer=bpe", "bpe_vocab_size=2"])]
    sample = ["sample", "RUN", "--max-new-tokens", "2"]
    for flag, values in (("--temperature", ["nan", "-1", "inf"]), ("--top-p", ["0", "2", "nan"]),
                         ("--top-k", ["0", "-3"]), ("--max-new-tokens", ["-1", "x"]), ("--seed", [str(2**70)]),
                         ("--num-samples", ["0"]), ("--prompt", ["€", ""]), ("--device", ["tpu", "cuda:x"]),
                         ("--stop", [""])):
        cases += [(f"sample {flag} {v!r}", [*sample, flag, v]) for v in values]
    # a prompt longer than the context is not a bad input: it is cropped to its last block_size tokens with a
    # notice (tests/cli/test_cli.py)
    cases += [("sample missing run", ["sample", str(root / "nope")]),
              ("sample a file as run", ["sample", str(f["corpus"])]),
              ("sample not a run", ["sample", str(f["not_a_run"])])]
    for flag, v in (("--eval-iters", "0"), ("--batch-size", "0"), ("--eval-iters", "-4"), ("--batch-size", "x")):
        cases.append((f"eval {flag} {v}", ["eval", "RUN", flag, v]))
    cases += [("eval unknown split", ["eval", "RUN", "--splits", "dev"]),
              ("eval data fifo", ["eval", "RUN", "--data", str(f["fifo"])]),
              ("eval missing", ["eval", str(root / "nope")])]
    inspect = ["inspect", "RUN"]
    cases += [("inspect no input", inspect), ("inspect both", [*inspect, "--text", "a", "--image", "x.png"]),
              ("inspect layer", [*inspect, "--text", "the", "--layer", "99"]),
              ("inspect head", [*inspect, "--text", "the", "--head", "99"]),
              ("inspect oov", [*inspect, "--text", "€€"]), ("inspect empty", [*inspect, "--text", ""]),
              ("inspect image on gpt", [*inspect, "--image", str(f["broken_png"])]),
              ("inspect faithfulness folder", [*inspect, "--text", "the", "--faithfulness", "/nonexistent/f.json"]),
              ("inspect samples", [*inspect, "--text", "the", "--faithfulness", str(root / "f.json"), "--samples",
                                   "3"])]
    cases += [("heads missing data", ["heads", "RUN", "--data", str(root / "nope.txt")]),
              ("heads fifo", ["heads", "RUN", "--data", str(f["fifo"])]),
              ("heads n-batches", ["heads", "RUN", "--data", str(f["corpus"]), "--n-batches", "0"]),
              ("heads batch-size", ["heads", "RUN", "--data", str(f["corpus"]), "--batch-size", "-2"]),
              ("heads json folder", ["heads", "RUN", "--data", str(f["corpus"]), "--json", "/nonexistent/h.json"])]
    lens = [("logit-lens short", ["logit-lens", "RUN", "--text", "t"]),
            ("logit-lens k", ["logit-lens", "RUN", "--text", "the", "--k", "0"]),
            ("ablate head", ["ablate", "RUN", "--text", "the", "--head", "9.9"]),
            ("ablate syntax", ["ablate", "RUN", "--text", "the", "--head", "one"]),
            ("dla two tokens", ["dla", "RUN", "--text", "the", "--answer", "ab"]),
            ("dla top", ["dla", "RUN", "--text", "the", "--answer", "a", "--top", "0"]),
            ("patch lengths", ["patch", "RUN", "--clean", "the", "--corrupted", "a", "--answer", "a",
                               "--wrong", "b"]),
            ("patch same", ["patch", "RUN", "--clean", "the", "--corrupted", "the", "--answer", "a", "--wrong", "a"]),
            ("patch path", ["patch", "RUN", "--clean", "the", "--corrupted", "thx", "--answer", "a", "--wrong", "b",
                            "--path", "1.0>0.0"]),
            ("probe malformed", ["probe", "RUN", "--data", str(f["bad_jsonl"])]),
            ("probe one class", ["probe", "RUN", "--data", str(f["one_class"])]),
            ("probe fifo", ["probe", "RUN", "--data", str(f["fifo"])]),
            ("probe seeds", ["probe", "RUN", "--data", str(f["one_class"]), "--seeds", "0"]),
            ("probe fraction", ["probe", "RUN", "--data", str(f["one_class"]), "--test-fraction", "nan"])]
    cases += [(f"lens {name}", ["lens", *argv]) for name, argv in lens]
    cases += [("explore port 0", ["explore", "RUN", "--port", "0"]),
              ("explore port big", ["explore", "RUN", "--port", "70000"]),
              ("explore missing", ["explore", str(root / "nope")]),
              ("import-hf missing", ["import-hf", str(root / "nope"), "--out", str(root / "imp1")]),
              ("import-hf occupied", ["import-hf", str(f["hf_huge"]), "--out", str(f["occupied"])]),
              ("experiment into a folder of one's own files",
               ["experiment", "hand-trace", "--out", str(f["occupied"])]),
              ("experiment --resume into a folder of one's own files",
               ["experiment", "hand-trace", "--resume", "--out", str(f["occupied"])]),
              ("import-hf huge", ["import-hf", str(f["hf_huge"]), "--out", str(root / "imp2")]),
              ("import-hf bad json", ["import-hf", str(f["hf_bad_json"]), "--out", str(root / "imp3")]),
              ("embed on gpt", ["embed", "RUN", "--text", "hi"]),
              ("probe on gpt", ["probe", "RUN", f"data={f['bad_jsonl']}"]),
              ("finetune on gpt", ["finetune", "RUN", f"data={f['bad_jsonl']}"]),
              ("translate on gpt", ["translate", "RUN", "--text", "hi"]),
              ("translate max-len", ["translate", "RUN", "--text", "hi", "--max-len", "-5"]),
              ("translate beam", ["translate", "RUN", "--text", "hi", "--beam", "0"]),
              ("resume not a run", ["resume", str(f["not_a_run"])]),
              ("resume missing", ["resume", str(root / "nope")]),
              ("resume bad override", ["resume", "RUN", "lr=nan"]),
              ("resume below its step", ["resume", "RUN", "max_iters=1"]),  # it reported "done", exit 0
              ("experiment unknown", ["experiment", "hand-tracee"]),
              ("bench unknown", ["bench", "nope"]),
              ("unknown command", ["trian"]), ("no command", [])]
    cases += [(f"sample {flag} {v!r}", [*sample, flag, v]) for flag, v in (
        ("--top-k", "x"), ("--temperature", "x"), ("--top-p", "-1"), ("--num-samples", "-2"),
        ("--max-new-tokens", str(2**70)), ("--seed", "x"))]
    # an empty path (an unset shell variable): read as "." or as no argument, it evaluated the run's own data
    # (eval --data ""), wrote into the current folder (--out ""), or named "." in its error
    cases += [(f"empty path: {' '.join(a if a else repr(a) for a in argv)}", argv) for argv in (
        ["eval", "RUN", "--data", ""], ["heads", "RUN", "--data", ""], ["sample", ""], ["export", "RUN", "--out", ""],
        ["experiment", "grokking", "--quick", "--out", ""], ["inspect", "RUN", "--text", "the", "--out", ""],
        ["lens", "logit-lens", "RUN", "--text", "the", "--json", ""], ["translate", "RUN", "--file", ""],
        ["predict", "RUN", "--data", "", "--out", str(root / "p.csv")], ["train", ""],
        *([*base, f"{key}="] for key in ("data", "out_dir", "init_from")))]
    cases += [("eval iters huge", ["eval", "RUN", "--eval-iters", str(2**70)]),
              ("eval batch nan", ["eval", "RUN", "--batch-size", "nan"]),
              ("explore port -1", ["explore", "RUN", "--port", "-1"]), ("explore port x", ["explore", "RUN", "--port",
                                                                                          "x"])]
    cases += [(f"lens {name}", ["lens", *argv]) for name, argv in (
        ("logit-lens json", ["logit-lens", "RUN", "--text", "the", "--json", "/nonexistent/l.json"]),
        ("ablate how", ["ablate", "RUN", "--text", "the", "--head", "0.0", "--how", "half"]),
        ("dla wrong", ["dla", "RUN", "--text", "the", "--answer", "a", "--wrong", "bc"]),
        ("patch path syntax", ["patch", "RUN", "--clean", "the", "--corrupted", "thx", "--answer", "a", "--wrong",
                               "b", "--path", "0.0-1.0"]),
        ("patch path empty", ["patch", "RUN", "--clean", "the", "--corrupted", "thx", "--answer", "a", "--wrong",
                              "b", "--path", "0.0>"]),
        ("probe fraction 0", ["probe", "RUN", "--data", str(f["one_class"]), "--test-fraction", "0"]),
        ("probe fraction 1", ["probe", "RUN", "--data", str(f["one_class"]), "--test-fraction", "1"]),
        ("probe empty", ["probe", "RUN", "--data", str(f["empty"])]),
        ("probe binary", ["probe", "RUN", "--data", str(f["binary"])]),
        ("probe latin1", ["probe", "RUN", "--data", str(f["latin1"])]))]
    cases += [(f"heads data {name}", ["heads", "RUN", "--data", str(f[name])]) for name in ("binary", "empty",
                                                                                           "latin1")]
    out = str(root / "predictions.csv")  # never created: every case below fails before writing
    cases += [(f"predict data {name}", ["predict", "RUN", "--data", str(f[name]), "--out", out])
              for name in ("binary", "latin1", "empty", "fifo", "broken_png", "bad_jsonl")]
    (root / "exists.csv").write_text("keep")
    cases += [("predict out exists", ["predict", "RUN", "--data", str(f["corpus"]), "--out", str(root / "exists.csv")]),
              ("predict out suffix", ["predict", "RUN", "--data", str(f["corpus"]), "--out", str(root / "p.txt")]),
              ("predict out folder missing", ["predict", "RUN", "--data", str(f["corpus"]), "--out",
                                              str(root / "nope" / "p.csv")]),
              ("predict batch 0", ["predict", "RUN", "--data", str(f["corpus"]), "--out", out, "--batch-size", "0"]),
              ("predict missing data", ["predict", "RUN", "--data", str(root / "nope.txt"), "--out", out]),
              ("predict missing run", ["predict", str(root / "nope"), "--data", str(f["corpus"]), "--out", out])]
    cases += [(f"data micrographs {' '.join(extra)}", ["data", "micrographs", "--out", str(root / "mg"), *extra])
              for extra in (["--size", "0"], ["--size", "4096"], ["--n", "1"], ["--n", "x"],
                            ["--test-fraction", "nan"], ["--test-fraction", "2"], ["--task", "types"],
                            ["--seed", str(2**70)], ["--seed", "-1"])]
    cases.append(("train micrographs data_seed -1", ["train", "vit-micrographs", "images.data_seed=-1",
                                                     f"out_dir={root / 'runs'}"]))
    cases.append(("data micrographs out not empty", ["data", "micrographs", "--out", str(root), "--n", "4"]))
    cases += [(f"data spoken-words {' '.join(extra)}", ["data", "spoken-words", "--out", str(root / "sw"), *extra])
              for extra in (["--n", "5"], ["--n", "x"], ["--seed", "-1"])]
    cases.append(("data spoken-words out not empty", ["data", "spoken-words", "--out", str(root), "--n", "20"]))
    # sizes beyond this machine: refused from an estimate before the first batch, image or clip (were an OOM
    # kill, exit 137; a MemoryError, exit 1; minutes of work towards a 3 TB disk)
    cases += [("eval batch beyond memory", ["eval", "RUN", "--batch-size", "1000000000"]),
              ("heads batches beyond memory", ["heads", "RUN", "--data", str(f["corpus"]), "--n-batches",
                                               "1000000000"]),
              ("sample beams beyond memory", [*sample, "--num-beams", "100000000"]),
              ("lens k beyond the vocabulary", ["lens", "logit-lens", "RUN", "--text", "the", "--k", "100000"]),
              ("data micrographs beyond memory", ["data", "micrographs", "--out", str(root / "mg"), "--n",
                                                  "1000000000"]),
              ("data spoken-words beyond disk", ["data", "spoken-words", "--out", str(root / "sw"), "--n",
                                                 "100000000"])]
    runs = f"out_dir={root / 'runs'}"
    cases += [("train speech-words n_mels 4", ["train", "speech-words", "continuous.n_mels=4", runs]),
              ("train speech-words audio_seconds 0", ["train", "speech-words", "continuous.audio_seconds=0", runs]),
              ("train lstm-words cell", ["train", "lstm-words", "model.cell=transformer", runs]),
              ("train lstm-words pooling cls", ["train", "lstm-words", "model.pooling=cls", runs]),
              ("train recurrent on sets", ["train", "lstm-words", "data=generated:set-interaction",
                                           "model.head=regression", runs]),
              ("train caption wrong data", ["train", "caption-micrographs", "data=generated:micrographs", runs]),
              ("train caption short context", ["train", "caption-micrographs", "model.block_size=8",
                                               "images.n_generated=40", runs]),
              ("train captioner as classifier", ["train", "caption-micrographs", "task=image-classification",
                                                 "images.n_generated=40", runs]),
              ("inspect audio on a gpt run", ["inspect", "RUN", "--audio", str(f["corpus"])]),
              ("inspect audio and text", ["inspect", "RUN", "--audio", str(f["corpus"]), "--text", "hi"])]
    cases += [(f"{cmd} missing run", [cmd, str(root / "nope"), *extra]) for cmd, extra in (
        ("embed", ["--text", "hi"]), ("probe", [f"data={f['bad_jsonl']}"]), ("finetune", [f"data={f['bad_jsonl']}"]),
        ("translate", ["--text", "hi"]), ("inspect", ["--text", "hi"]), ("heads", ["--data", str(f["corpus"])]))]
    under_a_file = str(f["corpus"] / "x")  # an output below a file: no command may compute and then fail to save
    cases += [(f"unwritable {name}", argv) for name, argv in (
        ("train out_dir", [*[a for a in base if not a.startswith("out_dir=")], f"out_dir={under_a_file}"]),
        ("train name is a file", [*[a for a in base if not a.startswith(("out_dir=", "name="))],
                                  f"out_dir={root}", "name=corpus.txt"]),
        ("experiment out", ["experiment", "hand-trace", "--out", under_a_file]),
        ("experiment out is a file", ["experiment", "hand-trace", "--out", str(f["corpus"])]),
        ("predict out", ["predict", "RUN", "--data", str(f["corpus"]), "--out", under_a_file + ".csv"]),
        ("heads out", ["heads", "RUN", "--data", str(f["corpus"]), "--out", under_a_file]),
        ("heads json", ["heads", "RUN", "--data", str(f["corpus"]), "--json", under_a_file + ".json"]),
        ("inspect text out", ["inspect", "RUN", "--text", "the", "--out", under_a_file]),
        ("inspect faithfulness", ["inspect", "RUN", "--text", "the", "--faithfulness", under_a_file + ".json"]),
        ("export out", ["export", "RUN", "--out", under_a_file]),
        ("import-hf out", ["import-hf", str(f["hf_huge"]), "--out", under_a_file]),
        ("data micrographs out", ["data", "micrographs", "--out", under_a_file, "--n", "4"]),
        ("lens logit-lens json", ["lens", "logit-lens", "RUN", "--text", "the", "--json", under_a_file + ".json"]))]
    return cases
