"""The classification scores equal scikit-learn's on random predictions (absent classes included)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.training.metrics import accuracy, confusion_matrix, macro_f1

sklearn_metrics = pytest.importorskip("sklearn.metrics")


@pytest.mark.filterwarnings("ignore:A single label was found")
@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=60))
def test_scores_equal_scikit_learns(k, pairs):
    true = torch.tensor([t % k for t, _ in pairs])
    pred = torch.tensor([p % k for _, p in pairs])
    labels = list(range(k))
    assert accuracy(true, pred) == pytest.approx(sklearn_metrics.accuracy_score(true, pred))
    assert macro_f1(true, pred, k) == pytest.approx(
        sklearn_metrics.f1_score(true, pred, labels=labels, average="macro", zero_division=0))
    assert confusion_matrix(true, pred, k).tolist() == sklearn_metrics.confusion_matrix(true, pred,
                                                                                        labels=labels).tolist()
