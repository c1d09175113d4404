"""XRD patterns of generated crystals: reproducible, balanced, physically right (a cubic pattern's sin^2 theta fall
in ratios of integers h^2 + k^2 + l^2), the two views of a pattern, the disk cache, and the MLP that reads one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.core.errors import DataError

xrd = pytest.importorskip("attnlab.data.xrd")
pytest.importorskip("pyxtal")


def test_a_pattern_is_redrawn_from_its_seed_and_index_and_the_systems_take_turns():
    a, b = xrd.pattern(5, 6), xrd.pattern(5, 6)
    assert a[0] == b[0] == "cubic" and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    assert [xrd.pattern(5, i)[0] for i in range(3)] == ["triclinic", "monoclinic", "orthorhombic"]
    assert a[1].min() >= 10 and a[1].max() <= 80 and math.isclose(a[2].max(), 100.0)


@pytest.mark.parametrize("index", [6, 13, 20])
def test_a_cubic_pattern_has_sin2_theta_in_integer_ratios(index):
    system, two_theta, _ = xrd.pattern(0, index)
    assert system == "cubic"
    s2 = np.sin(np.radians(two_theta / 2)) ** 2
    # 1/d^2 = (h^2 + k^2 + l^2) / a^2: some first integer N_1 makes every N_1 s2 / s2[0] an integer
    fits = [n1 for n1 in range(1, 13) if np.abs(n1 * s2 / s2[0] - np.round(n1 * s2 / s2[0])).max() < 0.03]
    assert fits, two_theta


def test_peak_sets_and_binned_patterns():
    x, y = np.array([20.0, 30.0, 40.0, 50.0]), np.array([10.0, 100.0, 5.0, 50.0])
    p = xrd.peak_set(x, y, k=3)
    assert np.allclose(p, [[20 / 90, 0.1], [30 / 90, 1.0], [50 / 90, 0.5]])
    assert xrd.peak_set(x, y, k=6)[4:].tolist() == [[0, 0], [0, 0]]  # padding
    b = xrd.binned(x, y)
    assert b.shape == (700,) and abs(xrd.BINS[int(b.argmax())] - 30.0) < 0.1
    assert b.sum() * 0.1 == pytest.approx((y / 100).sum() * 0.1 * math.sqrt(2 * math.pi), rel=1e-3)


def test_sets_are_cached_and_bad_sizes_refused(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    peaks, bins, systems = xrd.generate(14, 3)
    assert peaks.shape == (14, 32, 2) and bins.shape == (14, 700) and systems == list(xrd.SYSTEMS) * 2
    assert len(list((tmp_path / "xrd").glob("*.npz"))) == 1
    said = capfd.readouterr().err.splitlines()  # the wait is announced, then timed
    assert said[0].startswith("generating 14 XRD patterns (seed 3) on 1 worker process(es)")
    assert said[-1].startswith("generated 14 XRD patterns in ")
    again = xrd.generate(14, 3)
    assert capfd.readouterr().err == ""  # from the cache: nothing to wait for
    assert np.array_equal(again[0], peaks) and again[2] == systems
    with pytest.raises(DataError, match="n >= 14"):
        xrd.generate(5, 0)


def test_the_mlp_reads_a_fixed_length_input_only():
    from attnlab.models import ModelConfig, build_model

    model = build_model(ModelConfig.from_mapping({"family": "mlp", "n_features": 1, "n_steps": 700, "n_classes": 7}))
    out = model(features=torch.randn(3, 700, 1), labels=torch.tensor([0, 1, 6]))
    assert out.predictions.shape == (3, 7) and abs(float(out.loss) - math.log(7)) < 1e-5  # a zero head: uniform
    with pytest.raises(DataError, match="features must be"):
        model(features=torch.randn(3, 699, 1))
