"""The README's job (``shmq/cli/demo_spark.py``, what ``make run`` runs) on the shared session:
the per-page statistics are right, and the streaming variant resumes from its checkpoint with
exactly the new events."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from _spark_data import create_topics
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from shmq.cli import demo_spark


def read_back(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-check",
                  "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        out, eof = [], 0
        while eof < partitions:
            m = c.poll(10)
            assert m is not None
            if m.error():
                eof += 1
            else:
                out.append(m)
        return out
    finally:
        c.close()


def test_pipeline_and_streaming_variant(spark: Any, sbroker: Any, tmp_path: Path) -> None:
    b = sbroker.bootstrap
    create_topics(b, {"clicks": 6, "page-stats": 3, "checkout-clicks": 3})
    demo_spark.produce_clicks(b, 3000, seed=1)
    assert demo_spark.pipeline(spark, b, tmp_path) == 3000
    events = [json.loads(m.value()) for m in read_back(b, "clicks", 6)]
    views = Counter(e["page"] for e in events)
    stats = {m.key().decode(): json.loads(m.value()) for m in read_back(b, "page-stats", 3)}
    assert {p: s["views"] for p, s in stats.items()} == dict(views)
    assert all(s["users"] == len({e["user"] for e in events if e["page"] == p})
               for p, s in stats.items())
    assert spark.read.parquet(str(tmp_path / "page-stats.parquet")).count() == len(views)

    checkpoint = tmp_path / "checkpoint"
    assert demo_spark.stream_checkout(spark, b, checkpoint) == 3000
    demo_spark.produce_clicks(b, 500, seed=2)
    assert demo_spark.stream_checkout(spark, b, checkpoint) == 500
    checkout = [m for m in read_back(b, "clicks", 6) if json.loads(m.value())["page"] == "checkout"]
    assert sorted(m.value() for m in read_back(b, "checkout-clicks", 3)) == \
        sorted(m.value() for m in checkout)
