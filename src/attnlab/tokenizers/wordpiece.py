"""BERT's WordPiece with ``[PAD]``, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``: trained with the
``tokenizers`` library, or loaded from a Hugging Face ``tokenizer.json`` or ``vocab.txt``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from attnlab.core.errors import TokenizerError
from attnlab.tokenizers.base import DEFAULT_BPE_VOCAB_SIZE, Tokenizer, as_iterator, read_tokenizer_file

WORDPIECE_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def canonical_order(vocab: dict[str, int]) -> dict[str, int]:
    """The trained vocabulary with ids that do not depend on the order the trainer made its pieces.

    The trainer numbers its pieces in the order it creates them; WordPiece encodes by longest match in the
    set, so that order carries no meaning. Here the special tokens keep ids 0..4, the alphabet (characters and
    ``##`` + character) follows sorted by string, then the merged pieces sorted by string.
    """
    specials = [t for t in WORDPIECE_SPECIAL_TOKENS if t in vocab]
    rest = sorted((t for t in vocab if t not in specials), key=lambda t: (len(t.removeprefix("##")) > 1, t))
    return {t: i for i, t in enumerate([*specials, *rest])}


def continuing_alphabet(texts: Sequence[str], tokenizer: HFTokenizer) -> list[str]:
    """``##`` + every character that follows another inside a word of ``texts`` (after ``tokenizer``'s
    normaliser and pre-tokenizer), sorted.

    Why: the ``tokenizers`` trainer creates these pieces while iterating over a hash map of words whose order
    changes from process to process, and numbers them as it goes; merges of equal count are then chosen by
    those numbers, so two runs on one text learned different vocabularies (tokenizers#1794; in attnlab's BERT
    test corpus, six processes gave six different sets). Handed to the trainer first, as reserved tokens, they
    get these sorted ids instead, and every run learns the same pieces. Lines are split on ``\\n`` only: it
    is whitespace to BERT's pre-tokenizer, so no word spans two lines.
    """
    normalizer, pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer
    following: set[str] = set()
    for text in texts:
        for line in text.split("\n"):
            for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)):
                following.update(word[1:])
    return sorted("##" + c for c in following)


class WordPieceTokenizer(Tokenizer):
    """BERT's WordPiece: lower-casing normaliser, whitespace/punctuation split, ``##`` sub-words.

    ``encode`` gives the plain ids of a text; ``encode_batch`` adds the special tokens BERT expects,
    ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with segment ids 0 for A and 1 for B, and pads
    with [PAD] to the longest row. The file is the ``tokenizers`` library's own JSON (Hugging
    Face's ``tokenizer.json``); a BERT ``vocab.txt`` loads too.
    """

    kind: ClassVar[str] = "wordpiece"

    def __init__(self, tokenizer: HFTokenizer) -> None:
        """Wrap a ``tokenizers.Tokenizer`` with a WordPiece model holding BERT's five special tokens."""
        tokenizer.no_padding()  # padding and truncation are done per batch by encode_batch
        tokenizer.no_truncation()
        missing = [t for t in WORDPIECE_SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            raise TokenizerError(f"a WordPiece vocabulary needs the tokens {', '.join(missing)}")
        self.tokenizer = tokenizer
        ids = [tokenizer.token_to_id(t) for t in WORDPIECE_SPECIAL_TOKENS]
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids
        self.special_ids: frozenset[int] = frozenset(ids)

    @staticmethod
    def _pipeline(tokenizer: HFTokenizer, lowercase: bool) -> None:
        """BERT's normaliser, pre-tokenizer and decoder around a WordPiece model."""
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix="##")

    @classmethod
    def _with_template(cls, tokenizer: HFTokenizer, lowercase: bool) -> WordPieceTokenizer:
        """The pipeline plus the [CLS] A [SEP] (B [SEP]) template with segment ids."""
        cls._pipeline(tokenizer, lowercase)
        cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        if cls_id is not None and sep_id is not None:
            tokenizer.post_processor = processors.TemplateProcessing(
                single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
            )
        return cls(tokenizer)

    @classmethod
    def train(
        cls, text_or_iterator: str | Iterable[str], vocab_size: int = DEFAULT_BPE_VOCAB_SIZE, lowercase: bool = True
    ) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary of ``vocab_size`` (special tokens first: [PAD] = 0, ..., [MASK] = 4)."""
        texts = list(as_iterator(text_or_iterator))  # read twice: the pieces reserved, then the training
        tokenizer = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
        cls._pipeline(tokenizer, lowercase)
        reserved = [*WORDPIECE_SPECIAL_TOKENS, *continuing_alphabet(texts, tokenizer)]  # the same ids every run
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=reserved, show_progress=False)
        tokenizer.train_from_iterator(texts, trainer=trainer)
        canonical = HFTokenizer(models.WordPiece(canonical_order(tokenizer.get_vocab()), unk_token="[UNK]"))
        canonical.add_special_tokens(list(WORDPIECE_SPECIAL_TOKENS))  # "[MASK]" in a text is the token, as before
        return cls._with_template(canonical, lowercase)

    @classmethod
    def characters(cls, text: str) -> WordPieceTokenizer:
        """A character-level BERT tokenizer: the five special tokens (ids 0..4), then every character of ``text``
        in sorted order, each its own token. No normaliser (case and accents kept: in SMILES "c" is an aromatic
        carbon, "C" an aliphatic one); the pre-tokenizer splits every character off; [CLS] A [SEP] as BERT's;
        a character outside the vocabulary becomes [UNK]. The file is a standard ``tokenizers`` JSON."""
        chars = sorted(set(text) - set(WORDPIECE_SPECIAL_TOKENS))
        if not chars:
            raise TokenizerError("cannot build a character vocabulary from empty text")
        vocab = {t: i for i, t in enumerate([*WORDPIECE_SPECIAL_TOKENS, *chars])}
        tokenizer = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        tokenizer.add_special_tokens(list(WORDPIECE_SPECIAL_TOKENS))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        return cls(tokenizer)

    @classmethod
    def from_vocab(cls, file: str | Path, lowercase: bool = True) -> WordPieceTokenizer:
        """Load a BERT ``vocab.txt`` (one token a line, id = line number)."""
        file = Path(file)
        lines = read_tokenizer_file(file).splitlines()
        vocab = {tok: i for i, tok in enumerate(lines) if tok}
        if not vocab:
            raise TokenizerError(f"empty vocabulary: {file}")
        if "[UNK]" not in vocab:
            raise TokenizerError(f"a WordPiece vocabulary needs the tokens [UNK]: {file}")
        return cls._with_template(HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]")), lowercase)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """WordPiece ids of ``text``, without [CLS]/[SEP]."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Words re-joined from their pieces (``##`` continuations glued), special tokens kept."""
        return self.tokenizer.decode(self._checked_ids(ids), skip_special_tokens=False)

    def encode_batch(
        self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_len: int = 512
    ) -> dict[str, list[list[int]]]:
        """[CLS] A [SEP] (B [SEP]) per row, cut to ``max_len`` (longest text first), padded with [PAD].

        Returns lists of equal length rows: ``input_ids``, ``attention_mask`` (1 = token, 0 = [PAD])
        and ``token_type_ids`` (0 = A, 1 = B).
        """
        if max_len < (5 if pairs is not None else 3):
            raise TokenizerError(f"max_len={max_len} leaves no room for text between [CLS] and [SEP]")
        self.tokenizer.enable_truncation(max_len)
        try:
            inputs = list(texts) if pairs is None else list(zip(texts, pairs, strict=True))
            encodings = self.tokenizer.encode_batch(inputs, add_special_tokens=True)
        finally:
            self.tokenizer.no_truncation()
        T = max((len(e.ids) for e in encodings), default=0)
        out: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "token_type_ids": []}
        for e in encodings:
            pad = T - len(e.ids)
            out["input_ids"].append(e.ids + [self.pad_id] * pad)
            out["attention_mask"].append([1] * len(e.ids) + [0] * pad)
            out["token_type_ids"].append(e.type_ids + [0] * pad)
        return out

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token`` (a word piece or a special token), None if it is not in the vocabulary."""
        return self.tokenizer.token_to_id(token)

    def to_json(self) -> str:
        return self.tokenizer.to_str(pretty=True) + "\n"
