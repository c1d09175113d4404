"""Image bounds: a PNG of a few hundred bytes whose header claims 100,000 x 100,000 pixels (a decompression bomb)
is one DataError naming the file, from the header, before a pixel is decoded; so is one between attnlab's limit
and Pillow's own (which would only warn and decode); Pillow's warning never reaches the user's terminal."""

from __future__ import annotations

import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from attnlab.core.errors import DataError
from attnlab.data.images import MAX_IMAGE_PIXELS, load_image_folder, read_image


def png_header(path, width: int, height: int):
    """A grey PNG whose IHDR says ``width`` x ``height`` and whose data is a few zero bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                     + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("side", [100_000, 9_000, 10_000])  # over Pillow's error, under its warning, its warning
def test_a_huge_header_is_refused_before_decoding(tmp_path, side):
    assert side * side > MAX_IMAGE_PIXELS
    bomb = png_header(tmp_path / "bomb.png", side, side)
    assert bomb.stat().st_size < 200
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(DataError, match=r"bomb\.png (is|claims) .*pixels"):
            read_image(bomb, 1, 28, resize=True)
    assert not [w for w in seen if issubclass(w.category, Image.DecompressionBombWarning)]


def test_a_bomb_in_an_image_folder_names_its_file(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / cls / "ok.png")
    png_header(tmp_path / "b" / "huge.png", 50_000, 50_000)
    with pytest.raises(DataError, match=r"huge\.png"):
        load_image_folder(tmp_path, channels=1, size=8)


def test_images_within_the_bound_are_read(tmp_path):
    path = tmp_path / "wide.png"
    Image.fromarray(np.full((40, 3000), 200, np.uint8)).save(path)
    image = read_image(path, 3, 16, resize=True)
    assert image.shape == (3, 16, 16) and int(image.max()) == 200
    with pytest.raises(DataError, match="is 3000x40 pixels but the model takes 16x16"):
        read_image(path, 1, 16)
