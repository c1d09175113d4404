"""GPT-2-style byte-level BPE, trained with the ``tokenizers`` library: every string round-trips exactly
and nothing is ever unknown. Its file is the ``tokenizers`` library's own JSON, so Hugging Face tools
read it as-is."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import ClassVar

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from attnlab.core.errors import TokenizerError
from attnlab.tokenizers.base import DEFAULT_BPE_VOCAB_SIZE, Tokenizer, as_iterator

DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>",)
BYTES = 256  # the byte symbols every byte-level vocabulary starts from
PARALLEL_ENCODE_MIN_CHARS = 1_000_000
# Before the last newline of a blank-line run, e.g. "speech.\n" | "\nNext:": GPT-2's pre-tokenizer
# always splits there, so encoding the pieces separately gives the same ids.
_PARAGRAPH_CUT = re.compile(r"(?<=\n)(?=\n\S)")


class BPETokenizer(Tokenizer):
    """Byte-level BPE like GPT-2: any string encodes, and ``decode(encode(s)) == s`` exactly."""

    kind: ClassVar[str] = "bpe"

    def __init__(self, tokenizer: HFTokenizer) -> None:
        """Wrap a ``tokenizers.Tokenizer`` (a BPE model with byte-level pre-tokenizer/decoder)."""
        self.tokenizer = tokenizer

    @classmethod
    def train(
        cls,
        text_or_iterator: str | Iterable[str],
        vocab_size: int = DEFAULT_BPE_VOCAB_SIZE,
        special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
    ) -> BPETokenizer:
        """Learn merges from a string (or an iterator of strings) up to ``vocab_size`` tokens.

        The 256 byte symbols are always in the vocabulary (so nothing is unknown), plus
        ``special_tokens`` (ids first, from 0); ``vocab_size`` counts all of them, so a smaller one is refused
        (``TokenizerError``) rather than silently grown.
        """
        if vocab_size < (floor := BYTES + len(special_tokens)):
            raise TokenizerError(f"a byte-level BPE vocabulary holds its {BYTES} bytes and {len(special_tokens)} "
                                 f"special token(s), so its size must be >= {floor}, got {vocab_size}")
        tokenizer = HFTokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(special_tokens),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(as_iterator(text_or_iterator), trainer=trainer)
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Byte-level BPE ids of ``text`` (special-token strings map to their single id).

        Long texts are cut at paragraph breaks and encoded in parallel; the cuts fall where the
        GPT-2 pre-tokenizer splits anyway, so the ids equal those of one sequential call.
        """
        if len(text) < PARALLEL_ENCODE_MIN_CHARS or not self._can_cut(text):
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        chunks = _PARAGRAPH_CUT.split(text)
        encodings = self.tokenizer.encode_batch(chunks, add_special_tokens=False)
        return [i for encoding in encodings for i in encoding.ids]

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of ``ids``, special tokens kept; out-of-range ids raise TokenizerError."""
        return self.tokenizer.decode(self._checked_ids(ids), skip_special_tokens=False)

    def _can_cut(self, text: str) -> bool:
        """True if cutting ``text`` at paragraph breaks cannot change its ids.

        That needs GPT-2's pre-tokenizer regex, no normalizer, and no special token in the text
        (special tokens are split off before pre-tokenization, which would move the boundaries).
        """
        pre_tokenizer = self.tokenizer.pre_tokenizer
        splits_like_gpt2 = (
            self.tokenizer.normalizer is None
            and isinstance(pre_tokenizer, pre_tokenizers.ByteLevel)
            and pre_tokenizer.use_regex
            and not pre_tokenizer.add_prefix_space
        )
        added = self.tokenizer.get_added_tokens_decoder().values()
        return splits_like_gpt2 and not any(token.content in text for token in added)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string (e.g. ``"<|endoftext|>"``), or ``None`` if it has none."""
        return self.tokenizer.token_to_id(token)

    def to_json(self) -> str:
        """The ``tokenizers`` library's own JSON serialisation."""
        return self.tokenizer.to_str(pretty=True) + "\n"
