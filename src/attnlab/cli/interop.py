"""``attnlab import-hf | export``: Hugging Face folders in, transformers / sentence-transformers folders out."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add the import-hf and export commands to the parser."""
    p = sub.add_parser("import-hf", help="convert a Hugging Face folder (GPT-2, GPT-NeoX, LLaMA, BERT, ViT, "
                       "sentence-transformers) into an attnlab model folder")
    p.add_argument("directory", help="folder with config.json + model.safetensors (or pytorch_model.bin), or a "
                   "model id (org/name) already in the local Hugging Face cache (nothing is downloaded)")
    p.add_argument("--out", required=True, help="attnlab folder to write (config.json, attnlab_model.safetensors, "
                   "tokenizer.json)")
    p.set_defaults(func=_cmd_import_hf)

    p = sub.add_parser("export", help="write a run as a folder transformers' Auto classes (or SentenceTransformer) "
                       "load with the same logits")
    p.add_argument("run_dir")
    p.add_argument("--format", choices=("hf", "sentence-transformers"), default="hf")
    p.add_argument("--out", required=True, help="a new or empty folder (nothing is overwritten)")
    p.add_argument("--license", help="the model card's licence id (e.g. mit, apache-2.0); default: the base "
                   "model's for a model that came from one, else unknown")
    p.add_argument("--push", metavar="REPO", help="then upload the folder to this Hugging Face model repo (org/name; "
                   "created if new; token from HF_TOKEN or `hf auth login`, endpoint from HF_ENDPOINT)")
    p.set_defaults(func=_cmd_export)


def _cmd_import_hf(args: argparse.Namespace) -> int:
    from attnlab.interop.hf import import_hf
    from attnlab.interop.hfio import read_hf_config
    from attnlab.interop.hub import resolve_source

    directory, repo_id = resolve_source(args.directory)  # a folder, or a model id's snapshot in the local cache
    model, missing, has_tokenizer = import_hf(directory, args.out, repo_id)
    c = model.config
    source = f"{args.directory} (the cached {directory.name[:12]} snapshot)" if repo_id else args.directory
    print(f"imported {source} -> {args.out}: {c.family}, {c.n_layer} layers, d_model {c.d_model}, "
          f"{model.num_parameters() / 1e6:.2f}M parameters"
          + ("" if has_tokenizer or c.family == "vit" else " (no tokenizer.json/vocab.txt found: none written)"))
    if missing:
        print(f"note: the source has no {', '.join(sorted({m.split('.')[0] for m in missing}))} weights; "
              "those heads keep a fresh init")
    if c.family == "bert" and "BertForSequenceClassification" in (read_hf_config(directory)
                                                                   .get("architectures") or []):
        print("note: the source's sequence-classification head (classifier) is not imported: attnlab reads a BERT's "
              "encoder, pooler and masked-LM head; fine-tune the imported run to train a head "
              "(attnlab finetune RUN task=classify)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    import re

    from attnlab.interop.export import export_run

    if args.license is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}", args.license):
        from attnlab.core.errors import ConfigError  # the card's YAML header holds it as given

        raise ConfigError(f"--license {args.license!r} is not a licence id (letters, digits, . + -; e.g. mit, "
                          "apache-2.0, cc-by-4.0, other)")

    done = export_run(args.run_dir, args.format, args.out, license=args.license, push_to=args.push)
    what = "a sentence-transformers folder around " if args.format == "sentence-transformers" else ""
    print(f"exported {args.run_dir} -> {done.out}: {what}transformers' {done.architecture} "
          f"({', '.join(done.files)})")
    if done.pushed:
        print(f"pushed to {args.push}: {done.pushed}")
    return 0
