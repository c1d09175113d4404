"""Round two's broken Hugging Face folders (``import-hf``): non-finite weights and config numbers, bad image
statistics, tokenizers larger than the vocabulary or with a repeated token, FIFOs and /dev/zero in place of the
folder's files. Used by tests/bad_inputs_round2.py; imports no torch at its top."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tests.hf_folders import VOCAB, tiny_hf_folders

OWN_PROCESS = " [own process]"  # a case run only in a process of its own (tests/bad_inputs_round2.py)


def _write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding, "surrogateescape"))
    return path


POOLING = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


def _json_edit(path: Path, **changes) -> None:
    payload = json.loads(path.read_text())
    payload.update(changes)
    path.write_text(json.dumps(payload))  # NaN and inf as JSON's NaN / Infinity, as Python writes them


def _tensor_edit(folder: Path, fragment: str, value: float, dtype: str | None = None) -> None:
    """``value`` into the first element of the first tensor whose name holds ``fragment`` (cast to ``dtype``)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    name = next(k for k in sorted(tensors) if fragment in k)
    t = tensors[name].to(getattr(torch, dtype) if dtype else tensors[name].dtype).clone()
    t.view(-1)[0] = value
    tensors[name] = t
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def hf_cases(root: Path, out: Path) -> list[tuple[str, list[str], str]]:
    from attnlab.cli import main
    from attnlab.tokenizers import CharTokenizer

    src = tiny_hf_folders(root / "hf-sources")
    cases, n = [], 0

    def broken(family: str, name: str, expect: str = "refused") -> Path:
        nonlocal n
        n += 1
        folder = Path(shutil.copytree(src / family, root / "hf" / f"{n:02d}-{family}", symlinks=True))
        cases.append((f"import-hf {family}: {name}", ["import-hf", str(folder), "--out", str(out / "imported")],
                      expect))
        return folder

    nan, inf = float("nan"), float("inf")
    for family, fragment, value, dtype in (
            ("gpt2", "c_attn.weight", nan, None), ("gpt2", "wte.weight", inf, None), ("llama", "down_proj", nan, None),
            ("llama", "embed_tokens", -inf, None), ("bert", "query.weight", nan, None),
            ("bert", "word_embeddings", -inf, "float16"), ("vit", "classifier.weight", nan, None),
            ("vit", "patch_embeddings", inf, None), ("gpt2", "c_fc.weight", 1e300, "float64")):
        _tensor_edit(broken(family, f"{value} in {fragment} ({dtype or 'float32'})", "refused:finite"), fragment,
                     value, dtype)
    for family, key, value in (
            ("gpt2", "layer_norm_epsilon", nan), ("gpt2", "layer_norm_epsilon", inf), ("gpt2", "n_layer", "2"),
            ("llama", "rms_norm_eps", nan), ("llama", "rms_norm_eps", 0), ("llama", "rope_theta", nan),
            ("llama", "rope_theta", inf), ("llama", "rope_parameters", {"rope_type": "default", "rope_theta": nan}),
            ("llama", "num_attention_heads", 0), ("bert", "layer_norm_eps", nan), ("bert", "layer_norm_eps", inf),
            ("bert", "initializer_range", nan), ("bert", "num_attention_heads", 5), ("vit", "layer_norm_eps", nan),
            ("vit", "layer_norm_eps", -1.0), ("gpt2", "vocab_size", 10**12)):
        folder = broken(family, f"config {key}={value!r}")
        changes = {key: value, "rope_parameters": None} if key == "rope_theta" else {key: value}
        _json_edit(folder / "config.json", **changes)
    for processor in ({"image_std": [0]}, {"image_std": [0.2, 0.0, 0.3]}, {"image_mean": [nan, 0.5, 0.5]},
                      {"image_std": [inf, 0.2, 0.2]}, {"image_mean": [0.5, 0.5]}):
        (broken("vit", f"preprocessor {processor}") / "preprocessor_config.json").write_text(json.dumps(processor))
    CharTokenizer([chr(c) for c in range(0x100, 0x100 + VOCAB + 40)]).save(
        broken("gpt2", f"a tokenizer of {VOCAB + 40} tokens, {VOCAB} rows"))
    folder = broken("llama", "added tokens past the vocabulary")
    payload = json.loads((folder / "tokenizer.json").read_text())
    start = len(payload["model"]["vocab"])
    payload["added_tokens"] = [{"id": start + i, "content": f"<extra_{i}>", "special": True, "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False} for i in range(VOCAB)]
    (folder / "tokenizer.json").write_text(json.dumps(payload))
    _write(broken("bert", "vocab.txt longer than the vocabulary") / "vocab.txt",
           "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(VOCAB))]) + "\n")
    folder = broken("bert", "a repeated vocab.txt token")
    _write(folder / "vocab.txt", (folder / "vocab.txt").read_text() + "q\n")
    for family, name in (("gpt2", "config.json"), ("gpt2", "tokenizer.json"), ("bert", "vocab.txt"),
                         ("bert", "modules.json"), ("bert", "1_Pooling/config.json"), ("gpt2", "model.safetensors"),
                         ("vit", "preprocessor_config.json"), ("bert", "tokenizer_config.json")):
        for how in ("a FIFO", "a link to /dev/zero"):
            folder = broken(family, f"{name} is {how}{OWN_PROCESS}")
            if name == "1_Pooling/config.json":  # a sentence-transformers folder around the BERT
                (folder / "modules.json").write_text(json.dumps(POOLING))
                (folder / "1_Pooling").mkdir()
            (folder / name).unlink(missing_ok=True)
            os.mkfifo(folder / name) if how == "a FIFO" else (folder / name).symlink_to("/dev/zero")
    once = root / "imported-once"  # a finished import: a second one into it must be refused, the first kept
    if not once.exists():
        assert main(["import-hf", str(src / "bert"), "--out", str(once)]) == 0
    cases += [(f"import-hf {family} into the --out of an earlier import",
               ["import-hf", str(src / family), "--out", str(once)], "refused") for family in ("bert", "gpt2")]
    cases.append((f"ulimit -f: import-hf --out{OWN_PROCESS}", ["import-hf", str(src / "bert"), "--out",
                                                               str(out / "imported")], "refused"))
    return cases
