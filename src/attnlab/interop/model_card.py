"""The README.md model card of an exported folder, written with huggingface_hub's ``ModelCard``: a YAML header
the Hub reads (license, library_name, pipeline_tag, base_model, datasets, tags), then what the model is, where
it came from, how it was trained, its metrics and a snippet that loads it from where it was exported to.

Everything is read from the run's own files: config.yaml, metrics.jsonl, the manifest's step, the tokenizer it
saved, and, for a fine-tune, the folder it started from (``init_from`` / ``classify.init_from``) and that
folder's ``imported.json`` (what ``import-hf`` read, its model id and licence). No path on this machine is
written: a data file is named by its file name, a built-in corpus by its name.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from attnlab.core.manifest import read_manifest
from attnlab.interop.bert import head_kind
from attnlab.training.runs import read_metrics

LOADERS = {"GPT-2": "AutoModelForCausalLM", "GPT-NeoX": "AutoModelForCausalLM", "LLaMA": "AutoModelForCausalLM",
           "BERT": "AutoModelForMaskedLM", "ViT": "AutoModelForImageClassification"}
MODEL_TAGS = {"GPT-2": "gpt2", "GPT-NeoX": "gpt_neox", "LLaMA": "llama", "BERT": "bert", "ViT": "vit"}
TRAINING_KEYS = ("max_iters", "batch_size", "lr", "min_lr", "warmup_iters", "weight_decay", "optimizer", "seed")
MAX_BASE_HOPS = 8  # a fine-tune of a fine-tune ... of an import: how far back the card looks for the import
IMAGE_MODES = {1: "L", 3: "RGB", 4: "RGBA"}  # PIL's mode for an image of that many channels
PROMPTS = ("The ", "the ", "A ", "a ", "To be", "\n")  # the causal LM snippet's prompt: the first one that encodes


def _run_config(run: Path) -> dict | None:
    """The run's config.yaml as a dict; None when it has none or it cannot be read."""
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _imported(folder: Path) -> dict | None:
    """``imported.json`` of a folder written by ``attnlab import-hf``; None for any other folder."""
    try:
        record = json.loads((folder / "imported.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _started_from(cfg: dict | None) -> Path | None:
    """The folder a run's weights started from (``init_from``, or ``classify.init_from`` for ``attnlab finetune``)."""
    if not cfg:
        return None
    start = cfg.get("init_from") or (cfg.get("classify") or {}).get("init_from")
    return Path(str(start)) if start else None


def provenance(run: Path) -> dict:
    """Where the run's model came from: {"relation": "import" | "finetune" | None, "name": the model it came from
    (a Hub id, or a folder's name), "repo_id" (only when known), "license"/"license_name"/"license_link",
    "datasets", "fresh_heads"}: the run's own imported.json, else the chain of ``init_from`` folders back to the
    first import (or to the first folder that did not start from another)."""
    own = _imported(run)
    if own is not None:
        return {**own, "relation": "import", "name": own.get("repo_id") or Path(own.get("source", run)).name}
    start = _started_from(_run_config(run))
    if start is None:
        return {"relation": None}
    folder = start
    for _ in range(MAX_BASE_HOPS):
        record = _imported(folder)
        if record is not None:
            return {**record, "relation": "finetune", "name": record.get("repo_id") or Path(record["source"]).name}
        earlier = _started_from(_run_config(folder))
        if earlier is None:
            break
        folder = earlier
    return {"relation": "finetune", "name": folder.name}  # an attnlab run (or a folder no longer there)


def data_name(data) -> str | None:
    """A data setting as the card shows it: a file by its name only, a built-in set by its own name."""
    if data in (None, ""):
        return None
    text = str(data)
    return Path(text).name if ("/" in text or "\\" in text or Path(text).suffix) else text


def describe_tokenizer(run: Path) -> str | None:
    """The tokenizer the run saved, as the card names it ("WordPiece, 100 tokens"); None without one."""
    from attnlab.core.errors import AttnlabError
    from attnlab.tokenizers import BPETokenizer, CharTokenizer, WordPieceTokenizer, load_tokenizer

    if not (run / "tokenizer.json").is_file() and not (run / "vocab.txt").is_file():
        return None
    try:
        tokenizer = load_tokenizer(run)
    except AttnlabError:
        return None
    n = tokenizer.vocab_size
    if isinstance(tokenizer, CharTokenizer):
        return f"characters (one token per character), {n} tokens"
    if isinstance(tokenizer, BPETokenizer):
        return f"byte-level BPE, {n} tokens"
    if isinstance(tokenizer, WordPieceTokenizer):
        split = (json.loads(tokenizer.to_json()).get("pre_tokenizer") or {}).get("type") == "Split"
        return f"WordPiece over characters, {n} tokens" if split else f"WordPiece (BERT's sub-words), {n} tokens"
    return f"{type(tokenizer).__name__}, {n} tokens"


def _same_tokenizer(run: Path, base: Path | None) -> bool:
    """Whether the run's tokenizer.json is the one of the folder it started from."""
    if base is None:
        return False
    try:
        return (run / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    except OSError:
        return False


def _training(run: Path, cfg: dict | None) -> list[str]:
    if cfg is None:
        return ["Not trained by attnlab in this folder (imported, or the weights alone were given)."]
    lines = []
    if (data := data_name(cfg.get("data"))) is not None:
        lines.append(f"- data: `{data}`" + (f" (task `{cfg['task']}`)" if cfg.get("task") else ""))
    if (tokenizer := describe_tokenizer(run)) is not None:
        base = _started_from(cfg)
        lines.append(f"- tokenizer: {tokenizer}" + (" (the base model's)" if _same_tokenizer(run, base) else ""))
    lines += [f"- `{k}`: {cfg[k]}" for k in TRAINING_KEYS if k in cfg]
    step = (read_manifest(run) or {}).get("step")
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
    if kind == "token":
        return [f"The token classifier ({c.n_classes} BIO tags, id2label from the run) is the run's own; "
                "AutoModelForMaskedLM reads the same folder's encoder and masked-LM head.", ""]
    if kind == "span":
        return ["The question-answering head (start and end logits per token) is the run's own; "
                "AutoModelForMaskedLM reads the same folder's encoder and masked-LM head.", ""]
    if kind == "regression":
        return [f"The regression head ({c.n_targets} target(s), problem_type regression) gives the targets in their "
                "own units: the run's standardisation (targets.json) is folded into the classifier.", ""]
    return []


def _hub_link(name: str, repo_id: str | None) -> str:
    return f"[{name}](https://huggingface.co/{repo_id})" if repo_id else f"`{name}`"


def _origin(source: dict) -> list[str]:
    """The card's sentences on the model this one came from, with its licence."""
    if source["relation"] is None:
        return []
    link = _hub_link(source["name"], source.get("repo_id"))
    licence = source.get("license_name") or source.get("license")
    licence = f", released under the licence `{licence}`" if licence else ""
    if source["relation"] == "import":
        fresh = source.get("fresh_heads") or []
        note = (f" The source had no {', '.join(sorted({h.split('.')[0] for h in fresh}))} weights; those are freshly "
                "initialised." if fresh else "")
        return [f"Converted from {link}{licence}: the same weights, read by `attnlab import-hf`.{note}", ""]
    return [f"Fine-tuned from {link}{licence}.", ""]


def _prompt(run: Path) -> str:
    """A short prompt the run's tokenizer encodes and decodes back unchanged (a char vocabulary lacks most)."""
    from attnlab.core.errors import AttnlabError
    from attnlab.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(run)
    for text in PROMPTS:
        try:
            if tokenizer.decode(tokenizer.encode(text)) == text:
                return text
        except AttnlabError:
            continue
    return tokenizer.decode([0])


def usage(run: Path, model, architecture: str, fmt: str, load_from: str) -> str:
    """Python that loads the exported folder from ``load_from`` (the folder as exported, or a Hub id) and runs it."""
    c, where = model.config, json.dumps(load_from)
    if fmt == "sentence-transformers":
        return ("from sentence_transformers import SentenceTransformer\n\n"
                f"model = SentenceTransformer({where})\n"
                "embeddings = model.encode([\"A first sentence.\", \"Another one.\"])\n"
                "print(embeddings.shape)  # (2, embedding size)")
    if architecture == "ViT" and c.in_channels in IMAGE_MODES:
        return ("from PIL import Image\n"
                "from transformers import AutoImageProcessor, AutoModelForImageClassification\n\n"
                f"processor = AutoImageProcessor.from_pretrained({where})  # resizes and normalises as the run did\n"
                f"model = AutoModelForImageClassification.from_pretrained({where})\n"
                f"image = Image.new({json.dumps(IMAGE_MODES[c.in_channels])}, ({c.image_size}, {c.image_size}))  "
                "# or Image.open(\"picture.png\")\n"
                "inputs = processor(images=image, return_tensors=\"pt\")\n"
                "print(model.config.id2label[int(model(**inputs).logits.argmax(-1))])")
    if architecture == "ViT":
        return ("import torch\nfrom transformers import AutoModelForImageClassification\n\n"
                f"model = AutoModelForImageClassification.from_pretrained({where})\n"
                f"pixels = torch.rand(1, {c.in_channels}, {c.image_size}, {c.image_size})  # (B, C, H, W), normalised\n"
                "print(model.config.id2label[int(model(pixel_values=pixels).logits.argmax(-1))])")
    head = head_kind(c) if architecture == "BERT" else None
    loader = {"token": "AutoModelForTokenClassification", "span": "AutoModelForQuestionAnswering"}.get(
        head or "", "AutoModelForSequenceClassification" if head else LOADERS[architecture])
    load = (f"from transformers import AutoTokenizer, {loader}\n\n"
            f"tokenizer = AutoTokenizer.from_pretrained({where})\n"
            f"model = {loader}.from_pretrained({where})\n")
    if loader == "AutoModelForCausalLM":
        return (load + f"inputs = tokenizer({json.dumps(_prompt(run))}, return_tensors=\"pt\")\n"
                "out = model.generate(**inputs, do_sample=True)  # up to the context length (generation_config.json)\n"
                "print(tokenizer.decode(out[0]))")
    if head == "classification":
        return (load + "inputs = tokenizer([\"a first text\", \"another one\"], padding=True, return_tensors=\"pt\")\n"
                "print([model.config.id2label[i] for i in model(**inputs).logits.argmax(-1).tolist()])")
    if head == "token":
        return (load.replace(f"import AutoTokenizer, {loader}", f"import AutoTokenizer, {loader}, pipeline")
                + 'ner = pipeline("token-classification", model=model, tokenizer=tokenizer, '
                'aggregation_strategy="first")\n'
                'print(ner("Ana Rivas moved to Lisbon in May 2001 ."))')
    if head == "span":
        return (load + 'inputs = tokenizer("Where was Ana Rivas born?", "Ana Rivas was born in Lisbon.", '
                'return_tensors="pt")\nout = model(**inputs)\n'
                "start, end = int(out.start_logits[0].argmax()), int(out.end_logits[0].argmax())\n"
                'print(tokenizer.decode(inputs["input_ids"][0, start:end + 1]))')
    if head == "regression":
        return (load + "inputs = tokenizer([\"a first text\", \"another one\"], padding=True, return_tensors=\"pt\")\n"
                "print(model(**inputs).logits)  # (2, targets), in the targets' own units")
    return (load + "inputs = tokenizer(f\"the {tokenizer.mask_token} is here\", return_tensors=\"pt\")\n"
            "mask = inputs[\"input_ids\"][0].tolist().index(tokenizer.mask_token_id)\n"
            "print(tokenizer.decode(model(**inputs).logits[0, mask].argmax()))")


def _pipeline_tag(c, architecture: str, fmt: str) -> str:
    if fmt == "sentence-transformers":
        return "sentence-similarity"
    if architecture == "ViT":
        return "image-classification"
    if architecture == "BERT":
        kind = head_kind(c)
        return {"token": "token-classification", "span": "question-answering", None: "fill-mask"}.get(
            kind, "text-classification")
    return "text-generation"


def card_data(run: Path, model, architecture: str, fmt: str, license: str | None = None):
    """The card's ``ModelCardData``: the licence given, else the base model's, else ``unknown``; base_model where
    the model came from a Hub model; the training data's name (or the source's data sets, for a conversion)."""
    from huggingface_hub import ModelCardData

    source, cfg = provenance(run), _run_config(run)
    data = data_name((cfg or {}).get("data"))
    datasets = [data] if data else (source.get("datasets") if source["relation"] == "import" else None)
    inherited = license is None and source.get("license") is not None
    sentence = fmt == "sentence-transformers"
    tags = ["attnlab", MODEL_TAGS[architecture], *(["sentence-transformers", "feature-extraction"] if sentence else [])]
    return ModelCardData(
        license=license or source.get("license") or "unknown",
        license_name=source.get("license_name") if inherited else None,
        license_link=source.get("license_link") if inherited else None,
        library_name="sentence-transformers" if sentence else "transformers",
        pipeline_tag=_pipeline_tag(model.config, architecture, fmt),
        base_model=source.get("repo_id"),
        base_model_relation="finetune" if source["relation"] == "finetune" and source.get("repo_id") else None,
        datasets=datasets or None, tags=tags)


def model_card(run: Path, model, architecture: str, fmt: str, load_from: str = "./model",
               license: str | None = None) -> str:
    """The card's text: the YAML header (``card_data``), then Markdown; ``load_from`` is what the usage snippet
    loads (the folder as the user named it, or the Hub id it is pushed to)."""
    from huggingface_hub import ModelCard

    c = model.config
    data = card_data(run, model, architecture, fmt, license)
    shape = ", ".join(f"{k} {getattr(c, k)}" for k in ("n_layer", "d_model", "n_head", "block_size", "positions",
                                                         "norm", "activation", "vocab_size") if hasattr(c, k))
    body = "\n".join([
        f"# {run.resolve().name}", "",
        f"An attnlab `{c.family}` model ({model.num_parameters() / 1e6:.2f}M parameters) written as "
        f"transformers' {architecture}" + (" inside a sentence-transformers folder" if fmt != "hf" else "") + ".",
        f"Architecture: {shape}.", "", *_origin(provenance(run)),
        "## Training", "", *_training(run, _run_config(run)), "",
        "## Metrics (the last evaluation of the run)", "", *_metrics(run), "",
        "## Use", "", "```python", usage(run, model, architecture, fmt, load_from), "```", "",
        *_head_note(c, architecture, fmt),
        "attnlab checks on export-format test models that transformers' logits match attnlab's within 1e-4.", "",
    ])
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))
