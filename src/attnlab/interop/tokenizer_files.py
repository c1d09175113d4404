"""The tokenizer files a ``transformers`` folder carries: ``tokenizer.json`` (the ``tokenizers`` file every
attnlab tokenizer already writes), ``tokenizer_config.json`` and ``special_tokens_map.json``, so
``AutoTokenizer.from_pretrained(folder)`` gives the ids attnlab's tokenizer gives, special tokens included.

The class named is ``PreTrainedTokenizerFast``, which runs ``tokenizer.json`` exactly as written (its
normaliser, pre-tokeniser, model and [CLS]/[SEP] template); a class such as ``BertTokenizerFast`` would
rebuild parts of it from its own arguments.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.core.fileio import atomic_write_text
from attnlab.tokenizers import Tokenizer

# BERT's special tokens by the role transformers gives them
ROLES = {"[CLS]": "cls_token", "[SEP]": "sep_token", "[PAD]": "pad_token", "[MASK]": "mask_token",
         "[UNK]": "unk_token", "<|endoftext|>": "eos_token"}


def special_tokens(tokenizer: Tokenizer) -> dict:
    """{role: token} for the tokenizer's special tokens, the rest under ``additional_special_tokens``."""
    payload = json.loads(tokenizer.to_json())
    names = [t["content"] for t in payload.get("added_tokens") or [] if t.get("special")]
    out: dict = {ROLES[n]: n for n in names if n in ROLES}
    extra = [n for n in names if n not in ROLES]
    if extra:
        out["additional_special_tokens"] = extra
    return out


def write_tokenizer_files(tokenizer: Tokenizer, directory: Path, max_length: int) -> list[str]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; return their names."""
    tokenizer.save(directory)
    specials = special_tokens(tokenizer)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "clean_up_tokenization_spaces": False, **specials}
    atomic_write_text(directory / "tokenizer_config.json", json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(directory / "special_tokens_map.json", json.dumps(specials, indent=2, ensure_ascii=False) + "\n")
    return ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
