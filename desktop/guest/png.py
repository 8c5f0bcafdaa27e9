"""A fast PNG encoder for screenshots: no row filters, deflate level 1, in parallel.

Screens are mostly flat areas and text, which deflate compresses well without PNG's row
filters; skipping the filters and splitting deflate across threads (zlib releases the GIL)
makes a 1280×800 screenshot ~1.7–2× quicker to encode than Pillow at its fastest level,
at about the same size. The pieces are raw deflate streams ended with a full flush, so
their concatenation is one valid zlib stream (pigz does the same).
"""

from __future__ import annotations

import struct
import zlib
from concurrent.futures import Executor

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, fastest
_PIECES = 2


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data)
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def encode_rgb(pixels: np.ndarray, executor: Executor) -> bytes:
    """PNG (8-bit RGB) of an (height, width, 3) array in R, G, B order, on `executor`'s threads.

    The array may be a strided view (e.g. `bgrx[:, :, 2::-1]`): it is copied once, into
    the rows PNG wants.
    """
    height, width, _ = pixels.shape
    rows = np.empty((height, 1 + width * 3), np.uint8)
    rows[:, 0] = 0  # filter type None
    rows[:, 1:].reshape(height, width, 3)[:] = pixels
    raw = rows.reshape(-1).data
    row_bytes = 1 + width * 3
    step = -(-height // _PIECES) * row_bytes

    def deflate(start: int) -> bytes:
        compressor = zlib.compressobj(1, zlib.DEFLATED, -15, 9)
        last = start + step >= len(raw)
        body = compressor.compress(raw[start : start + step])
        return body + compressor.flush(zlib.Z_FINISH if last else zlib.Z_FULL_FLUSH)

    pieces = list(executor.map(deflate, range(0, len(raw), step)))
    stream = _ZLIB_HEADER + b"".join(pieces) + struct.pack(">I", zlib.adler32(raw))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return _SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", stream) + _chunk(b"IEND", b"")
