"""Tiny random-weights Hugging Face folders written by transformers itself, for the import tests and round two
of the bad inputs: GPT-2 and LLaMA with a char tokenizer.json, BERT with a vocab.txt, ViT with a
preprocessor_config.json. Imports no torch at its top."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 60  # the token rows of the GPT-2, LLaMA and BERT folders
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # the head of the BERT's vocab.txt


def tiny_hf_folders(root: Path) -> Path:
    """``root/{gpt2,llama,bert,vit}``: 2 layers, 32 dims, 4 heads, each saved by transformers; returns root."""
    import transformers

    from attnlab.tokenizers import CharTokenizer
    from tests.interop.test_interop_hf import _folder_from

    transformers.logging.set_verbosity_error()
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    _folder_from(transformers.GPT2LMHeadModel, transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4), root / "gpt2")
    _folder_from(transformers.LlamaForCausalLM, transformers.LlamaConfig(
        vocab_size=VOCAB, max_position_embeddings=16, **small), root / "llama")
    _folder_from(transformers.BertForMaskedLM, transformers.BertConfig(
        vocab_size=VOCAB, max_position_embeddings=16, **small), root / "bert")
    _folder_from(transformers.ViTForImageClassification, transformers.ViTConfig(
        image_size=8, patch_size=4, num_channels=3, num_labels=2, **small), root / "vit")
    for name in ("gpt2", "llama"):
        CharTokenizer(list("abcdefghijklmnopqrstuvwxyz .,")).save(root / name)
    (root / "bert" / "vocab.txt").write_text("\n".join(SPECIAL + list("abcdefghijklmnopqrstuvwxyz")) + "\n")
    (root / "vit" / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "ViTImageProcessor", "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.3, 0.4]}))
    return root
