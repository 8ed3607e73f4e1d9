"""Parity: the compiled ``shmq._fast`` modules against their pure-Python twin (``_reference``).

The twin is written for obviousness and is the oracle here; independent oracles back both up
where one exists (the ``crc32c`` PyPI package for CRC-32C, ``bisect`` for the index searches).
Skipped when the extensions are not loaded (not built, or ``SHMQ_PURE=1``).
"""

from __future__ import annotations

import bisect
import gc
import importlib
import random
import struct
import tracemalloc
from collections.abc import Callable
from typing import Any, NamedTuple

import crc32c as crc_oracle
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq.errors import CorruptRecordError

if not fast.HAVE_FAST:
    pytest.skip("compiled shmq._fast extensions are not loaded", allow_module_level=True)

from shmq._fast import _reference as ref  # noqa: E402
from shmq._fast import batch, index  # noqa: E402

# ``shmq._fast`` rebinds the name ``crc32c`` to the function, so ``from shmq._fast import crc32c``
# yields the function; the compiled module itself comes from the import system.
crcmod = importlib.import_module("shmq._fast.crc32c")

KiB = 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1
SCAN_COLUMNS = fast.SCAN_COLUMNS

PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NO_LAT = -(2**63)  # shmq._fast.NO_LOG_APPEND_TIME: not a LogAppendTime batch


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """("ok", result) or ("corrupt", message); any other exception propagates (fails the test)."""
    try:
        return "ok", fn(*args, **kwargs)
    except CorruptRecordError as e:
        return "corrupt", str(e)


def outcome_kind(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """Like ``outcome`` but drops the error message (messages may legitimately differ)."""
    kind, value = outcome(fn, *args, **kwargs)
    return (kind, value) if kind == "ok" else (kind, None)


# --- CRC-32C -----------------------------------------------------------------------------------

# The hardware path runs three interleaved streams over blocks of 256*3 and 8192*3 bytes; test
# around those boundaries, their multiples, and tiny sizes (the byte-at-a-time head and tail).
_BLOCKS = (256 * 3, 8192 * 3)
CRC_SIZES = sorted(
    set(range(0, 34))
    | {m * b + d for b in _BLOCKS for m in (1, 2, 3) for d in (-9, -8, -1, 0, 1, 7, 8, 9)}
    | {255, 256, 257, 511, 512, 513, 8191, 8192, 8193, 16384, 100 * KiB}
)
_BIG = random.Random(1234).randbytes(100 * KiB + 64)


def _crc_all(data: Any, value: int = 0) -> tuple[int, int, int, int]:
    return (
        crcmod.crc32c(data, value),
        crcmod.crc32c_software(data, value),
        ref.crc32c(data, value),
        crc_oracle.crc32c(bytes(data), value),
    )


def test_crc32c_check_value() -> None:
    # The CRC-32C check value from the Castagnoli paper / RFC 3720.
    assert set(_crc_all(b"123456789")) == {0xE3069283}
    assert set(_crc_all(b"")) == {0}
    assert set(_crc_all(bytes(32))) == {0x8A9136AA}
    assert set(_crc_all(b"\xff" * 32)) == {0x62A8AB43}


@pytest.mark.parametrize("size", CRC_SIZES)
def test_crc32c_sizes_around_stream_boundaries(size: int) -> None:
    for offset in (0, 1, 3, 7):
        view = memoryview(_BIG)[offset : offset + size]
        results = _crc_all(view)
        assert len(set(results)) == 1, (size, offset, [hex(r) for r in results])


@PROPS
@given(
    size=st.one_of(st.integers(0, 100 * KiB), st.sampled_from(CRC_SIZES)),
    seed=st.integers(0, 2**32),
    offset=st.integers(0, 63),
)
def test_crc32c_random_unaligned_slices(size: int, seed: int, offset: int) -> None:
    big = random.Random(seed).randbytes(size + 64)
    view = memoryview(big)[offset : offset + size]
    assert len(view) == size
    results = _crc_all(view)
    assert len(set(results)) == 1, [hex(r) for r in results]
    # bytes, bytearray and memoryview of the same data agree
    assert crcmod.crc32c(bytes(view)) == crcmod.crc32c(bytearray(view)) == results[0]


@PROPS
@given(
    a=st.one_of(st.binary(max_size=300), st.builds(lambda n: _BIG[:n], st.integers(0, 30 * KiB))),
    b=st.one_of(st.binary(max_size=300), st.builds(lambda n: _BIG[-n:] if n else b"",
                                                   st.integers(0, 30 * KiB))),
)
def test_crc32c_running_value(a: bytes, b: bytes) -> None:
    whole = crc_oracle.crc32c(a + b)
    assert crcmod.crc32c(b, crcmod.crc32c(a)) == whole
    assert crcmod.crc32c_software(b, crcmod.crc32c_software(a)) == whole
    assert ref.crc32c(b, ref.crc32c(a)) == whole
    # an arbitrary starting value, not only a CRC we computed
    start = crc_oracle.crc32c(a) ^ 0x5A5A5A5A
    assert crcmod.crc32c(b, start) == crcmod.crc32c_software(b, start) == ref.crc32c(b, start) \
        == crc_oracle.crc32c(b, start)


def test_crc32c_have_hardware_is_a_bool() -> None:
    assert isinstance(crcmod.have_hardware(), bool)
    assert ref.have_hardware() is False


# --- records -----------------------------------------------------------------------------------

header_keys = st.one_of(st.text(max_size=12), st.sampled_from(["", "ключ", "键", "🔑x", "é" * 70]))
nullable_bytes = st.one_of(st.none(), st.binary(max_size=40), st.binary(max_size=300))
headers = st.lists(st.tuples(header_keys, st.one_of(st.none(), st.binary(max_size=30))), max_size=4)
base_timestamps = st.one_of(st.integers(-1, 2**41), st.sampled_from([0, -1, 1_700_000_000_000]))


@st.composite
def record_lists(draw: st.DrawFn, max_size: int = 12) -> tuple[list[tuple[Any, ...]], int]:
    base = draw(base_timestamps)
    recs = draw(
        st.lists(
            st.tuples(
                nullable_bytes,
                nullable_bytes,
                st.integers(-(2**40), 2**40).map(lambda d: base + d),
                headers,
            ),
            max_size=max_size,
        )
    )
    return recs, base


def _expected_records(recs: list[tuple[Any, ...]], base_offset: int, lat: int = NO_LAT) -> list[tuple]:
    return [
        (base_offset + i, lat if lat != NO_LAT else ts, k, v, tuple(hs))
        for i, (k, v, ts, hs) in enumerate(recs)
    ]


@PROPS
@given(case=record_lists(), wrap=st.sampled_from([bytes, bytearray, memoryview]))
def test_encode_records_parity(case: tuple[list, int], wrap: Callable[[bytes], Any]) -> None:
    recs, base = case
    # feed the compiled encoder other bytes-likes too; the twin sees the same values
    wrapped = [
        (None if k is None else wrap(k), None if v is None else wrap(v), ts, hs)
        for k, v, ts, hs in recs
    ]
    out_c = batch.encode_records(wrapped, base)
    out_t = ref.encode_records(recs, base)
    assert type(out_c) is bytes
    assert out_c == out_t
    # and it round-trips through both decoders
    expected = _expected_records(recs, 7)
    assert batch.decode_records(out_c, len(recs), 7, base) == expected
    assert ref.decode_records(out_c, len(recs), 7, base) == expected


def test_encode_records_accepts_bytes_header_keys_and_str_values() -> None:
    recs = [("k", "välue", 5, [(b"raw", b"1"), ("ü", None)])]
    assert batch.encode_records(recs, 0) == ref.encode_records(recs, 0)
    assert batch.decode_records(batch.encode_records(recs, 0), 1, 0, 0) == [
        (0, 5, b"k", "välue".encode(), (("raw", b"1"), ("ü", None)))
    ]


def test_encode_records_rejects_null_header_key_in_both() -> None:
    recs = [(b"k", b"v", 0, [(None, b"x")])]
    for impl in (batch, ref):
        with pytest.raises(ValueError):
            impl.encode_records(recs, 0)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few random edits: byte overwrites, bit flips, cuts, inserts."""
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["set", "flip", "cut", "insert", "truncate"]))
        if op in ("set", "flip") and out:
            i = draw(st.integers(0, len(out) - 1))
            if op == "set":
                out[i] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE, 0x03]))
            else:
                out[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut" and out:
            i = draw(st.integers(0, len(out) - 1))
            del out[i : i + draw(st.integers(1, 4))]
        elif op == "insert":
            i = draw(st.integers(0, len(out)))
            out[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "truncate":
            del out[draw(st.integers(0, len(out))) :]
    return bytes(out)


@st.composite
def record_sections(draw: st.DrawFn) -> tuple[bytes, int, int, int]:
    """(body, count, base_timestamp, real count): a valid section, often mutated or miscounted."""
    recs, base = draw(record_lists(max_size=6))
    body = ref.encode_records(recs, base)
    if draw(st.booleans()):
        body = draw(mutated(body))
    count = len(recs) + draw(st.sampled_from([0, 0, 0, -1, 1, -len(recs) - 1]))
    return body, count, base, len(recs)


@PROPS
@given(
    section=record_sections(),
    base_offset=st.integers(0, 2**40),
    lat=st.one_of(st.just(NO_LAT), st.integers(0, 2**41)),
)
def test_decode_records_parity(section: tuple[bytes, int, int, int], base_offset: int,
                               lat: int) -> None:
    body, count, base_ts, _ = section
    got_c = outcome_kind(batch.decode_records, body, count, base_offset, base_ts, lat)
    got_t = outcome_kind(ref.decode_records, body, count, base_offset, base_ts, lat)
    assert got_c == got_t
    # memoryview / bytearray input gives the same answer
    assert outcome_kind(batch.decode_records, memoryview(bytearray(body)), count, base_offset,
                        base_ts, lat) == got_c


@PROPS
@given(
    section=record_sections(),
    base_offset=st.integers(0, 2**40),
    lat=st.one_of(st.just(NO_LAT), st.just(-1), st.integers(0, 2**41)),
    create_time=st.booleans(),
    now=st.one_of(st.integers(0, 2**41), st.just(1_700_000_000_000)),
    before=st.one_of(st.integers(0, 2**42), st.just(INT64_MAX)),
    after=st.one_of(st.integers(0, 2**42), st.just(INT64_MAX), st.just(3_600_000)),
)
def test_check_timestamps_parity(section: tuple[bytes, int, int, int], base_offset: int, lat: int,
                                 create_time: bool, now: int, before: int, after: int) -> None:
    """LogValidator.validateTimestamp, compiled and twin: the derived max timestamp, every
    refused record, and the same InvalidRecordError on a malformed section."""
    from shmq.errors import InvalidRecordError

    body, count, base_ts, _ = section
    args = (count, base_offset, base_ts, lat, create_time, now, before, after)

    def run(fn: Callable[..., Any], data: Any) -> tuple[str, Any]:
        try:
            return "ok", fn(data, *args)
        except InvalidRecordError:
            return "invalid", None

    got_c = run(batch.check_timestamps, body)
    assert got_c == run(ref.check_timestamps, body)
    assert run(batch.check_timestamps, memoryview(bytearray(body))) == got_c
    if got_c[0] == "ok" and lat == NO_LAT:  # the max is the decoders' max
        decoded = batch.decode_records(body, count, base_offset, base_ts)
        assert got_c[1][0] == max([-1] + [r[1] for r in decoded])


class _Rec(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple


@FEW
@given(case=record_lists(max_size=6), lat=st.sampled_from([-1, 3]))
def test_decode_records_record_type_parity(case: tuple[list, int], lat: int) -> None:
    recs, base = case
    body = ref.encode_records(recs, base)
    got_c = batch.decode_records(body, len(recs), 5, base, lat, _Rec)
    got_t = ref.decode_records(body, len(recs), 5, base, lat, _Rec)
    assert all(type(r) is _Rec for r in got_c + got_t)
    assert got_c == got_t == [_Rec(*r) for r in _expected_records(recs, 5, lat)]
    assert [r.headers for r in got_c] == [tuple(hs) for *_, hs in recs]


@pytest.mark.parametrize("record_type", [list, tuple, dict, type("T3", (tuple,), {"_fields": (1, 2, 3)})])
def test_decode_records_rejects_bad_record_type_in_both(record_type: Any) -> None:
    body = ref.encode_records([(b"k", b"v", 0, [])], 0)
    for impl in (batch, ref):
        with pytest.raises(TypeError):
            impl.decode_records(body, 1, 0, 0, NO_LAT, record_type)


@PROPS
@given(body=st.binary(max_size=200), count=st.integers(-2, 6),
       record_type=st.sampled_from([None, _Rec]))
def test_decode_records_parity_on_garbage(body: bytes, count: int, record_type: Any) -> None:
    assert outcome_kind(batch.decode_records, body, count, 0, 0, NO_LAT, record_type) == outcome_kind(
        ref.decode_records, body, count, 0, 0, NO_LAT, record_type
    )


@pytest.mark.parametrize("record_type", [None, _Rec], ids=["tuple", "namedtuple"])
def test_decode_records_does_not_leak(record_type: Any) -> None:
    # The compiled decoder builds tuples by hand (reference counts managed explicitly): decoding
    # the same section over and over, keeping nothing, must not grow traced memory.
    recs = [(b"key%d" % i, b"value" * i, 1000 + i, [("h", b"x"), ("n", None)]) for i in range(20)]
    body = ref.encode_records(recs, 1000)
    bad = body[:-1]
    for _ in range(200):  # warm up caches and free lists
        batch.decode_records(body, 20, 0, 1000, NO_LAT, record_type)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(600):  # a leaked object per record would be > 1 MiB by now
            batch.decode_records(body, 20, 0, 1000, NO_LAT, record_type)
            try:
                batch.decode_records(bad, 20, 0, 1000, NO_LAT, record_type)
            except CorruptRecordError:
                pass
            else:
                raise AssertionError("a truncated section decoded")
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 128 * 1024, grown


def _zigzag(v: int) -> bytes:
    return ref._zigzag(v)


def _record(ts_delta_raw: bytes, offset_delta: int = 0) -> bytes:
    """One record (null key/value, no headers) with a raw timestamp-delta varint."""
    body = b"\x00" + ts_delta_raw + _zigzag(offset_delta) + _zigzag(-1) + _zigzag(-1) + _zigzag(0)
    return _zigzag(len(body)) + body


def test_decode_records_parity_ten_byte_varlong() -> None:
    # A 10-byte varlong whose last byte carries more than the 64th bit: Java's readVarlong (and
    # the compiled decoder) keep the low 64 bits; a decoder must not return a non-int64 delta.
    body = _record(bytes([0xFF] * 9 + [0x7F]))
    got_c = batch.decode_records(body, 1, 0, 0)
    got_t = ref.decode_records(body, 1, 0, 0)
    assert INT64_MIN <= got_c[0][1] <= INT64_MAX
    assert got_c == got_t


def test_decode_records_parity_timestamp_overflow() -> None:
    # base_timestamp + delta beyond int64: the two implementations must agree on the outcome
    # (wrap like Java's long arithmetic, or reject as corrupt) and never return a non-int64.
    body = _record(_zigzag(2**62))
    got_c = outcome_kind(batch.decode_records, body, 1, 0, 2**62)
    got_t = outcome_kind(ref.decode_records, body, 1, 0, 2**62)
    if got_t[0] == "ok":
        assert INT64_MIN <= got_t[1][0][1] <= INT64_MAX
    assert got_c == got_t


# --- batches -----------------------------------------------------------------------------------

batch_fields = st.tuples(
    st.integers(INT32_MIN, INT32_MAX),  # records_count
    st.integers(INT32_MIN, INT32_MAX),  # last_offset_delta
    st.integers(INT16_MIN, INT16_MAX),  # attributes
    st.integers(INT64_MIN, INT64_MAX),  # base_offset
    st.integers(INT32_MIN, INT32_MAX),  # leader_epoch
    st.integers(INT64_MIN, INT64_MAX),  # base_timestamp
    st.integers(INT64_MIN, INT64_MAX),  # max_timestamp
    st.integers(INT64_MIN, INT64_MAX),  # producer_id
    st.integers(INT16_MIN, INT16_MAX),  # producer_epoch
    st.integers(INT32_MIN, INT32_MAX),  # base_sequence
)


@PROPS
@given(body=st.binary(max_size=500), fields=batch_fields)
def test_build_batch_and_batch_header_parity(body: bytes, fields: tuple[int, ...]) -> None:
    out_c = batch.build_batch(body, *fields)
    out_t = ref.build_batch(body, *fields)
    assert type(out_c) is bytearray and type(out_t) is bytearray
    assert out_c == out_t
    count, delta, attrs, base_off, epoch, base_ts, max_ts, pid, pepoch, seq = fields
    crc = crc_oracle.crc32c(bytes(out_c[21:]))
    expected = (base_off, len(out_c) - 12, epoch, 2, crc, attrs, delta, base_ts, max_ts, pid,
                pepoch, seq, count)
    assert batch.batch_header(out_c) == ref.batch_header(out_c) == expected
    assert out_c[61:] == body
    # at an offset inside a larger buffer
    padded = b"\xee" * 5 + bytes(out_c) + b"\xdd" * 3
    assert batch.batch_header(padded, 5) == ref.batch_header(padded, 5) == expected


@PROPS
@given(buf=st.binary(max_size=140), pos=st.integers(-3, 140))
def test_batch_header_parity_on_garbage(buf: bytes, pos: int) -> None:
    assert outcome(batch.batch_header, buf, pos) == outcome(ref.batch_header, buf, pos)


@st.composite
def valid_batches(draw: st.DrawFn) -> bytearray:
    recs, base = draw(record_lists(max_size=3))
    if not recs:
        recs = [(b"k", b"v", base, [])]
    body = ref.encode_records(recs, base)
    n = len(recs)
    control = draw(st.sampled_from([0, 0, 0, 0x20]))
    pid = draw(st.sampled_from([-1, -1, 0, 77, 2**40]))
    seq = draw(st.sampled_from([-1, 0, 5])) if pid >= 0 else draw(st.sampled_from([-1, -1, 3]))
    delta = n - 1 if draw(st.integers(0, 5)) else draw(st.integers(-1, n + 1))
    count = n if draw(st.integers(0, 5)) else draw(st.integers(-1, n + 1))
    return ref.build_batch(
        body, count, delta, control | draw(st.sampled_from([0, 0x08, 0x10])),
        draw(st.integers(0, 2**40)), draw(st.integers(-1, 100)), base,
        max(r[2] for r in recs), pid, draw(st.sampled_from([-1, 0, 3])), seq,
    )


@st.composite
def batch_logs(draw: st.DrawFn) -> bytes:
    """Valid batches back to back, then maybe garbage, a truncated batch, or a mutation."""
    parts = draw(st.lists(valid_batches(), max_size=3))
    log = b"".join(bytes(p) for p in parts)
    tail = draw(st.sampled_from(["none", "garbage", "truncated", "mutate", "zeros"]))
    if tail == "garbage":
        log += draw(st.binary(min_size=1, max_size=100))
    elif tail == "truncated":
        extra = bytes(draw(valid_batches()))
        log += extra[: draw(st.integers(0, len(extra) - 1))]
    elif tail == "mutate":
        log = draw(mutated(log))
    elif tail == "zeros":
        log += bytes(draw(st.integers(1, 80)))  # a preallocated/zero-filled file tail
    return log


@FEW
@given(
    log=batch_logs(),
    verify_crc=st.booleans(),
    strict=st.booleans(),
    data=st.data(),
)
def test_validate_batch_parity(log: bytes, verify_crc: bool, strict: bool,
                               data: st.DataObject) -> None:
    positions = {0, len(log)} | set(data.draw(st.lists(st.integers(-2, len(log) + 2), max_size=4)))
    end = data.draw(st.one_of(st.just(-1), st.integers(0, len(log) + 3)))
    for pos in sorted(positions):
        got_c = outcome(batch.validate_batch, log, pos, end, verify_crc, strict)
        got_t = outcome(ref.validate_batch, log, pos, end, verify_crc, strict)
        assert got_c == got_t, pos
    # walking from 0 batch by batch agrees as well
    pos = 0
    while pos < len(log):
        got_c = outcome(batch.validate_batch, log, pos, -1, verify_crc, strict)
        assert got_c == outcome(ref.validate_batch, log, pos, -1, verify_crc, strict)
        if got_c[0] != "ok":
            break
        assert got_c[1] >= 61
        pos += got_c[1]


@FEW
@given(
    log=batch_logs(),
    verify_crc=st.booleans(),
    strict=st.booleans(),
    rows=st.integers(0, 6),
    data=st.data(),
)
def test_scan_batches_parity(log: bytes, verify_crc: bool, strict: bool, rows: int,
                             data: st.DataObject) -> None:
    start = data.draw(st.one_of(st.just(0), st.integers(0, len(log))))
    end = data.draw(st.one_of(st.just(-1), st.just(len(log)), st.integers(0, len(log) + 3)))
    # a few spare int64s past the last full row are never written
    out_c = np.full(SCAN_COLUMNS * rows + 5, -7, dtype=np.int64)
    out_t = out_c.copy()
    got_c = outcome(batch.scan_batches, log, start, end, out_c, verify_crc, strict)
    got_t = outcome(ref.scan_batches, log, start, end, out_t, verify_crc, strict)
    assert got_c == got_t
    assert np.array_equal(out_c, out_t)
    if got_c[0] == "ok":
        n, pos, status, reason = got_c[1]
        assert 0 <= n <= rows
        assert status in (fast.SCAN_END, fast.SCAN_PARTIAL, fast.SCAN_CORRUPT, fast.SCAN_FULL)
        assert (reason is None) == (status in (fast.SCAN_END, fast.SCAN_FULL))
        table = out_c[: n * SCAN_COLUMNS].reshape(n, SCAN_COLUMNS)
        expect_pos = start
        for row in table:
            assert row[fast.COL_POSITION] == expect_pos
            h = ref.batch_header(log, expect_pos)
            assert row[fast.COL_SIZE] == h[1] + 12
            assert row[fast.COL_BASE_OFFSET] == h[0]
            assert row[fast.COL_LAST_OFFSET] == h[0] + h[6]
            assert row[fast.COL_RECORDS_COUNT] == h[12]
            expect_pos += int(row[fast.COL_SIZE])
        assert pos == expect_pos
        assert np.all(out_c[n * SCAN_COLUMNS :] == -7)


def test_scan_batches_parity_last_offset_overflow() -> None:
    # baseOffset lies outside the CRC, so a CRC-valid batch can claim baseOffset = Long.MAX;
    # baseOffset + lastOffsetDelta then overflows int64.  Both scanners must agree (the
    # compiled one wraps like Java); neither may raise something other than CorruptRecordError.
    body = ref.encode_records([(b"a", b"1", 0, []), (b"b", b"2", 0, [])], 0)
    buf = bytes(ref.build_batch(body, 2, 1, 0, INT64_MAX, 0, 0, 0, -1, -1, -1))
    out_c = np.zeros(SCAN_COLUMNS, dtype=np.int64)
    out_t = out_c.copy()
    got_c = outcome(batch.scan_batches, buf, 0, -1, out_c)
    got_t = outcome(ref.scan_batches, buf, 0, -1, out_t)
    assert got_c == got_t
    assert np.array_equal(out_c, out_t)


@PROPS
@given(
    prefix=st.integers(0, 20),
    size=st.integers(0, 120),
    pos=st.integers(-2, 140),
    base_offset=st.integers(INT64_MIN, INT64_MAX),
    epoch=st.integers(INT32_MIN, INT32_MAX),
    seed=st.integers(0, 2**16),
)
def test_stamp_batch_parity(prefix: int, size: int, pos: int, base_offset: int, epoch: int,
                            seed: int) -> None:
    original = random.Random(seed).randbytes(prefix + size)
    buf_c, buf_t = bytearray(original), bytearray(original)
    got_c = outcome(batch.stamp_batch, buf_c, pos, base_offset, epoch)
    got_t = outcome(ref.stamp_batch, buf_t, pos, base_offset, epoch)
    assert got_c == got_t
    assert buf_c == buf_t
    if got_c[0] == "ok":
        assert struct.unpack_from(">q", buf_c, pos)[0] == base_offset
        assert struct.unpack_from(">i", buf_c, pos + 12)[0] == epoch
        # nothing else moved
        untouched = [i for i in range(len(buf_c))
                     if not (pos <= i < pos + 8 or pos + 12 <= i < pos + 16)]
        assert all(buf_c[i] == original[i] for i in untouched)
    else:
        assert buf_c == original


def test_stamp_batch_keeps_crc_valid() -> None:
    body = ref.encode_records([(b"k", b"v", 10, [("h", b"x")])], 10)
    for impl in (batch, ref):
        buf = ref.build_batch(body, 1, 0, 0, 0, -1, 10, 10, -1, -1, -1)
        impl.stamp_batch(buf, 0, 123456789, 42)
        assert impl.validate_batch(buf) == len(buf)
        assert impl.batch_header(buf)[:3] == (123456789, len(buf) - 12, 42)


# --- fill_columns (records sections straight into Arrow column buffers) ------------------------


def run_fill(impl: Any, sections: list[tuple[bytes, int, int, int, int]], lo: int = -(2**63) + 1,
             hi: int = 2**63 - 1, scale: int = 1, spare_rows: int = 0,
             spare_bytes: int = 0) -> tuple[str, Any, dict[str, np.ndarray]]:
    """Size the buffers as ``batches_to_arrow`` does (plus spare room), fill them, return
    (kind, result, buffers).  Buffers start as junk to show what is and is not written."""
    rows = sum(max(s[1], 0) for s in sections) + spare_rows
    data = sum(len(s[0]) for s in sections) + spare_bytes
    bufs = {
        "offsets": np.full(rows, -7, np.int64),
        "timestamps": np.full(rows, -7, np.int64),
        "key_offsets": np.full(rows + 1, -7, np.int32),
        "key_data": np.full(max(data, 1), 0xEE, np.uint8),
        "key_valid": np.full(rows // 8 + 1, 0xAA, np.uint8),
        "value_offsets": np.full(rows + 1, -7, np.int32),
        "value_data": np.full(max(data, 1), 0xEE, np.uint8),
        "value_valid": np.full(rows // 8 + 1, 0x55, np.uint8),
    }
    meta = np.array([v for s in sections for v in s[1:]], dtype=np.int64)
    kind, result = outcome_kind(
        impl.fill_columns, [s[0] for s in sections], meta, bufs["offsets"], bufs["timestamps"],
        bufs["key_offsets"], bufs["key_data"], bufs["key_valid"], bufs["value_offsets"],
        bufs["value_data"], bufs["value_valid"], lo, hi, scale,
    )
    return kind, result, bufs


def _bits(buf: Any, n: int) -> list[int]:
    raw = bytes(memoryview(buf))
    assert len(raw) >= (n + 7) // 8
    return [(raw[i >> 3] >> (i & 7)) & 1 for i in range(n)]


def filled_columns(result: tuple[int, int, int, int, int],
                   bufs: dict[str, np.ndarray]) -> dict[str, Any]:
    """The meaningful part of filled buffers (what Arrow will see)."""
    n, klen, vlen, knulls, vnulls = result
    return {
        "result": tuple(result),
        "offsets": bufs["offsets"][:n].tolist(),
        "timestamps": bufs["timestamps"][:n].tolist(),
        "key_offsets": bufs["key_offsets"][: n + 1].tolist(),
        "key_data": bytes(bufs["key_data"][:klen]),
        "key_valid": _bits(bufs["key_valid"], n),
        "value_offsets": bufs["value_offsets"][: n + 1].tolist(),
        "value_data": bytes(bufs["value_data"][:vlen]),
        "value_valid": _bits(bufs["value_valid"], n),
    }


def columns_from_records(records: list[tuple], scale: int = 1) -> dict[str, Any]:
    """Independent expectation of ``filled_columns`` from decoded record tuples."""
    out: dict[str, Any] = {
        "offsets": [r[0] for r in records],
        "timestamps": [r[1] * scale for r in records],
    }
    totals = []
    for name, col in (("key", 2), ("value", 3)):
        offs, data = [0], b""
        for r in records:
            data += r[col] or b""
            offs.append(len(data))
        out[f"{name}_offsets"] = offs
        out[f"{name}_data"] = data
        out[f"{name}_valid"] = [int(r[col] is not None) for r in records]
        totals.append((len(data), sum(r[col] is None for r in records)))
    out["result"] = (len(records), totals[0][0], totals[1][0], totals[0][1], totals[1][1])
    return out


@st.composite
def fill_sections(draw: st.DrawFn) -> tuple[bytes, int, int, int, int]:
    body, count, base_ts, _ = draw(record_sections())
    base_offset = draw(st.integers(0, 2**40))
    lat = draw(st.one_of(st.just(NO_LAT), st.just(NO_LAT), st.integers(0, 2**40)))
    return body, count, base_offset, base_ts, lat


@FEW
@given(
    sections=st.lists(fill_sections(), max_size=4),
    window=st.one_of(st.just(None), st.tuples(st.integers(-1, 2**40 + 10),
                                              st.integers(-1, 2**40 + 10))),
    scale=st.sampled_from([1, 1000]),
    spare=st.sampled_from([0, 0, 9]),
)
def test_fill_columns_parity(sections: list[tuple], window: tuple[int, int] | None, scale: int,
                             spare: int) -> None:
    lo, hi = window if window else (-(2**63) + 1, 2**63 - 1)
    kind_c, res_c, bufs_c = run_fill(batch, sections, lo, hi, scale, spare, spare)
    kind_t, res_t, bufs_t = run_fill(ref, sections, lo, hi, scale, spare, spare)
    assert (kind_c, res_c) == (kind_t, res_t)
    # the oracle: decode every section on its own, keep the window
    want_records: list[tuple] | None = []
    for body, count, base_offset, base_ts, lat in sections:
        got = outcome_kind(ref.decode_records, body, count, base_offset, base_ts, lat)
        if got[0] != "ok":
            want_records = None
            break
        want_records += [r for r in got[1] if lo <= r[0] < hi]
    if want_records is None:
        assert kind_c == "corrupt"
        return
    assert kind_c == "ok"
    got_c = filled_columns(res_c, bufs_c)
    assert got_c == filled_columns(res_t, bufs_t)
    assert got_c == columns_from_records(want_records, scale)


def test_fill_columns_parity_many_rows() -> None:
    # Thousands of rows over many sections, nulls across bitmap byte boundaries, big keys.
    rng = random.Random(99)
    sections, expected, base_offset = [], [], 0
    for _ in range(8):
        n = rng.randint(1, 1500)
        recs = [
            (
                None if rng.random() < 0.3 else rng.randbytes(
                    rng.randint(0, 3000) if i % 97 == 0 else rng.randint(0, 6)),
                None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 10)),
                1000 + i,
                [],
            )
            for i in range(n)
        ]
        body = ref.encode_records(recs, 1000)
        sections.append((body, n, base_offset, 1000, NO_LAT))
        expected += ref.decode_records(body, n, base_offset, 1000)
        base_offset += n
    kind_c, res_c, bufs_c = run_fill(batch, sections)
    kind_t, res_t, bufs_t = run_fill(ref, sections)
    assert kind_c == kind_t == "ok"
    got = filled_columns(res_c, bufs_c)
    assert got == filled_columns(res_t, bufs_t) == columns_from_records(expected)


@pytest.mark.parametrize("impl", [batch, ref], ids=["compiled", "twin"])
def test_fill_columns_buffers_too_small(impl: Any) -> None:
    body = ref.encode_records([(b"key", b"value", 0, []), (None, b"v", 0, [])], 0)
    meta = np.array([2, 0, 0, NO_LAT], np.int64)

    def fill(rows: int, kbytes: int, vbytes: int, valid: int | None = None) -> Any:
        v = rows // 8 + 1 if valid is None else valid
        return impl.fill_columns(
            [body], meta, np.zeros(rows, np.int64), np.zeros(rows, np.int64),
            np.zeros(rows + 1, np.int32), np.zeros(kbytes, np.uint8), np.zeros(v, np.uint8),
            np.zeros(rows + 1, np.int32), np.zeros(vbytes, np.uint8), np.zeros(v, np.uint8))

    assert fill(2, 3, 6) == (2, 3, 6, 1, 0)  # exactly enough
    for args in [(1, 3, 6), (2, 2, 6), (2, 3, 5), (2, 3, 6, 0)]:
        with pytest.raises(ValueError) as info:
            fill(*args)
        assert not isinstance(info.value, CorruptRecordError)
    with pytest.raises(ValueError):  # meta shorter than 4 values per body
        impl.fill_columns([body], np.zeros(3, np.int64), *(
            [np.zeros(2, np.int64)] * 2 + [np.zeros(3, np.int32), np.zeros(9, np.uint8),
                                           np.zeros(1, np.uint8), np.zeros(3, np.int32),
                                           np.zeros(9, np.uint8), np.zeros(1, np.uint8)]))


def test_fill_columns_parity_timestamp_overflow() -> None:
    # (base_timestamp + delta) * scale beyond int64 on hostile input: both implementations must
    # agree, and the only exception either may raise is CorruptRecordError.
    body = _record(_zigzag(2**62))
    for scale in (1, 1000):
        got_c = run_fill(batch, [(body, 1, 0, 2**62, NO_LAT)], scale=scale)
        got_t = run_fill(ref, [(body, 1, 0, 2**62, NO_LAT)], scale=scale)
        assert got_c[:2] == got_t[:2]
        if got_c[0] == "ok":
            assert filled_columns(*got_c[1:]) == filled_columns(*got_t[1:])


def test_fill_columns_no_sections() -> None:
    for impl in (batch, ref):
        kind, result, bufs = run_fill(impl, [])
        assert (kind, tuple(result)) == ("ok", (0, 0, 0, 0, 0))
        assert bufs["key_offsets"][0] == bufs["value_offsets"][0] == 0


# --- index search ------------------------------------------------------------------------------

# (entry_size, key_offset, key_width): .index offset column, .index position column,
# .timeindex timestamp column, .timeindex offset column.
LAYOUTS = [(8, 0, 4), (8, 4, 4), (12, 0, 8), (12, 8, 4)]
# around the warm section: 8192 // 8 = 1024 and 8192 // 12 = 682 entries
INDEX_SIZES = [0, 1, 2, 3, 681, 682, 683, 684, 1023, 1024, 1025, 1026, 2048, 5000]


def make_index(rng: random.Random, n: int, entry_size: int, slack: int,
               dense: bool) -> tuple[bytes, dict[int, list[int]]]:
    """An index of ``n`` entries whose every column is sorted and distinct, then ``slack`` zero
    entries (a preallocated file's tail).  Returns the bytes and the keys by column offset."""
    def column(width: int) -> list[int]:
        lo, hi = (INT32_MIN, INT32_MAX) if width == 4 else (INT64_MIN, INT64_MAX)
        span = 3 * n + 1 if dense else min(hi - lo, 2**62)
        start = rng.randint(lo, hi - span)
        return sorted(rng.sample(range(start, start + span), n))

    if entry_size == 8:
        cols = {0: column(4), 4: column(4)}
        raw = b"".join(struct.pack(">ii", a, b) for a, b in zip(cols[0], cols[4], strict=True))
    else:
        cols = {0: column(8), 8: column(4)}
        raw = b"".join(struct.pack(">qi", a, b) for a, b in zip(cols[0], cols[8], strict=True))
    return raw + bytes(slack * entry_size), cols


def targets_for(rng: random.Random, keys: list[int], width: int, k: int) -> list[int]:
    lo, hi = (INT32_MIN, INT32_MAX) if width == 4 else (INT64_MIN, INT64_MAX)
    out = {lo, hi, 0, -1, INT64_MIN, INT64_MAX}
    if keys:
        out |= {keys[0] - 1, keys[0], keys[-1], keys[-1] + 1}
        for key in rng.sample(keys, min(k, len(keys))):
            out |= {key - 1, key, key + 1}
        for _ in range(k):
            out.add(rng.randint(keys[0] - 2, keys[-1] + 2))
    return sorted(t for t in out if INT64_MIN <= t <= INT64_MAX)


def bisect_lower(keys: list[int], target: int) -> int:
    return bisect.bisect_right(keys, target) - 1


def bisect_upper(keys: list[int], target: int) -> int:
    i = bisect.bisect_left(keys, target)
    return i if i < len(keys) else -1


@FEW
@given(
    layout=st.sampled_from(LAYOUTS),
    n=st.one_of(st.sampled_from(INDEX_SIZES), st.integers(0, 5000)),
    seed=st.integers(0, 2**32),
    slack=st.sampled_from([0, 0, 1, 50]),
    dense=st.booleans(),
)
@example(layout=(8, 0, 4), n=1025, seed=1, slack=0, dense=True)
@example(layout=(12, 0, 8), n=683, seed=2, slack=3, dense=True)
def test_index_search_parity(layout: tuple[int, int, int], n: int, seed: int, slack: int,
                             dense: bool) -> None:
    entry_size, key_offset, key_width = layout
    rng = random.Random(seed)
    buf, cols = make_index(rng, n, entry_size, slack, dense)
    keys = cols[key_offset]
    targets = targets_for(rng, keys, key_width, 6)
    twin_targets = set(rng.sample(targets, min(4, len(targets))))  # the twin is a linear scan
    for t in targets:
        args = (buf, n, entry_size, key_offset, key_width, t)
        lower, upper = bisect_lower(keys, t), bisect_upper(keys, t)
        assert index.largest_lower_bound(*args) == lower, t
        assert index.smallest_upper_bound(*args) == upper, t
        if t in twin_targets:
            assert ref.largest_lower_bound(*args) == lower, t
            assert ref.smallest_upper_bound(*args) == upper, t


# --- CRC-32C folding (VPCLMULQDQ) against the crc32 instruction ------------------------------


def _fold_constant(bits: int) -> int:
    """x^bits mod P (Castagnoli), bit-reflected and shifted left by one: a folding constant."""
    poly = int(f"{0x82F63B78:032b}"[::-1], 2) | 1 << 32
    r = 1
    for _ in range(bits):
        r <<= 1
        if r & 1 << 32:
            r ^= poly
    return int(f"{r:032b}"[::-1], 2) << 1


def test_crc32c_fold_constants() -> None:
    """The header's constants are x^(D+32) and x^(D-32) mod P for each fold distance D."""
    from pathlib import Path

    header = (Path(fast.__file__).parent / "_crc32c_impl.h").read_text()
    for d in (2048, 512, 384, 256, 128):
        hi, lo = _fold_constant(d - 32), _fold_constant(d + 32)
        assert f"_mm_set_epi64x({hi:#x}, {lo:#x})" in header, d


def test_crc32c_folding_is_used_where_the_cpu_has_it() -> None:
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    want = {"avx512f", "avx512vl", "vpclmulqdq", "pclmulqdq", "sse4_2"} <= flags
    assert crcmod.have_folding() is want
    assert ref.have_folding() is False


@pytest.mark.parametrize("size", [255, 256, 257, 300, 319, 320, 321, 383, 384, 447, 448, 511,
                                  512, 513, 576, 1000, 4096, 65_536 + 17, 110_000])
def test_crc32c_folding_matches_the_instruction(size: int) -> None:
    rng = random.Random(size)
    big = rng.randbytes(size + 64)
    for offset in (0, 1, 5, 63):
        view = memoryview(big)[offset : offset + size]
        for start in (0, 0xFFFFFFFF, rng.getrandbits(32)):
            got = crcmod.crc32c(view, start)
            assert got == crcmod.crc32c_sse42(view, start) == crcmod.crc32c_software(view, start) \
                == crc_oracle.crc32c(bytes(view), start), (size, offset, start)
