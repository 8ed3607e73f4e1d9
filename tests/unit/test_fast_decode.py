"""The decoders' fast paths against the pure-Python twin (``_reference``).

``shmq/_fast/_record.h`` parses one- and two-byte varints inline, skips a one-byte zero headers
count, copies fields into Arrow buffers in 32-byte blocks when both sides have room, and
``batch.pyx`` allocates NamedTuple records without PyType_GenericAlloc and shares a timestamp
int between consecutive records.  Each test here drives a branch next to its edge (varint
widths, the last record of a section, exact-size buffers, odd record types) and compares with
the twin, which has none of these shortcuts.  Skipped without the compiled extensions.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq.errors import CorruptRecordError

if not fast.HAVE_FAST:
    pytest.skip("compiled shmq._fast extensions are not loaded", allow_module_level=True)

from shmq._fast import _reference as ref  # noqa: E402
from shmq._fast import batch  # noqa: E402

NO_LAT = fast.NO_LOG_APPEND_TIME
PROPS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Rec(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple


class RecSlots(Rec):
    """A NamedTuple subclass that adds nothing: still laid out as a tuple."""

    __slots__ = ()


class RecDict(Rec):
    """A NamedTuple subclass with a __dict__: must take PyType_GenericAlloc."""


class RecPlain(tuple):  # noqa: SLOT001  (the point: a tuple subtype with __dict__, __weakref__)
    _fields = ("offset", "timestamp", "key", "value", "headers")

    def __new__(cls, *fields: Any) -> RecPlain:  # the twin builds records as record_type(*fields)
        return super().__new__(cls, fields)


RECORD_TYPES = [None, Rec, RecSlots, RecDict, RecPlain]


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except CorruptRecordError:
        return "corrupt", None


def zz(v: int) -> bytes:
    return ref._zigzag(v)


def raw_record(ts: bytes, off: bytes, key: bytes | None, value: bytes | None,
               headers: bytes = b"\x00", attributes: bytes = b"\x00") -> bytes:
    """A record from raw varint bytes (to write non-canonical or odd-width varints)."""
    body = attributes + ts + off
    body += zz(-1) if key is None else zz(len(key)) + key
    body += zz(-1) if value is None else zz(len(value)) + value
    body += headers
    return zz(len(body)) + body


# sizes around the varint width edges: zigzag(63) = 126 is one byte, zigzag(64) = 128 two;
# zigzag(8191) is two bytes, zigzag(8192) three
EDGE_SIZES = [0, 1, 7, 8, 31, 32, 33, 62, 63, 64, 65, 84, 127, 128, 8191, 8192, 8200]
EDGE_DELTAS = [0, 1, -1, 63, 64, -64, -65, 8191, 8192, -8193, 2**20, 2**31 - 1, -(2**31),
               2**40, -(2**40), 2**62]


@st.composite
def edge_records(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    sizes = st.one_of(st.sampled_from(EDGE_SIZES), st.integers(0, 300))
    fields = st.one_of(st.none(), sizes.map(lambda n: bytes(range(256)) * (n // 256) + bytes(n % 256)))
    hdrs = st.one_of(st.just([]), st.lists(
        st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=70))), max_size=3))
    n = draw(st.integers(1, 8))
    return [(draw(fields), draw(fields), draw(st.sampled_from(EDGE_DELTAS)), draw(hdrs))
            for _ in range(n)]


@PROPS
@given(recs=edge_records(), base_ts=st.sampled_from([0, 1_700_000_000_000, -1]),
       base_offset=st.sampled_from([0, 5, 2**31, 2**40]), record_type=st.sampled_from(RECORD_TYPES),
       lat=st.sampled_from([NO_LAT, 7]))
def test_decode_records_varint_edges(recs: list, base_ts: int, base_offset: int,
                                     record_type: Any, lat: int) -> None:
    items = [(k, v, base_ts + d, h) for k, v, d, h in recs]
    body = ref.encode_records(items, base_ts)
    got_c = batch.decode_records(body, len(items), base_offset, base_ts, lat, record_type)
    got_t = ref.decode_records(body, len(items), base_offset, base_ts, lat, record_type)
    assert got_c == got_t
    want_type = tuple if record_type is None else record_type
    assert all(type(r) is want_type for r in got_c)
    # with the same bytes as the last record of a longer section and as a lone record
    for i in range(len(items)):
        one = ref.encode_records(items[i : i + 1], base_ts)
        assert batch.decode_records(one, 1, 0, base_ts) == ref.decode_records(one, 1, 0, base_ts)


def test_record_types_laid_out_as_tuples_or_not() -> None:
    body = ref.encode_records([(b"k", b"v", 3, [("h", b"x")]), (None, None, 3, [])], 0)
    for record_type in RECORD_TYPES[1:]:
        got = batch.decode_records(body, 2, 10, 0, NO_LAT, record_type)
        assert got == ref.decode_records(body, 2, 10, 0, NO_LAT, record_type)
        assert [type(r) for r in got] == [record_type] * 2
        assert got[0][2] == b"k" and got[1][0] == 11
        # never tracked by the GC (a record cannot be part of a cycle) and freed cleanly
        assert not any(gc.is_tracked(r) for r in got)
    d = batch.decode_records(body, 2, 0, 0, NO_LAT, RecDict)[0]
    d.note = 1  # the __dict__ slot works
    assert d.note == 1


def test_equal_timestamps_share_one_int_and_values_stay_right() -> None:
    ts = [10**12, 10**12, 10**12 + 1, 10**12 + 1, 10**12, 2**40]
    body = ref.encode_records([(b"k", b"v", t, []) for t in ts], 10**12)
    got = batch.decode_records(body, len(ts), 0, 10**12)
    assert [r[1] for r in got] == ts
    assert got[0][1] is got[1][1] and got[2][1] is got[3][1]
    lat = batch.decode_records(body, len(ts), 0, 10**12, 99**5)
    assert {id(r[1]) for r in lat} == {id(lat[0][1])} and lat[0][1] == 99**5


@pytest.mark.parametrize("headers", [b"\x80\x00", b"\x00", b"\x02" + zz(1) + b"h" + zz(-1)],
                         ids=["two-byte-zero-count", "one-byte-zero-count", "one-header"])
def test_headers_count_encodings(headers: bytes) -> None:
    rec = raw_record(zz(0), zz(0), b"key", b"value", headers)
    for body, count in ((rec, 1), (rec + rec, 2)):
        assert outcome(batch.decode_records, body, count, 0, 0) == outcome(
            ref.decode_records, body, count, 0, 0)


@pytest.mark.parametrize("ts,off", [
    (b"\x80\x00", b"\x00"),            # non-canonical two-byte zero
    (b"\xff\x7f", b"\x81\x01"),        # two-byte values
    (b"\x80\x80\x80\x00", b"\x80\x80\x00"),  # longer non-canonical zeros (the slow path)
    (b"\xff" * 9 + b"\x01", b"\x00"),  # ten-byte varlong
    (b"\xff" * 10 + b"\x01", b"\x00"),  # eleven bytes: too long
    (b"\x00", b"\xff\xff\xff\xff\x0f"),  # five-byte varint
    (b"\x00", b"\xff\xff\xff\xff\xff\x01"),  # six bytes: too long
])
def test_odd_varint_widths(ts: bytes, off: bytes) -> None:
    rec = raw_record(ts, off, None, b"v" * 70)
    for body, count in ((rec, 1), (rec + rec, 2), (rec[:-1], 1)):
        assert outcome(batch.decode_records, body, count, 0, 0) == outcome(
            ref.decode_records, body, count, 0, 0)


@PROPS
@given(sections=st.lists(st.tuples(edge_records(), st.booleans(), st.sampled_from([0, 0, 1, -1])),
                         max_size=4),
       record_type=st.sampled_from([None, Rec, RecDict]), cut=st.integers(0, 3))
def test_decode_sections_parity(sections: list, record_type: Any, cut: int) -> None:
    bodies, meta = [], []
    for i, (recs, lat, miscount) in enumerate(sections):
        items = [(k, v, 1000 + d, h) for k, v, d, h in recs]
        body = ref.encode_records(items, 1000)
        if miscount == 1:
            body = body[: max(0, len(body) - cut)]
        bodies.append(body)
        meta += [len(items) + (miscount if miscount < 0 else 0), 100 * i, 1000,
                 5 if lat else NO_LAT]
    m = np.array(meta, dtype=np.int64)
    got_c = outcome(batch.decode_sections, bodies, m, record_type)
    got_t = outcome(ref.decode_sections, bodies, m, record_type)
    assert got_c == got_t
    if got_c[0] == "ok":
        want = []
        for i, body in enumerate(bodies):
            want += batch.decode_records(body, *meta[4 * i : 4 * i + 4], record_type)
        assert got_c[1] == want


def test_decode_sections_rejects_what_cannot_fit_before_allocating() -> None:
    body = ref.encode_records([(b"k", b"v", 0, [])], 0)
    for impl in (batch, ref):
        with pytest.raises(CorruptRecordError):  # 7 bytes a record at least
            impl.decode_sections([body], np.array([len(body) // 7 + 1, 0, 0, NO_LAT], np.int64))
        with pytest.raises(CorruptRecordError):
            impl.decode_sections([body], np.array([-1, 0, 0, NO_LAT], np.int64))
        with pytest.raises(ValueError):
            impl.decode_sections([body], np.array([1, 0, 0], np.int64))
        with pytest.raises(TypeError):
            impl.decode_sections([body], np.array([1, 0, 0, NO_LAT], np.int64), list)
        assert impl.decode_sections([], np.zeros(0, np.int64)) == []


@pytest.mark.parametrize("record_type", [None, Rec, RecDict], ids=["tuple", "namedtuple", "dict"])
def test_decode_sections_does_not_leak(record_type: Any) -> None:
    recs = [(b"key%d" % i, b"value" * i, 1000 + i % 3, [("h", b"x")] if i % 4 else [])
            for i in range(20)]
    good = ref.encode_records(recs, 1000)
    bodies = [good, good, good[:-1], good]  # the third section is torn: the call raises
    meta = np.array([20, 0, 1000, NO_LAT] * 4, np.int64)
    for _ in range(100):
        batch.decode_sections(bodies[:2], meta, record_type)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(400):
            batch.decode_sections(bodies[:2], meta, record_type)
            with pytest.raises(CorruptRecordError):
                batch.decode_sections(bodies, meta, record_type)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 128 * 1024, grown
    assert sys.getrefcount(None) > 0  # (None's count was never driven below zero)


# --- fill_columns: block copies need room on both sides ----------------------------------------


def fill(impl: Any, bodies: list[bytes], meta: list[int], rows: int, kbytes: int,
         vbytes: int) -> tuple[Any, dict[str, Any]]:
    bufs = {
        "offsets": np.full(rows, -7, np.int64), "timestamps": np.full(rows, -7, np.int64),
        "key_offsets": np.full(rows + 1, -7, np.int32), "key_data": np.full(kbytes, 0xEE, np.uint8),
        "key_valid": np.full(rows // 8 + 1, 0xAA, np.uint8),
        "value_offsets": np.full(rows + 1, -7, np.int32),
        "value_data": np.full(vbytes, 0xEE, np.uint8),
        "value_valid": np.full(rows // 8 + 1, 0x55, np.uint8),
    }
    try:
        res = impl.fill_columns(bodies, np.array(meta, np.int64), *bufs.values())
    except (ValueError, OverflowError) as e:
        return type(e).__name__, {}
    n, klen, vlen = res[:3]
    bits = lambda b: [(int(b[i >> 3]) >> (i & 7)) & 1 for i in range(n)]  # noqa: E731
    return tuple(res), {
        "offsets": bufs["offsets"][:n].tolist(), "timestamps": bufs["timestamps"][:n].tolist(),
        "key_offsets": bufs["key_offsets"][: n + 1].tolist(),
        "key_data": bytes(bufs["key_data"][:klen]), "key_valid": bits(bufs["key_valid"]),
        "value_offsets": bufs["value_offsets"][: n + 1].tolist(),
        "value_data": bytes(bufs["value_data"][:vlen]), "value_valid": bits(bufs["value_valid"]),
        # bits past the rows are cleared (the bitmaps start all ones in the compiled code)
        "tail_bits": [int(b[n >> 3]) >> (n & 7) for b in (bufs["key_valid"], bufs["value_valid"])],
    }


@PROPS
@given(sections=st.lists(edge_records(), min_size=1, max_size=3),
       slack=st.sampled_from([0, 0, 1, 31, 32, 33, 64]), short=st.sampled_from([0, 0, 1]))
def test_fill_columns_block_copy_edges(sections: list, slack: int, short: int) -> None:
    bodies, meta, rows, kbytes, vbytes = [], [], 0, 0, 0
    for i, recs in enumerate(sections):
        items = [(k, v, 50 + d, h) for k, v, d, h in recs]
        bodies.append(ref.encode_records(items, 50))
        meta += [len(items), 1000 * i, 50, NO_LAT]
        rows += len(items)
        kbytes += sum(len(k) for k, *_ in items if k is not None)
        vbytes += sum(len(v) for _, v, *_ in items if v is not None)
    # buffers of exactly the data size (plus slack), or one byte short
    args = (bodies, meta, rows, max(kbytes + slack - short, 0), vbytes + slack)
    got_c, cols_c = fill(batch, *args)
    got_t, cols_t = fill(ref, *args)
    assert got_c == got_t
    cols_c.pop("tail_bits", None)
    tail = cols_t.pop("tail_bits", None)
    assert cols_c == cols_t
    if short or not rows:
        return
    assert tail is not None
    # and with the generous sizing batches_to_arrow uses (the roomy loop)
    data = sum(len(b) for b in bodies) + 64
    got_r, cols_r = fill(batch, bodies, meta, rows, data, data)
    assert cols_r.pop("tail_bits") == [0, 0]
    assert (got_r, cols_r) == (got_c, cols_c)


def test_fill_columns_nulls_clear_only_their_bits() -> None:
    recs = [(None if i % 3 == 0 else b"k", None if i % 5 == 0 else b"v" * i, 0, []) for i in range(21)]
    body = ref.encode_records(recs, 0)
    got_c, cols_c = fill(batch, [body], [21, 0, 0, NO_LAT], 21, 400, 400)
    got_t, cols_t = fill(ref, [body], [21, 0, 0, NO_LAT], 21, 400, 400)
    assert cols_c.pop("tail_bits") == [0, 0]
    cols_t.pop("tail_bits")
    assert (got_c, cols_c) == (got_t, cols_t)
    assert cols_c["key_valid"] == [int(i % 3 != 0) for i in range(21)]


def _arena_allocator() -> tuple[int, int, int]:
    import ctypes

    class Allocator(ctypes.Structure):
        _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]

    a = Allocator()
    ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(a))
    return a.ctx or 0, a.alloc or 0, a.free or 0


@pytest.mark.parametrize("fn", ["decode_records", "decode_sections"])
def test_large_decodes_restore_the_arena_allocator(fn: str) -> None:
    # Large decodes wrap pymalloc's arena allocator (arenas populated up front) for their
    # duration only, errors included.
    n = 5000
    body = ref.encode_records([(b"k", b"v" * 90, 0, [])] * n, 0)
    before = _arena_allocator()

    def call(data: bytes) -> list:
        if fn == "decode_records":
            return batch.decode_records(data, n, 0, 0, NO_LAT, Rec)
        return batch.decode_sections([data], np.array([n, 0, 0, NO_LAT], np.int64), Rec)

    got = call(body)
    assert len(got) == n and got[-1] == Rec(n - 1, 0, b"k", b"v" * 90, ())
    assert _arena_allocator() == before
    with pytest.raises(CorruptRecordError):
        call(body[:-1])
    assert _arena_allocator() == before
    del got
    gc.collect()
