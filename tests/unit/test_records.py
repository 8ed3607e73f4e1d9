"""shmq.protocol.records against an independent oracle: kafka-python 3.0.12's record code.

kafka-python's ``DefaultRecordBatchBuilder`` / ``DefaultRecordBatch`` share no code with shmq
(their own varints, their own CRC-32C through the ``crc32c`` package, their own codecs through
python-snappy, lz4 and zstandard), so agreement both ways pins the byte format.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmq import _fast
from shmq.errors import CorruptRecordError
from shmq.protocol.compression import CODEC_NAMES, GZIP, LZ4, NONE, SNAPPY, ZSTD
from shmq.protocol.records import (
    LOG_APPEND_TIME,
    Record,
    RecordBatchView,
    batches_to_arrow,
    decode_batches,
    encode_batch,
    iter_batches,
)

with warnings.catch_warnings():
    # kafka-python 3.0.12 calls the deprecated importlib.resources.read_text on import.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

ROOT = Path(__file__).resolve().parents[2]
CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# a record that compresses well, so kafka-python never falls back to an uncompressed batch
FILLER = (b"filler-key", b"abcdefgh" * 64, [("f", b"1")])


# --- helpers -----------------------------------------------------------------------------------


def kp_build(
    recs: list[tuple[Any, Any, int, list]],
    codec: int = NONE,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytes:
    """Build a batch with kafka-python (offset deltas 0..n-1)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=transactional,
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
        batch_size=1 << 24,
    )
    for i, (key, value, ts, headers) in enumerate(recs):
        assert builder.append(i, timestamp=ts, key=key, value=value, headers=headers) is not None
    return bytes(builder.build())


def kp_records(buf: Any) -> list[tuple]:
    """(offset, timestamp, key, value, headers) of every record, as kafka-python sees them."""
    batch = DefaultRecordBatch(bytes(buf))
    return [(r.offset, r.timestamp, r.key, r.value, tuple(tuple(h) for h in r.headers))
            for r in batch]


def ours(buf: Any) -> list[tuple]:
    return [tuple(r) for r in RecordBatchView(buf).records()]


def arrow_rows(rb: Any) -> list[tuple]:
    assert rb.schema.names == ["offset", "timestamp", "key", "value"]
    assert rb.schema.field("timestamp").type == pa.timestamp("ms")
    cols = [
        rb.column(0).to_pylist(),
        rb.column(1).cast(pa.int64()).to_pylist(),
        rb.column(2).to_pylist(),
        rb.column(3).to_pylist(),
    ]
    return list(zip(*cols, strict=True))


def kp_header(buf: Any) -> dict[str, Any]:
    b = DefaultRecordBatch(bytes(buf))
    return dict(
        base_offset=b.base_offset, size=b.size_in_bytes, leader_epoch=b.leader_epoch,
        magic=b.magic, crc=b.crc, attributes=b.attributes, last_offset_delta=b.last_offset_delta,
        first_timestamp=b.first_timestamp, max_timestamp=b.max_timestamp,
        producer_id=b.producer_id, producer_epoch=b.producer_epoch,
        base_sequence=b.base_sequence, records_count=b.records_count,
        timestamp_type=b.timestamp_type, transactional=b.is_transactional,
        control=b.is_control_batch, compression=b.compression_type,
    )


def our_header(buf: Any) -> dict[str, Any]:
    v = RecordBatchView(buf)
    return dict(
        base_offset=v.base_offset, size=v.size, leader_epoch=v.partition_leader_epoch,
        magic=v.magic, crc=v.crc, attributes=v.attributes, last_offset_delta=v.last_offset_delta,
        first_timestamp=v.base_timestamp, max_timestamp=v.max_timestamp,
        producer_id=v.producer_id, producer_epoch=v.producer_epoch,
        base_sequence=v.base_sequence, records_count=v.records_count,
        timestamp_type=v.timestamp_type, transactional=v.is_transactional,
        control=v.is_control, compression=v.compression_type,
    )


def kp_crc_ok(buf: Any) -> bool:
    return DefaultRecordBatch(bytes(buf)).validate_crc()


# --- strategies --------------------------------------------------------------------------------

nullable = st.one_of(st.none(), st.binary(max_size=64))
header_lists = st.lists(
    st.tuples(st.one_of(st.text(max_size=10), st.sampled_from(["", "ключ", "🔑"])),
              st.one_of(st.none(), st.binary(max_size=20))),
    max_size=3,
)


@st.composite
def record_lists(draw: st.DrawFn, min_size: int = 1) -> list[tuple[Any, Any, int, list]]:
    base = draw(st.integers(0, 2**42))
    recs = draw(
        st.lists(
            st.tuples(nullable, nullable, st.integers(-(2**20), 2**30).map(lambda d: base + d),
                      header_lists),
            min_size=min_size, max_size=8,
        )
    )
    return [(k, v, ts, list(h)) for k, v, ts, h in recs]


producers = st.one_of(
    st.just((-1, -1, -1, False)),
    st.tuples(st.integers(0, 2**62), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1000),
              st.booleans()),
)


def with_filler(recs: list[tuple], codec: int) -> list[tuple]:
    if codec == NONE:
        return recs
    ts = recs[-1][2] if recs else 0
    return [*recs, (FILLER[0], FILLER[1], ts, list(FILLER[2]))]


def expected(recs: list[tuple], base_offset: int = 0, lat: int | None = None) -> list[tuple]:
    return [(base_offset + i, ts if lat is None else lat, k, v, tuple(tuple(h) for h in hs))
            for i, (k, v, ts, hs) in enumerate(recs)]


# --- kafka-python builds, shmq reads -----------------------------------------------------------

KP_CASES = [
    pytest.param(codec, hdrs, nulls, prod, id=f"{CODEC_NAMES[codec]}-{hdrs}-{nulls}-{prod}")
    for codec in CODECS
    for hdrs in ("headers", "noheaders")
    for nulls in ("nulls", "values")
    for prod in ("plain", "idempotent", "transactional")
]


@pytest.mark.parametrize(("codec", "hdrs", "nulls", "prod"), KP_CASES)
def test_kafka_python_batch_is_accepted_and_decodes_the_same(codec: int, hdrs: str, nulls: str,
                                                             prod: str) -> None:
    headers = [("h1", b"v1"), ("ключ", None), ("", b"")] if hdrs == "headers" else []
    recs = [
        (None if nulls == "nulls" else b"key-0", b"value-0" * 20, 1_700_000_000_000, headers),
        (b"key-1", None if nulls == "nulls" else b"v1", 1_700_000_000_005, headers[:1]),
        (None, None, 1_699_999_999_990, []) if nulls == "nulls" else (b"", b"", 1_700_000_000_001, []),
        (b"k" * 300, b"xyz" * 500, 1_700_000_000_003, headers),
    ]
    pid, epoch, seq, txn = {
        "plain": (-1, -1, -1, False),
        "idempotent": (4242, 7, 1000, False),
        "transactional": (2**40, 3, 0, True),
    }[prod]
    buf = kp_build(recs, codec, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                   transactional=txn)
    assert buf[21 + 1] & 0x07 == codec  # kafka-python did compress (attributes low byte)

    assert _fast.validate_batch(buf, 0, -1, True, True) == len(buf)
    view = RecordBatchView(buf)
    assert view.validate(strict=True) == len(buf)
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (pid, epoch, seq)
    assert view.is_transactional == txn
    assert view.compression_type == codec
    assert view.last_sequence == (-1 if seq == -1 else seq + len(recs) - 1)
    assert our_header(buf) == kp_header(buf)

    want = expected(recs)
    assert kp_records(buf) == want  # the oracle agrees with itself
    assert ours(buf) == want
    assert all(type(r) is Record for r in view.records())
    assert arrow_rows(batches_to_arrow(buf)) == [r[:4] for r in want]
    assert decode_batches(buf) == want


@FEW
@given(recs=record_lists(), codec=st.sampled_from(CODECS), prod=producers)
def test_kafka_python_random_batches_decode_the_same(recs: list[tuple], codec: int,
                                                     prod: tuple[int, int, int, bool]) -> None:
    recs = with_filler(recs, codec)
    pid, epoch, seq, txn = prod
    buf = kp_build(recs, codec, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                   transactional=txn)
    assert _fast.validate_batch(buf, 0, -1, True, True) == len(buf)
    want = kp_records(buf)
    assert want == expected(recs)
    assert ours(buf) == want
    assert arrow_rows(batches_to_arrow(buf)) == [r[:4] for r in want]
    assert our_header(buf) == kp_header(buf)


# --- shmq builds, kafka-python reads -----------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_NAMES.get)
@FEW
@given(
    recs=record_lists(),
    prod=producers,
    base_offset=st.integers(0, 2**62),
    epoch=st.integers(-1, 2**31 - 1),
)
def test_encode_batch_decodes_with_kafka_python(codec: int, recs: list[tuple],
                                                prod: tuple[int, int, int, bool],
                                                base_offset: int, epoch: int) -> None:
    pid, pepoch, seq, txn = prod
    buf = encode_batch(
        [(k, v, ts, hs) for k, v, ts, hs in recs], compression_type=codec,
        base_offset=base_offset, partition_leader_epoch=epoch, producer_id=pid,
        producer_epoch=pepoch, base_sequence=seq, transactional=txn,
    )
    assert type(buf) is bytearray
    assert kp_crc_ok(buf)
    h = kp_header(buf)
    assert h == our_header(buf)
    assert h["magic"] == 2
    assert h["size"] == len(buf)
    assert h["base_offset"] == base_offset and h["leader_epoch"] == epoch
    assert (h["producer_id"], h["producer_epoch"], h["base_sequence"]) == (pid, pepoch, seq)
    assert h["attributes"] == codec | (0x10 if txn else 0)
    assert (h["compression"], h["timestamp_type"], h["transactional"], h["control"]) == (
        codec, 0, txn, False)
    assert h["records_count"] == len(recs) and h["last_offset_delta"] == len(recs) - 1
    assert h["first_timestamp"] == recs[0][2]
    assert h["max_timestamp"] == max(r[2] for r in recs)
    want = expected(recs, base_offset)
    assert kp_records(buf) == want
    assert ours(buf) == want
    assert RecordBatchView(buf).validate(strict=True) == len(buf)


def test_encode_batch_default_timestamp_is_now_and_items_may_be_pairs() -> None:
    import time

    before = int(time.time() * 1000)
    buf = encode_batch([(b"k", b"v"), (None, b"w", None), (b"x", None, None, None)])
    after = int(time.time() * 1000)
    got = kp_records(buf)
    assert [r[2:4] for r in got] == [(b"k", b"v"), (None, b"w"), (b"x", None)]
    assert all(before <= r[1] <= after for r in got)
    assert [r[4] for r in got] == [(), (), ()]
    assert ours(buf) == got


def test_encode_batch_rejects_empty() -> None:
    with pytest.raises(ValueError):
        encode_batch([])


# --- stamping ----------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_NAMES.get)
@pytest.mark.parametrize("builder", ["kafka-python", "shmq"])
def test_stamp_keeps_crc_valid(codec: int, builder: str) -> None:
    recs = with_filler([(b"a", b"1", 100, [("h", b"x")]), (None, b"2", 101, [])], codec)
    if builder == "shmq":
        buf = encode_batch(recs, compression_type=codec, producer_id=9, producer_epoch=1,
                           base_sequence=0)
    else:
        buf = bytearray(kp_build(recs, codec, producer_id=9, producer_epoch=1, base_sequence=0))
    crc_before = RecordBatchView(buf).crc
    for base, epoch in [(0, 0), (123_456_789_012, 17), (2**63 - 1 - len(recs), 2**31 - 1),
                        (5, -1)]:
        view = RecordBatchView(buf)
        view.stamp(base, epoch)
        assert (view.base_offset, view.partition_leader_epoch) == (base, epoch)
        assert view.crc == crc_before
        assert view.validate(strict=True) == len(buf)
        assert kp_crc_ok(buf)
        h = kp_header(buf)
        assert (h["base_offset"], h["leader_epoch"]) == (base, epoch)
        assert kp_records(buf) == ours(buf) == expected(recs, base)
    # stamping through a memoryview of a larger buffer writes in place
    log = bytearray(b"\x00" * 7) + buf
    RecordBatchView(memoryview(log), 7).stamp(77, 3)
    assert bytes(log[7:]) != bytes(buf)
    assert kp_header(log[7:])["base_offset"] == 77 and kp_crc_ok(log[7:])


def test_stamp_needs_a_writable_buffer() -> None:
    buf = bytes(encode_batch([(b"k", b"v", 1)]))
    with pytest.raises((TypeError, ValueError, BufferError)):
        RecordBatchView(buf).stamp(1, 1)


# --- LogAppendTime -----------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_NAMES.get)
@FEW
@given(recs=record_lists(), lat=st.integers(0, 2**42))
def test_log_append_time(codec: int, recs: list[tuple], lat: int) -> None:
    buf = encode_batch(recs, compression_type=codec, timestamp_type=LOG_APPEND_TIME,
                       log_append_time=lat, base_offset=10)
    view = RecordBatchView(buf)
    assert view.timestamp_type == LOG_APPEND_TIME and view.max_timestamp == lat
    assert view.base_timestamp == recs[0][2]
    assert kp_crc_ok(buf)
    kb = DefaultRecordBatch(bytes(buf))
    assert kb.timestamp_type == 1
    kp = [(r.offset, r.timestamp, r.timestamp_type) for r in kb]
    assert kp == [(10 + i, lat, 1) for i in range(len(recs))]
    assert ours(buf) == expected(recs, 10, lat=lat)
    assert arrow_rows(batches_to_arrow(buf)) == [r[:4] for r in expected(recs, 10, lat=lat)]


def test_log_append_time_without_explicit_time_uses_max_timestamp() -> None:
    recs = [(b"a", b"1", 50, []), (b"b", b"2", 70, []), (b"c", b"3", 60, [])]
    buf = encode_batch(recs, timestamp_type=LOG_APPEND_TIME)
    assert [r.timestamp for r in DefaultRecordBatch(bytes(buf))] == [70, 70, 70]
    assert [r.timestamp for r in RecordBatchView(buf).records()] == [70, 70, 70]


# --- several batches ---------------------------------------------------------------------------


def _log(n_batches: int = 5) -> tuple[bytearray, list[tuple], list[int]]:
    """A log of batches from both builders with every codec, stamped with running offsets."""
    log = bytearray()
    want: list[tuple] = []
    starts = []
    offset = 0
    for i in range(n_batches):
        codec = CODECS[i % len(CODECS)]
        recs = with_filler(
            [(f"k{i}-{j}".encode(), f"v{i}-{j}".encode() * (j + 1), 1000 + 10 * i + j,
              [("i", str(i).encode())]) for j in range(i + 1)],
            codec,
        )
        if i % 2:
            buf = bytearray(kp_build(recs, codec))
        else:
            buf = encode_batch(recs, compression_type=codec)
        RecordBatchView(buf).stamp(offset, i)
        starts.append(len(log))
        log += buf
        want += expected(recs, offset)
        offset += len(recs)
    return log, want, starts


def test_iter_batches_and_decode_batches_over_a_log() -> None:
    log, want, starts = _log()
    views = list(iter_batches(log))
    assert [v._pos for v in views] == starts
    assert [v.partition_leader_epoch for v in views] == list(range(len(starts)))
    assert [bytes(v.buffer) for v in views] == [
        bytes(log[s:e]) for s, e in zip(starts, [*starts[1:], len(log)], strict=True)]
    assert [r for v in views for r in v.records()] == want
    assert decode_batches(log) == want
    assert decode_batches(memoryview(log)) == want
    assert arrow_rows(batches_to_arrow(log)) == [r[:4] for r in want]
    # kafka-python agrees batch by batch
    assert [r for s, e in zip(starts, [*starts[1:], len(log)], strict=True)
            for r in kp_records(log[s:e])] == want
    # a start/end window selects whole batches
    assert [v.base_offset for v in iter_batches(log, starts[1], starts[3])] == [
        views[1].base_offset, views[2].base_offset]
    assert list(iter_batches(log, len(log))) == []
    assert decode_batches(b"") == []


def test_iter_batches_stops_at_a_torn_tail() -> None:
    log, want, starts = _log(3)
    torn = log + encode_batch([(b"x", b"y", 1)])[:-1]
    seen = []
    with pytest.raises(CorruptRecordError):
        for view in iter_batches(torn):
            seen.append(view.base_offset)
    assert len(seen) == 3
    with pytest.raises(CorruptRecordError):
        decode_batches(torn)
    # a flipped byte in the second batch: the first is yielded, then the error
    bad = bytearray(log)
    bad[starts[1] + 70] ^= 0x40
    it = iter_batches(bad)
    assert next(it)._pos == 0
    with pytest.raises(CorruptRecordError):
        next(it)
    # without CRC checks the damaged batch is yielded
    assert len(list(iter_batches(bad, verify_crc=False))) == 3


def test_batches_to_arrow_offset_window_and_control_batches() -> None:
    log, want, _ = _log(4)
    control = encode_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", 5)],
                           control=True, transactional=True, producer_id=1, producer_epoch=0,
                           base_offset=len(want))
    log += control
    all_records = decode_batches(log)
    assert len(all_records) == len(want) + 1  # decode_batches keeps control records
    assert arrow_rows(batches_to_arrow(log)) == [r[:4] for r in want]  # arrow skips them
    assert len(batches_to_arrow(log, skip_control=False).column(0)) == len(want) + 1
    # (windows that keep no record at all are in test_batches_to_arrow_empty_results)
    for lo, hi in [(0, 1), (1, 4), (3, 4), (2, 100), (None, 5), (6, None), (-5, 1)]:
        got = arrow_rows(batches_to_arrow(log, min_offset=lo, max_offset=hi))
        lo_ = -(2**63) if lo is None else lo
        hi_ = 2**63 if hi is None else hi
        assert got == [r[:4] for r in want if lo_ <= r[0] < hi_], (lo, hi)
    # kafka-python reads the control batch as a control batch
    kb = DefaultRecordBatch(bytes(control))
    assert kb.is_control_batch and kb.validate_crc()
    with pytest.raises(CorruptRecordError):
        RecordBatchView(control).validate(strict=True)


def test_batches_to_arrow_nulls() -> None:
    recs = [(None, b"v", 1, []), (b"k", None, 2, []), (None, None, 3, []), (b"", b"", 4, [])]
    rb = batches_to_arrow(encode_batch(recs))
    assert rb.column(2).null_count == 2 and rb.column(3).null_count == 2
    assert arrow_rows(rb) == [(i, ts, k, v) for i, (k, v, ts, _) in enumerate(recs)]
    rb.validate(full=True)


_EMPTY_ARROW = '''
from shmq.protocol.records import ARROW_FIELDS, batches_to_arrow, encode_batch
log = encode_batch([(b"k", b"v", 1), (None, b"w", 2)], base_offset=10)
for kwargs, buf in [({}, b""), ({"min_offset": 12}, log), ({"max_offset": 10}, log),
                    ({"min_offset": 11, "max_offset": 11}, log)]:
    rb = batches_to_arrow(buf, **kwargs)
    assert rb.num_rows == 0, kwargs
    assert rb.schema.names == list(ARROW_FIELDS)
    rb.validate(full=True)
print("ok")
'''


def test_batches_to_arrow_empty_results() -> None:
    # An empty buffer, or an offset window that keeps no record (a fetch past the data), gives
    # an empty RecordBatch.  Run in a child process: a failure here has aborted the interpreter.
    proc = subprocess.run([sys.executable, "-c", _EMPTY_ARROW], capture_output=True, text=True,
                          timeout=60, env=_child_env())
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


# --- header accessors --------------------------------------------------------------------------


def test_view_accessors_match_the_header_struct() -> None:
    buf = encode_batch([(b"k", b"v", 5), (b"k2", b"v2", 9)], base_offset=100,
                       partition_leader_epoch=4, producer_id=11, producer_epoch=2,
                       base_sequence=2**31 - 1, transactional=True, compression_type=GZIP)
    fields = struct.unpack_from(">qiibIhiqqqhii", buf)
    v = RecordBatchView(buf)
    assert (v.base_offset, v.batch_length, v.partition_leader_epoch, v.magic, v.crc, v.attributes,
            v.last_offset_delta, v.base_timestamp, v.max_timestamp, v.producer_id,
            v.producer_epoch, v.base_sequence, v.records_count) == fields
    assert _fast.batch_header(buf) == fields
    assert (v.last_offset, v.next_offset, v.size) == (101, 102, len(buf))
    assert v.last_sequence == 0  # wraps at Int.MAX like DefaultRecordBatch
    assert DefaultRecordBatch(bytes(buf)).last_sequence == 0
    assert v.is_valid() and not v.is_control and not v.has_delete_horizon
    assert "count=2" in repr(v) and "gzip" in repr(v)


def test_few_batches_take_the_list_path_with_the_same_sections(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """``_records_sections`` of up to ``_FEW_BATCHES`` batches (a waiting reader's one-batch
    read; Consumer.poll's) goes through Python lists, not numpy: the same sections and meta as
    the numpy path for every codec, LogAppendTime, control batches and offset windows, and the
    same errors."""
    from shmq.protocol import records as rec

    log, want, starts = _log(5)
    lat = encode_batch([(b"k", b"v", 7), (None, b"w", 9)], base_offset=len(want),
                       timestamp_type=LOG_APPEND_TIME, log_append_time=123_456)
    control = encode_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", 5)],
                           control=True, transactional=True, producer_id=1, producer_epoch=0,
                           base_offset=len(want) + 2)
    log += lat + control
    ends = [*starts[1:], len(log) - len(lat) - len(control)]

    def both(buf: Any, **kw: Any) -> tuple[Any, Any]:
        got = rec._records_sections(buf, verify_crc=True, max_decompressed=1 << 24, **kw)
        with monkeypatch.context() as m:
            m.setattr(rec, "_FEW_BATCHES", -1)  # the numpy path
            ref = rec._records_sections(buf, verify_crc=True, max_decompressed=1 << 24, **kw)
        return got, ref

    windows = [{}, {"skip_control": True}, {"min_offset": 3, "max_offset": 9},
               {"min_offset": 100}, {"max_offset": 0}, {"min_offset": 14, "skip_control": True}]
    for buf in (log, log[starts[2]:ends[2]], bytes(lat), bytes(control), b""):
        for kw in windows:
            (bodies, meta), (ref_bodies, ref_meta) = both(memoryview(bytes(buf)), **kw)
            assert [bytes(b) for b in bodies] == [bytes(b) for b in ref_bodies], kw
            assert meta.dtype == ref_meta.dtype and meta.tolist() == ref_meta.tolist(), kw
    # the LogAppendTime batch's time and the control batch's presence reach the meta
    _, meta = rec._records_sections(memoryview(bytes(lat + control)), verify_crc=True,
                                    max_decompressed=1 << 24)
    assert meta.tolist() == [2, len(want), 7, 123_456, 1, len(want) + 2, 5,
                             _fast.NO_LOG_APPEND_TIME]
    # a lying records count is the same error on both paths
    bad = bytearray(encode_batch([(b"k", b"v", 1)]))
    struct.pack_into(">i", bad, 57, 1000)
    import crc32c

    struct.pack_into(">I", bad, 17, crc32c.crc32c(bytes(bad[21:])))  # a valid CRC over the lie
    for few in (8, -1):
        with monkeypatch.context() as m:
            m.setattr(rec, "_FEW_BATCHES", few)
            with pytest.raises(CorruptRecordError, match="cannot fit"):
                rec._records_sections(memoryview(bytes(bad)), verify_crc=True,
                                      max_decompressed=1 << 24)
