"""A text as the token ids a model was trained on: its special tokens added, in one place.

    family     ids of a text
    gpt        tokenizer.encode(text)                     nothing added: a causal LM reads the bare text
    bert       [CLS] tokenizer.encode(text) [SEP]          as the tokenizer's own template writes it

An encoder was trained on rows its tokenizer's template made (``encode_batch``: ``[CLS] $A [SEP]`` for a
BERT WordPiece, whatever ``tokenizer.json``'s post-processor says for an imported one), so every path that
runs one text through it (``attnlab inspect --text``, ``attnlab.load(...).attention``, the explorer, the
faithfulness scores) encodes it here, and their maps agree: the [CLS] and [SEP] rows and columns are the
ones the model saw in training. A BERT tokenizer without a template gets ``[CLS] ... [SEP]`` from its
``cls_id`` and ``sep_id``.
"""

from __future__ import annotations

from attnlab.core.errors import TokenizerError

#: the families whose inputs begin and end with special tokens (their tokenizer's template)
ENCODER_FAMILIES: tuple[str, ...] = ("bert",)


def adds_specials(model) -> bool:
    """Whether ``model``'s family reads its text between special tokens (an encoder such as BERT)."""
    return getattr(getattr(model, "config", None), "family", None) in ENCODER_FAMILIES


def encode_for(model, tokenizer, text: str) -> list[int]:
    """The ids of ``text`` as ``model`` was trained to read them: bare for a GPT, ``[CLS] ... [SEP]`` (the
    tokenizer's template) for a BERT. TokenizerError (one line) for a BERT whose tokenizer has no [CLS]/[SEP]."""
    if not adds_specials(model):
        return tokenizer.encode(text)
    cls_id, sep_id = getattr(tokenizer, "cls_id", None), getattr(tokenizer, "sep_id", None)
    if cls_id is None or sep_id is None:
        raise TokenizerError(f"a {model.config.family} model reads [CLS] text [SEP], and this tokenizer "
                             f"({tokenizer!r}) has no [CLS] or [SEP]")
    backend = getattr(tokenizer, "tokenizer", None)  # the ``tokenizers`` object behind a WordPiece
    if getattr(backend, "post_processor", None) is not None:
        return backend.encode(text, add_special_tokens=True).ids  # the template, as encode_batch writes rows
    return [cls_id, *tokenizer.encode(text), sep_id]


def n_specials(model, tokenizer) -> int:
    """How many ids ``encode_for`` adds around a text (0 for a GPT, 2 for BERT's [CLS] and [SEP])."""
    return len(encode_for(model, tokenizer, "")) if adds_specials(model) else 0
