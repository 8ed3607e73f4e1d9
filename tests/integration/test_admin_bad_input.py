"""Malformed admin requests against a live broker: Kafka's error codes, no crash, no data loss.

Requests are encoded by kio (``shmq.cli.configs.kafka_call``) so that they are well-formed on
the wire but wrong in content (unknown config names, bad values, negative counts, unknown
topics, unknown resource types and operations), or written by hand so that they are garbage.
After the battery no worker was restarted and every record produced before it reads back.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kio.schema.alter_configs.v2.request import AlterableConfig as LegacyConfig
from kio.schema.alter_configs.v2.request import AlterConfigsRequest
from kio.schema.alter_configs.v2.request import AlterConfigsResource as LegacyResource
from kio.schema.create_partitions.v3.request import (
    CreatePartitionsAssignment,
    CreatePartitionsRequest,
    CreatePartitionsTopic,
)
from kio.schema.delete_records.v2.request import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
)
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.incremental_alter_configs.v1.request import (
    AlterableConfig,
    AlterConfigsResource,
    IncrementalAlterConfigsRequest,
)

from shmq.cli.configs import kafka_call

NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC, NOT_LEADER, INVALID_TOPIC = 0, 1, 3, 6, 17
INVALID_PARTITIONS, INVALID_REPLICA_ASSIGNMENT, INVALID_CONFIG, INVALID_REQUEST = 37, 39, 40, 42
POLICY_VIOLATION = 44
TOPIC = "victim"
RECORDS = 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    home = tmp_path_factory.mktemp("admin-bad")
    b = start_broker(home / "data")
    try:
        p = Producer({"bootstrap.servers": b.bootstrap, "log_level": 0})
        for i in range(RECORDS):
            p.produce(TOPIC, b"record-%d" % i, partition=0)
        assert p.flush(30) == 0
        yield b
    finally:
        code = b.stop()
        log = b.log_path.read_text()
        shutil.rmtree(home)
        assert code == 0, log


def call(b: RunningBroker, request: object) -> object:
    return kafka_call(b.bootstrap, request, 10)


def worker_address(b: RunningBroker, topic: str = TOPIC, partition: int = 0) -> str:
    a = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 0})
    leader = a.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader
    port = {w["node_id"]: w["port"] for w in b.run_info["workers"]}[leader]
    return f"127.0.0.1:{port}"


def incremental(name: str, op: int, value: str | None, rtype: int = 2,
                resource: str = TOPIC) -> IncrementalAlterConfigsRequest:
    return IncrementalAlterConfigsRequest(resources=(AlterConfigsResource(
        resource_type=rtype, resource_name=resource,
        configs=(AlterableConfig(name=name, config_operation=op, value=value),)),),
        validate_only=False)


@pytest.mark.parametrize(("request_", "code"), [
    (incremental("retention.ms", 0, "abc"), INVALID_CONFIG),
    (incremental("retention.ms", 0, None), INVALID_REQUEST),       # ConfigAdminManager
    (incremental("retention.ms", 0, "99999999999999999999999"), INVALID_CONFIG),
    (incremental("segment.bytes", 0, "10"), INVALID_CONFIG),
    (incremental("segment.bytes", 0, "-1"), INVALID_CONFIG),
    (incremental("flush.messages", 0, "0"), INVALID_CONFIG),
    (incremental("min.cleanable.dirty.ratio", 0, "1.5"), INVALID_CONFIG),
    (incremental("preallocate", 0, "maybe"), INVALID_CONFIG),
    (incremental("x" * 300, 0, "1"), INVALID_CONFIG),
    (incremental("", 0, "1"), INVALID_CONFIG),
    (incremental("retention.ms", 9, "1"), INVALID_REQUEST),         # no such operation
    (incremental("retention.ms", -1, "1"), INVALID_REQUEST),
    (incremental("retention.ms", 3, "1"), INVALID_CONFIG),          # SUBTRACT from a LONG
    (incremental("retention.ms", 0, "1", resource="no-such-topic"), UNKNOWN_TOPIC),
    (incremental("retention.ms", 0, "1", resource="bad/name"), INVALID_TOPIC),
    (incremental("retention.ms", 0, "1", resource=""), INVALID_TOPIC),
    (incremental("retention.ms", 0, "1", rtype=99), INVALID_REQUEST),  # unknown resource type
    (incremental("level", 0, "DEBUG", rtype=8, resource="1"), INVALID_REQUEST),  # broker logger
    (incremental("log.retention.ms", 0, "1", rtype=4, resource="77"), INVALID_REQUEST),
    (incremental("log.retention.ms", 0, "1", rtype=4, resource="x"), INVALID_REQUEST),
    # a broker config's invalid value: INVALID_REQUEST, as Kafka 4.3's controller answers
    # (Kafka takes -5 for one broker's log.retention.ms: kafka_differences.py, row 15)
    (incremental("log.retention.ms", 0, "-5", rtype=4, resource="1"), INVALID_REQUEST),
    (incremental("listeners", 0, "PLAINTEXT://0.0.0.0:1", rtype=4, resource=""),
     INVALID_REQUEST),
])
def test_bad_incremental_alter_configs(cluster: RunningBroker, request_: object,
                                       code: int) -> None:
    response = call(cluster, request_)
    (result,) = response.responses  # type: ignore[attr-defined]
    assert int(result.error_code) == code, result.error_message
    assert result.error_message


def test_duplicate_keys_and_resources_are_invalid_request(cluster: RunningBroker) -> None:
    twice = IncrementalAlterConfigsRequest(resources=(AlterConfigsResource(
        resource_type=2, resource_name=TOPIC,
        configs=(AlterableConfig(name="retention.ms", config_operation=0, value="1000"),
                 AlterableConfig(name="retention.ms", config_operation=0, value="2000"))),),
        validate_only=False)
    (result,) = call(cluster, twice).responses  # type: ignore[attr-defined]
    assert int(result.error_code) == INVALID_REQUEST
    resource = AlterConfigsResource(resource_type=2, resource_name=TOPIC, configs=(
        AlterableConfig(name="retention.ms", config_operation=0, value="1000"),))
    both = IncrementalAlterConfigsRequest(resources=(resource, resource), validate_only=False)
    results = call(cluster, both).responses  # type: ignore[attr-defined]
    assert [int(r.error_code) for r in results] == [INVALID_REQUEST, INVALID_REQUEST]


def test_one_bad_resource_does_not_spoil_the_others(cluster: RunningBroker) -> None:
    request = AlterConfigsRequest(resources=(
        LegacyResource(resource_type=2, resource_name="no-such-topic",
                       configs=(LegacyConfig(name="retention.ms", value="1"),)),
        LegacyResource(resource_type=2, resource_name=TOPIC,
                       configs=(LegacyConfig(name="retention.ms", value="x"),)),
        LegacyResource(resource_type=2, resource_name=TOPIC + "-other",
                       configs=(LegacyConfig(name="retention.ms", value="1"),)),
    ), validate_only=True)
    codes = [int(r.error_code) for r in call(cluster, request).responses]  # type: ignore
    assert codes == [UNKNOWN_TOPIC, INVALID_CONFIG, UNKNOWN_TOPIC]


def test_validate_only_changes_nothing(cluster: RunningBroker) -> None:
    request = AlterConfigsRequest(resources=(LegacyResource(
        resource_type=2, resource_name=TOPIC,
        configs=(LegacyConfig(name="retention.ms", value="1"),)),), validate_only=True)
    assert int(call(cluster, request).responses[0].error_code) == NONE  # type: ignore
    describe = DescribeConfigsRequest(resources=(DescribeConfigsResource(
        resource_type=2, resource_name=TOPIC, configuration_keys=("retention.ms",)),),
        include_synonyms=True, include_documentation=True)
    (result,) = call(cluster, describe).results  # type: ignore[attr-defined]
    (entry,) = result.configs
    assert (entry.name, entry.value, int(entry.config_source)) == ("retention.ms", "604800000", 5)
    # Kafka lists no synonym for an unset retention.ms (its default is log.retention.hours')
    assert entry.documentation and entry.synonyms == ()


@pytest.mark.parametrize(("count", "assignments", "code"), [
    (-5, None, INVALID_PARTITIONS),
    (0, None, INVALID_PARTITIONS),
    (1, None, INVALID_PARTITIONS),
    (2**31 - 1, None, POLICY_VIOLATION),   # more than 10,000 new partitions in one request
    (3, ((77,), (1,)), INVALID_REPLICA_ASSIGNMENT),
    (3, ((1,),), INVALID_REPLICA_ASSIGNMENT),
    (3, ((1, 2), (1,)), INVALID_REPLICA_ASSIGNMENT),
])
def test_bad_create_partitions(cluster: RunningBroker, count: int,
                               assignments: tuple | None, code: int) -> None:
    topic = CreatePartitionsTopic(
        name=TOPIC, count=count,
        assignments=None if assignments is None else tuple(
            CreatePartitionsAssignment(broker_ids=a) for a in assignments))
    import datetime

    request = CreatePartitionsRequest(topics=(topic,), timeout=datetime.timedelta(seconds=5),
                                      validate_only=False)
    (result,) = call(cluster, request).results  # type: ignore[attr-defined]
    assert int(result.error_code) == code, result.error_message


def test_create_partitions_for_unknown_and_duplicate_topics(cluster: RunningBroker) -> None:
    import datetime

    t = CreatePartitionsTopic(name="no-such-topic", count=4, assignments=None)
    dup = CreatePartitionsTopic(name=TOPIC, count=4, assignments=None)
    request = CreatePartitionsRequest(topics=(t, dup, dup), timeout=datetime.timedelta(seconds=5),
                                      validate_only=False)
    codes = [int(r.error_code) for r in call(cluster, request).results]  # type: ignore
    assert codes == [UNKNOWN_TOPIC, INVALID_REQUEST]  # ControllerApis: one per name given twice


@pytest.mark.parametrize(("offset", "code"), [
    (RECORDS + 1, OFFSET_OUT_OF_RANGE), (-7, OFFSET_OUT_OF_RANGE), (2**63 - 1, OFFSET_OUT_OF_RANGE),
])
def test_bad_delete_records(cluster: RunningBroker, offset: int, code: int) -> None:
    import datetime

    request = DeleteRecordsRequest(topics=(
        DeleteRecordsTopic(name=TOPIC, partitions=(
            DeleteRecordsPartition(partition_index=0, offset=offset),
            DeleteRecordsPartition(partition_index=9, offset=0))),
        DeleteRecordsTopic(name="no-such-topic", partitions=(
            DeleteRecordsPartition(partition_index=0, offset=0),))),
        timeout=datetime.timedelta(seconds=5))
    response = kafka_call(worker_address(cluster), request, 10)
    first, second = response.topics  # type: ignore[attr-defined]
    assert [int(p.error_code) for p in first.partitions] == [code, UNKNOWN_TOPIC]
    assert int(second.partitions[0].error_code) == UNKNOWN_TOPIC
    # the controller leads no partition
    response = call(cluster, request)
    assert int(response.topics[0].partitions[0].error_code) == NOT_LEADER  # type: ignore


@pytest.mark.parametrize("payload", [
    struct.pack(">hhih", 44, 1, 1, 2) + b"f2" + b"\x00" + b"\xff\xff\xff\x7f",  # huge count
    struct.pack(">hhih", 32, 4, 1, 2) + b"f2" + b"\x00" + b"\x02\x02",           # truncated
    struct.pack(">hhih", 37, 3, 1, 2) + b"f2",                                  # no body
    struct.pack(">hhih", 21, 2, 1, 2) + b"f2" + os.urandom(64),                  # noise
    struct.pack(">hhih", 33, 0, 1, 2) + b"f2" + b"\x00\x00\x00\x01\x02\xff\xff",  # bad string
    struct.pack(">hhih", 60, 9, 1, 2) + b"f2",                                  # no such version
], ids=["huge count", "truncated", "no body", "noise", "bad string", "no such version"])
def test_garbage_admin_requests_end_only_their_connection(cluster: RunningBroker,
                                                          payload: bytes) -> None:
    for address in (cluster.bootstrap, worker_address(cluster)):
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            sock.settimeout(5)
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                data = b""
            assert data == b""  # closed, not answered with something undecodable


def test_nothing_was_lost_and_no_worker_restarted(cluster: RunningBroker) -> None:
    pids = cluster.worker_pids()
    a = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    assert len(a.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions) == 1
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "bad-input-check",
                  "auto.offset.reset": "earliest", "log_level": 0})
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        values = []
        while len(values) < RECORDS:
            msg = c.poll(10)
            assert msg is not None, f"only {len(values)} records came back"
            assert msg.error() is None
            values.append(msg.value())
        assert values == [b"record-%d" % i for i in range(RECORDS)]
    finally:
        c.close()
    assert cluster.worker_pids() == pids
    assert cluster.proc.poll() is None


def test_a_config_change_survives_a_killed_broker(tmp_path: Path) -> None:
    """The metadata is rewritten atomically before the answer: SIGKILL right after loses
    nothing that was acknowledged."""
    from confluent_kafka.admin import NewPartitions, NewTopic

    b = start_broker(tmp_path / "data")
    a = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 0})
    for fut in a.create_topics([NewTopic(TOPIC, 1, 1)]).values():
        fut.result()
    (f,) = a.incremental_alter_configs([ConfigResource("topic", TOPIC, incremental_configs=[
        ConfigEntry("retention.bytes", "7777777",
                    incremental_operation=AlterConfigOpType.SET)])]).values()
    assert f.result() is None
    (f,) = a.create_partitions([NewPartitions(TOPIC, 4)]).values()
    assert f.result() is None
    workers = list(b.worker_pids().values())
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait()
    for pid in workers:  # they follow their controller (PR_SET_PDEATHSIG), wait for that
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
    b.stop()
    b = start_broker(tmp_path / "data")
    try:
        a = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 0})
        (f,) = a.describe_configs([ConfigResource("topic", TOPIC)]).values()
        assert f.result()["retention.bytes"].value == "7777777"
        assert len(a.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions) == 4
    finally:
        assert b.stop() == 0
        shutil.rmtree(tmp_path)


def test_create_topics_from_clients_that_go_away_at_once(tmp_path: Path) -> None:
    """A client that sends CreateTopics and closes its connection at once: every topic is still
    created and published to the workers, and the controller logs no error (the cancelled
    request abandoned the wait for the workers' acks: 'exception was never retrieved')."""
    from kafka.protocol.admin import CreateTopicsRequest
    from test_wire_bad_input import encode

    env = {k: v for k, v in os.environ.items() if k != "SHMQ_LOG_LEVEL"}  # ERROR lines shown
    b = start_broker(tmp_path / "data", workers=2, env=env)
    try:
        host, port = b.bootstrap.split(":")
        for i in range(20):
            request = CreateTopicsRequest[3](topics=[(f"gone-{i}", 4, 1, [], [])],
                                             timeout_ms=10000, validate_only=False)
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(encode(request, 9))
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            topics = admin.list_topics(timeout=5).topics
            if all(f"gone-{i}" in topics and len(topics[f"gone-{i}"].partitions) == 4
                   for i in range(20)):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("not every topic was created")
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
        for i in range(20):
            p.produce(f"gone-{i}", value=b"x", partition=3)
        assert p.flush(30) == 0
    finally:
        assert b.stop() == 0
    text = b.log_path.read_text()
    assert " ERROR " not in text and "never retrieved" not in text, text[-3000:]
