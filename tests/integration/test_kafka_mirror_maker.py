"""Outgrowing one machine: MirrorMaker 2 moves topics, records and a group's committed offsets
from a running shmq to Apache Kafka, and the group's consumer carries on there.

The migration of the README ("Outgrowing one machine"), end to end: records are produced to shmq
and a consumer group reads them and commits; MirrorMaker 2 (Kafka's ``connect-mirror``, the
README's ``mm2.properties``) starts and copies while producers still write to shmq; then the
producers stop, the consumers drain and stop, MirrorMaker catches up (records and the group's
offsets), and producers and consumers move to Kafka by changing only their bootstrap address.
Kafka must hold every record at the same offset with the same key, value, headers and timestamp,
and the consumer must read there exactly the records produced to Kafka: nothing lost, nothing
read twice.

MirrorMaker translates a group's offset exactly where it has an offset sync, which it always
has for the last record before the producers stopped (its periodic commit emits it); that is why
the consumers drain before they move.  A consumer moved while it lags may re-read up to
``offset.lag.max`` (100) records per partition on Kafka.

The default suite moves 20,000 records; the ``slow`` run moves 1,000,000.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import apache_kafka
import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 6


def mm2_properties(shmq: str, kafka: str, topics: str, groups: str) -> str:
    """The README's mm2.properties, with the test's addresses and a fast pace."""
    return f"""\
# shmq -> Apache Kafka, one way (README, "Outgrowing one machine")
clusters = shmq, kafka
shmq.bootstrap.servers = {shmq}
kafka.bootstrap.servers = {kafka}
shmq->kafka.enabled = true
shmq->kafka.topics = {topics}
shmq->kafka.groups = {groups}
# one way: no flow, and no heartbeats, back into shmq
kafka->shmq.enabled = false
kafka->shmq.emit.heartbeats.enabled = false
# the same topic names on Kafka, so clients only change their bootstrap address
replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy
# committed offsets of groups with no members on Kafka are written there
sync.group.offsets.enabled = true
sync.group.offsets.interval.seconds = 1
emit.checkpoints.interval.seconds = 1
# the copying task commits (and writes its latest offset sync) every second, on Kafka's side
kafka.offset.flush.interval.ms = 1000
refresh.topics.interval.seconds = 5
refresh.groups.interval.seconds = 5
# MirrorMaker's own topics live on Kafka; nothing is written to shmq
offset-syncs.topic.location = target
# shmq has no ACLs to copy
sync.topic.acls.enabled = false
# a single-node Kafka; a real cluster keeps its default of 3
replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
config.storage.replication.factor = 1
"""


@pytest.fixture
def shmq(tmp_path: Path) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path / "data")
    try:
        yield b
    finally:
        assert b.stop() == 0, b.log_path.read_text()[-3000:]


def produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4",
                  "log_level": 0})
    for i in range(start, start + count):
        while True:
            try:
                p.produce(topic, key=b"k%d" % i, value=b"value-%09d" % i,
                          headers=[("n", b"%d" % i)] if i % 3 == 0 else None)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def consume(bootstrap: str, group: str, topic: str, count: int, deadline_s: float,
            commit: bool) -> list[bytes]:
    """Read ``count`` records as ``group`` (from its committed offsets, else the earliest),
    a little longer to see any extra, commit, leave."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    values: list[bytes] = []
    eof: set[int] = set()
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline and not (len(values) >= count
                                                   and len(eof) == PARTITIONS):
            for m in c.consume(10_000, 0.5):
                if m.error() is not None:
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    eof.add(m.partition())
                    continue
                eof.discard(m.partition())
                values.append(m.value())
        if commit and values:
            c.commit(asynchronous=False)
    finally:
        c.close()
    return values


def ends(bootstrap: str, topic: str) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "mm2-ends", "log_level": 0})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(PARTITIONS)]
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    try:
        return [tp.offset for tp in c.committed([TopicPartition(topic, p)
                                                 for p in range(PARTITIONS)], timeout=30)]
    finally:
        c.close()


def digest(bootstrap: str, topic: str, total: int) -> list[str]:
    """Per partition: a hash over every record's offset, key, value, headers and timestamp."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "mm2-digest", "log_level": 0,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    hashes = [hashlib.sha256() for _ in range(PARTITIONS)]
    n, eof = 0, set()
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (n >= total and len(eof) == PARTITIONS):
            for m in c.consume(10_000, 0.5):
                if m.error() is not None:
                    eof.add(m.partition())
                    continue
                eof.discard(m.partition())
                hashes[m.partition()].update(repr((m.offset(), m.key(), m.value(), m.headers(),
                                                   m.timestamp())).encode())
                n += 1
    finally:
        c.close()
    assert n == total, f"read {n} records of {total} from {bootstrap}"
    return [h.hexdigest() for h in hashes]


def start_mirror_maker(props: Path) -> subprocess.Popen[bytes]:
    log = open(props.with_suffix(".log"), "wb")
    try:
        return subprocess.Popen(apache_kafka.tool_command("mirror-maker", [str(props)],
                                                          heap="512m"),
                                stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=apache_kafka._die_with_parent)
    finally:
        log.close()


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def migrate(tmp_path: Path, shmq: RunningBroker, kafka: apache_kafka.KafkaBroker,
            before: int, during: int, after: int = 2_000) -> None:
    topic = f"mm2-{uuid.uuid4().hex[:8]}"
    group = f"{topic}-readers"
    admin = AdminClient({"bootstrap.servers": shmq.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={
        "retention.ms": "-1"})])[topic].result(30)
    produce(shmq.bootstrap, topic, 0, before)
    read_on_shmq = consume(shmq.bootstrap, group, topic, before, 120, commit=True)

    props = tmp_path / "mm2.properties"
    props.write_text(mm2_properties(shmq.bootstrap, kafka.bootstrap, topic, group))
    log_path = props.with_suffix(".log")
    mm2 = start_mirror_maker(props)
    try:
        produce(shmq.bootstrap, topic, before, during)  # producers still write to shmq; then
        read_on_shmq += consume(shmq.bootstrap, group, topic, during, 120,  # they stop and
                                commit=True)                                 # readers drain
        total = before + during
        assert len(read_on_shmq) == total
        source_ends = ends(shmq.bootstrap, topic)
        stopped_at = committed(shmq.bootstrap, group, topic)
        assert sum(source_ends) == total and stopped_at == source_ends
        deadline = time.monotonic() + max(180, total / 2000)
        while True:  # every record on Kafka, and the group's offsets
            assert mm2.poll() is None, log_path.read_text()[-5000:]
            try:
                there = ends(kafka.bootstrap, topic), committed(kafka.bootstrap, group, topic)
            except Exception:  # noqa: BLE001 - the topic is not on Kafka yet
                there = ([], [])
            if there == (source_ends, stopped_at):
                break
            assert time.monotonic() < deadline, (
                f"MirrorMaker 2 did not catch up: Kafka has {there}, shmq {source_ends} and "
                f"{stopped_at}\n{log_path.read_text()[-5000:]}")
            time.sleep(1)
    finally:
        running = log_path.read_text()
        stop(mm2)
    # errors while it ran; its own shutdown races its scheduled tasks (a checkpoint task's
    # "Cannot accept new calls when AdminClient is closing"), which says nothing about shmq
    errors = [line for line in running.splitlines() if " ERROR " in line]
    assert not errors, "\n".join(errors[:20])

    # the same records at the same offsets
    assert digest(kafka.bootstrap, topic, total) == digest(shmq.bootstrap, topic, total)
    # producers and consumers move: only their bootstrap address changes
    produce(kafka.bootstrap, topic, total, after)
    read_on_kafka = consume(kafka.bootstrap, group, topic, after, 120, commit=True)
    assert len(read_on_kafka) == after, "records lost or read twice on Kafka"
    everything = read_on_shmq + read_on_kafka
    assert len(set(everything)) == len(everything) == total + after
    assert set(everything) == {b"value-%09d" % i for i in range(total + after)}


def test_mirror_maker_moves_records_and_group_offsets(tmp_path: Path, shmq: RunningBroker,
                                                      kafka: apache_kafka.KafkaBroker) -> None:
    migrate(tmp_path, shmq, kafka, before=12_000, during=8_000)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_mirror_maker_moves_a_million_records(tmp_path: Path, shmq: RunningBroker,
                                              kafka: apache_kafka.KafkaBroker) -> None:
    migrate(tmp_path, shmq, kafka, before=600_000, during=400_000)
