"""``df.write.format("shmq")`` and ``writeStream.format("shmq")``: Kafka's sink columns through
the broker, idempotent with acks=all, keyed records in the partition Kafka's Java client
chooses (kafka-python's murmur2, a port of Java's ``Utils.murmur2``, is the oracle)."""

from __future__ import annotations

import datetime as dt
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from _spark_data import create_topics, produce_confluent
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from shmq_test_broker import start_broker

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2


@pytest.fixture(scope="module")
def wbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    b = start_broker(tmp_path_factory.mktemp("spark-write") / "data",
                     "--override", "auto.create.topics.enable=false")
    try:
        yield b
    finally:
        assert b.stop() == 0


def consume(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.partition.eof": True,
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        out, eof = [], set()
        while len(eof) < partitions:
            m = c.poll(10)
            assert m is not None, "timed out reading back"
            if m.error():
                eof.add(m.partition())
                continue
            out.append(m)
        return out
    finally:
        c.close()


def write(df: Any, bootstrap: str, **options: str) -> None:
    w = df.write.format("shmq").option("kafka.bootstrap.servers", bootstrap).mode("append")
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


@pytest.mark.parametrize("transport", ["auto", "kafka"])
def test_batch_write_with_every_sink_column(spark: Any, wbroker: Any, transport: str) -> None:
    """auto: the shared-memory rings (the broker is local); kafka: confluent-kafka."""
    topic = f"w-out-{transport}"
    create_topics(wbroker.bootstrap, {topic: 5})
    ts = dt.datetime(2024, 5, 6, 7, 8, 9, 123000)
    rows = [(f"key-{i}" if i % 5 else None, f"value-{i}",
             [("source", b"spark"), ("n", str(i).encode())] if i % 3 == 0 else None,
             2 if i % 10 == 7 else None, ts)
            for i in range(2000)]
    df = spark.createDataFrame(rows, "key string, value string, "
                               "headers array<struct<key: string, value: binary>>, "
                               "partition int, timestamp timestamp")
    def ring_entries() -> int:
        return sum(s.get("ring_entries", 0) for s in wbroker.worker_stats(after=time.time()))

    before = ring_entries()
    write(df, wbroker.bootstrap, topic=topic, **{"shmq.transport": transport})
    through_rings = ring_entries() - before
    assert (through_rings > 0) == (transport == "auto"), through_rings
    got = consume(wbroker.bootstrap, topic, 5)
    assert len(got) == 2000
    by_value = {m.value().decode(): m for m in got}
    for key, value, headers, partition, _ in rows:
        m = by_value[value]
        assert (m.key().decode() if m.key() is not None else None) == key
        assert m.headers() == ([(k, v) for k, v in headers] if headers else None)
        assert m.timestamp()[1] == int(ts.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
        if partition is not None:
            assert m.partition() == partition
        elif key is not None:  # Java's default partitioner: murmur2(key) mod partitions
            assert m.partition() == (murmur2(key.encode()) & 0x7FFFFFFF) % 5


def test_topic_column_and_round_trip_through_read(spark: Any, wbroker: Any) -> None:
    create_topics(wbroker.bootstrap, {"w-a": 2, "w-b": 1, "w-copy": 3})
    df = spark.createDataFrame([("w-a" if i % 2 else "w-b", bytes([i % 256]) * 3)
                                for i in range(300)], "topic string, value binary")
    write(df, wbroker.bootstrap)
    assert len(consume(wbroker.bootstrap, "w-a", 2)) == 150
    assert len(consume(wbroker.bootstrap, "w-b", 1)) == 150
    # read a topic and write it to another: the option overrides the topic column
    src = (spark.read.format("shmq").option("kafka.bootstrap.servers", wbroker.bootstrap)
           .option("subscribe", "w-a,w-b").load())
    write(src.select("topic", "key", "value"), wbroker.bootstrap, topic="w-copy")
    copied = sorted(m.value() for m in consume(wbroker.bootstrap, "w-copy", 3))
    assert copied == sorted(bytes(r.value) for r in src.collect())


def test_write_errors(spark: Any, wbroker: Any) -> None:
    create_topics(wbroker.bootstrap, {"w-err": 2})

    def err(df: Any, expected: str, **options: str) -> None:
        with pytest.raises(Exception) as info:  # noqa: B017 - the text is what matters
            write(df, wbroker.bootstrap, **options)
        assert f"shmq: {expected}" in str(info.value), str(info.value)[-2000:]

    values = spark.createDataFrame([("a",), ("b",)], "value string")
    err(values, "topic option required when no 'topic' attribute is present")
    err(spark.createDataFrame([("t", "a")], "topic string, payload string"),
        "required attribute 'value' not found")
    err(spark.createDataFrame([(1,)], "value int"), "value attribute unsupported type int",
        topic="w-err")
    err(spark.createDataFrame([("a", 1.5)], "value string, partition double"),
        "partition attribute unsupported type double", topic="w-err")
    err(spark.createDataFrame([(None, "a")], "topic string, value string"),
        "null topic present in the data")
    err(values, "topic 'w-missing' does not exist and the broker does not create topics "
        "automatically", topic="w-missing")
    err(spark.createDataFrame([("a", 9)], "value string, partition int"),
        "cannot write a record to w-err-9", topic="w-err")
    # a negative partition over the Kafka protocol too (librdkafka reads -1 as "any")
    err(spark.createDataFrame([("a", -1)], "value string, partition int"),
        "cannot write a record to w-err--1", topic="w-err", **{"shmq.transport": "kafka"})
    assert consume(wbroker.bootstrap, "w-err", 2) == []


def test_stream_write_available_now(spark: Any, wbroker: Any, tmp_path: Any) -> None:
    create_topics(wbroker.bootstrap, {"w-src": 3, "w-dst": 3})
    produce_confluent(wbroker.bootstrap, "w-src", 1000, "zstd")
    q = (spark.readStream.format("shmq").option("kafka.bootstrap.servers", wbroker.bootstrap)
         .option("subscribe", "w-src").option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "400").option("includeHeaders", "true").load()
         .selectExpr("key", "value", "headers")
         .writeStream.format("shmq").option("kafka.bootstrap.servers", wbroker.bootstrap)
         .option("topic", "w-dst").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(300)
    src = consume(wbroker.bootstrap, "w-src", 3)
    dst = consume(wbroker.bootstrap, "w-dst", 3)
    assert sorted((m.key() or b"", m.value() or b"") for m in dst) == \
        sorted((m.key() or b"", m.value() or b"") for m in src)
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 1000 and len(sizes) == 3 and max(sizes) <= 400
