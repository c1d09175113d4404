"""``attnlab import-hf | export``: Hugging Face folders in, transformers / sentence-transformers folders out."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the import-hf and export commands to the parser."""
    p = sub.add_parser("import-hf", help="convert a Hugging Face folder (GPT-2, GPT-NeoX, LLaMA, BERT, ViT, "
                       "sentence-transformers) into an attnlab model folder")
    p.add_argument("directory", help="folder with config.json + model.safetensors (or pytorch_model.bin)")
    p.add_argument("--out", required=True, help="attnlab folder to write (config.json, attnlab_model.safetensors, "
                   "tokenizer.json)")
    p.set_defaults(func=_cmd_import_hf)

    p = sub.add_parser("export", help="write a run as a folder transformers' Auto classes (or SentenceTransformer) "
                       "load with the same logits")
    p.add_argument("run_dir")
    p.add_argument("--format", choices=("hf", "sentence-transformers"), default="hf")
    p.add_argument("--out", required=True, help="a new or empty folder (nothing is overwritten)")
    p.set_defaults(func=_cmd_export)


def _cmd_import_hf(args: argparse.Namespace) -> int:
    from attnlab.interop.hf import import_hf
    from attnlab.interop.hfio import read_hf_config

    model, missing, has_tokenizer = import_hf(args.directory, args.out)
    c = model.config
    print(f"imported {args.directory} -> {args.out}: {c.family}, {c.n_layer} layers, d_model {c.d_model}, "
          f"{model.num_parameters() / 1e6:.2f}M parameters"
          + ("" if has_tokenizer or c.family == "vit" else " (no tokenizer.json/vocab.txt found: none written)"))
    if missing:
        print(f"note: the source has no {', '.join(sorted({m.split('.')[0] for m in missing}))} weights; "
              "those heads keep a fresh init")
    if c.family == "bert" and "BertForSequenceClassification" in (read_hf_config(Path(args.directory))
                                                                   .get("architectures") or []):
        print("note: the source's sequence-classification head (classifier) is not imported: attnlab reads a BERT's "
              "encoder, pooler and masked-LM head; fine-tune the imported run to train a head "
              "(attnlab finetune RUN task=classify)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from attnlab.interop.export import export_run

    done = export_run(args.run_dir, args.format, args.out)
    what = "a sentence-transformers folder around " if args.format == "sentence-transformers" else ""
    print(f"exported {args.run_dir} -> {done.out}: {what}transformers' {done.architecture} "
          f"({', '.join(done.files)})")
    return 0
