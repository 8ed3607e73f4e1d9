"""Topics written by real clients for the Spark tests: confluent-kafka (every codec), kcat and
kafka-python, with keys, null keys and values, headers (one with a null value) and set
timestamps, over several partitions."""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

BASE_TS = (int(time.time()) - 3600) * 1000  # an hour ago: no retention deletes it
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
KCAT = shutil.which("kcat")


def create_topics(bootstrap: str, topics: dict[str, int], config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, n, 1, config=config or {})
                                   for t, n in topics.items()])
    for f in futures.values():
        f.result(30)


def record(i: int) -> dict[str, Any]:
    """The i-th test record: every fourth key null, every seventh value null, headers on every
    third (one with a null value), a timestamp that moves by 10 ms a record."""
    out: dict[str, Any] = {
        "key": None if i % 4 == 0 else b"key-%d" % (i % 13),
        "value": None if i % 7 == 0 else b"value-%d-" % i + bytes([i % 251]) * (i % 40),
        "timestamp": BASE_TS + 10 * i,
    }
    if i % 3 == 0:
        out["headers"] = [("h1", b"one-%d" % i), ("h\u00e9", None)]
    return out


def produce_confluent(bootstrap: str, topic: str, n: int, codec: str = "none",
                      partitions: int | None = None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20,
                  "enable.idempotence": True, "batch.num.messages": 300})
    for i in range(n):
        r = record(i)
        kw = {"partition": i % partitions} if partitions else {}
        p.produce(topic, value=r["value"], key=r["key"], timestamp=r["timestamp"],
                  headers=r.get("headers"), **kw)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def produce_kafka_python(bootstrap: str, topic: str, n: int, codec: str = "gzip") -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=10)
    try:
        for i in range(n):
            r = record(i)
            if r["key"] is None and r["value"] is None:
                r["value"] = b""  # kafka-python refuses a record with neither
            p.send(topic, value=r["value"], key=r["key"], timestamp_ms=r["timestamp"],
                   headers=[(k, v if v is not None else b"") for k, v in r.get("headers", [])])
        p.flush(30)
    finally:
        p.close(10)


def produce_kcat(bootstrap: str, topic: str, n: int) -> None:
    assert KCAT is not None
    lines = "".join(f"k{i % 5}:line {i}\n" for i in range(n))
    subprocess.run([KCAT, "-P", "-b", bootstrap, "-t", topic, "-K:", "-z", "snappy",
                    "-H", "source=kcat"], input=lines.encode(), check=True, timeout=60)
