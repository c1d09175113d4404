"""Powder X-ray diffraction patterns of generated crystals, labelled by crystal system (the ``[materials]`` extra).

Pattern i of ``generate(n, seed)`` (seeded by (seed, i), so any pattern can be re-drawn):

    system   the i-th of the seven crystal systems in turn (balanced classes)
    crystal  PyXtal's random symmetric crystal in a space group drawn uniformly from that system's range
             (triclinic 1-2, monoclinic 3-15, orthorhombic 16-74, tetragonal 75-142, trigonal 143-167,
             hexagonal 168-194, cubic 195-230), of one of COMPOSITIONS; a space group whose Wyckoff positions
             cannot hold the composition is re-drawn
    pattern  pymatgen's XRDCalculator (Cu K-alpha, 1.5406 A): the peaks (2 theta in 10-80 degrees, intensity
             scaled to 100 for the strongest), from the structure factors and Lorentz-polarisation factors

Two views of a pattern, for the two models the lecture compares:

    peaks    the K strongest peaks as a set of (2 theta / 90, I / 100), sorted by angle and padded with (0, 0)
             when fewer: (N, K, 2), for a transformer over the peak set
    binned   the pattern on a grid of 0.1 degree from 10 to 80 (700 bins), each peak a Gaussian of sd 0.1 degree
             scaled by its intensity: (N, 700), for an MLP

Telling the systems apart needs the ratios of peak positions (for a cubic lattice 1/d^2 = (h^2 + k^2 + l^2)/a^2,
so sin^2 theta of the peaks fall in ratios of integers); low symmetry gives many more, irregular peaks.
Generating a pattern takes ~50 ms, so sets are cached as .npz under the attnlab cache folder.
"""

from __future__ import annotations

import warnings

import numpy as np

from attnlab.core.errors import DataError

SYSTEMS = {"triclinic": (1, 2), "monoclinic": (3, 15), "orthorhombic": (16, 74), "tetragonal": (75, 142),
           "trigonal": (143, 167), "hexagonal": (168, 194), "cubic": (195, 230)}
COMPOSITIONS = ((("Si", "O"), (2, 4)), (("Na", "Cl"), (4, 4)), (("Ti", "O"), (2, 4)), (("Fe", "S"), (2, 4)),
                (("Mg", "Al", "O"), (1, 2, 4)), (("Ca", "Ti", "O"), (1, 1, 3)), (("Zn", "S"), (2, 2)),
                (("Cu",), (4,)))
TWO_THETA = (10.0, 80.0)
K_PEAKS = 32
BINS = np.arange(TWO_THETA[0], TWO_THETA[1], 0.1) + 0.05  # 700 bin centres


def pattern(seed: int, index: int) -> tuple[str, np.ndarray, np.ndarray]:
    """(crystal system, 2 theta (P,), intensities (P,)) of pattern ``index`` of ``seed``."""
    from attnlab.core.extras import require

    require("pyxtal", "XRD patterns of generated crystals")
    from pymatgen.analysis.diffraction.xrd import XRDCalculator
    from pyxtal import pyxtal

    system = list(SYSTEMS)[index % len(SYSTEMS)]
    rng = np.random.default_rng([seed, index])
    for _ in range(50):
        group = int(rng.integers(SYSTEMS[system][0], SYSTEMS[system][1] + 1))
        species, counts = COMPOSITIONS[int(rng.integers(len(COMPOSITIONS)))]
        crystal = pyxtal()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                crystal.from_random(3, group, list(species), list(counts), random_state=int(rng.integers(2**31)))
                p = XRDCalculator().get_pattern(crystal.to_pymatgen(), two_theta_range=TWO_THETA)
        except Exception:
            continue
        if len(p.x) >= 3:
            return system, np.asarray(p.x, dtype=np.float64), np.asarray(p.y, dtype=np.float64)
    raise DataError(f"could not generate a {system} crystal for pattern {index} of seed {seed}")


def peak_set(two_theta: np.ndarray, intensity: np.ndarray, k: int = K_PEAKS) -> np.ndarray:
    """The k strongest peaks as (k, 2) [2 theta / 90, I / 100], sorted by angle, zero-padded."""
    keep = np.sort(np.argsort(-intensity, kind="stable")[:k])
    out = np.zeros((k, 2), dtype=np.float32)
    out[: len(keep), 0] = two_theta[keep] / 90.0
    out[: len(keep), 1] = intensity[keep] / 100.0
    return out


def binned(two_theta: np.ndarray, intensity: np.ndarray, sd: float = 0.1) -> np.ndarray:
    """The pattern on BINS: sum_p I_p / 100 exp(-(x - 2 theta_p)^2 / (2 sd^2)), (700,) float32."""
    x = BINS[:, None] - two_theta[None, :]
    return (np.exp(-0.5 * (x / sd) ** 2) @ (intensity / 100.0)).astype(np.float32)


def generate(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """n patterns -> (peaks (n, K, 2), binned (n, 700), crystal systems (n,)); cached on disk by (n, seed)."""
    from attnlab.core.fileio import default_cache_dir

    if n < 14:
        raise DataError(f"generated XRD patterns need n >= 14 (two of each crystal system), got {n}")
    if seed < 0:
        raise DataError(f"the XRD seed must be >= 0, got {seed}")
    file = default_cache_dir() / "xrd" / f"xrd-v2-{n}-{seed}-k{K_PEAKS}.npz"
    if file.is_file():
        with np.load(file) as z:
            return z["peaks"], z["binned"], [str(s) for s in z["systems"]]
    peaks, bins, systems = [], [], []
    for i in range(n):
        system, x, y = pattern(seed, i)
        peaks.append(peak_set(x, y))
        bins.append(binned(x, y))
        systems.append(system)
    out = np.stack(peaks), np.stack(bins), systems
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".tmp.npz")
    np.savez(tmp, peaks=out[0], binned=out[1], systems=np.array(systems))
    tmp.replace(file)
    return out
