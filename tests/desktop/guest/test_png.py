"""The screenshot PNG encoder: Pillow and zlib read back exactly the pixels given."""

from __future__ import annotations

import io
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from cubicle.guest import png

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def executor():
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield pool


@pytest.mark.parametrize("size", [(1280, 800), (641, 3), (1, 1)])
def test_busy_and_odd_sized_pictures_decode_exactly(executor, size):
    width, height = size
    rng = np.random.default_rng(7)
    bgrx = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    bgrx[: height // 2, : width // 2] = (200, 100, 50, 0)  # a flat area too
    data = png.encode_rgb(bgrx[:, :, 2::-1], executor)
    image = Image.open(io.BytesIO(data))
    image.load()  # checks every chunk's CRC and the zlib stream's adler32
    assert image.format == "PNG" and image.mode == "RGB" and image.size == size
    expected = Image.frombuffer("RGB", size, bgrx.tobytes(), "raw", "BGRX", 0, 1)
    assert image.tobytes() == expected.tobytes()


def test_the_idat_stream_is_one_valid_zlib_stream(executor):
    rgb = np.zeros((800, 1280, 3), np.uint8)
    rgb[100:200, 100:900] = (255, 255, 255)
    data = png.encode_rgb(rgb, executor)
    start = data.index(b"IDAT") + 4
    length = int.from_bytes(data[start - 8 : start - 4], "big")
    raw = zlib.decompress(data[start : start + length])
    assert len(raw) == 800 * (1 + 1280 * 3)
    assert len(data) < 20_000  # flat screens stay small
