"""``format("shmq")`` batch reads: both transports agree, reads under a concurrent produce stop at
the high watermark, and offsets deleted after planning follow ``failOnDataLoss``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from _spark_data import create_topics, produce_confluent
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient


def shmq(spark: Any, broker: Any, **options: str) -> Any:
    reader = spark.read.format("shmq").option("kafka.bootstrap.servers", broker.bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def rows(df: Any) -> list:
    return df.orderBy("topic", "partition", "offset").collect()


def test_kafka_transport_returns_the_same_rows(spark: Any, sbroker: Any) -> None:
    create_topics(sbroker.bootstrap, {"r-transport": 3})
    produce_confluent(sbroker.bootstrap, "r-transport", 1200, "snappy")
    opts = {"subscribe": "r-transport", "includeHeaders": "true",
            "startingOffsets": '{"r-transport": {"0": 3, "1": -2, "2": 10}}'}
    mm = rows(shmq(spark, sbroker, **opts))
    over_tcp = rows(shmq(spark, sbroker, **opts, **{"shmq.transport": "kafka"}))
    assert len(mm) > 1000 and mm == over_tcp
    # the local broker is found from its bootstrap address, or from its data directory
    by_dir = rows(spark.read.format("shmq").option("shmq.dataDir", str(sbroker.data_dir))
                  .options(**opts).load())
    assert by_dir == mm


def test_reads_during_a_produce_stop_at_the_high_watermark(spark: Any, sbroker: Any) -> None:
    topic = "r-concurrent"
    create_topics(sbroker.bootstrap, {topic: 2})
    acked: dict[tuple[int, int], bytes] = {}
    stop = threading.Event()
    errors: list = []

    def produce() -> None:
        p = Producer({"bootstrap.servers": sbroker.bootstrap, "linger.ms": 2,
                      "enable.idempotence": True})

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                acked[(msg.partition(), msg.offset())] = msg.value()

        i = 0
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline and i < 100_000:
            p.produce(topic, value=b"%08d" % i + b"." * (i % 300), key=b"k%d" % (i % 17),
                      on_delivery=done)
            i += 1
            if i % 500 == 0:
                p.poll(0)
                time.sleep(0.02)  # ~25,000 records/s at most: the 2 cores also run Spark
        p.flush(30)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        seen = 0
        for _ in range(3):
            time.sleep(0.3)
            got = shmq(spark, sbroker, subscribe=topic).select("partition", "offset",
                                                                "value").collect()
            per_partition: dict[int, list[int]] = {}
            for r in got:
                per_partition.setdefault(r.partition, []).append(r.offset)
                # every row is a record the broker acknowledged, with its own value
                assert acked.get((r.partition, r.offset), bytes(r.value)) == bytes(r.value)
            for offs in per_partition.values():
                assert sorted(offs) == list(range(len(offs)))  # a prefix, no holes
            assert len(got) >= seen
            seen = len(got)
    finally:
        stop.set()
        thread.join(60)
    assert not errors and seen > 0


def test_records_deleted_after_planning_follow_fail_on_data_loss(spark: Any,
                                                                  sbroker: Any) -> None:
    from pyspark.errors import PythonException

    topic = "r-dataloss"
    create_topics(sbroker.bootstrap, {topic: 1})
    produce_confluent(sbroker.bootstrap, topic, 400, "none", partitions=1)
    admin = AdminClient({"bootstrap.servers": sbroker.bootstrap})
    strict = shmq(spark, sbroker, subscribe=topic)
    lenient = shmq(spark, sbroker, subscribe=topic, failOnDataLoss="false")
    strict_rdd, lenient_rdd = strict.rdd, lenient.rdd  # planned now: offsets 0 to 399
    assert strict_rdd.getNumPartitions() == lenient_rdd.getNumPartitions() == 1
    futures = admin.delete_records([TopicPartition(topic, 0, 150)])
    for f in futures.values():
        f.result(30)
    with pytest.raises(PythonException) as info:
        strict_rdd.count()
    text = str(info.value)
    assert "shmq: offsets 0 to 149 of r-dataloss-0 are no longer in the log" in text
    assert "failOnDataLoss" in text
    kept = [r.offset for r in lenient_rdd.collect()]
    assert kept == list(range(150, 400))
    # planned now, the deleted offsets are simply not there
    assert shmq(spark, sbroker, subscribe=topic).count() == 250


def test_read_committed_leaves_out_aborted_and_open_transactions(spark: Any,
                                                                  sbroker: Any) -> None:
    """``kafka.isolation.level=read_committed`` over the mapped segments: records of committed
    transactions and plain records, never those of aborted transactions (left out by the
    ``.txnindex``) nor of one still open (the read stops at the last stable offset); the same
    rows as over the Kafka protocol and as a confluent-kafka read_committed consumer."""
    from confluent_kafka import Consumer

    topic = "r-txn"
    create_topics(sbroker.bootstrap, {topic: 2})
    tx = Producer({"bootstrap.servers": sbroker.bootstrap, "transactional.id": "r-txn-1"})
    tx.init_transactions(30)
    expected = set()
    for n, commit in enumerate([True, False, True, False, True]):
        tx.begin_transaction()
        for i in range(20):
            value = b"t%d-%d" % (n, i)
            tx.produce(topic, value, partition=i % 2)
            if commit:
                expected.add(value)
        tx.flush(30)  # on the broker before the abort (librdkafka drops unsent ones itself)
        tx.commit_transaction(30) if commit else tx.abort_transaction(30)
    plain = Producer({"bootstrap.servers": sbroker.bootstrap})
    for i in range(10):
        plain.produce(topic, b"plain-%d" % i, partition=i % 2)
        expected.add(b"plain-%d" % i)
    assert plain.flush(30) == 0
    tx.begin_transaction()  # left open: its records lie past the last stable offset
    for i in range(6):
        tx.produce(topic, b"open-%d" % i, partition=i % 2)
    tx.flush(30)
    try:
        opts = {"subscribe": topic, "kafka.isolation.level": "read_committed"}
        mm = rows(shmq(spark, sbroker, **opts))
        over_tcp = rows(shmq(spark, sbroker, **opts, **{"shmq.transport": "kafka"}))
        assert {bytes(r.value) for r in mm} == expected
        assert {bytes(r.value) for r in rows(shmq(spark, sbroker, subscribe=topic))} >= {
            b"t1-%d" % i for i in range(20)}  # the aborted records are stored
        assert [(r.partition, r.offset, bytes(r.value)) for r in mm] == \
            [(r.partition, r.offset, bytes(r.value)) for r in over_tcp]
        c = Consumer({"bootstrap.servers": sbroker.bootstrap, "group.id": "r-txn-oracle",
                      "isolation.level": "read_committed", "enable.partition.eof": True,
                      "auto.offset.reset": "earliest"})
        try:
            c.assign([TopicPartition(topic, p, 0) for p in range(2)])
            seen, eof = [], set()
            deadline = time.monotonic() + 30
            while len(eof) < 2 and time.monotonic() < deadline:
                for m in c.consume(500, 0.5):
                    if m.error():
                        eof.add(m.partition())
                    else:
                        seen.append((m.partition(), m.offset(), m.value()))
        finally:
            c.close()
        assert sorted(seen) == [(r.partition, r.offset, bytes(r.value)) for r in mm]
        # read_uncommitted sees everything up to the high watermark, open transaction included
        everything = rows(shmq(spark, sbroker, subscribe=topic))
        assert {b"open-%d" % i for i in range(6)} <= {bytes(r.value) for r in everything}
    finally:
        tx.abort_transaction(30)
