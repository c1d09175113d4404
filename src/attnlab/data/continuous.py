"""Continuous inputs for the encoder family: feature sequences and (element, value) sets, from CSV,
NPY/NPZ, or generated benchmarks.

Every loader returns a ``ContinuousData``: either ``features`` (N, T, F) or ``elements``/``values``/
``mask`` (N, S) padded sets, and raw ``targets`` (N,) as strings (class names) or floats.

* CSV, features: a header naming a target column (default ``target``); every other column is one
  step of a univariate sequence, so a row x_1..x_T becomes a (T, 1) sequence (a spectrum, a series).
* CSV, sets: a header with a ``set`` column of space-separated ``name:value`` pairs (``Fe:0.7 Ni:0.3``)
  and the target column. Element names become ids in order of first appearance (saved with the model).
* NPY: a folder holding ``X.npy`` (N, T, F) (or (N, T): F = 1) and ``y.npy`` (N,) / (N, k); or an
  ``.npz`` with ``X`` and ``y``, or ``elements`` (N, S) int, ``values`` (N, S) [, ``mask`` (N, S)] and ``y``.
* Audio: a folder ``ROOT/<class>/*.wav`` (or ``ROOT/train|test/<class>/*.wav``) -> log-mel frames
  (N, T, n_mels), one per 10 ms (``data/audio.py``).
* ``generated:set-interaction``, ``generated:peaks``: the benchmarks below (seeded, no files);
  ``generated:spoken-words``: keywords synthesised with eSpeak NG (``data/spoken.py``); ``generated:xrd``: the
  peak sets of powder XRD patterns of generated crystals, labelled by crystal system, and
  ``generated:xrd-binned`` the same patterns on a 0.1 degree grid (``data/xrd.py``).

Generated set interaction (a property of a composition that depends on pairs of elements):

    y = sum_{i<j} v_i v_j K[e_i, e_j],   K symmetric, K_ab ~ N(0, 1), fixed by the seed

with 2..8 distinct elements per set out of n_elements, values fractions summing to 1. Summing
per-element features first (DeepSets) must encode every pair's coefficient through its ρ network;
attention compares elements pairwise directly.

Generated peaks (a spectrum whose label depends on the relative position of two peaks): T steps,
two Gaussian peaks of width 1.5 at random positions p_1, p_2 plus noise N(0, 0.1^2); class
"near" if |p_1 - p_2| < T/4 else "far" (balanced by construction).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.core.errors import DataError
from attnlab.core.fileio import check_regular_file

GENERATED = ("generated:set-interaction", "generated:peaks", "generated:spoken-words", "generated:xrd",
             "generated:xrd-binned")


@dataclass
class ContinuousData:
    """Numeric inputs and their targets: feature sequences (N, T, F), or sets of (element id, value) pairs with a
    mask."""
    targets: list  # (N,) class names (str) or floats, or (N, k) lists of floats
    features: np.ndarray | None = None  # (N, T, F) float32
    elements: np.ndarray | None = None  # (N, S) int64, padding slots 0
    values: np.ndarray | None = None  # (N, S) float32, padding slots 0
    mask: np.ndarray | None = None  # (N, S) bool, True at real elements
    element_names: list[str] = field(default_factory=list)  # id -> name (sets)
    held_out: np.ndarray | None = None  # (N,) bool: the data's own test split (audio folders), else None
    front: Any = None  # audio.FrontEnd that made the features from audio, else None

    def __len__(self) -> int:
        return len(self.targets)

    @property
    def kind(self) -> str:
        """"features" (sequences of feature vectors) or "set" (element-value pairs)."""
        return "features" if self.features is not None else "set"


# ----------------------------------------------------------------------------- generated benchmarks


def interaction_matrix(n_elements: int, seed: int) -> np.ndarray:
    """The fixed symmetric K (n_elements, n_elements), K_ab ~ N(0, 1)."""
    a = np.random.default_rng(seed + 10_000).standard_normal((n_elements, n_elements))
    return ((a + a.T) / np.sqrt(2)).astype(np.float64)


def set_interaction(n: int, n_elements: int = 32, min_size: int = 2, max_size: int = 8,
                    seed: int = 0) -> ContinuousData:
    """n sets of min_size..max_size distinct elements, fractions v_i, y = sum_{i<j} v_i v_j K[e_i, e_j]."""
    if not 2 <= min_size <= max_size <= n_elements:
        raise DataError(f"set sizes need 2 <= min_size <= max_size <= n_elements, got {min_size}, {max_size}, "
                        f"{n_elements}")
    K = interaction_matrix(n_elements, seed)
    rng = np.random.default_rng(seed)
    elements = np.zeros((n, max_size), dtype=np.int64)
    values = np.zeros((n, max_size), dtype=np.float32)
    mask = np.zeros((n, max_size), dtype=bool)
    targets = []
    for r in range(n):
        size = int(rng.integers(min_size, max_size + 1))
        e = rng.choice(n_elements, size=size, replace=False)
        v = rng.uniform(0.05, 1.0, size=size)
        v = v / v.sum()
        pair = np.outer(v, v) * K[np.ix_(e, e)]  # (size, size): v_i v_j K[e_i, e_j]
        targets.append(float(np.triu(pair, k=1).sum()))
        elements[r, :size], values[r, :size], mask[r, :size] = e, v, True
    names = [f"E{i}" for i in range(n_elements)]
    return ContinuousData(targets=targets, elements=elements, values=values, mask=mask, element_names=names)


def peaks(n: int, length: int = 64, seed: int = 0) -> ContinuousData:
    """n spectra (length, 1) with two Gaussian peaks; label "near" if |p_1 - p_2| < length/4 else "far"."""
    rng = np.random.default_rng(seed)
    t = np.arange(length, dtype=np.float64)
    x = rng.normal(0.0, 0.1, size=(n, length))
    targets = []
    for r in range(n):
        near = r % 2 == 0
        while True:
            p1, p2 = rng.uniform(2, length - 3, size=2)
            if (abs(p1 - p2) < length / 4) == near and abs(p1 - p2) > 3:
                break
        x[r] += np.exp(-0.5 * ((t - p1) / 1.5) ** 2) + np.exp(-0.5 * ((t - p2) / 1.5) ** 2)
        targets.append("near" if near else "far")
    return ContinuousData(targets=targets, features=x[:, :, None].astype(np.float32))


def generated(name: str, n: int, seed: int, front=None) -> ContinuousData:
    """A built-in generated data set by name (``generated:set-interaction``, ``generated:peaks``,
    ``generated:spoken-words``: log-mel frames, its test split spoken by unseen voices), ``n`` rows."""
    if name == "generated:set-interaction":
        return set_interaction(n, seed=seed)
    if name == "generated:peaks":
        return peaks(n, seed=seed)
    if name in ("generated:xrd", "generated:xrd-binned"):
        from attnlab.data import xrd

        peak_sets, bins, systems = xrd.generate(n, seed)
        return ContinuousData(targets=systems, features=peak_sets if name == "generated:xrd" else bins[:, :, None])
    if name == "generated:spoken-words":
        from attnlab.data import spoken
        from attnlab.data.audio import FrontEnd

        front = front or FrontEnd()
        x, words, held = spoken.features(n, seed, front)
        return ContinuousData(targets=words, features=x, held_out=held, front=front)
    raise DataError(f"unknown generated data '{name}'; choose one of {GENERATED}")


# ----------------------------------------------------------------------------- files


def _float(text: str, where: str) -> float:
    try:
        x = float(text)
    except (TypeError, ValueError):
        raise DataError(f"{where}: '{text}' is not a number") from None
    if not np.isfinite(x):
        raise DataError(f"{where}: value {text} is not finite")
    return x


def read_csv(path: Path, target: str = "target", element_names: list[str] | None = None,
             require_target: bool = True) -> ContinuousData:
    """Rows of feature values, or of ``name:value`` sets, plus a target column (see the module doc); without
    ``require_target`` (new rows to predict) the target column may be missing (targets "") and one row is enough."""
    check_regular_file(path, "data file", DataError)
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text") from None
    reader = csv.reader(raw.splitlines())
    header = next(reader, None)
    if not header:
        raise DataError(f"{path}: empty file (need a header row naming a '{target}' column)")
    header = [h.strip() for h in header]
    if target not in header and require_target:
        raise DataError(f"{path}: the header has no target column '{target}' (got {header[:6]})")
    ti = header.index(target) if target in header else -1
    is_set = "set" in header
    si = header.index("set") if is_set else -1
    names = list(element_names or [])
    index = {name: i for i, name in enumerate(names)}
    frozen = element_names is not None
    rows_x: list[list[float]] = []
    rows_set: list[list[tuple[int, float]]] = []
    targets: list = []
    for n, row in enumerate(reader, 2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise DataError(f"{path}:{n}: expected {len(header)} columns, got {len(row)}")
        targets.append(row[ti].strip() if ti >= 0 else "")
        if is_set:
            pairs = []
            for item in row[si].split():
                name, sep, value = item.partition(":")
                if not sep or not name:
                    raise DataError(f"{path}:{n}: set item '{item}' is not name:value")
                if name not in index:
                    if frozen:
                        raise DataError(f"{path}:{n}: element '{name}' is unknown to the model")
                    index[name] = len(names)
                    names.append(name)
                pairs.append((index[name], _float(value, f"{path}:{n}")))
            if not pairs:
                raise DataError(f"{path}:{n}: empty set")
            rows_set.append(pairs)
        else:
            rows_x.append([_float(c, f"{path}:{n}") for j, c in enumerate(row) if j != ti])
    if len(targets) < (4 if require_target else 1):
        raise DataError(f"{path}: need at least {4 if require_target else 1} rows, found {len(targets)}")
    if is_set:
        S = max(len(p) for p in rows_set)
        elements = np.zeros((len(rows_set), S), dtype=np.int64)
        values = np.zeros((len(rows_set), S), dtype=np.float32)
        mask = np.zeros((len(rows_set), S), dtype=bool)
        for r, pairs in enumerate(rows_set):
            elements[r, :len(pairs)] = [e for e, _ in pairs]
            values[r, :len(pairs)] = [v for _, v in pairs]
            mask[r, :len(pairs)] = True
        return ContinuousData(targets=targets, elements=elements, values=values, mask=mask, element_names=names)
    if len(header) - (ti >= 0) < 1:
        raise DataError(f"{path}: no feature columns besides the target '{target}'")
    return ContinuousData(targets=targets, features=np.asarray(rows_x, dtype=np.float32)[:, :, None])


def _load_array(file: Path) -> np.ndarray:
    try:
        return np.load(file, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {file} as a NumPy array: {e}") from None


def read_npy(path: Path, require_target: bool = True) -> ContinuousData:
    """A folder with X.npy + y.npy, or an .npz with X + y or elements + values [+ mask] + y; without
    ``require_target`` (new rows to predict) y may be missing."""
    if path.is_dir():
        arrays = {"X": _load_array(path / "X.npy")}
        if require_target or (path / "y.npy").exists():
            arrays["y"] = _load_array(path / "y.npy")
    else:
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {path} as a NumPy .npz archive: {e}") from None
    if "y" not in arrays and not require_target:
        first = arrays.get("X", arrays.get("elements"))
        arrays["y"] = np.zeros(len(first) if first is not None and first.ndim else 0)
    if "y" not in arrays:
        raise DataError(f"{path}: no target array 'y' (got {sorted(arrays)})")
    y = arrays["y"]
    if y.dtype.kind not in "iufUS" or y.ndim not in (1, 2):
        raise DataError(f"{path}: y must be a (N,) or (N, k) array of numbers or strings, got {y.dtype} {y.shape}")
    targets = [str(t) for t in y] if y.dtype.kind in "US" else y.astype(np.float64).tolist()
    if "X" in arrays:
        X = arrays["X"]
        X = X[:, :, None] if X.ndim == 2 else X
        if X.ndim != 3 or X.dtype.kind not in "iuf":
            raise DataError(f"{path}: X must be a numeric (N, T, F) or (N, T) array, got {X.dtype} {arrays['X'].shape}")
        if len(X) != len(y):
            raise DataError(f"{path}: X has {len(X)} rows but y has {len(y)}")
        if not np.isfinite(X).all():
            raise DataError(f"{path}: X holds NaN or infinite values")
        return ContinuousData(targets=targets, features=X.astype(np.float32))
    if "elements" not in arrays or "values" not in arrays:
        raise DataError(f"{path}: need X, or elements and values (got {sorted(arrays)})")
    e, v = arrays["elements"], arrays["values"]
    m = arrays.get("mask", np.ones(e.shape, dtype=bool))
    if e.ndim != 2 or e.shape != v.shape or m.shape != e.shape or len(e) != len(y):
        raise DataError(f"{path}: elements, values and mask must all be (N, S) with N = len(y) = {len(y)}")
    if e.dtype.kind not in "iu" or (e[m.astype(bool)] < 0).any():
        raise DataError(f"{path}: elements must be non-negative integer ids")
    n_el = int(e.max()) + 1 if e.size else 1
    return ContinuousData(targets=targets, elements=e.astype(np.int64), values=v.astype(np.float32),
                          mask=m.astype(bool), element_names=[f"E{i}" for i in range(n_el)])


def read_continuous(source: str, target: str = "target", n_generated: int = 4000, seed: int = 0,
                    element_names: list[str] | None = None, front=None) -> ContinuousData:
    """Dispatch on ``source``: a generated benchmark, a .csv file, an .npz file, a folder of .npy files,
    or a folder of audio clips in class folders (log-mel frames through ``front``, an ``audio.FrontEnd``)."""
    if source.startswith("generated:"):
        return generated(source, n_generated, seed, front)
    path = Path(source)
    if path.is_dir() and not (path / "X.npy").exists():
        from attnlab.data.audio import FrontEnd, is_audio_folder, read_audio_folder

        if is_audio_folder(path):
            front = front or FrontEnd()
            x, names, held = read_audio_folder(path, front)
            return ContinuousData(targets=names, features=x, held_out=held, front=front)
    if path.is_dir() or path.suffix.lower() == ".npz":
        if not path.exists():
            raise DataError(f"data not found: {path}")
        return read_npy(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    if path.suffix.lower() == ".csv":
        return read_csv(path, target, element_names)
    raise DataError(f"{path}: continuous data must be a .csv file, an .npz file, a folder with X.npy + y.npy, "
                    f"or one of {GENERATED}")
