"""The README.md model card of an exported folder: what the model is, how it was trained, its metrics,
and how to load it, from the run's own files (config.yaml, metrics.jsonl, the manifest's step)."""

from __future__ import annotations

from pathlib import Path

import yaml

from attnlab.core.manifest import read_manifest
from attnlab.interop.bert import head_kind
from attnlab.training.runs import read_metrics

LOADERS = {"GPT-2": "AutoModelForCausalLM", "GPT-NeoX": "AutoModelForCausalLM", "LLaMA": "AutoModelForCausalLM",
           "BERT": "AutoModelForMaskedLM", "ViT": "AutoModelForImageClassification"}
TRAINING_KEYS = ("data", "tokenizer", "max_iters", "batch_size", "lr", "min_lr", "warmup_iters", "weight_decay",
                 "optimizer", "seed")


def _training(run: Path) -> list[str]:
    path = run / "config.yaml"
    if not path.is_file():
        return ["Not trained by attnlab in this folder (imported, or the weights alone were given)."]
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return ["The run's config.yaml could not be read."]
    step = (read_manifest(run) or {}).get("step")
    lines = [f"- `{k}`: {cfg[k]}" for k in TRAINING_KEYS if k in cfg]
    if step is not None:
        lines.append(f"- weights of step {step}")
    return lines or ["(config.yaml lists no training options)"]


def _metrics(run: Path) -> list[str]:
    evals = [r for r in read_metrics(run) if any(k.startswith(("val", "test")) for k in r)]
    if not evals:
        return ["No evaluation was recorded."]
    last = evals[-1]
    return [f"- `{k}`: {v:.4f}" if isinstance(v, float) else f"- `{k}`: {v}"
            for k, v in last.items() if k == "step" or k.startswith(("val", "test"))]


def _head_note(c, architecture: str, fmt: str) -> list[str]:
    """What the exported head computes, for a BERT with a classification or regression head."""
    if architecture != "BERT" or fmt != "hf":
        return []
    kind = head_kind(c)
    if kind == "classification":
        return [f"The sequence classifier ({c.n_classes} classes, id2label from the run) is the run's own; "
                "AutoModelForMaskedLM reads the same folder's encoder and masked-LM head.", ""]
    if kind == "regression":
        return [f"The regression head ({c.n_targets} target(s), problem_type regression) gives the targets in their "
                "own units: the run's standardisation (targets.json) is folded into the classifier.", ""]
    return []


def model_card(run: Path, model, architecture: str, fmt: str) -> str:
    """The card's Markdown text."""
    c = model.config
    shape = ", ".join(f"{k} {getattr(c, k)}" for k in ("n_layer", "d_model", "n_head", "block_size", "positions",
                                                         "norm", "activation", "vocab_size") if hasattr(c, k))
    if fmt == "sentence-transformers":
        use = ("from sentence_transformers import SentenceTransformer\n"
               "model = SentenceTransformer(\"PATH\")\nembeddings = model.encode([\"a sentence\"])")
    else:
        head = architecture == "BERT" and head_kind(c) is not None
        loader = "AutoModelForSequenceClassification" if head else LOADERS[architecture]
        use = (f"from transformers import AutoTokenizer, {loader}\n"
               f"model = {loader}.from_pretrained(\"PATH\")")
        if architecture != "ViT":
            use += "\ntokenizer = AutoTokenizer.from_pretrained(\"PATH\")"
    return "\n".join([
        f"# {run.resolve().name}", "",
        f"An attnlab `{c.family}` model ({model.num_parameters() / 1e6:.2f}M parameters) written as "
        f"transformers' {architecture}" + (" inside a sentence-transformers folder" if fmt != "hf" else "") + ".",
        f"Architecture: {shape}.", "",
        "## Training", "", *_training(run), "",
        "## Metrics (the last evaluation of the run)", "", *_metrics(run), "",
        "## Use", "", "```python", use, "```", "", *_head_note(c, architecture, fmt),
        "attnlab checks on export-format test models that transformers' logits match attnlab's within 1e-4.", "",
    ])
