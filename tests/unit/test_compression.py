"""Tests for shmq.protocol.compression.

Oracles that share no code with cramjam: stdlib gzip/zlib, the lz4 and zstandard packages
(C bindings), kafka-python's own framing code and a small pure-Python snappy codec written
here.  python-snappy 0.7 is a thin wrapper around cramjam, so it only backs up kafka-python.
"""

from __future__ import annotations

import gzip
import mmap
import random
import struct
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shmq.errors import CorruptRecordError
from shmq.protocol.compression import (
    CODEC_BY_NAME,
    CODEC_NAMES,
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    compress,
    decompress,
)

with warnings.catch_warnings():
    # kafka-python 3.0.12 calls the deprecated importlib.resources.read_text on import.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import codec as kafka_codec

ROOT = Path(__file__).resolve().parents[2]
ALL = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
COMPRESSED = [GZIP, SNAPPY, LZ4, ZSTD]
KiB, MiB = 1024, 1024 * 1024
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
BOMB_SIZE = 100 * MiB

FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MANY = settings(max_examples=200, deadline=None)


def _synth(seed: int, size: int, run_share: float) -> bytes:
    """Random data of ``size`` bytes, part incompressible, part byte runs."""
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < size:
        n = rng.randint(1, 4096)
        out += bytes([rng.randrange(256)]) * n if rng.random() < run_share else rng.randbytes(n)
    return bytes(out[:size])


def payloads(max_size: int = 200 * KiB) -> st.SearchStrategy[bytes]:
    edges = [s for s in (0, 1, 32 * KiB - 1, 32 * KiB, 32 * KiB + 1, 64 * KiB) if s <= max_size]
    sizes = st.one_of(st.integers(0, max_size), st.sampled_from(edges))
    synth = st.builds(_synth, st.integers(0, 2**32), sizes, st.sampled_from([0.0, 0.5, 0.95, 1.0]))
    return st.one_of(st.binary(max_size=min(512, max_size)), synth)


def _decompress_checked(codec: int, data: bytes, max_size: int = 4 * MiB) -> bytes | None:
    """Decompress; None on CorruptRecordError, any other exception fails the test."""
    try:
        out = decompress(codec, data, max_size)
    except CorruptRecordError:
        return None
    assert type(out) is bytes
    assert len(out) <= max_size
    return out


# --- a tiny independent snappy codec (raw format) ------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def py_snappy_decode(buf: bytes) -> bytes:
    size = shift = pos = 0
    while True:
        byte = buf[pos]
        pos += 1
        size |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    out = bytearray()
    while pos < len(buf):
        tag = buf[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            length = tag >> 2
            if length >= 60:
                extra = length - 59
                length = int.from_bytes(buf[pos : pos + extra], "little")
                pos += extra
            length += 1
            out += buf[pos : pos + length]
            pos += length
            continue
        if kind == 1:
            length, offset = ((tag >> 2) & 7) + 4, (tag >> 5) << 8 | buf[pos]
            pos += 1
        else:
            width = 2 if kind == 2 else 4
            length, offset = (tag >> 2) + 1, int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        assert 0 < offset <= len(out)
        pattern = out[len(out) - offset :][:length]
        out += (pattern * (length // len(pattern) + 1))[:length]
    assert len(out) == size
    return bytes(out)


def py_snappy_encode(data: bytes) -> bytes:
    """Valid raw snappy: literals plus offset-1 copies for byte runs (overlapping copies)."""
    out = bytearray(_varint(len(data)))

    def literal(chunk: bytes) -> None:
        for start in range(0, len(chunk), 65536):
            part = chunk[start : start + 65536]
            n = len(part) - 1
            if n < 60:
                out.append(n << 2)
            elif n < 256:
                out.extend((60 << 2, n))
            else:
                out.extend(bytes([61 << 2]) + n.to_bytes(2, "little"))
            out.extend(part)

    i = lit_start = 0
    while i < len(data):
        j = i + 1
        while j < len(data) and data[j] == data[i] and j - i < 65:
            j += 1
        if j - i >= 5:
            literal(data[lit_start : i + 1])
            out += bytes([(j - i - 2) << 2 | 2]) + (1).to_bytes(2, "little")
            i = lit_start = j
        else:
            i += 1
    literal(data[lit_start:])
    return bytes(out)


def xerial_blocks(stream: bytes) -> list[bytes]:
    """Split a xerial stream into its raw snappy blocks, checking the header."""
    assert stream[:16] == XERIAL_HEADER
    blocks, pos = [], 16
    while pos < len(stream):
        (length,) = struct.unpack_from(">i", stream, pos)
        assert 0 < length <= len(stream) - pos - 4
        blocks.append(stream[pos + 4 : pos + 4 + length])
        pos += 4 + length
    return blocks


def xerial(blocks: list[bytes]) -> bytes:
    return XERIAL_HEADER + b"".join(struct.pack(">i", len(b)) + b for b in blocks)


def test_py_snappy_codec_agrees_with_itself_and_python_snappy() -> None:
    data = _synth(7, 50_000, 0.5)
    assert py_snappy_decode(py_snappy_encode(data)) == data
    assert snappy.decompress(py_snappy_encode(data)) == data
    assert py_snappy_decode(snappy.compress(data)) == data


# --- API and round trips --------------------------------------------------------------------


def test_constants() -> None:
    assert (NONE, GZIP, SNAPPY, LZ4, ZSTD) == (0, 1, 2, 3, 4)
    assert CODEC_NAMES == {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
    assert CODEC_BY_NAME == {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
    assert DEFAULT_MAX_DECOMPRESSED_BYTES == 64 * MiB


@pytest.mark.parametrize("codec", ALL, ids=CODEC_NAMES.get)
@FEW
@given(data=payloads())
@example(data=b"")
def test_round_trip(codec: int, data: bytes) -> None:
    packed = compress(codec, data)
    assert type(packed) is bytes
    out = decompress(codec, packed)
    assert type(out) is bytes
    assert out == data


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD], ids=CODEC_NAMES.get)
@pytest.mark.parametrize("level", [1, 9])
def test_levels_round_trip(codec: int, level: int) -> None:
    data = _synth(3, 100_000, 0.5)
    assert decompress(codec, compress(codec, data, level=level)) == data


def test_none_is_identity_and_capped() -> None:
    assert compress(NONE, bytearray(b"abc")) == b"abc"
    assert decompress(NONE, memoryview(b"xabcx")[1:4]) == b"abc"
    assert decompress(NONE, b"abc", max_size=3) == b"abc"
    with pytest.raises(CorruptRecordError, match="exceeds 2 bytes"):
        decompress(NONE, b"abc", max_size=2)


@pytest.mark.parametrize("codec", ALL, ids=CODEC_NAMES.get)
def test_memoryview_inputs(codec: int, tmp_path: Path) -> None:
    data = _synth(11, 150_000, 0.7)
    big = bytearray(b"<" * 1000 + data + b">" * 1000)
    assert compress(codec, memoryview(big)[1000:-1000]) == compress(codec, data)

    packed = compress(codec, data)
    framed = bytearray(b"\xaa" * 333 + packed + b"\xbb" * 77)
    assert decompress(codec, memoryview(framed)[333:-77]) == data
    assert decompress(codec, bytearray(packed)) == data

    path = tmp_path / "segment"
    path.write_bytes(b"\x00" * 4096 + packed + b"\xff" * 10)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            assert decompress(codec, view[4096 : 4096 + len(packed)]) == data
        finally:
            view.release()


# --- independent oracles -------------------------------------------------------------------

KAFKA_ENCODERS: dict[str, tuple[int, Callable[[bytes], bytes]]] = {
    "gzip": (GZIP, kafka_codec.gzip_encode),
    "snappy-xerial": (SNAPPY, lambda d: kafka_codec.snappy_encode(d, xerial_compatible=True)),
    "snappy-xerial-4k": (
        SNAPPY,
        lambda d: kafka_codec.snappy_encode(d, xerial_compatible=True, xerial_blocksize=4096),
    ),
    "snappy-raw": (SNAPPY, lambda d: kafka_codec.snappy_encode(d, xerial_compatible=False)),
    "lz4": (LZ4, kafka_codec.lz4_encode),
    "zstd": (ZSTD, kafka_codec.zstd_encode),
    "stdlib-gzip": (GZIP, gzip.compress),
    "lz4.frame-linked": (LZ4, lambda d: lz4.frame.compress(d, block_linked=True)),
    "lz4.frame-sized": (
        LZ4,
        lambda d: lz4.frame.compress(d, block_size=lz4.frame.BLOCKSIZE_MAX4MB),
    ),
    "zstandard": (ZSTD, lambda d: zstandard.ZstdCompressor(write_checksum=True).compress(d)),
    "py-snappy-raw": (SNAPPY, py_snappy_encode),
    "py-snappy-xerial": (
        SNAPPY,
        lambda d: xerial([py_snappy_encode(d[i : i + 1000]) for i in range(0, len(d), 1000)]),
    ),
}


@pytest.mark.parametrize("name", list(KAFKA_ENCODERS))
@FEW
@given(data=payloads(max_size=64 * KiB))
def test_foreign_compressed_decompresses(name: str, data: bytes) -> None:
    codec, encode = KAFKA_ENCODERS[name]
    assert decompress(codec, encode(data)) == data


def _zstandard_decode(packed: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(packed, max_output_size=4 * MiB)


def _py_xerial_decode(packed: bytes) -> bytes:
    return b"".join(py_snappy_decode(block) for block in xerial_blocks(packed))


FOREIGN_DECODERS: dict[str, tuple[int, Callable[[bytes], bytes]]] = {
    "kafka-gzip": (GZIP, kafka_codec.gzip_decode),
    "kafka-snappy": (SNAPPY, kafka_codec.snappy_decode),
    "kafka-lz4": (LZ4, kafka_codec.lz4_decode),
    "kafka-zstd": (ZSTD, kafka_codec.zstd_decode),
    "stdlib-gzip": (GZIP, gzip.decompress),
    "lz4.frame": (LZ4, lz4.frame.decompress),
    "zstandard": (ZSTD, _zstandard_decode),
    "py-snappy-xerial": (SNAPPY, _py_xerial_decode),
}


@pytest.mark.parametrize("name", list(FOREIGN_DECODERS))
@FEW
@given(data=payloads(max_size=64 * KiB))
def test_ours_decompresses_with_foreign(name: str, data: bytes) -> None:
    codec, decode = FOREIGN_DECODERS[name]
    if name == "kafka-snappy" and not data:
        return  # kafka-python misreads a header-only xerial stream as raw snappy
    assert decode(compress(codec, data)) == data


@pytest.mark.parametrize("size", [0, 1, 32 * KiB - 1, 32 * KiB, 32 * KiB + 1, 100_000])
def test_snappy_writes_java_xerial_layout(size: int) -> None:
    data = _synth(size, size, 0.3)
    packed = compress(SNAPPY, data)
    assert packed[:16] == bytes.fromhex("82534e41505059000000000100000001")
    blocks = xerial_blocks(packed)
    assert len(blocks) == -(-size // (32 * KiB))
    decoded = [py_snappy_decode(block) for block in blocks]
    assert all(len(d) == 32 * KiB for d in decoded[:-1])
    assert b"".join(decoded) == data


def test_snappy_empty_is_header_only_like_java() -> None:
    assert compress(SNAPPY, b"") == XERIAL_HEADER
    assert decompress(SNAPPY, XERIAL_HEADER) == b""


def test_lz4_frame_has_independent_blocks() -> None:
    # Kafka's Java KafkaLZ4BlockInputStream rejects frames without FLG.BLOCK_INDEPENDENCE.
    for data in (b"", b"x", _synth(5, 300_000, 0.5)):
        packed = compress(LZ4, data)
        assert packed[:4] == b"\x04\x22\x4d\x18"
        flg = packed[4]
        assert flg >> 6 == 1  # version
        assert flg & 0x20  # block independence
        assert flg & 0x03 == 0  # reserved
        assert lz4.frame.get_frame_info(packed)["block_linked"] is False


def test_gzip_has_gzip_header() -> None:
    assert compress(GZIP, b"hello")[:3] == b"\x1f\x8b\x08"


@pytest.mark.parametrize(
    ("codec", "encode"),
    [(GZIP, gzip.compress), (ZSTD, zstandard.ZstdCompressor().compress), (LZ4, lz4.frame.compress)],
    ids=["gzip", "zstd", "lz4"],
)
def test_concatenated_members_and_frames(codec: int, encode: Callable[[bytes], bytes]) -> None:
    assert decompress(codec, encode(b"hello ") + encode(b"world")) == b"hello world"


# --- caps and compression bombs --------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL, ids=CODEC_NAMES.get)
@pytest.mark.parametrize("size", [0, 1, 64 * KiB - 1, 64 * KiB, 64 * KiB + 1, 128 * KiB, 300_000])
@pytest.mark.parametrize("run_share", [0.0, 1.0])
def test_cap_is_exact(codec: int, size: int, run_share: float) -> None:
    data = _synth(size, size, run_share)
    packed = compress(codec, data)
    assert decompress(codec, packed, max_size=size) == data
    assert decompress(codec, packed, max_size=size + 1) == data
    if size:
        with pytest.raises(CorruptRecordError, match=f"decompressed size exceeds {size - 1} bytes"):
            decompress(codec, packed, max_size=size - 1)


@pytest.mark.parametrize("codec", ALL, ids=CODEC_NAMES.get)
@MANY
@given(data=payloads(max_size=20 * KiB), max_size=st.integers(0, 40 * KiB))
def test_cap_random(codec: int, data: bytes, max_size: int) -> None:
    packed = compress(codec, data)
    if len(data) <= max_size:
        assert decompress(codec, packed, max_size) == data
    else:
        with pytest.raises(CorruptRecordError, match="exceeds"):
            decompress(codec, packed, max_size)


@pytest.fixture(scope="module")
def bombs() -> dict[str, tuple[int, bytes]]:
    zeros = bytes(BOMB_SIZE)
    out = {CODEC_NAMES[c]: (c, compress(c, zeros)) for c in COMPRESSED}
    out["snappy-raw"] = (SNAPPY, snappy.compress(zeros))
    return out


BOMB_NAMES = ["gzip", "snappy", "lz4", "zstd", "snappy-raw"]


@pytest.mark.parametrize("name", BOMB_NAMES)
def test_bomb_is_refused_quickly(name: str, bombs: dict[str, tuple[int, bytes]]) -> None:
    codec, packed = bombs[name]
    assert len(packed) < BOMB_SIZE // 20
    start = time.perf_counter()
    with pytest.raises(CorruptRecordError, match=f"exceeds {MiB} bytes"):
        decompress(codec, packed, max_size=MiB)
    with pytest.raises(CorruptRecordError, match="exceeds"):
        decompress(codec, packed)  # the 64 MiB default
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("name", BOMB_NAMES)
def test_bomb_exact_cap(name: str, bombs: dict[str, tuple[int, bytes]]) -> None:
    codec, packed = bombs[name]
    out = decompress(codec, packed, max_size=BOMB_SIZE)
    assert len(out) == BOMB_SIZE
    assert out.count(0) == BOMB_SIZE
    del out
    with pytest.raises(CorruptRecordError, match="exceeds"):
        decompress(codec, packed, max_size=BOMB_SIZE - 1)


_RSS_PROBE = """
import resource, sys
from shmq.errors import CorruptRecordError
from shmq.protocol.compression import decompress
bombs = [(int(c), open(p, "rb").read()) for c, p in zip(sys.argv[1::2], sys.argv[2::2])]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for codec, data in bombs:
    try:
        decompress(codec, data, max_size=1 << 20)
    except CorruptRecordError:
        pass
    else:
        sys.exit("a bomb decompressed")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux only")
def test_bomb_peak_memory_stays_near_cap(
    bombs: dict[str, tuple[int, bytes]], tmp_path: Path
) -> None:
    # A fresh interpreter: ru_maxrss is a high-water mark that this process already raised.
    args: list[str] = []
    for name, (codec, packed) in bombs.items():
        path = tmp_path / name
        path.write_bytes(packed)
        args += [str(codec), str(path)]
    result = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    grown_kib = int(result.stdout)
    assert grown_kib < 16 * 1024, f"peak RSS grew {grown_kib} KiB for a 1 MiB cap"


# --- malformed input -------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [5, 6, 7, -1, 8], ids=str)
def test_unknown_codec(codec: int) -> None:
    with pytest.raises(CorruptRecordError, match=f"unknown compression codec {codec}"):
        decompress(codec, b"whatever")
    with pytest.raises(CorruptRecordError, match=f"unknown compression codec {codec}"):
        compress(codec, b"whatever")


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES.get)
def test_empty_input_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptRecordError, match=f"corrupt {CODEC_NAMES[codec]} data"):
        decompress(codec, b"")


def test_invalid_level_is_corrupt_record_error() -> None:
    with pytest.raises(CorruptRecordError, match="gzip compression failed"):
        compress(GZIP, b"abc", level=-1)


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD], ids=CODEC_NAMES.get)
def test_every_truncation_is_corrupt(codec: int) -> None:
    data = _synth(1, 20_000, 0.5)
    packed = compress(codec, data)
    for cut in range(len(packed)):
        with pytest.raises(CorruptRecordError):
            decompress(codec, packed[:cut])


def test_snappy_truncation_is_corrupt_or_a_block_prefix() -> None:
    # Xerial has no end marker: a cut on a block boundary is a valid, shorter stream (as in Java).
    data = _synth(2, 100_000, 0.5)
    packed = compress(SNAPPY, data)
    boundaries, pos = {16: 0}, 16
    for block in xerial_blocks(packed):
        pos += 4 + len(block)
        boundaries[pos] = boundaries[max(boundaries)] + len(py_snappy_decode(block))
    for cut in range(len(packed)):
        out = _decompress_checked(SNAPPY, packed[:cut])
        if cut in boundaries:
            assert out == data[: boundaries[cut]]
        else:
            assert out is None, cut
    raw = py_snappy_encode(data)
    for cut in range(0, len(raw), 7):
        assert _decompress_checked(SNAPPY, raw[:cut]) is None


@pytest.mark.parametrize(
    "stream",
    [
        XERIAL_HEADER + struct.pack(">i", 0x7FFFFFFF) + b"\x05\x10hello",
        XERIAL_HEADER + struct.pack(">i", -1) + b"\x05\x10hello",
        XERIAL_HEADER + struct.pack(">i", -(2**31)) + b"\x05\x10hello",
        XERIAL_HEADER + struct.pack(">i", 8) + b"\x05\x10hello",
        XERIAL_HEADER + struct.pack(">i", 0),
        XERIAL_HEADER + struct.pack(">i", 7) + b"\x05\x10hello" + b"\x00\x00\x00",
        XERIAL_HEADER + struct.pack(">i", 7) + b"\x06\x10hello",
        XERIAL_HEADER + struct.pack(">i", 7) + b"\x04\x10hello",
        XERIAL_HEADER + struct.pack(">i", 2) + b"\x05\x10",
        XERIAL_HEADER[:15],
        XERIAL_HEADER + XERIAL_HEADER,
    ],
    ids=[
        "len-0x7fffffff",
        "len-minus-1",
        "len-int-min",
        "len-one-past-end",
        "len-zero",
        "dangling-length-bytes",
        "block-declares-more",
        "block-declares-less",
        "block-short-literal",
        "short-header",
        "concatenated-streams",
    ],
)
def test_bad_xerial_framing(stream: bytes) -> None:
    assert decompress(SNAPPY, XERIAL_HEADER + struct.pack(">i", 7) + b"\x05\x10hello") == b"hello"
    with pytest.raises(CorruptRecordError):
        decompress(SNAPPY, stream)


@pytest.mark.parametrize(
    ("stream", "max_size"),
    [
        (b"\xff\xff\xff\xff\x0f", DEFAULT_MAX_DECOMPRESSED_BYTES),  # raw, declares 4 GiB
        (XERIAL_HEADER + struct.pack(">i", 5) + b"\xff\xff\xff\xff\x0f", MiB),
        # Two blocks declaring 8 MiB each: each fits the cap, their sum does not.
        (XERIAL_HEADER + (struct.pack(">i", 4) + b"\x80\x80\x80\x04") * 2, 10 * MiB),
    ],
    ids=["raw", "xerial-one-block", "xerial-sum"],
)
def test_snappy_declared_length_over_cap_is_refused_before_allocating(
    stream: bytes, max_size: int
) -> None:
    start = time.perf_counter()
    with pytest.raises(CorruptRecordError, match=f"exceeds {max_size} bytes"):
        decompress(SNAPPY, stream, max_size=max_size)
    assert time.perf_counter() - start < 0.5


# Real stream openings, so that garbage gets past the magic numbers into the parsers.
PREFIXES = {
    codec: [compress(codec, b"hello hello hello hello")[:cut] for cut in (0, 4, 7, 10, 16, 20)]
    for codec in COMPRESSED
}


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES.get)
@MANY
@given(data=st.data(), tail=st.binary(max_size=300))
def test_garbage_only_raises_corrupt_record_error(
    codec: int, data: st.DataObject, tail: bytes
) -> None:
    prefix = data.draw(st.sampled_from(PREFIXES[codec]))
    max_size = data.draw(st.sampled_from([0, 100, MiB]))
    _decompress_checked(codec, prefix + tail, max_size)


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES.get)
@MANY
@given(data=st.data())
def test_mutated_stream_only_raises_corrupt_record_error(codec: int, data: st.DataObject) -> None:
    original = _synth(9, 5000, 0.5)
    packed = bytearray(compress(codec, original))
    for _ in range(data.draw(st.integers(1, 4))):
        packed[data.draw(st.integers(0, len(packed) - 1))] = data.draw(st.integers(0, 255))
    out = _decompress_checked(codec, bytes(packed), max_size=10_000)
    if codec in (GZIP, LZ4) and out is not None:
        assert out == original  # CRC32 / xxhash32 content checksum catch real damage


def test_decompress_scratch_reuses_one_buffer_and_caps_like_decompress() -> None:
    """The produce path's decompression: the same output as the codecs' own libraries, a view
    of one buffer per thread (no per-batch output allocation), the same cap and errors."""
    from shmq.protocol import compression as c

    data = bytes(random.Random(3).choices(range(65, 91), k=300_000))
    oracles = {c.GZIP: gzip.compress, c.LZ4: lz4.frame.compress,
               c.ZSTD: zstandard.ZstdCompressor().compress, c.SNAPPY: snappy.compress}
    for codec, pack in oracles.items():
        out = c.decompress_scratch(codec, pack(data))
        assert bytes(out) == data, codec
        assert bytes(c.decompress_scratch(codec, pack(b"tiny"))) == b"tiny"
        with pytest.raises(CorruptRecordError):
            c.decompress_scratch(codec, pack(data), max_size=len(data) - 1)
        damaged = pack(data)[:-7] + b"garbage" if codec != c.SNAPPY \
            else pack(data)[:-7]  # raw snappy has no checksum: cut it instead
        with pytest.raises(CorruptRecordError):
            c.decompress_scratch(codec, damaged)
    first = c.decompress_scratch(c.LZ4, lz4.frame.compress(data))
    second = c.decompress_scratch(c.LZ4, lz4.frame.compress(data[::-1]))
    assert isinstance(first, memoryview) and first.obj is second.obj  # one buffer, reused
    assert bytes(second) == data[::-1]
    assert bytes(c.decompress_scratch(c.NONE, b"plain")) == b"plain"
