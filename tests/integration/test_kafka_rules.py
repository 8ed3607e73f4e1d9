"""Kafka 4's rules for Fetch, ListOffsets, OffsetForLeaderEpoch and the topic admin APIs,
case by case, over raw requests (kio encodes them; the broker's answer is compared with what
Kafka's sources say it answers: ``Partition``, ``ReplicaManager``, ``KafkaApis``,
``ControllerApis``, ``ReplicationControlManager``, ``ConfigAdminManager``).

The helpers find leaders through Metadata, not through shmq's files, so the same cases can run
against an Apache Kafka broker.  The one exception is the leader-epoch test: shmq has no API
that bumps an epoch, so it re-elects the leaders in place by editing the stopped broker's
metadata file.
"""

from __future__ import annotations

import datetime
import json
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kio.schema.create_partitions.v3.request import (
    CreatePartitionsAssignment,
    CreatePartitionsRequest,
    CreatePartitionsTopic,
)
from kio.schema.create_topics.v7.request import (
    CreatableReplicaAssignment,
    CreatableTopic,
    CreatableTopicConfig,
    CreateTopicsRequest,
)
from kio.schema.delete_topics.v5.request import DeleteTopicsRequest as DeleteTopicsRequestV5
from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.incremental_alter_configs.v1.request import (
    AlterableConfig,
    AlterConfigsResource,
    IncrementalAlterConfigsRequest,
)
from kio.schema.list_offsets.v8.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from shmq.cli.configs import kafka_call
from shmq.protocol.records import encode_batch, iter_batches

NONE, UNKNOWN_SERVER_ERROR, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION = 0, -1, 1, 3
INVALID_TOPIC, INVALID_PARTITIONS, INVALID_REPLICA_ASSIGNMENT, INVALID_CONFIG = 17, 37, 39, 40
INVALID_REQUEST, POLICY_VIOLATION = 42, 44
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, UNKNOWN_TOPIC_ID = 74, 75, 100
FETCH_MAX_BYTES = 20_000  # the module broker's fetch.max.bytes
ZERO = None  # the zero topic id, as kio decodes it
SECONDS = datetime.timedelta(seconds=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    home = tmp_path_factory.mktemp("kafka-rules")
    b = start_broker(home / "data", "--override", f"fetch.max.bytes={FETCH_MAX_BYTES}")
    try:
        yield b
    finally:
        code = b.stop()
        log = b.log_path.read_text()
        shutil.rmtree(home)
        assert code == 0, log


# --- raw requests ----------------------------------------------------------------------------


def call(address: str, request: Any) -> Any:
    return kafka_call(address, request, 15)


def metadata(bootstrap: str, *topics: str) -> dict[str, Any]:
    body = call(bootstrap, MetadataRequest(
        topics=tuple(MetadataRequestTopic(topic_id=None, name=t) for t in topics),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    brokers = {int(b.node_id): f"{b.host}:{b.port}" for b in body.brokers}
    return {t.name: (t, brokers) for t in body.topics}


def leader(bootstrap: str, topic: str, partition: int = 0) -> str:
    t, brokers = metadata(bootstrap, topic)[topic]
    (p,) = [p for p in t.partitions if p.partition_index == partition]
    return brokers[int(p.leader_id)]


def leaders(bootstrap: str, topic: str) -> list[int]:
    t, _ = metadata(bootstrap, topic)[topic]
    return [int(p.leader_id) for p in sorted(t.partitions, key=lambda p: p.partition_index)]


def create(bootstrap: str, *topics: CreatableTopic, validate_only: bool = False) -> list[Any]:
    return list(call(bootstrap, CreateTopicsRequest(
        topics=topics, timeout=SECONDS, validate_only=validate_only)).topics)


def new_topic(name: str, partitions: int = 1, rf: int = -1, assignments: Any = (),
              **configs: str | None) -> CreatableTopic:
    return CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=rf,
        assignments=tuple(CreatableReplicaAssignment(partition_index=i, broker_ids=tuple(b))
                          for i, b in assignments),
        configs=tuple(CreatableTopicConfig(name=k.replace("_", "."), value=v)
                      for k, v in configs.items()))


def produce(bootstrap: str, topic: str, counts: list[int], size: int = 10,
            partition: int = 0) -> None:
    """One batch per count, acks=1, straight to the leader."""
    data = tuple(PartitionProduceData(index=partition, records=bytes(encode_batch(
        [(None, b"v" * size)] * n))) for n in counts)
    address = leader(bootstrap, topic, partition)
    for d in data:
        body = call(address, ProduceRequest(
            transactional_id=None, acks=1, timeout=SECONDS,
            topic_data=(TopicProduceData(name=topic, partition_data=(d,)),)))
        assert int(body.responses[0].partition_responses[0].error_code) == NONE


def fetch_partition(partition: int, offset: int, epoch: int = -1, last_fetched: int = -1,
                    max_bytes: int = 1 << 20) -> FetchPartition:
    return FetchPartition(partition=partition, current_leader_epoch=epoch, fetch_offset=offset,
                          last_fetched_epoch=last_fetched, log_start_offset=-1,
                          partition_max_bytes=max_bytes)


def fetch(address: str, *topics: tuple[str, list[FetchPartition]], max_bytes: int = 1 << 30,
          max_wait_ms: int = 0, min_bytes: int = 0) -> list[tuple[str, Any]]:
    body = call(address, FetchRequest(
        cluster_id=None, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes, max_bytes=max_bytes,
        topics=tuple(FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in topics),
        forgotten_topics_data=()))
    return [(t.topic, p) for t in body.responses for p in t.partitions]


def batch_offsets(records: bytes | None) -> list[tuple[int, int]]:
    """(base offset, last offset) of every whole batch in a Fetch answer's records."""
    return [(b.base_offset, b.last_offset) for b in iter_batches(records or b"")]


def offsets(p: Any) -> tuple[int, int, int, int]:
    return int(p.error_code), p.high_watermark, p.last_stable_offset, p.log_start_offset


# --- leader epochs (Partition.checkCurrentLeaderEpoch, LeaderEpochFileCache, KIP-595) ---------


def test_leader_epochs_fence_and_diverge(tmp_path: Path) -> None:
    """Epoch 0 holds offsets 0..9; the leader is re-elected in place (epoch 1) and takes 10..14.
    An older current_leader_epoch is FENCED_LEADER_EPOCH (74), a newer UNKNOWN_LEADER_EPOCH (75),
    in Fetch, ListOffsets and OffsetForLeaderEpoch alike; the epoch history answers end offsets
    and KIP-595 diverging epochs."""
    b = start_broker(tmp_path / "data")
    try:
        assert [r.error_code for r in create(b.bootstrap, new_topic("ep", 1))] == [NONE]
        produce(b.bootstrap, "ep", [4, 6])
    finally:
        assert b.stop() == 0, b.log_path.read_text()
    path = tmp_path / "data" / "meta" / "cluster.json"  # a re-election in place: epoch + 1
    meta = json.loads(path.read_text())
    meta["topics"]["ep"]["partitions"][0]["leader_epoch"] += 1
    path.write_text(json.dumps(meta))
    b = start_broker(tmp_path / "data")
    try:
        produce(b.bootstrap, "ep", [5])
        address = leader(b.bootstrap, "ep")

        def fetch_ep(**kw: Any) -> Any:
            ((_, p),) = fetch(address, ("ep", [fetch_partition(0, **kw)]))
            return p

        for epoch, code in ((0, FENCED_LEADER_EPOCH), (2, UNKNOWN_LEADER_EPOCH)):
            p = fetch_ep(offset=0, epoch=epoch)
            assert offsets(p) == (code, -1, -1, -1) and not p.records
        for epoch in (1, -1):
            p = fetch_ep(offset=0, epoch=epoch)
            assert offsets(p) == (NONE, 15, 15, 0)
            assert batch_offsets(p.records) == [(0, 3), (4, 9), (10, 14)]

        # KIP-595: epoch 0 ended at 10; a consumer at 12 that last fetched in epoch 0 diverged
        p = fetch_ep(offset=12, epoch=1, last_fetched=0)
        assert offsets(p) == (NONE, 15, 15, 0) and not p.records
        assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (0, 10)
        p = fetch_ep(offset=10, epoch=1, last_fetched=0)
        assert p.diverging_epoch.epoch == -1 and batch_offsets(p.records) == [(10, 14)]
        p = fetch_ep(offset=15, epoch=1, last_fetched=1)
        assert p.diverging_epoch.epoch == -1 and offsets(p) == (NONE, 15, 15, 0)
        for last in (2, 7):  # an epoch the partition never had: no end offset to compare
            assert offsets(fetch_ep(offset=12, epoch=1, last_fetched=last))[0] == \
                OFFSET_OUT_OF_RANGE

        def list_offsets(epoch: int) -> Any:
            body = call(address, ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
                ListOffsetsTopic(name="ep", partitions=(ListOffsetsPartition(
                    partition_index=0, current_leader_epoch=epoch, timestamp=-1),)),)))
            p = body.topics[0].partitions[0]
            return int(p.error_code), p.offset, p.leader_epoch

        assert list_offsets(0) == (FENCED_LEADER_EPOCH, -1, -1)
        assert list_offsets(2) == (UNKNOWN_LEADER_EPOCH, -1, -1)
        assert list_offsets(1) == list_offsets(-1) == (NONE, 15, 1)

        def end_offset(current: int, epoch: int) -> tuple[int, int, int]:
            body = call(address, OffsetForLeaderEpochRequest(replica_id=-1, topics=(
                OffsetForLeaderTopic(topic="ep", partitions=(OffsetForLeaderPartition(
                    partition=0, current_leader_epoch=current, leader_epoch=epoch),)),)))
            p = body.topics[0].partitions[0]
            return int(p.error_code), p.leader_epoch, p.end_offset

        assert end_offset(0, 0) == (FENCED_LEADER_EPOCH, -1, -1)
        assert end_offset(2, 0) == (UNKNOWN_LEADER_EPOCH, -1, -1)
        assert end_offset(1, 0) == end_offset(-1, 0) == (NONE, 0, 10)
        assert end_offset(1, 1) == (NONE, 1, 15)
        assert end_offset(1, 4) == (NONE, -1, -1)  # newer than any epoch: undefined, no error
    finally:
        assert b.stop() == 0, b.log_path.read_text()


# --- Fetch --------------------------------------------------------------------------------------


def test_error_partitions_carry_no_offsets(cluster: RunningBroker) -> None:
    """ReplicaManager.createLogReadResult / FetchResponse.partitionResponse: -1 for the high
    watermark, last stable offset and log start offset of a partition in error."""
    create(cluster.bootstrap, new_topic("errs", 1))
    produce(cluster.bootstrap, "errs", [3])
    got = fetch(leader(cluster.bootstrap, "errs"),
                ("errs", [fetch_partition(0, 1000), fetch_partition(7, 0)]),
                ("errs-missing", [fetch_partition(0, 0)]))
    assert [(t, p.partition_index, *offsets(p)) for t, p in got] == [
        ("errs", 0, OFFSET_OUT_OF_RANGE, -1, -1, -1),
        ("errs", 7, UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1),
        ("errs-missing", 0, UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1)]


def test_a_partition_asked_twice_is_answered_once(cluster: RunningBroker) -> None:
    """Kafka keys a Fetch by topic-partition: one answer, where the partition was first asked,
    with the offset and limits of its last mention."""
    create(cluster.bootstrap, new_topic("twice", -1, assignments=[(0, [1]), (1, [1])]))
    produce(cluster.bootstrap, "twice", [10, 10, 10])
    produce(cluster.bootstrap, "twice", [5], partition=1)
    got = fetch(leader(cluster.bootstrap, "twice"),
                ("twice", [fetch_partition(0, 0, max_bytes=1), fetch_partition(1, 0)]),
                ("twice", [fetch_partition(0, 25)]))
    assert [(t, p.partition_index, batch_offsets(p.records)) for t, p in got] == [
        ("twice", 0, [(20, 29)]), ("twice", 1, [(0, 4)])]


def test_fetch_max_bytes_caps_the_response(cluster: RunningBroker) -> None:
    """KafkaApis: the response limit is min(max_bytes, fetch.max.bytes); the first batch with
    data is whole even when larger (KIP-74), so max_bytes 0 is one batch; a negative limit fails
    the segment read of a partition with data (UNKNOWN_SERVER_ERROR)."""
    create(cluster.bootstrap, new_topic("capped", 1))
    produce(cluster.bootstrap, "capped", [8] * 10, size=500)  # ten batches of ~4 KiB
    address = leader(cluster.bootstrap, "capped", 0)
    ((_, p),) = fetch(address, ("capped", [fetch_partition(0, 0, max_bytes=1 << 30)]))
    assert 0 < len(p.records) <= FETCH_MAX_BYTES and len(batch_offsets(p.records)) == 4
    ((_, p),) = fetch(address, ("capped", [fetch_partition(0, 0)]), max_bytes=0)
    assert batch_offsets(p.records) == [(0, 7)]
    ((_, p),) = fetch(address, ("capped", [fetch_partition(0, 16, max_bytes=0)]))
    assert batch_offsets(p.records) == [(16, 23)]
    ((_, p),) = fetch(address, ("capped", [fetch_partition(0, 0)]), max_bytes=-1)
    assert offsets(p) == (UNKNOWN_SERVER_ERROR, -1, -1, -1)
    ((_, p),) = fetch(address, ("capped", [fetch_partition(0, 80)]), max_bytes=-1)
    assert offsets(p) == (NONE, 80, 80, 0) and not p.records  # at the high watermark: no read


def test_a_long_poll_on_a_deleted_partition_answers_at_once(cluster: RunningBroker) -> None:
    """DelayedFetch.tryComplete: a partition that disappears completes the fetch at once;
    partitions unknown when the request came are answered without waiting for them."""
    create(cluster.bootstrap, new_topic("doomed", 1))
    address = leader(cluster.bootstrap, "doomed")
    started = time.monotonic()
    fetch(address, ("nothing-here", [fetch_partition(0, 0)]), max_wait_ms=5000, min_bytes=1)
    assert time.monotonic() - started < 2  # nothing to wait for
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.extend(fetch(
        address, ("doomed", [fetch_partition(0, 0)]), max_wait_ms=8000, min_bytes=1)))
    started = time.monotonic()
    waiter.start()
    time.sleep(0.5)
    body = call(cluster.bootstrap, DeleteTopicsRequestV5(topic_names=("doomed",), timeout=SECONDS))
    assert int(body.responses[0].error_code) == NONE
    waiter.join(15)
    elapsed = time.monotonic() - started
    assert elapsed < 3, elapsed  # not the 8 s max_wait
    assert [(t, offsets(p)) for t, p in got] == [("doomed", (UNKNOWN_TOPIC_OR_PARTITION,
                                                             -1, -1, -1))]


# --- CreateTopics / CreatePartitions / DeleteTopics / IncrementalAlterConfigs ------------------


def test_create_topics_answers_configs_and_places_manual_assignments(
        cluster: RunningBroker) -> None:
    (ok, manual) = create(cluster.bootstrap, new_topic("cfg", 3, retention_ms="3600000"),
                          new_topic("manual", -1, -1, assignments=[(0, [2]), (1, [1]), (2, [2])]))
    assert (int(ok.error_code), ok.num_partitions, ok.replication_factor) == (NONE, 3, 1)
    assert ok.topic_id != ZERO
    configs = {c.name: (c.value, int(c.config_source), c.read_only, c.is_sensitive)
               for c in ok.configs}
    assert configs["retention.ms"] == ("3600000", 1, False, False)   # DYNAMIC_TOPIC_CONFIG
    assert configs["cleanup.policy"] == ("delete", 5, False, False)  # DEFAULT_CONFIG
    assert [c.name for c in ok.configs] == sorted(configs)
    assert (int(manual.error_code), manual.num_partitions, manual.replication_factor) == \
        (NONE, 3, 1)
    assert leaders(cluster.bootstrap, "manual") == [2, 1, 2]
    # validate_only: the same answer, nothing created
    (v,) = create(cluster.bootstrap, new_topic("dry", 2), validate_only=True)
    assert (int(v.error_code), v.num_partitions, len(v.configs) > 0) == (NONE, 2, True)
    assert int(metadata(cluster.bootstrap, "dry")["dry"][0].error_code) == \
        UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize(("topic", "code"), [
    (new_topic("m1", 3, -1, assignments=[(0, [1])]), INVALID_REQUEST),
    (new_topic("m2", -1, 1, assignments=[(0, [1])]), INVALID_REQUEST),
    (new_topic("m3", -1, -1, assignments=[(0, [0])]), INVALID_REPLICA_ASSIGNMENT),  # controller
    (new_topic("m4", -1, -1, assignments=[(0, [9])]), INVALID_REPLICA_ASSIGNMENT),
    (new_topic("m5", -1, -1, assignments=[(0, [1]), (2, [2])]), INVALID_REPLICA_ASSIGNMENT),
    (new_topic("m6", -1, -1, assignments=[(0, [1]), (0, [2])]), INVALID_REPLICA_ASSIGNMENT),
    (new_topic("m7", -1, -1, assignments=[(0, [1, 1])]), INVALID_REPLICA_ASSIGNMENT),
    (new_topic("m8", -1, -1, assignments=[(0, [])]), INVALID_REPLICA_ASSIGNMENT),
    (new_topic("__cluster_metadata", 1), INVALID_REQUEST),
    (new_topic("big", 10_000), POLICY_VIOLATION),   # 10,001 metadata records
    (new_topic("nulls", 1, retention_ms=None), INVALID_CONFIG),
])
def test_create_topics_refusals(cluster: RunningBroker, topic: CreatableTopic,
                                code: int) -> None:
    (r,) = create(cluster.bootstrap, topic)
    assert (r.name, int(r.error_code)) == (topic.name, code), r.error_message
    assert (r.num_partitions, r.replication_factor, r.topic_id, r.configs) == (-1, -1, ZERO, ())
    assert int(metadata(cluster.bootstrap, topic.name)[topic.name][0].error_code) in (
        UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC)  # nothing was created


def test_topic_names_colliding_on_dot_and_underscore(cluster: RunningBroker) -> None:
    """ReplicationControlManager.validateNewTopicNames: '.' and '_' collide in metric names."""
    (a,) = create(cluster.bootstrap, new_topic("metrics.events", 1))
    assert int(a.error_code) == NONE
    (b,) = create(cluster.bootstrap, new_topic("metrics_events", 1))
    assert (int(b.error_code), b.error_message) == (
        INVALID_TOPIC, "Topic 'metrics_events' collides with existing topic: metrics.events")


def test_create_partitions_places_manual_assignments(cluster: RunningBroker) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    for f in admin.create_topics([NewTopic("placed", 2, replica_assignment=[[2], [1]])]).values():
        f.result()
    assert leaders(cluster.bootstrap, "placed") == [2, 1]
    (f,) = admin.create_partitions([NewPartitions("placed", 5, [[1], [1], [2]])]).values()
    f.result()
    assert leaders(cluster.bootstrap, "placed") == [2, 1, 1, 1, 2]

    def grow(count: int, *assignments: tuple[int, ...]) -> tuple[int, str | None]:
        body = call(cluster.bootstrap, CreatePartitionsRequest(
            topics=(CreatePartitionsTopic(name="placed", count=count, assignments=tuple(
                CreatePartitionsAssignment(broker_ids=a) for a in assignments) or None),),
            timeout=SECONDS, validate_only=False))
        return int(body.results[0].error_code), body.results[0].error_message

    assert grow(7, (0,), (1,))[0] == INVALID_REPLICA_ASSIGNMENT  # node 0: the controller
    assert grow(7, (1,)) == (INVALID_REPLICA_ASSIGNMENT, "Attempted to add 2 additional "
                             "partition(s), but only 1 assignment(s) were specified.")
    assert grow(4) == (INVALID_PARTITIONS, "The topic placed currently has 5 partition(s); 4 "
                                           "would not be an increase.")
    assert grow(10_006)[0] == POLICY_VIOLATION  # 10,001 new partitions
    assert leaders(cluster.bootstrap, "placed") == [2, 1, 1, 1, 2]


def test_delete_topics_by_id(cluster: RunningBroker) -> None:
    """ControllerApis.deleteTopics (v6): a topic by name or by id, never both."""
    (r,) = create(cluster.bootstrap, new_topic("by-id", 1))
    topic_id = r.topic_id
    stranger = uuid.uuid4()

    def delete(*states: tuple[str | None, uuid.UUID]) -> list[tuple[Any, ...]]:
        body = call(cluster.bootstrap, DeleteTopicsRequest(
            topics=tuple(DeleteTopicState(name=n, topic_id=i) for n, i in states),
            timeout=SECONDS))
        return sorted(((r.name, r.topic_id, int(r.error_code)) for r in body.responses),
                      key=repr)

    assert delete(("by-id", stranger)) == [("by-id", stranger, INVALID_REQUEST)]
    assert delete(("by-id", topic_id)) == [("by-id", topic_id, INVALID_REQUEST)]
    assert delete((None, uuid.UUID(int=0))) == [(None, ZERO, INVALID_REQUEST)]
    assert delete((None, stranger)) == [(None, stranger, UNKNOWN_TOPIC_ID)]
    assert delete((None, topic_id), (None, topic_id)) == [(None, topic_id, INVALID_REQUEST)]
    assert delete(("by-id", uuid.UUID(int=0)), (None, topic_id)) == [("by-id", topic_id, INVALID_REQUEST)]
    assert int(metadata(cluster.bootstrap, "by-id")["by-id"][0].error_code) == NONE  # intact
    assert delete((None, topic_id)) == [("by-id", topic_id, NONE)]
    assert int(metadata(cluster.bootstrap, "by-id")["by-id"][0].error_code) == \
        UNKNOWN_TOPIC_OR_PARTITION
    body = call(cluster.bootstrap, DeleteTopicsRequestV5(topic_names=("x", "x"), timeout=SECONDS))
    assert [(r.name, int(r.error_code)) for r in body.responses] == [("x", INVALID_REQUEST)]


def test_incremental_alter_configs_null_value_is_invalid_request(cluster: RunningBroker) -> None:
    """ConfigAdminManager.preprocess: a null value for any operation but DELETE."""
    create(cluster.bootstrap, new_topic("nullcfg", 1))
    body = call(cluster.bootstrap, IncrementalAlterConfigsRequest(resources=(AlterConfigsResource(
        resource_type=2, resource_name="nullcfg", configs=(
            AlterableConfig(name="retention.ms", config_operation=0, value=None),
            AlterableConfig(name="segment.ms", config_operation=1, value=None))),),
        validate_only=False))
    (r,) = body.responses
    assert (int(r.error_code), r.error_message) == (INVALID_REQUEST,
                                                    "Null value not supported for : retention.ms")
