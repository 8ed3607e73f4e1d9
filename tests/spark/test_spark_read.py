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
