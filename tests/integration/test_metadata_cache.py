"""Cached Metadata answers (``handlers/metadata.py``) through real processes and real clients:
every node (the controller and each worker answer Metadata from their own cache) answers a
topic's creation, growth, deletion and re-creation at once, to raw requests and to a
librdkafka consumer that reads the new partitions."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka_wire import Wire

TOPIC = "cached"


@pytest.fixture
def cluster(tmp_path) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path / "data", "--override", "auto.create.topics.enable=false")
    try:
        yield b
    finally:
        code = b.stop()
        assert code == 0, b.log_path.read_text()


def _metadata(wire: Wire, node: tuple[str, int] | None, topics: list[str]) -> dict:
    md = wire.send(3, 12, {"topics": [{"name": t, "topic_id": str(uuid.UUID(int=0))}
                                      for t in topics],
                           "allow_auto_topic_creation": False,
                           "include_topic_authorized_operations": False}, to=node)
    return {t["name"]: (t["error_code"], t["topic_id"], len(t["partitions"]))
            for t in md["topics"]}


def _nodes(wire: Wire) -> list[tuple[str, int] | None]:
    md = wire.send(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                           "include_topic_authorized_operations": False})
    return [None] + [(b["host"], b["port"]) for b in md["brokers"] if b["node_id"] != 0]


def _everywhere(wire: Wire, nodes: list, expect_error: int, expect_partitions: int,
                timeout: float = 10) -> set[str]:
    """Each node's answer for TOPIC (asked twice: the second from its cache) matches; the topic
    ids they answer.  Workers apply the controller's metadata before the admin call is answered
    (CreateTopics and CreatePartitions wait for their acks), so this holds at once; the short
    retry covers only DeleteTopics, whose workers apply the change asynchronously."""
    ids = set()
    for node in nodes:
        deadline = time.monotonic() + timeout
        while True:
            answers = [_metadata(wire, node, [TOPIC])[TOPIC] for _ in range(2)]
            if all(a[0] == expect_error and a[2] == expect_partitions for a in answers):
                break
            assert time.monotonic() < deadline, (node, answers)
            time.sleep(0.05)
        assert answers[0] == answers[1]
        ids.add(answers[0][1])
    return ids


def test_every_node_answers_topic_changes_at_once(cluster: RunningBroker) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    with Wire(cluster.bootstrap) as wire:
        nodes = _nodes(wire)
        assert len(nodes) == 3
        _everywhere(wire, nodes, 3, 0)  # UNKNOWN_TOPIC_OR_PARTITION, cached on every node
        for f in admin.create_topics([NewTopic(TOPIC, 3, 1)]).values():
            f.result(30)
        (first_id,) = _everywhere(wire, nodes, 0, 3)
        for f in admin.create_partitions([NewPartitions(TOPIC, 5)]).values():
            f.result(30)
        assert _everywhere(wire, nodes, 0, 5) == {first_id}
        for f in admin.delete_topics([TOPIC]).values():
            f.result(30)
        _everywhere(wire, nodes, 3, 0)
        for f in admin.create_topics([NewTopic(TOPIC, 2, 1)]).values():
            f.result(30)
        (second_id,) = _everywhere(wire, nodes, 0, 2)
        assert second_id != first_id


def test_a_consumer_reads_partitions_added_after_its_first_metadata(
        cluster: RunningBroker) -> None:
    """librdkafka learns of new partitions from a Metadata answer that must not be the cached
    answer of before CreatePartitions."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    for f in admin.create_topics([NewTopic(TOPIC, 2, 1)]).values():
        f.result(30)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "cache",
                         "enable.auto.commit": False, "log_level": 0})
    try:
        assert len(consumer.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions) == 2
        for f in admin.create_partitions([NewPartitions(TOPIC, 6)]).values():
            f.result(30)
        assert len(consumer.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions) == 6
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
        for p in range(6):
            producer.produce(TOPIC, b"v%d" % p, partition=p)
        assert producer.flush(30) == 0
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(6)])
        got: set[bytes] = set()
        deadline = time.monotonic() + 30
        while len(got) < 6 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.add(m.value())
        assert got == {b"v%d" % p for p in range(6)}
    finally:
        consumer.close()
