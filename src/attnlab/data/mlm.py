"""Masked-language-model data: BERT's masking rule and (optionally) next-sentence pairs.

Masking (Devlin et al. 2019): each non-special token is *selected* with probability p (0.15); a
selected token is replaced by [MASK] with probability 0.8, by a random non-special token with 0.1,
and left unchanged with 0.1. The label is the original id at selected positions and -100 (no loss)
everywhere else, so the loss is computed on the selected positions only. [CLS], [SEP] and [PAD]
are never selected. All randomness comes from the ``torch.Generator`` passed in, so a resumed run
draws exactly the batches the uninterrupted run would have drawn.

Next-sentence prediction: example = [CLS] A [SEP] B [SEP], where B is the segment that follows A in
the text with probability 1/2 (label 0, "IsNext") and a random segment otherwise (label 1, "NotNext").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.core.errors import DataError

IGNORE_INDEX = -100


def mask_tokens(
    input_ids: Tensor, special: Tensor, mask_id: int, replacement_ids: Tensor, generator: torch.Generator,
    mask_prob: float = 0.15, mask_token_prob: float = 0.8, random_token_prob: float = 0.1,
) -> tuple[Tensor, Tensor]:
    """BERT masking of input_ids (B, T). ``special`` (B, T) is True at tokens never selected ([CLS], [SEP],
    [PAD]); random replacements are drawn uniformly from ``replacement_ids`` (1-D, the non-special ids).

    Returns (masked input_ids (B, T), labels (B, T): the original id where selected, else -100).
    """
    selected = (torch.rand(input_ids.shape, generator=generator) < mask_prob) & ~special  # (B, T)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    r = torch.rand(input_ids.shape, generator=generator)  # which of the three fates a selected token meets
    to_mask = selected & (r < mask_token_prob)
    to_random = selected & (r >= mask_token_prob) & (r < mask_token_prob + random_token_prob)
    random_ids = replacement_ids[torch.randint(len(replacement_ids), input_ids.shape, generator=generator)]
    out = torch.where(to_mask, torch.full_like(input_ids, mask_id), input_ids)
    out = torch.where(to_random, random_ids, out)
    return out, labels


@dataclass
class Specials:
    """The ids of BERT's special tokens ([PAD], [CLS], [SEP], [MASK]) and the set of all special ids."""
    pad: int
    cls: int
    sep: int
    mask: int
    all: frozenset[int]


def pack_segments(lines: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Concatenate consecutive tokenized lines into segments of at most ``max_tokens`` tokens (a line
    longer than that is cut); empty lines are skipped."""
    segments: list[list[int]] = []
    current: list[int] = []
    for ids in lines:
        if not ids:
            continue
        ids = ids[:max_tokens]
        if current and len(current) + len(ids) > max_tokens:
            segments.append(current)
            current = []
        current = current + ids
    if current:
        segments.append(current)
    return segments


class MLMDataset:
    """Segments of consecutive lines of a text, turned into masked (and optionally NSP) batches.

    Without NSP a segment fills ``max_len - 2`` tokens: [CLS] S [SEP]. With NSP each segment holds at
    most ``(max_len - 3) // 2`` tokens so that [CLS] A [SEP] B [SEP] fits. The first ``1 - val_fraction``
    of the segments train, the rest validate (contiguous, so no text is in both).
    """

    def __init__(self, lines: list[list[int]], specials: Specials, vocab_size: int, max_len: int, nsp: bool,
                 val_fraction: float = 0.1) -> None:
        if max_len < (5 if nsp else 3):
            raise DataError(f"max_len={max_len} leaves no room for text between [CLS] and [SEP]")
        self.specials, self.vocab_size, self.max_len, self.nsp = specials, vocab_size, max_len, nsp
        per_segment = (max_len - 3) // 2 if nsp else max_len - 2
        segments = pack_segments(lines, per_segment)
        n_val = int(len(segments) * val_fraction)
        if len(segments) - n_val < 2 or n_val < 2:
            raise DataError(f"the text gives only {len(segments)} segments of up to {per_segment} tokens; "
                            "need at least 2 for training and 2 for validation (more text or a smaller max_len)")
        self.segments = {"train": segments[: len(segments) - n_val], "val": segments[len(segments) - n_val:]}
        self.replacement_ids = torch.tensor([i for i in range(vocab_size) if i not in specials.all])

    def counts(self) -> Tensor:
        """How often each id occurs in the training segments (V,): the unigram baseline."""
        flat = torch.tensor([i for s in self.segments["train"] for i in s], dtype=torch.long)
        return torch.bincount(flat, minlength=self.vocab_size)

    def batch(self, split: str, batch_size: int, generator: torch.Generator, mask_prob: float = 0.15,
              mask_token_prob: float = 0.8, random_token_prob: float = 0.1,
              shard: tuple[int, int] = (0, 1)) -> dict[str, Tensor]:
        """input_ids, attention_mask, token_type_ids, mlm_labels (B, max_len), and next_sentence_label (B,)."""
        segs = self.segments[split]
        rank, world = shard
        n_own = len(segs) // world if split == "train" and world > 1 else len(segs)
        offset = rank * n_own if split == "train" and world > 1 else 0
        sp = self.specials
        starts = (torch.randint(n_own - (1 if self.nsp else 0), (batch_size,), generator=generator) + offset).tolist()
        rows, types, nsp_labels = [], [], []
        coin = torch.rand(batch_size, generator=generator).tolist()
        others = torch.randint(len(segs), (batch_size,), generator=generator).tolist()
        for b, i in enumerate(starts):
            if not self.nsp:
                ids = [sp.cls, *segs[i], sp.sep]
                rows.append(ids)
                types.append([0] * len(ids))
                continue
            is_next = coin[b] < 0.5
            j = i + 1 if is_next else others[b]
            if not is_next and j == i + 1:  # a "random" segment that happens to be the real next one
                j = (j + 1) % len(segs)
            a, bb = segs[i], segs[j]
            ids = [sp.cls, *a, sp.sep, *bb, sp.sep]
            rows.append(ids)
            types.append([0] * (len(a) + 2) + [1] * (len(bb) + 1))
            nsp_labels.append(0 if is_next else 1)
        T = max(len(r) for r in rows)
        input_ids = torch.full((batch_size, T), sp.pad, dtype=torch.long)
        token_type_ids = torch.zeros((batch_size, T), dtype=torch.long)
        attention_mask = torch.zeros((batch_size, T), dtype=torch.long)
        for b, (r, t) in enumerate(zip(rows, types, strict=True)):
            input_ids[b, : len(r)] = torch.tensor(r)
            token_type_ids[b, : len(t)] = torch.tensor(t)
            attention_mask[b, : len(r)] = 1
        special = (input_ids == sp.pad) | (input_ids == sp.cls) | (input_ids == sp.sep)
        masked, labels = mask_tokens(input_ids, special, sp.mask, self.replacement_ids, generator,
                                     mask_prob, mask_token_prob, random_token_prob)
        out = {"input_ids": masked, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
               "mlm_labels": labels}
        if self.nsp:
            out["next_sentence_label"] = torch.tensor(nsp_labels, dtype=torch.long)
        return out
