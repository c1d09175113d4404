"""Micrograph-like images with known defects: grains, boundaries, SEM imaging, and a mask of every defect.

One image (size x size, 32..512 px; the tasks use 64..256) is drawn in four steps, each from the image's own
numpy Generator seeded by (data seed, image index), so any single image and its mask can be re-drawn:

Every length scales with the width: w = size / 64 px, so a larger size is the same field at a finer resolution.

1. **Grains.** A Voronoi tessellation of n random seeds s_k (n = 24 within +-40%): pixel p
   belongs to grain k = argmin_k |p - s_k|. Its distance to the boundary with the second-nearest seed j is
   the distance to their bisector, d_b = (|p - s_j|^2 - |p - s_k|^2) / (2 |s_j - s_k|). Each grain has its
   own grey level (uniform 0.35..0.65) and a faint lamellar texture 0.03 cos(<p, u_k> / lambda_k + phi_k)
   (random direction u_k), as orientation contrast gives grains of different shades.
2. **Boundaries** are etched grooves: the grey level is lowered by 0.25 exp(-(d_b / w)^2).
3. **Defects**, placed at random, at least 2 w apart (a draw that comes closer is re-drawn elsewhere):
     pore       a dark, rounded cavity (grey 0.08) with an irregular rim (radius modulated by low Fourier
                orders) and a bright halo just outside it (the SEM edge effect);
     crack      a thin dark line (grey 0.05) following a persistent random walk, 0.25..0.45 size long,
                tapering from ~1.6 to ~0.6 w;
     inclusion  a compact bright particle (grey 0.88) with a sharp edge: a second phase.
   ``mask`` holds each defect's pixels: 0 none, 1 pore, 2 crack, 3 inclusion (``KINDS``).
4. **Imaging** as in an SEM: random brightness and contrast, a Gaussian blur (sigma 0.6..1.2 w), shot-like
   Gaussian noise (sd 0.03..0.07) and a per-scan-line offset (sd 0.01); clipped and stored as uint8.

Labelled sets (``generate``): ``defect`` (classes "defect" / "none": 1..3 defects of any kinds, or none),
``type`` (one defect: "crack" / "inclusion" / "pore"), ``count`` (0..3 defects of any kinds: "0".."3").
Labels cycle through the classes (balanced sets); the train/val/test split is the caller's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnlab.core.errors import DataError
from attnlab.core.fileio import check_writable_folder
from attnlab.core.resources import check_room
from attnlab.core.staging import staged_folder

KINDS = ("pore", "crack", "inclusion")  # mask codes 1, 2, 3
TASKS = {"defect": ["defect", "none"], "type": ["crack", "inclusion", "pore"], "count": ["0", "1", "2", "3"]}
SOURCES = {"generated:micrographs": "defect", "generated:micrograph-types": "type",
           "generated:micrograph-counts": "count", "generated:micrograph-captions": "count"}
MIN_SIZE, MAX_SIZE = 32, 512


@dataclass
class Defect:
    """One placed defect: its kind, centre (row, column) and bounding box (top, left, bottom, right), in px."""

    kind: str
    centre: tuple[float, float]
    box: tuple[int, int, int, int]


@dataclass
class Micrograph:
    """uint8 image (H, W); uint8 mask (H, W) of defect codes (0 none, 1 + KINDS.index(kind)); the defects."""

    image: np.ndarray
    mask: np.ndarray
    defects: list[Defect] = field(default_factory=list)


# --------------------------------------------------------------------------------------- grains


def grains(size: int, rng: np.random.Generator) -> np.ndarray:
    """Grey levels (H, W) in [0, 1] of a Voronoi grain structure with etched boundaries (steps 1-2)."""
    w = size / 64
    n = round(24 * rng.uniform(0.6, 1.4))
    seeds = rng.uniform(0, size, (n, 2))  # (n, 2): row, column
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    py, px = yy.reshape(-1, 1), xx.reshape(-1, 1)  # (P, 1) each pixel's row and column
    d2 = (py - seeds[:, 0]) ** 2 + (px - seeds[:, 1]) ** 2  # (P, n) squared distances to the seeds
    rows = np.arange(len(d2))
    k = d2.argmin(axis=1)  # (P,) the nearest seed: the pixel's grain
    nearest = d2[rows, k]
    d2[rows, k] = np.inf
    j = d2.argmin(axis=1)  # (P,) the second-nearest seed: the grain across the nearest boundary
    gap = np.linalg.norm(seeds[j] - seeds[k], axis=1)  # (P,)
    d_boundary = (d2[rows, j] - nearest) / (2 * gap)  # (P,) distance to the bisector of the two seeds
    level = rng.uniform(0.35, 0.65, n)  # (n,) each grain's shade
    angle = rng.uniform(0, np.pi, n)
    u = np.stack([np.cos(angle), np.sin(angle)], axis=1)  # (n, 2) texture direction
    wavelength = rng.uniform(1.5, 4.0, n) * w
    phase = rng.uniform(0, 2 * np.pi, n)
    texture = 0.03 * np.cos((py[:, 0] * u[k, 0] + px[:, 0] * u[k, 1]) / wavelength[k] + phase[k])  # (P,)
    grey = level[k] + texture - 0.25 * np.exp(-(d_boundary / w) ** 2)
    return grey.reshape(size, size)


# -------------------------------------------------------------------------------------- defects


def _window(centre: tuple[float, float], radius: float, size: int) -> tuple[slice, slice, np.ndarray, np.ndarray]:
    """The pixel window round ``centre`` of half-width ``radius``, and its row/column coordinates (h, w)."""
    top, left = (min(size, max(0, int(c - radius))) for c in centre)
    bottom, right = (max(lo, min(size, int(c + radius) + 2)) for c, lo in zip(centre, (top, left)))
    yy, xx = np.mgrid[top:bottom, left:right].astype(np.float64)
    return slice(top, bottom), slice(left, right), yy, xx


def _blob(grey: np.ndarray, centre: tuple[float, float], radius: float, rng: np.random.Generator,
          roughness: float) -> np.ndarray:
    """The pixels (H, W) bool of a rounded blob: r(theta) = radius (1 + sum_m a_m cos(m theta + phi_m)),
    m = 2..4, elongated by a random aspect ratio and rotated."""
    size = grey.shape[0]
    rows, cols, yy, xx = _window(centre, radius * 1.8, size)
    aspect, tilt = rng.uniform(0.65, 1.0), rng.uniform(0, np.pi)
    dy, dx = yy - centre[0], xx - centre[1]
    a = dx * np.cos(tilt) + dy * np.sin(tilt)  # along the long axis
    b = (-dx * np.sin(tilt) + dy * np.cos(tilt)) / aspect
    theta, r = np.arctan2(b, a), np.hypot(a, b)
    edge = radius * (1 + sum(rng.uniform(0, roughness) * np.cos(m * theta + rng.uniform(0, 2 * np.pi))
                             for m in (2, 3, 4)))
    inside = np.zeros(grey.shape, dtype=bool)
    inside[rows, cols] = r <= edge
    return inside


def _pore(grey: np.ndarray, centre: tuple[float, float], w: float, rng: np.random.Generator) -> np.ndarray:
    """A dark cavity with a bright halo one w wide just outside it; returns its pixels (H, W) bool."""
    inside = _blob(grey, centre, rng.uniform(2.8, 5.0) * w, rng, roughness=0.12)
    halo = _dilate(inside, max(1, round(w))) & ~inside
    grey[halo] += 0.22
    grey[inside] = 0.08 + 0.03 * rng.standard_normal(inside.sum())
    return inside


def _inclusion(grey: np.ndarray, centre: tuple[float, float], w: float, rng: np.random.Generator) -> np.ndarray:
    """A bright compact second-phase particle with a sharp edge; returns its pixels (H, W) bool."""
    inside = _blob(grey, centre, rng.uniform(2.2, 4.0) * w, rng, roughness=0.2)
    grey[inside] = 0.88 + 0.02 * rng.standard_normal(inside.sum())
    return inside


def _crack(grey: np.ndarray, centre: tuple[float, float], w: float, rng: np.random.Generator) -> np.ndarray:
    """A tapering dark line along a persistent random walk through ``centre``; returns its pixels (H, W) bool."""
    size = grey.shape[0]
    length = rng.uniform(0.25, 0.45) * size
    n = max(8, int(length))
    turns = np.cumsum(rng.normal(0, 0.12, n))  # (n,) heading changes: a persistent walk
    heading = rng.uniform(0, 2 * np.pi) + turns - turns[n // 2]
    steps = np.stack([np.sin(heading), np.cos(heading)], axis=1) * (length / n)  # (n, 2)
    path = np.cumsum(steps, axis=0)
    path -= path[n // 2]  # (n, 2) relative to the centre
    room = np.minimum(np.asarray(centre), size - 1 - np.asarray(centre)) - 2 * w  # (2,) to the nearest edges
    path *= min(1.0, float(np.min(room / np.maximum(np.abs(path).max(axis=0), 1e-9))))  # shrunk to stay inside
    path += np.asarray(centre)  # the walk passes through the centre
    width = np.linspace(1.6, 0.6, n) * w * rng.uniform(0.8, 1.2)  # (n,) tapering half-width
    inside = np.zeros(grey.shape, dtype=bool)
    for (y, x), half in zip(path, width):
        rows, cols, yy, xx = _window((y, x), half + 1, size)
        inside[rows, cols] |= (yy - y) ** 2 + (xx - x) ** 2 <= half**2
    grey[inside] = 0.05
    return inside


def _dilate(mask: np.ndarray, r: int) -> np.ndarray:
    """Binary dilation of ``mask`` (H, W) by a (2r+1)^2 square."""
    padded = np.pad(mask, r)
    out = np.zeros_like(mask)
    H, W = mask.shape
    for dy in range(2 * r + 1):
        for dx in range(2 * r + 1):
            out |= padded[dy:dy + H, dx:dx + W]
    return out


DRAW = {"pore": _pore, "crack": _crack, "inclusion": _inclusion}
MARGIN = {"pore": 6.0, "crack": 12.8, "inclusion": 5.0}  # in w: a centre's distance from the image's edge


def place(grey: np.ndarray, mask: np.ndarray, kinds: list[str], rng: np.random.Generator) -> list[Defect]:
    """Draw ``kinds`` into ``grey`` (H, W) at random places, each at least 2 w from the others (a draw that
    comes closer is discarded and re-drawn elsewhere); writes their codes into ``mask`` (H, W)."""
    size, w = grey.shape[0], grey.shape[0] / 64
    placed: list[Defect] = []
    for kind in kinds:
        taken = _dilate(mask > 0, max(1, round(2 * w)))
        for _ in range(100):
            margin = min(MARGIN[kind] * w, 0.3 * size)
            centre = tuple(float(c) for c in rng.uniform(margin, size - margin, 2))
            trial = grey.copy()
            inside = DRAW[kind](trial, centre, w, rng)
            if inside.any() and not (inside & taken).any():
                break
        else:
            raise DataError(f"cannot place {len(kinds)} defects apart in a {size}x{size} image")
        grey[:] = trial
        mask[inside] = 1 + KINDS.index(kind)
        ys, xs = np.nonzero(inside)
        placed.append(Defect(kind, centre, (int(ys.min()), int(xs.min()), int(ys.max()) + 1, int(xs.max()) + 1)))
    return placed


# -------------------------------------------------------------------------------------- imaging


def gaussian_blur(grey: np.ndarray, sigma: float) -> np.ndarray:
    """(H, W) convolved with a normalised Gaussian of ``sigma`` px (separable, reflected edges)."""
    r = max(1, int(3 * sigma))
    kernel = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    kernel /= kernel.sum()
    padded = np.pad(grey, r, mode="reflect")
    H, W = grey.shape
    rows = sum(k * padded[i:i + H, :] for i, k in enumerate(kernel))  # (H, W + 2r)
    return sum(k * rows[:, i:i + W] for i, k in enumerate(kernel))


def sem_imaging(grey: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Brightness/contrast, blur, noise and scan-line offsets (step 4): float (H, W) -> uint8 (H, W)."""
    w = grey.shape[0] / 64
    grey = rng.uniform(0.85, 1.15) * (grey - 0.5) + 0.5 + rng.uniform(-0.05, 0.05)
    grey = gaussian_blur(grey, rng.uniform(0.6, 1.2) * w)
    grey = grey + rng.uniform(0.03, 0.07) * rng.standard_normal(grey.shape)
    grey = grey + 0.01 * rng.standard_normal((grey.shape[0], 1))  # (H, 1): one offset per scan line
    return np.clip(np.round(grey * 255), 0, 255).astype(np.uint8)


def micrograph(size: int, kinds: list[str], seed: int, index: int) -> Micrograph:
    """Image ``index`` of data seed ``seed``: a size x size micrograph holding defects of ``kinds``."""
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise DataError(f"micrographs are {MIN_SIZE} to {MAX_SIZE} px wide, not {size} (set model.image_size)")
    if seed < 0 or index < 0:
        raise DataError(f"a micrograph's seed and index are >= 0, got seed {seed}, index {index}")
    rng = np.random.default_rng([seed, index])
    grey = grains(size, rng)
    mask = np.zeros((size, size), dtype=np.uint8)
    defects = place(grey, mask, kinds, rng)
    return Micrograph(sem_imaging(grey, rng), mask, defects)


def defects_for(task: str, label: int, rng: np.random.Generator) -> list[str]:
    """The defect kinds an image of class ``TASKS[task][label]`` holds (kinds drawn with ``rng``)."""
    if task == "defect":
        return [] if TASKS[task][label] == "none" else list(rng.choice(KINDS, rng.integers(1, 4)))
    if task == "type":
        return [TASKS[task][label]]
    return list(rng.choice(KINDS, label))  # count: "0".."3"


@functools.lru_cache(maxsize=4)
def generate(task: str, n: int, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
    """``n`` labelled micrographs for ``task``: images (N, 1, H, W) uint8, labels (N,) int64 (cycling through
    the classes), masks (N, H, W) uint8, and each image's defects. Cached: the arrays are read-only."""
    if task not in TASKS:
        raise DataError(f"unknown micrograph task '{task}'; choose one of {', '.join(TASKS)}")
    k = len(TASKS[task])
    check_room(f"{n:,} micrographs of {size}x{size}", memory=2 * n * size * size,  # images and masks, uint8
               advice="use a smaller --n or --size", error=DataError)
    images = np.empty((n, 1, size, size), dtype=np.uint8)
    masks = np.empty((n, size, size), dtype=np.uint8)
    labels = np.arange(n, dtype=np.int64) % k
    defects = []
    for i in range(n):
        kinds = defects_for(task, int(labels[i]), np.random.default_rng([seed, i, 1]))
        m = micrograph(size, kinds, seed, i)
        images[i, 0], masks[i] = m.image, m.mask
        defects.append(tuple(m.defects))
    for a in (images, masks, labels):
        a.flags.writeable = False
    return images, labels, masks, tuple(defects)


def task_of(source: str) -> str:
    """The task of a ``generated:micrograph...`` data name, or a one-line DataError naming the choices."""
    if source not in SOURCES:
        raise DataError(f"unknown generated image data '{source}'; choose one of {', '.join(SOURCES)}")
    return SOURCES[source]


def write_folder(root: str | Path, task: str, n: int, size: int, seed: int = 0, test_fraction: float = 0.2) -> int:
    """Write ``root/{train,test}/<class>/<i>.png`` (a folder attnlab and other tools train on), the masks as
    ``root/masks/{train,test}/<class>/<i>.png`` (0 none, 1 pore, 2 crack, 3 inclusion: multiplied by 80 to be
    visible) and ``root/defects.jsonl`` (file, class, each defect's kind, centre and box). Returns n."""
    import json

    from PIL import Image

    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise DataError(f"{root} exists and is not an empty folder; choose a new --out")
    check_writable_folder(root, "--out", DataError)  # before the images are generated
    images, labels, masks, defects = generate(task, n, size, seed)
    test = set(np.random.default_rng([seed, 2]).permutation(n)[:max(1, round(test_fraction * n))].tolist())
    lines = []
    with staged_folder(root, DataError) as staging:  # a kill leaves no root or all of it, never a part
        for i in range(n):
            split, name = ("test" if i in test else "train"), TASKS[task][labels[i]]
            rel = Path(split) / name / f"{i:06d}.png"
            for base, array in ((staging, images[i, 0]), (staging / "masks", masks[i] * 80)):
                (base / rel).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.ascontiguousarray(array)).save(base / rel)
            lines.append(json.dumps({"file": rel.as_posix(), "class": name, "defects": [
                {"kind": d.kind, "centre": [round(c, 1) for c in d.centre], "box": list(d.box)} for d in defects[i]]}))
        (staging / "defects.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return n
