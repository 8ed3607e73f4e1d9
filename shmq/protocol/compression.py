"""Compression codecs for the record stream inside a Kafka RecordBatch v2.

The codec is attribute bits 0-2 of the batch.  Every codec goes through cramjam: one
well-kept native dependency (Rust) covers gzip, snappy, lz4 and zstd, it releases the GIL
while it works, and it can decompress into a caller-sized buffer, which is what caps the
output.  The formats are the ones the Java client and kafka-python write:

    gzip    gzip member(s), RFC 1952 (Java GZIPOutputStream)
    snappy  xerial block framing (snappy-java SnappyOutputStream), below; on read a plain
            raw snappy block (librdkafka may send one) is also accepted
    lz4     LZ4 frame with *independent* blocks (Kafka's Java reader refuses linked ones)
    zstd    zstd frame(s)

Xerial snappy framing, all integers big-endian int32:

    offset  size  field
    0       8     magic       82 53 4E 41 50 50 59 00   (0x82 "SNAPPY" NUL)
    8       4     version     1
    12      4     compatible  1
    16      4     length N1 of block 1
    20      N1    block 1: raw snappy of at most 32 KiB of input
    20+N1   4     length N2 of block 2
    ...           (length, block) pairs up to the end of the data

Reading ignores version and compatible (some producers write them little-endian).

``decompress`` never returns, nor allocates much more than, ``max_size`` bytes; larger
output, like any malformed input or unknown codec, raises ``CorruptRecordError``.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import TypeAlias

import cramjam

from shmq.errors import CorruptRecordError

BytesLike: TypeAlias = bytes | bytearray | memoryview

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
CODEC_BY_NAME = {v: k for k, v in CODEC_NAMES.items()}
DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_SIZE = 32 * 1024  # snappy-java's default block size
_INT32 = struct.Struct(">i")
_MIN_GUESS = 64 * 1024
_OUT_OF_ROOM = "failed to write whole buffer"  # cramjam's message when `out` is too small

_DecompressInto = Callable[[BytesLike, bytearray], int]
_STREAMING: dict[int, _DecompressInto] = {
    GZIP: cramjam.gzip.decompress_into,
    LZ4: cramjam.lz4.decompress_into,
    ZSTD: cramjam.zstd.decompress_into,
}


def compress(codec: int, data: BytesLike, level: int | None = None) -> bytes:
    """Compress ``data`` as a Kafka client would; ``level`` None means the codec default."""
    if codec not in CODEC_NAMES:
        raise CorruptRecordError(f"unknown compression codec {codec}")
    try:
        if codec == GZIP:
            return bytes(cramjam.gzip.compress(data, level=level))
        if codec == SNAPPY:
            return _xerial_compress(data)
        if codec == LZ4:
            return _lz4_compress(data, level)
        if codec == ZSTD:
            return bytes(cramjam.zstd.compress(data, level=level))
        return bytes(data)
    except (cramjam.CompressionError, OverflowError) as e:
        raise CorruptRecordError(f"{CODEC_NAMES[codec]} compression failed: {e}") from e


def decompress(
    codec: int, data: BytesLike, max_size: int = DEFAULT_MAX_DECOMPRESSED_BYTES
) -> bytes:
    """Decompress ``data``; raise ``CorruptRecordError`` if it is invalid or too large."""
    if codec == NONE:
        out = bytes(data)
        if len(out) > max_size:
            raise _too_big(max_size)
        return out
    if codec not in CODEC_NAMES:
        raise CorruptRecordError(f"unknown compression codec {codec}")
    try:
        if codec == SNAPPY:
            return _snappy_decompress(memoryview(data), max_size)
        return _capped(_STREAMING[codec], data, max_size)
    except cramjam.DecompressionError as e:
        raise CorruptRecordError(f"corrupt {CODEC_NAMES[codec]} data: {e}") from e


# One growing output buffer per thread for ``decompress_scratch`` (dropped after use when a
# batch made it larger than this: a compression bomb must not pin 64 MiB for good).
_scratch = threading.local()
_SCRATCH_KEEP = 8 << 20


def decompress_scratch(codec: int, data: BytesLike,
                       max_size: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> memoryview | bytes:
    """``decompress`` into a buffer this thread reuses: a view of the output, valid until the
    next call on the same thread.  For reading a batch's records on the produce path without
    allocating, zeroing and copying an output buffer per batch."""
    if codec not in _STREAMING:
        return decompress(codec, data, max_size)
    decompress_into = _STREAMING[codec]
    limit = max_size + 1
    buf: bytearray | None = getattr(_scratch, "buf", None)
    if buf is None or len(buf) > limit:
        buf = bytearray(min(limit, max(_MIN_GUESS, 8 * len(data))))
    try:
        while True:
            try:
                n = decompress_into(data, buf)
            except cramjam.DecompressionError as e:
                if _OUT_OF_ROOM not in str(e):
                    raise
                n = len(buf)
            if n < len(buf):
                break
            if len(buf) >= limit:
                raise _too_big(max_size)
            buf = bytearray(min(limit, 2 * len(buf)))  # never resized in place: views may live
    except cramjam.DecompressionError as e:
        raise CorruptRecordError(f"corrupt {CODEC_NAMES[codec]} data: {e}") from e
    _scratch.buf = buf if len(buf) <= _SCRATCH_KEEP else None
    return memoryview(buf)[:n]


def _too_big(max_size: int) -> CorruptRecordError:
    return CorruptRecordError(f"decompressed size exceeds {max_size} bytes")


def _lz4_compress(data: BytesLike, level: int | None) -> bytes:
    # cramjam.lz4.compress links blocks, which Java refuses; the Compressor can be told
    # not to, but only takes ``bytes``.
    compressor = cramjam.lz4.Compressor(level=level, block_linked=False)
    compressor.compress(data if type(data) is bytes else bytes(data))
    return bytes(compressor.finish())


def _xerial_compress(data: BytesLike) -> bytes:
    view = memoryview(data)
    parts: list[bytes | cramjam.Buffer] = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE])
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _capped(decompress_into: _DecompressInto, data: BytesLike, max_size: int) -> bytes:
    """Decompress into ever larger buffers; one byte past ``max_size`` proves "too big"."""
    limit = max_size + 1
    size = min(limit, max(_MIN_GUESS, 8 * len(data)))
    while True:
        out = bytearray(size)
        try:
            n = decompress_into(data, out)
        except cramjam.DecompressionError as e:
            if _OUT_OF_ROOM not in str(e):
                raise
            n = size
        if n < size:
            return bytes(memoryview(out)[:n])
        if size == limit:
            raise _too_big(max_size)
        size = min(limit, 2 * size)  # a full buffer may have been just big enough: retry


def _snappy_decompress(view: memoryview, max_size: int) -> bytes:
    if len(view) >= len(_XERIAL_HEADER) and view[: len(_XERIAL_MAGIC)] == _XERIAL_MAGIC:
        return _xerial_decompress(view, max_size)
    size = cramjam.snappy.decompress_raw_len(view)
    if size > max_size:
        raise _too_big(max_size)
    out = bytearray(size)
    if cramjam.snappy.decompress_raw_into(view, out) != size:
        raise CorruptRecordError("snappy block is shorter than its declared length")
    return bytes(out)


def _xerial_decompress(view: memoryview, max_size: int) -> bytes:
    # First pass: check the framing and add up the sizes the blocks declare.
    blocks: list[tuple[memoryview, int]] = []
    total = 0
    pos, end = len(_XERIAL_HEADER), len(view)
    while pos < end:
        if end - pos < _INT32.size:
            raise CorruptRecordError(f"truncated xerial snappy block length at offset {pos}")
        (length,) = _INT32.unpack_from(view, pos)
        pos += _INT32.size
        if not 0 <= length <= end - pos:
            raise CorruptRecordError(
                f"xerial snappy block length {length} at offset {pos - _INT32.size} "
                f"does not fit the {end - pos} bytes left"
            )
        block = view[pos : pos + length]
        pos += length
        size = cramjam.snappy.decompress_raw_len(block)
        total += size
        if total > max_size:
            raise _too_big(max_size)
        blocks.append((block, size))
    # Second pass: decompress each block straight into its place in the output.
    out = bytearray(total)
    target = memoryview(out)
    offset = 0
    for block, size in blocks:
        if cramjam.snappy.decompress_raw_into(block, target[offset : offset + size]) != size:
            raise CorruptRecordError("xerial snappy block is shorter than its declared length")
        offset += size
    target.release()
    return bytes(out)
