"""The producer's open batch (``shmq._fast.client.Batch``): records encoded as ``produce`` hands
them over, the header and CRC written when the batch goes.

Oracles: the ring encoder's twin ``_ring_reference.encode_batch_into`` (the bytes the producer
sent before records were encoded per ``produce``), kafka-python's record decoder and the
``crc32c`` package; the compiled ``Batch`` and its twin write the same bytes.
"""

from __future__ import annotations

import threading

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

import shmq._fast as fast
from shmq._fast import _client_reference, _ring_reference

IMPLS = [_client_reference] + ([fast._client] if fast.HAVE_FAST else [])
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

blob = st.one_of(st.none(), st.binary(max_size=300))
header = st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=20)))
row = st.tuples(blob, blob, st.integers(0, 2**41), st.one_of(st.none(),
                                                             st.lists(header, max_size=3)))


def _decode(buf: bytes) -> list[tuple]:
    batch = DefaultRecordBatch(buf)
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]


@PROPS
@given(st.lists(row, min_size=1, max_size=40), st.integers(-1, 2**40), st.integers(-1, 300),
       st.integers(-1, 2**31 - 1))
def test_batch_writes_what_the_ring_encoder_writes(rows, pid, epoch, seq) -> None:
    """Records appended one by one, then written with a producer id, epoch and sequence: the
    bytes of encode_batch_into for the same records (kafka-python reads them back; the CRC is
    crc32c's), compiled and twin alike, and what encoded() returns."""
    want = bytearray(64 * 1024)
    records = [(k, v, ts, h or []) for k, v, ts, h in rows]
    size = _ring_reference.encode_batch_into(want, 0, len(want), records, rows[0][2], pid,
                                             epoch, seq)
    for impl in IMPLS:
        batch = impl.Batch(1.0)
        for k, v, ts, h in rows:
            batch.append(k, v, ts, h, None)
        assert batch.count() == len(rows) and batch.size() == size
        assert batch.write(bytearray(), 0, -1) == size  # the size pass writes nothing
        out = bytearray(size + 16)
        with pytest.raises(IndexError):
            batch.write(out, 0, size - 1, pid, epoch, seq)
        assert batch.write(out, 8, size, pid, epoch, seq) == size
        assert bytes(out[8 : 8 + size]) == bytes(want[:size]), impl.__name__
        assert bytes(batch.encoded(pid, epoch, seq)) == bytes(want[:size])
        assert batch.reports() is None  # no callback: nothing kept for reports
    got = _decode(bytes(want[:size]))
    assert int.from_bytes(want[17:21], "big") == crc32c.crc32c(bytes(want[21:size]))
    assert [(g[2], g[3], g[1]) for g in got] == [(k, v, ts) for k, v, ts, _ in rows]
    assert [[(hk, hv) for hk, hv in g[4]] for g in got] == [
        [(hk, hv) for hk, hv in (h or [])] for _, _, _, h in rows]


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_reports_are_kept_from_the_first_callback_on(impl) -> None:
    def cb(err, msg):
        return None

    batch = impl.Batch(0.0)
    batch.append(None, b"a", 5, None, None)
    assert batch.reports() is None
    batch.append(b"k", b"b", 6, [("h", b"x")], cb)
    batch.append(None, None, 7, None, None)
    assert batch.reports() == [None, (cb, b"k", b"b", 6, [("h", b"x")]), None]


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_batch_refuses_bad_input(impl) -> None:
    batch = impl.Batch(0.0)
    with pytest.raises(ValueError):
        batch.write(bytearray(100), 0, 61)  # no record yet
    with pytest.raises(TypeError):
        batch.append("str key", b"v", 0, None, None)
    with pytest.raises(TypeError):
        batch.append(None, 42, 0, None, None)
    with pytest.raises(ValueError):
        batch.append(None, b"v", 0, [(None, b"x")], None)
    assert batch.count() == 0  # nothing half-added
    batch.append(None, b"v", 0, None, None)
    with pytest.raises(ValueError):
        batch.load(bytearray(100), 100, 1, 0, 0)  # not empty
    data = batch.release()
    assert isinstance(data, bytearray)
    with pytest.raises(ValueError):
        batch.append(None, b"w", 0, None, None)  # released: its buffer went to another batch


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_load_takes_an_encoded_batch(impl) -> None:
    """produce_batch's batches: encode_arrow_batch_into's bytes, header rewritten on write."""
    import numpy as np

    values = [b"a", b"bcd", b""]
    offsets = np.array([0, 1, 4, 4], np.int32)
    data = np.frombuffer(b"abcd", np.uint8)
    rows = np.arange(3, dtype=np.int64)
    size = -fast.encode_arrow_batch_into(bytearray(), 0, 0, rows, None, None, None, offsets,
                                         data, None, 1234)
    buf = bytearray(size + 10)  # a reused buffer may be larger
    fast.encode_arrow_batch_into(buf, 0, size, rows, None, None, None, offsets, data, None, 1234)
    batch = impl.Batch(0.0, buf)
    batch.load(buf, size, 3, 1234, 1234)
    out = bytearray(size)
    batch.write(out, 0, size, 7, 1, 40)
    got = DefaultRecordBatch(bytes(out))
    assert got.validate_crc() and got.producer_id == 7 and got.base_sequence == 40
    records = list(got)
    assert [r.value for r in records] == values and {r.timestamp for r in records} == {1234}
    with pytest.raises(ValueError):
        impl.Batch(0.0).load(buf, size + 11, 3, 0, 0)  # used past the buffer


@pytest.mark.skipif(not fast.HAVE_FAST, reason="the compiled lock")
def test_rlock_is_reentrant_and_exclusive() -> None:
    lock = fast._client.RLock()
    with lock:
        with lock:
            pass
    with pytest.raises(RuntimeError):
        lock.release()
    held = threading.Event()
    go = threading.Event()
    order = []

    def other() -> None:
        with lock:
            held.set()
            go.wait(5)
            order.append("other")

    t = threading.Thread(target=other)
    t.start()
    held.wait(5)
    with pytest.raises(RuntimeError):
        lock.release()  # not the owner
    go.set()
    with lock:  # waits for the other thread (the GIL released meanwhile)
        order.append("main")
    t.join(5)
    assert order == ["other", "main"]


@PROPS
@given(st.lists(blob, min_size=1, max_size=40), st.data())
def test_extend_writes_what_append_writes(values, data) -> None:
    """produce_batch's keyless lists: ``extend`` over a slice encodes what ``append`` would, and
    ``bytes_stats`` gives the bytes and the longest value."""
    start = data.draw(st.integers(0, len(values) - 1))
    stop = data.draw(st.integers(start + 1, len(values)))
    want = _client_reference.Batch(0.0)
    for v in values[start:stop]:
        want.append(None, v, 77, None, None)
    for impl in IMPLS:
        got = impl.Batch(0.0)
        got.extend(values, start, stop, 77)
        assert bytes(got.encoded(3, 0, 9)) == bytes(want.encoded(3, 0, 9)), impl.__name__
        lengths = [len(v) for v in values if v is not None]
        assert impl.bytes_stats(values) == (sum(lengths), max(lengths, default=0))


@PROPS
@given(st.lists(st.one_of(blob, st.sampled_from(["str", 3, bytearray(b"b")])), max_size=40),
       st.integers(-1, 45))
def test_bytes_stats_of_a_prefix_checks_the_whole_list(values, stop) -> None:
    """``bytes_stats(values, stop)``: the bytes and the longest value of ``values[:stop]`` (all
    of it for a negative ``stop``), but every item of the list checked (produce_batch queues the
    prefix its queue has room for and refuses a call with a bad item anywhere), in one pass
    without a slice."""
    bad = [i for i, v in enumerate(values) if v is not None and type(v) is not bytes]
    head = values if stop < 0 else values[:stop]
    lengths = [len(v) for v in head if type(v) is bytes]
    want = (-1, bad[0]) if bad else (sum(lengths), max(lengths, default=0))
    for impl in IMPLS:
        assert impl.bytes_stats(values, stop) == want, impl.__name__


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_extend_and_bytes_stats_refuse_other_items(impl) -> None:
    assert impl.bytes_stats([b"a", None, "str", 3]) == (-1, 2)
    batch = impl.Batch(0.0)
    with pytest.raises(TypeError):
        batch.extend([b"a", bytearray(b"b")], 0, 2, 0)
    with pytest.raises(IndexError):
        batch.extend([b"a"], 0, 2, 0)


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_extend_after_appends_grows_and_stops_at_a_bad_item(impl) -> None:
    """``extend`` (one loop, no ``append`` per record in C) on a batch that holds records
    already, from a spare buffer too small for one record: the timestamps' deltas from the
    first record (earlier and later), the room grown, and a value that is not bytes raising
    TypeError with the records before it kept, exactly as ``append`` one by one does."""
    want = _client_reference.Batch(0.0)
    got = impl.Batch(0.0, bytearray(70))
    for b in (want, got):
        b.append(b"k", b"first", 1_000, None, None)
    values = [b"v" * 200, None, b"", b"w" * 3000]
    for v in values:
        want.append(None, v, 500, None, None)
    got.extend(values, 0, len(values), 500)
    for v in values[1:3]:
        want.append(None, v, 2_000, None, None)
    got.extend(values, 1, 3, 2_000)
    with pytest.raises(TypeError):
        got.extend([b"a", b"b", "str", b"c"], 0, 4, 2_000)
    for v in (b"a", b"b"):
        want.append(None, v, 2_000, None, None)
    assert got.count() == want.count() == 9
    assert bytes(got.encoded(7, 1, 0)) == bytes(want.encoded(7, 1, 0))
    rows = _decode(bytes(got.encoded(7, 1, 0)))
    assert [r[1] for r in rows] == [1_000] + [500] * 4 + [2_000] * 4
    assert [r[3] for r in rows][1:] == values + values[1:3] + [b"a", b"b"]
