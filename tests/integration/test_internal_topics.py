"""``__consumer_offsets`` as Kafka shows it, with real clients (issue 20).

It is listed once a group uses the broker (internal, 50 partitions, led by node 0), kcat,
kafka-python (``exclude_internal_topics=False``) and confluent-kafka read it, its records decode with an independent reader (kafka-python's protocol types over Kafka's
record schemas: ``_offsets_records``) to the offsets the groups committed, no client can write it,
and a broker upgraded from the single-partition layout of earlier shmq versions places its
committed offsets into the 50 partitions at start, losing none.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from _monitoring import require_binary
from _offsets_records import committed, decode
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from shmq.coordinator.records import partition_for

OFFSETS = "__consumer_offsets"
LAG = {0: 2000, 1: 1400, 2: 1000}  # committed offset per partition of the topic


@pytest.fixture(scope="module")
def ibroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    home = tmp_path_factory.mktemp("internal")
    b = start_broker(home / "data", "--override", "group.min.session.timeout.ms=1000")
    try:
        yield b
    finally:
        code = b.stop()
        log = b.log_path.read_text()
        shutil.rmtree(home)
        assert code == 0, log
        assert "Traceback" not in log and " ERROR " not in log, log[-5000:]


def create_topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"it-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the result is in
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                 asynchronous=False)
    finally:
        c.close()


def committed_by_broker(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)
        return [tp.offset for tp in got]
    finally:
        c.close()


def kafka_python_metadata(bootstrap: str) -> dict[str, dict]:
    """Every topic of a Metadata request (kafka-python's admin client: is_internal included)."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return {t["name"]: t for t in admin.describe_topics()}
    finally:
        admin.close()


def test_listed_as_kafka_lists_it(ibroker: RunningBroker) -> None:
    topics = kafka_python_metadata(ibroker.bootstrap)
    assert OFFSETS not in topics  # no group yet: Kafka creates it for the first one too
    topic = create_topic(ibroker.bootstrap)
    commit(ibroker.bootstrap, "first-group", topic, {0: 1})
    meta = kafka_python_metadata(ibroker.bootstrap)[OFFSETS]
    assert meta["is_internal"] is True and meta["error_code"] == 0
    assert sorted(p["partition_index"] for p in meta["partitions"]) == list(range(50))
    assert {(p["leader_id"], tuple(p["replica_nodes"]), tuple(p["isr_nodes"]))
            for p in meta["partitions"]} == {(0, (0,), (0,))}
    assert not kafka_python_metadata(ibroker.bootstrap)[topic]["is_internal"]
    # every worker serves the same metadata
    for w in ibroker.run_info["workers"]:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{w['port']}"})
        listed = admin.list_topics(OFFSETS, timeout=10).topics[OFFSETS]
        assert listed.error is None and len(listed.partitions) == 50


def consume_all(consumer: Consumer, until: dict[tuple, int], timeout: float = 30) -> dict:
    """Poll ``__consumer_offsets`` records until the committed offsets include ``until``."""
    records: list[tuple[bytes, bytes | None]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None or msg.error() is not None:
            continue
        assert msg.topic() == OFFSETS
        records.append((msg.key(), msg.value()))
        if until.items() <= committed(records).items():
            return committed(records)
    raise AssertionError(f"{until} not read from {OFFSETS}; got {committed(records)}")


def test_confluent_kafka_reads_it(ibroker: RunningBroker) -> None:
    """librdkafka has no ``exclude.internal.topics``: its regex subscriptions match internal
    topics like any other (checked against this broker: ``^__.*`` gets all 50 partitions)."""
    topic = create_topic(ibroker.bootstrap)
    group = f"lag-{uuid.uuid4().hex[:6]}"
    commit(ibroker.bootstrap, group, topic, LAG)
    expected = {(group, topic, p): o for p, o in LAG.items()}
    reader = Consumer({"bootstrap.servers": ibroker.bootstrap, "auto.offset.reset": "earliest",
                       "group.id": f"r-{uuid.uuid4().hex[:6]}", "session.timeout.ms": 6000})
    try:
        reader.subscribe([f"^{OFFSETS}$"])
        got = consume_all(reader, expected)
        assert {k: v for k, v in got.items() if k[0] == group} == expected
        assert len(reader.assignment()) == 50
    finally:
        reader.close()


def test_kafka_python_reads_it_with_exclude_internal_topics_false(
        ibroker: RunningBroker) -> None:
    from kafka import KafkaConsumer

    topic = create_topic(ibroker.bootstrap)
    group = f"lag-{uuid.uuid4().hex[:6]}"
    commit(ibroker.bootstrap, group, topic, LAG)
    commit(ibroker.bootstrap, group, topic, {1: 1500})  # the last commit wins
    expected = {(group, topic, 0): 2000, (group, topic, 1): 1500, (group, topic, 2): 1000}
    common = {"bootstrap_servers": ibroker.bootstrap, "auto_offset_reset": "earliest",
              "session_timeout_ms": 6000, "heartbeat_interval_ms": 500}
    consumer = KafkaConsumer(group_id=f"kp-{uuid.uuid4().hex[:6]}",
                             exclude_internal_topics=False, **common)
    hidden = KafkaConsumer(group_id=f"kp-{uuid.uuid4().hex[:6]}", **common)
    try:
        hidden.subscribe(pattern=f"^{OFFSETS}$")  # is_internal: the default excludes it
        consumer.subscribe(pattern=f"^{OFFSETS}$")
        records: list[tuple[bytes, bytes | None]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not expected.items() <= committed(records).items():
            for msgs in consumer.poll(timeout_ms=200).values():
                records += [(m.key, m.value) for m in msgs]
        got = committed(records)
        assert {k: v for k, v in got.items() if k[0] == group} == expected
        # ListOffsets from kafka-python (served by node 0): the ends of the group's partition
        tp = __import__("kafka").TopicPartition(OFFSETS, partition_for(group, 50))
        assert consumer.beginning_offsets([tp])[tp] == 0
        assert consumer.end_offsets([tp])[tp] >= 4  # at least this group's four commits
        assert hidden.poll(timeout_ms=500) == {} and hidden.subscription() in (None, set())
    finally:
        consumer.close()
        hidden.close()


def test_kcat_reads_it(ibroker: RunningBroker) -> None:
    kcat = require_binary("kcat")
    topic = create_topic(ibroker.bootstrap)
    group = f"lag-{uuid.uuid4().hex[:6]}"
    commit(ibroker.bootstrap, group, topic, LAG)
    listing = subprocess.run([kcat, "-b", ibroker.bootstrap, "-L", "-t", OFFSETS],
                             capture_output=True, text=True, timeout=30)
    assert listing.returncode == 0, listing.stderr
    assert f'topic "{OFFSETS}" with 50 partitions' in listing.stdout
    # a header line, then the raw key and value bytes of the lengths it gives
    out = subprocess.run([kcat, "-b", ibroker.bootstrap, "-C", "-t", OFFSETS, "-o", "beginning",
                          "-e", "-q", "-f", "%p %o %K %S\n%k%s"],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    data, pos, records = out.stdout, 0, []
    while pos < len(data):
        end = data.index(b"\n", pos)
        partition, _offset, klen, vlen = (int(x) for x in data[pos:end].split())
        key = data[end + 1 : end + 1 + klen]
        value = data[end + 1 + klen : end + 1 + klen + max(vlen, 0)] if vlen >= 0 else None
        pos = end + 1 + klen + max(vlen, 0)
        records.append((key, value))
        assert partition == partition_for(decode(key, value)[1][0], 50)  # Kafka's placement
    assert {k: v for k, v in committed(records).items() if k[0] == group} == {
        (group, topic, p): o for p, o in LAG.items()}


def test_clients_cannot_write_it(ibroker: RunningBroker) -> None:
    topic = create_topic(ibroker.bootstrap)
    group = f"safe-{uuid.uuid4().hex[:6]}"
    commit(ibroker.bootstrap, group, topic, LAG)
    admin = AdminClient({"bootstrap.servers": ibroker.bootstrap})
    p = partition_for(group, 50)
    producer = Producer({"bootstrap.servers": ibroker.bootstrap, "message.timeout.ms": 5000})
    errors = []
    producer.produce(OFFSETS, b"forged", key=b"forged", partition=p,
                     on_delivery=lambda err, msg: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None and errors[0].name() == "TOPIC_EXCEPTION", errors
    with pytest.raises(KafkaException, match="TOPIC_EXCEPTION"):
        admin.delete_records([TopicPartition(OFFSETS, p, 1)])[
            TopicPartition(OFFSETS, p, 1)].result(10)
    with pytest.raises(KafkaException, match="INVALID_REQUEST"):  # librdkafka: no message
        admin.delete_topics([OFFSETS])[OFFSETS].result(10)
    with pytest.raises(KafkaException, match="internal topic"):
        admin.create_partitions([NewPartitions(OFFSETS, 60)])[OFFSETS].result(10)
    with pytest.raises(KafkaException, match="TOPIC_ALREADY_EXISTS"):  # Kafka's answer
        admin.create_topics([NewTopic(OFFSETS, 3, 1)])[OFFSETS].result(10)
    assert committed_by_broker(ibroker.bootstrap, group, topic, 3) == list(LAG.values())
    c = Consumer({"bootstrap.servers": ibroker.bootstrap, "group.id": "w"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(OFFSETS, p), 10)
    finally:
        c.close()
    assert low == 0 and high >= len(LAG)


def test_upgrade_from_the_single_partition_layout(tmp_path: Path) -> None:
    """A data dir written before ``__consumer_offsets`` was listed: one partition on disk, no
    topic in the metadata.  The next start places every group's records into 50 partitions and
    keeps every committed offset."""
    from kafka import KafkaConsumer

    data = tmp_path / "data"
    old = start_broker(data, "--override", "offsets.topic.num.partitions=1",
                       "--override", "group.min.session.timeout.ms=1000")
    groups = [f"up-{i}" for i in range(12)]
    try:
        topic = create_topic(old.bootstrap)
        for i, g in enumerate(groups):
            commit(old.bootstrap, g, topic, {0: 10 + i, 1: 20 + i, 2: 30 + i})
        # a group with members (group metadata records too), which commits as a member
        member = KafkaConsumer(topic, bootstrap_servers=old.bootstrap, group_id="member-group",
                               session_timeout_ms=6000, heartbeat_interval_ms=500,
                               enable_auto_commit=False)
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(timeout_ms=100)
        tp_cls = __import__("kafka").TopicPartition
        from kafka.structs import OffsetAndMetadata

        member.commit({tp_cls(topic, p): OffsetAndMetadata(100 + p, "meta", -1)
                       for p in range(3)})
        member.close(autocommit=False)
    finally:
        assert old.stop() == 0, old.log_path.read_text()
    controller = data / "controller"
    assert sorted(d.name for d in controller.glob(f"{OFFSETS}-*")) == [f"{OFFSETS}-0"]
    meta_path = data / "meta" / "cluster.json"
    meta = json.loads(meta_path.read_text())
    del meta["topics"][OFFSETS]  # as earlier versions wrote it: never listed
    meta_path.write_text(json.dumps(meta))
    for attempt in range(2):  # the second start finds the placed layout and keeps it
        b = start_broker(data)
        try:
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            listed = admin.list_topics(OFFSETS, timeout=10).topics[OFFSETS]
            assert len(listed.partitions) == 50, attempt
            for i, g in enumerate(groups):
                assert committed_by_broker(b.bootstrap, g, topic, 3) == [10 + i, 20 + i, 30 + i]
            assert committed_by_broker(b.bootstrap, "member-group", topic, 3) == [100, 101, 102]
        finally:
            assert b.stop() == 0, b.log_path.read_text()
    on_disk = {int(d.name.rsplit("-", 1)[1]) for d in controller.glob(f"{OFFSETS}-*")}
    wanted = {partition_for(g, 50) for g in [*groups, "member-group"]}
    assert wanted <= on_disk <= set(range(50)) and len(wanted) > 5
