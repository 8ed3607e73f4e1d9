"""``batches_to_spark_arrow`` against the record decoder: Spark's Kafka schema, offsets cut
inside batches, LogAppendTime batches (timestampType 1), control batches left out, headers null
when a record has none (Spark's ``KafkaRecordToRowConverter``)."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmq.ipc.buffers import BufferPool
from shmq.ipc.reader import batches_to_spark_arrow, spark_schema
from shmq.protocol import records as rec

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _log(batches: list[tuple[list, bool, bool]]) -> tuple[bytes, list]:
    out, base, expected = b"", 0, []
    for items, lat, control in batches:
        b = rec.encode_batch(items, base_offset=base, control=control,
                             timestamp_type=rec.LOG_APPEND_TIME if lat else rec.CREATE_TIME,
                             log_append_time=1_700_000_000_123 if lat else None)
        for r in rec.RecordBatchView(b).records():
            if not control:
                expected.append((r, 1 if lat else 0))
        out += bytes(b)
        base += len(items)
    return out, expected


item = st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.binary(max_size=50),
                 st.integers(0, 2**41), st.lists(st.tuples(st.text(max_size=5),
                                                           st.one_of(st.none(), st.binary(max_size=5))),
                                                 max_size=2))


POOL = BufferPool(max_bytes=1 << 20)  # shared across examples: buffers are reused


@PROPS
@given(st.lists(st.tuples(st.lists(item, min_size=1, max_size=5), st.booleans(), st.booleans()),
                min_size=1, max_size=6), st.integers(0, 10), st.integers(0, 40),
       st.booleans(), st.booleans())
def test_spark_arrow_matches_the_decoder(batches, lo, span, headers, pooled) -> None:
    buf, expected = _log(batches)
    hi = lo + span
    got = batches_to_spark_arrow(memoryview(buf), "t.opic", 3, lo, hi, include_headers=headers,
                                 alloc=POOL.take if pooled else None)
    assert got.schema == spark_schema(headers)
    want = [(r, t) for r, t in expected if lo <= r.offset < hi]
    rows = got.to_pylist()
    assert [row["offset"] for row in rows] == [r.offset for r, _ in want]
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    for row, (r, t) in zip(rows, want, strict=True):
        assert (row["key"], row["value"], row["topic"], row["partition"]) == (r.key, r.value,
                                                                              "t.opic", 3)
        assert row["timestamp"] == epoch + datetime.timedelta(milliseconds=r.timestamp)
        assert row["timestampType"] == t
        if headers:
            assert row["headers"] == ([{"key": k, "value": v} for k, v in r.headers]
                                      if r.headers else None)


def test_spark_schema_types() -> None:
    s = spark_schema(True)
    assert s.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert s.field("partition").type == pa.int32() and s.field("timestampType").type == pa.int32()
    assert s.field("headers").type == pa.list_(pa.struct([("key", pa.string()),
                                                          ("value", pa.binary())]))


def test_empty_and_corrupt_input() -> None:
    assert batches_to_spark_arrow(memoryview(b""), "t", 0, 0, 10).num_rows == 0
    buf, _ = _log([([(None, b"v", 1, [])], False, False)])
    bad = bytearray(buf)
    bad[-1] ^= 1
    from shmq.errors import CorruptRecordError

    with pytest.raises(CorruptRecordError):
        batches_to_spark_arrow(memoryview(bytes(bad)), "t", 0, 0, 10)
