"""``shmq.protocol.kafka_arrow``: records sections into Spark's Kafka schema as Arrow.

The schema must be exactly what pyspark makes of Spark's Kafka source schema (pyspark >= 4.2
refuses anything else); the rows must be what ``decode_records`` (the tuple decoder) says,
with Kafka's conversions: microseconds, LogAppendTime batches, null (not empty) headers, header
keys that are not UTF-8 decoded with replacement characters.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute below; nothing else imports it)
import pytest

from shmq import _fast
from shmq.protocol.kafka_arrow import (
    DDL_WITH_HEADERS,
    SCHEMA,
    SCHEMA_WITH_HEADERS,
    empty_batch,
    sections_to_arrow,
)

NO_LAT = _fast.NO_LOG_APPEND_TIME


def test_schema_is_pysparks_arrow_schema_for_the_kafka_schema() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    base = [StructField("key", BinaryType()), StructField("value", BinaryType()),
            StructField("topic", StringType()), StructField("partition", IntegerType()),
            StructField("offset", LongType()), StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType())]
    headers = StructField("headers", ArrayType(StructType(
        [StructField("key", StringType()), StructField("value", BinaryType())])))
    assert to_arrow_schema(StructType(base), timezone="UTC").equals(SCHEMA)
    assert to_arrow_schema(StructType([*base, headers]), timezone="UTC").equals(
        SCHEMA_WITH_HEADERS)
    assert "headers array<struct<key: string, value: binary>>" in DDL_WITH_HEADERS
    assert empty_batch(True).schema.equals(SCHEMA_WITH_HEADERS)


def section(records: list[tuple], base_ts: int = 1_700_000_000_000) -> bytes:
    return _fast.encode_records(records, base_ts)


def test_rows_match_the_tuple_decoder() -> None:
    a = [(b"k1", b"v1", 1_700_000_000_000, [("h", b"1"), ("\u00e9", None)]),
         (None, b"v2", 1_700_000_000_005, []),
         (b"k3", None, 1_700_000_000_009, [("x", b"")])]
    b = [(b"k4", b"v4", 1_600_000_000_000, [])]
    bodies = [section(a), section(b, 1_600_000_000_000)]
    meta = np.array([3, 10, 1_700_000_000_000, NO_LAT,
                     1, 13, 1_600_000_000_000, 1_750_000_000_000], np.int64)  # b: LogAppendTime
    rb = sections_to_arrow(bodies, meta, "events", 4, min_offset=11, max_offset=14,
                           include_headers=True)
    assert rb.schema.equals(SCHEMA_WITH_HEADERS)
    utc = dt.timezone.utc
    got = rb.to_pylist()
    assert got == [
        {"key": None, "value": b"v2", "topic": "events", "partition": 4, "offset": 11,
         "timestamp": dt.datetime(2023, 11, 14, 22, 13, 20, 5000, tzinfo=utc),
         "timestampType": 0, "headers": None},
        {"key": b"k3", "value": None, "topic": "events", "partition": 4, "offset": 12,
         "timestamp": dt.datetime(2023, 11, 14, 22, 13, 20, 9000, tzinfo=utc),
         "timestampType": 0, "headers": [{"key": "x", "value": b""}]},
        {"key": b"k4", "value": b"v4", "topic": "events", "partition": 4, "offset": 13,
         "timestamp": dt.datetime.fromtimestamp(1_750_000_000, utc),  # the append time
         "timestampType": 1, "headers": None},
    ]
    whole = sections_to_arrow(bodies, meta, "events", 4, min_offset=0, max_offset=99,
                              include_headers=True).to_pylist()
    assert whole[0]["headers"] == [{"key": "h", "value": b"1"}, {"key": "\u00e9", "value": None}]
    assert sections_to_arrow(bodies, meta, "events", 4, min_offset=0,
                             max_offset=99).schema.equals(SCHEMA)


def test_invalid_utf8_header_keys_are_replaced_like_java() -> None:
    body = section([(None, b"v", 1, [(b"ok\xff", b"1"), (b"\xed\xa0\x80", None)])])
    meta = np.array([1, 0, 1, NO_LAT], np.int64)
    rb = sections_to_arrow([body], meta, "t", 0, min_offset=0, max_offset=1,
                           include_headers=True)
    keys = [h["key"] for h in rb.column("headers").to_pylist()[0]]
    assert keys == ["ok\ufffd", "\ufffd\ufffd\ufffd"]
    rb.validate(full=True)  # valid UTF-8 in the string column


@pytest.mark.parametrize("n", [0, 1, 9, 70_000])
def test_sizes_and_validity(n: int) -> None:
    recs = [(b"k%d" % i, None if i % 11 == 0 else b"v" * (i % 50), i, []) for i in range(n)]
    bodies = [section(recs, 0)] if n else []
    meta = np.array([n, 0, 0, NO_LAT] if n else [], np.int64)
    rb = sections_to_arrow(bodies, meta, "topic-x", 1, min_offset=0, max_offset=n)
    rb.validate(full=True)
    assert rb.num_rows == n
    assert rb.column("value").null_count == sum(1 for i in range(n) if i % 11 == 0)
    assert pa.compute.sum(rb.column("partition")).as_py() in (None, n)
    assert rb.column("topic").to_pylist() == ["topic-x"] * n
