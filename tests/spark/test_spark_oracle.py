"""The oracle: Spark's own Kafka connector, ``format("kafka")``, reading the shmq broker over the
Kafka protocol, against ``format("shmq")`` reading the same topics from the segment files.

Same options, identical DataFrames (schema and every row); for streams the same micro-batches
(start and end offsets, row counts) for the same ``maxOffsetsPerTrigger``.  The topics are
written by confluent-kafka with every codec, by kafka-python and by kcat, with keys and null
keys, null values, headers (and a null header value), set timestamps, a LogAppendTime topic,
several partitions.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _spark_data import (
    BASE_TS,
    CODECS,
    KCAT,
    create_topics,
    produce_confluent,
    produce_kafka_python,
    produce_kcat,
)

N = 900


@pytest.fixture(scope="module")
def topics(sbroker: Any) -> list[str]:
    b = sbroker.bootstrap
    names = {f"ck-{c}": 3 for c in CODECS} | {"kpy": 2, "kcat": 2}
    create_topics(b, names)
    create_topics(b, {"lat": 2}, {"message.timestamp.type": "LogAppendTime"})
    for codec in CODECS:
        produce_confluent(b, f"ck-{codec}", N, codec)
    produce_kafka_python(b, "kpy", 300, "lz4")
    produce_confluent(b, "lat", 200, "lz4")
    if KCAT is not None:
        produce_kcat(b, "kcat", 150)
    return [*names, "lat"]


def read(spark: Any, fmt: str, broker: Any, **options: str) -> tuple[Any, list]:
    reader = spark.read.format(fmt).option("kafka.bootstrap.servers", broker.bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load()
    return df, df.orderBy("topic", "partition", "offset").collect()


def same(spark: Any, kafka: str, broker: Any, **options: str) -> list:
    kdf, expected = read(spark, kafka, broker, **options)
    sdf, got = read(spark, "shmq", broker, **options)
    assert sdf.schema == kdf.schema
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g == e, (g, e)
    return got


def test_every_client_and_codec_with_headers(spark: Any, kafka_format: str, sbroker: Any,
                                            topics: list[str]) -> None:
    rows = same(spark, kafka_format, sbroker, subscribePattern="ck-.*|kpy|kcat|lat",
                includeHeaders="true")
    by_topic: dict[str, int] = {}
    for r in rows:
        by_topic[r.topic] = by_topic.get(r.topic, 0) + 1
    assert by_topic == {**{f"ck-{c}": N for c in CODECS}, "kpy": 300, "lat": 200,
                        **({"kcat": 150} if KCAT else {})}
    # what the comparison covered: null keys and values, null header values, both time types
    assert any(r.key is None for r in rows) and any(r.value is None for r in rows)
    assert any(r.headers and any(h.value is None for h in r.headers) for r in rows)
    assert {r.timestampType for r in rows} == {0, 1}
    assert any(r.headers is None for r in rows)


def test_without_headers_and_assign_with_offsets(spark: Any, kafka_format: str, sbroker: Any,
                                                topics: list[str]) -> None:
    same(spark, kafka_format, sbroker, subscribe="ck-gzip,ck-snappy")
    rows = same(spark, kafka_format, sbroker, assign=json.dumps({"ck-zstd": [0, 2]}),
                startingOffsets=json.dumps({"ck-zstd": {"0": 5, "2": -2}}),
                endingOffsets=json.dumps({"ck-zstd": {"0": 77, "2": -1}}))
    assert {r.partition for r in rows} == {0, 2}
    assert min(r.offset for r in rows if r.partition == 0) == 5
    assert max(r.offset for r in rows if r.partition == 0) == 76


def test_timestamps_and_min_partitions(spark: Any, kafka_format: str, sbroker: Any,
                                       topics: list[str]) -> None:
    middle = BASE_TS + 10 * 150
    rows = same(spark, kafka_format, sbroker, subscribe="ck-lz4,kpy",
                startingTimestamp=str(middle), endingTimestamp=str(middle + 2000))
    assert rows and all(middle <= r.timestamp.timestamp() * 1000 for r in rows)
    by_partition = json.dumps({"ck-none": {"0": middle, "1": BASE_TS, "2": middle + 10**9}})
    same(spark, kafka_format, sbroker, assign=json.dumps({"ck-none": [0, 1, 2]}),
         startingOffsetsByTimestamp=by_partition,
         startingOffsetsByTimestampStrategy="latest")
    # minPartitions splits big partitions the same way: the same Spark partitions
    def spark_partitions(fmt: str) -> list:
        df, _ = read(spark, fmt, sbroker, subscribe="ck-none,ck-gzip", minPartitions="9")
        return sorted(df.rdd.mapPartitions(lambda rows: [
            (lambda r: (r[0].topic, r[0].partition, r[0].offset, r[-1].offset) if r else None)(
                list(rows))]).collect(), key=str)

    split = spark_partitions("shmq")
    assert split == spark_partitions(kafka_format)
    assert len(split) > 6  # something was split


def micro_batches(spark: Any, fmt: str, broker: Any, checkpoint: str, **options: str) -> tuple:
    reader = (spark.readStream.format(fmt).option("kafka.bootstrap.servers", broker.bootstrap)
              .option("startingOffsets", "earliest"))
    for k, v in options.items():
        reader = reader.option(k, v)
    name = f"oracle_{fmt}_{abs(hash(checkpoint))}"
    q = (reader.load().writeStream.format("memory").queryName(name)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(300)
        batches = [(json.loads(p["sources"][0]["startOffset"] or "null"),
                    json.loads(p["sources"][0]["endOffset"]), p["numInputRows"])
                   for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    rows = spark.sql(f"select * from {name} order by topic, partition, offset").collect()
    spark.catalog.dropTempView(name)
    return batches, rows


def test_streaming_micro_batches_match(spark: Any, kafka_format: str, sbroker: Any,
                                       topics: list[str], tmp_path: Any) -> None:
    opts = {"subscribe": "ck-zstd,kpy", "maxOffsetsPerTrigger": "701"}
    k_batches, k_rows = micro_batches(spark, kafka_format, sbroker, str(tmp_path / "k"), **opts)
    s_batches, s_rows = micro_batches(spark, "shmq", sbroker, str(tmp_path / "s"), **opts)
    assert s_batches == k_batches
    assert len(k_batches) == -(-(N + 300) // 701)
    assert s_rows == k_rows
