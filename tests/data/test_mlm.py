"""MLM data: BERT's 80/10/10 masking (statistically), specials never selected, NSP pairs, determinism."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.core.errors import DataError
from attnlab.data.mlm import MLMDataset, Specials, mask_tokens, pack_segments

SPECIALS = Specials(pad=0, cls=2, sep=3, mask=4, all=frozenset({0, 1, 2, 3, 4}))


def _within(observed: float, p: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(observed - p) <= sigmas * math.sqrt(p * (1 - p) / n)


def test_masking_proportions_match_bert():
    g = torch.Generator().manual_seed(0)
    V = 100
    ids = torch.randint(5, V, (400, 128), generator=g)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True  # [CLS] ... [SEP]
    special[:, 100:-1] = True  # padding
    ids[:, 0], ids[:, -1], ids[:, 100:-1] = 2, 3, 0
    out, labels = mask_tokens(ids, special, 4, torch.arange(5, V), g)
    selected = labels != -100
    n_candidates = int((~special).sum())
    assert not (selected & special).any()  # [CLS], [SEP], [PAD] are never selected
    assert _within(selected.sum().item() / n_candidates, 0.15, n_candidates)
    assert torch.equal(labels[selected], ids[selected])  # labels hold the original ids
    assert torch.equal(out[~selected], ids[~selected])  # unselected tokens are untouched
    n = int(selected.sum())
    as_mask = (out[selected] == 4).float().mean().item()
    unchanged = (out[selected] == ids[selected]).float().mean().item()
    random_other = 1 - as_mask - unchanged
    assert _within(as_mask, 0.8, n) and _within(random_other, 0.1 * (1 - 1 / 95), n, 6)
    assert _within(unchanged, 0.1 + 0.1 / 95, n, 6)  # a random replacement may hit the same token
    assert out[selected].min() >= 4  # random replacements are never special tokens other than [MASK]


def test_masking_is_a_function_of_the_generator():
    ids = torch.randint(5, 50, (8, 16))
    special = torch.zeros_like(ids, dtype=torch.bool)
    a = mask_tokens(ids, special, 4, torch.arange(5, 50), torch.Generator().manual_seed(3))
    b = mask_tokens(ids, special, 4, torch.arange(5, 50), torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_pack_segments_keeps_lines_whole_and_in_order():
    lines = [[5, 6], [], [7, 8, 9], [10], list(range(11, 20))]
    segs = pack_segments(lines, 4)
    assert segs == [[5, 6], [7, 8, 9, 10], [11, 12, 13, 14]]


def _dataset(nsp: bool) -> MLMDataset:
    lines = [[5 + (i * 7 + j) % 40 for j in range(3 + i % 4)] for i in range(400)]
    return MLMDataset(lines, SPECIALS, 50, max_len=24, nsp=nsp, val_fraction=0.1)


def test_batches_have_bert_layout_and_nsp_pairs_are_half_real():
    data = _dataset(nsp=True)
    g = torch.Generator().manual_seed(0)
    b = data.batch("train", 256, g)
    ids, mask, types, nsp = b["input_ids"], b["attention_mask"], b["token_type_ids"], b["next_sentence_label"]
    assert ids.shape[1] <= 24 and (ids[:, 0] == 2).all()
    assert _within(nsp.float().mean().item(), 0.5, 256)
    segs = data.segments["train"]
    for row in range(8):  # [CLS] A [SEP] B [SEP]; B follows A exactly when the label says IsNext
        labels = b["mlm_labels"][row]
        orig = torch.where(labels != -100, labels, ids[row])[mask[row].bool()].tolist()
        seps = [i for i, t in enumerate(orig) if t == 3]
        a, bb = orig[1:seps[0]], orig[seps[0] + 1:seps[1]]
        i = segs.index(a)
        assert (segs[i + 1] == bb) == (nsp[row].item() == 0)
        assert types[row, : seps[0] + 1].eq(0).all() and types[row, seps[0] + 1: len(orig)].eq(1).all()


def test_too_little_text_is_a_data_error():
    with pytest.raises(DataError, match="segments"):
        MLMDataset([[5, 6]], SPECIALS, 50, max_len=24, nsp=False)
