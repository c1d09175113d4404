"""A linear probe's split is checked before anything is embedded: a test_fraction that leaves the training part
one class (or under 2 rows) is one line, where scikit-learn used to raise after the encoder's pass (exit 1)."""

from __future__ import annotations

import pytest
import torch

from attnlab.core.errors import DataError
from attnlab.inspect.encoders import linear_probe, probe_split


def test_a_split_that_leaves_one_class_to_fit_is_refused():
    labels = ["a", "b"] * 20
    train, test = probe_split(labels, 0.5, 0)
    assert len(train) + len(test) == 40 and len({labels[i] for i in train}) == 2
    with pytest.raises(DataError, match=r"test_fraction=0\.99 of 40 rows leaves 1 row of 1 class"):
        probe_split(labels, 0.99, 0)
    with pytest.raises(DataError, match="leaves 1 row to fit"):  # numbers: ridge needs 2 rows, any values
        probe_split([float(i) for i in range(40)], 0.99, 0, numeric=True)
    with pytest.raises(DataError, match="smaller test_fraction"):  # the library call refuses as the CLI does
        linear_probe(torch.randn(40, 8), labels, 0.99, 0)
