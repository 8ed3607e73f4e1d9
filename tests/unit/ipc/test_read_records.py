"""``ReadResult.records()``: the few-plain-batches path (a waiting reader's usual read, no numpy)
against the general path over ``_records_sections`` (the oracle): offsets cut, LogAppendTime,
control and compressed batches (left to the general path), several batches, corrupt bytes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmq import _fast
from shmq.errors import CorruptRecordError
from shmq.ipc.reader import _PLAIN_BATCHES, ReadResult, _plain_batches_records
from shmq.ipc.state_table import PartitionState
from shmq.protocol import compression as codecs
from shmq.protocol import records as rec

PROPS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STATE = tuple.__new__(PartitionState, (0,) * len(PartitionState._fields))


def _general(buf: memoryview, lo: int, hi: int) -> list[rec.Record]:
    bodies, meta = rec._records_sections(
        buf, verify_crc=True, max_decompressed=codecs.DEFAULT_MAX_DECOMPRESSED_BYTES,
        skip_control=True)
    return [r for r in _fast.decode_sections(bodies, meta, rec.Record) if lo <= r.offset < hi]


item = st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.binary(max_size=50),
                 st.integers(0, 2**41), st.lists(st.tuples(st.text(max_size=5),
                                                           st.one_of(st.none(), st.binary(max_size=5))),
                                                 max_size=2))


@PROPS
@given(st.lists(st.tuples(st.lists(item, min_size=1, max_size=5), st.booleans(), st.booleans(),
                          st.booleans()), min_size=1, max_size=6),
       st.integers(0, 200), st.integers(0, 6), st.integers(0, 20))
def test_records_match_the_general_path(batches, base, lo, span) -> None:
    buf = b""
    at = base
    for items, lat, control, gzip in batches:
        buf += bytes(rec.encode_batch(
            items, base_offset=at, control=control,
            compression_type=codecs.GZIP if gzip else codecs.NONE,
            timestamp_type=rec.LOG_APPEND_TIME if lat else rec.CREATE_TIME,
            log_append_time=1_700_000_000_123 if lat else None))
        at += len(items)
    mv = memoryview(buf)
    lo, hi = base + lo, base + lo + span
    got = ReadResult(mv, lo, hi, STATE).records()
    assert got == _general(mv, lo, hi)
    plain = len(batches) <= _PLAIN_BATCHES and all(
        not control and not gzip for _, _, control, gzip in batches)
    assert (_plain_batches_records(mv) is not None) == plain


def test_one_plain_batch_takes_the_short_path() -> None:
    b = rec.encode_batch([(None, b"v" * 100, 1_700_000_000_000)], base_offset=41)
    mv = memoryview(bytes(b))
    assert _plain_batches_records(mv) == [rec.Record(41, 1_700_000_000_000, None, b"v" * 100, ())]
    assert ReadResult(mv, 41, 42, STATE).records() == _general(mv, 41, 42)
    assert ReadResult(mv, 42, 42, STATE).records() == []


def test_a_few_plain_batches_take_the_short_path() -> None:
    """Two single-record batches (a loaded box's usual tail read at 10,000 records/s) are
    decoded batch by batch too; a fragment after them leaves it to the general path, which
    raises as it always did."""
    a = bytes(rec.encode_batch([(None, b"a" * 100, 5)], base_offset=41))
    b = bytes(rec.encode_batch([(b"k", b"b" * 100, 6)], base_offset=42))
    mv = memoryview(a + b)
    want = [rec.Record(41, 5, None, b"a" * 100, ()), rec.Record(42, 6, b"k", b"b" * 100, ())]
    assert _plain_batches_records(mv) == want == _general(mv, 41, 43)
    assert ReadResult(mv, 42, 43, STATE).records() == want[1:]
    torn = memoryview(a + b + b[:30])
    assert _plain_batches_records(torn) is None
    with pytest.raises(CorruptRecordError):
        ReadResult(torn, 41, 43, STATE).records()
    with pytest.raises(CorruptRecordError):
        _general(torn, 41, 43)


@pytest.mark.parametrize("where", ["crc", "count", "truncated"])
def test_corrupt_one_batch_raises(where: str) -> None:
    b = rec.encode_batch([(b"k", b"v" * 30, 1), (None, b"w", 2)], base_offset=7)
    if where == "crc":
        b[-1] ^= 1
    elif where == "count":  # a count that cannot fit, with the CRC made right again
        b[57:61] = (10**6).to_bytes(4, "big")
        b[17:21] = _fast.crc32c(bytes(b[21:])).to_bytes(4, "big")
    else:
        b = b[:-3]
    mv = memoryview(bytes(b))
    with pytest.raises(CorruptRecordError):
        ReadResult(mv, 7, 9, STATE).records()
    with pytest.raises(CorruptRecordError):
        _general(mv, 7, 9)


@pytest.mark.parametrize("impl", ["reference"] + (["fast"] if _fast.HAVE_FAST else []))
def test_scan_batches_fills_an_array_table_as_a_numpy_one(impl: str) -> None:
    """``PartitionReader._scan`` hands ``scan_batches`` an ``array.array("q")`` (read without
    numpy's per-call costs): both implementations fill it as they fill a numpy table."""
    import array

    import numpy as np

    from shmq._fast import _reference

    scan = _reference.scan_batches if impl == "reference" else _fast.scan_batches
    buf = b"".join(bytes(rec.encode_batch([(None, b"v%d" % i, 5)] * (i + 1), base_offset=10 * i))
                   for i in range(3))
    cols = _fast.SCAN_COLUMNS
    table = array.array("q", [0]) * (cols * 2)
    want = np.zeros(cols * 2, np.int64)
    got = scan(memoryview(buf), 0, len(buf), table, False, False)
    assert got[:3] == scan(memoryview(buf), 0, len(buf), want, False, False)[:3]
    assert got[0] == 2 and got[2] == _fast.SCAN_FULL
    assert table.tolist() == want.tolist()
    assert table[_fast.COL_BASE_OFFSET + cols] == 10
