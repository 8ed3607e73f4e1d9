"""The request versions Kafka 4.0 removed (KIP-896) and Kafka 3.9 served, against a live broker
(issue 20).

Every request is encoded, and every answer decoded, by kafka-python's hand-written
``kafka.protocol.old`` classes (an encoder independent of kio and of ``shmq.protocol.legacy``):
ListOffsets v0, OffsetCommit v0-1, OffsetFetch v0, CreateTopics v0-1, DeleteTopics v0,
DescribeConfigs v0, OffsetForLeaderEpoch v0-1, and an old client's whole group life cycle
(FindCoordinator v0, JoinGroup v0/v1, SyncGroup v0, Heartbeat v0, OffsetCommit v1, OffsetFetch v0,
LeaveGroup v0, Metadata v0).  Malformed bodies of each end the connection and nothing else; Produce
v0-v2 and Fetch v0-v3 (message format v0/v1: they would need record conversion) are refused as
Kafka 4 refuses them, by closing the connection.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka.protocol.old import admin as kp_admin
from kafka.protocol.old import commit as kp_commit
from kafka.protocol.old import fetch as kp_fetch
from kafka.protocol.old import find_coordinator as kp_find
from kafka.protocol.old import group as kp_group
from kafka.protocol.old import list_offsets as kp_list_offsets
from kafka.protocol.old import metadata as kp_metadata
from kafka.protocol.old import offset_for_leader_epoch as kp_epoch
from kafka.protocol.old import produce as kp_produce
from kafka.protocol.old.api_versions import ApiVersionsRequest_v0, ApiVersionsResponse_v0

from shmq.protocol import api_versions, legacy

NONE, UNKNOWN_SERVER_ERROR, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, -1, 3, 6
ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, TOPIC_ALREADY_EXISTS, UNSUPPORTED_VERSION = 22, 25, 36, 35


@pytest.fixture(scope="module")
def obroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    home = tmp_path_factory.mktemp("old")
    b = start_broker(home / "data", "--override", "group.min.session.timeout.ms=1000")
    try:
        yield b
    finally:
        code = b.stop()
        log = b.log_path.read_text()
        shutil.rmtree(home)
        assert code == 0, log
        assert "Traceback" not in log and " ERROR " not in log, log[-5000:]


class Connection:
    """One client connection speaking kafka-python's old request classes."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation = 0

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def read(self) -> bytes | None:
        """One response frame without its size, or None when the broker closed."""
        head = self._exactly(4)
        if head is None:
            return None
        return self._exactly(struct.unpack(">i", head)[0])

    def _exactly(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    def call(self, request: Any, response_cls: Any) -> Any:
        self.correlation += 1
        request.with_header(correlation_id=self.correlation, client_id="old-client")
        self.sock.sendall(request.encode(header=True, framed=True))
        frame = self.read()
        assert frame is not None, f"the broker closed the connection on {request}"
        decoded = response_cls.decode(frame, header=True)
        assert decoded.header.correlation_id == self.correlation
        return _attributes(decoded.to_object())

    def close(self) -> None:
        self.sock.close()


def _attributes(value: Any) -> Any:
    """kafka-python's decoded dicts with attribute access (``response.topics[0].name``)."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _attributes(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_attributes(v) for v in value]
    return value


def port_of(broker: RunningBroker, node: int) -> int:
    if node == 0:
        return int(broker.bootstrap.rsplit(":", 1)[1])
    return next(w["port"] for w in broker.run_info["workers"] if w["node_id"] == node)


def leader_port(broker: RunningBroker, topic: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader
    return port_of(broker, leader)


def create_topic(broker: RunningBroker, partitions: int = 2, **configs: str) -> str:
    name = f"old-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=configs)])[name].result(30)
    return name


def produce(broker: RunningBroker, topic: str, partition: int, count: int,
            size: int = 100) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for i in range(count):
        p.produce(topic, b"v" * size, key=b"%d" % i, partition=partition)
        p.poll(0)
    assert p.flush(30) == 0


# -- the advertised table ---------------------------------------------------------------------


def test_api_versions_advertises_the_old_versions(obroker: RunningBroker) -> None:
    conn = Connection(port_of(obroker, 0))
    try:
        answer = conn.call(ApiVersionsRequest_v0(), ApiVersionsResponse_v0)
    finally:
        conn.close()
    table = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert table == api_versions.SUPPORTED
    for key, version in legacy.MODULES:
        assert table[key][0] <= version  # every removed version served is advertised
    assert table[1][0] == 4 and table[0] == (0, 12)  # Fetch from 4, Produce 0-12 (served 3+)


# -- ListOffsets v0 ---------------------------------------------------------------------------


def test_list_offsets_v0_lists_segment_offsets(obroker: RunningBroker) -> None:
    topic = create_topic(obroker, 2, **{"internal.segment.bytes": "1024"})
    produce(obroker, topic, 0, 40)  # ~160-byte batches: several segments
    port = leader_port(obroker, topic, 0)
    worker = next(w["node_id"] for w in obroker.run_info["workers"] if w["port"] == port)
    directory = obroker.data_dir / f"worker-{worker}" / f"{topic}-0"
    bases = sorted(int(f.name[:-4]) for f in directory.glob("*.log"))
    assert len(bases) >= 3 and bases[0] == 0

    def offsets(timestamp: int, max_num: int, replica_id: int = -1,
                partition: int = 0) -> tuple[int, list[int]]:
        conn = Connection(port)
        try:
            r = conn.call(kp_list_offsets.ListOffsetsRequest_v0(
                replica_id=replica_id, topics=[(topic, [(partition, timestamp, max_num)])]),
                kp_list_offsets.ListOffsetsResponse_v0)
        finally:
            conn.close()
        (t,) = r.topics
        (p,) = t.partitions
        assert t.name == topic and p.partition_index == partition
        return p.error_code, list(p.old_style_offsets)

    assert offsets(-1, 1) == (NONE, [40])                       # the high watermark
    newest_first = [40] + sorted(bases, reverse=True)           # LEO, then every segment base
    assert offsets(-1, 100) == (NONE, newest_first)
    assert offsets(-1, 3) == (NONE, newest_first[:3])
    assert offsets(-2, 5) == (NONE, [0])                        # the log start
    assert offsets(int(time.time() * 1000) + 60_000, 100) == (NONE, newest_first)
    assert offsets(1, 10) == (NONE, [])                         # nothing modified before 1 ms
    assert offsets(-1, 0) == (NONE, [])
    assert offsets(-3, 1) == (UNSUPPORTED_VERSION, [])           # v0 knows only -1 and -2
    assert offsets(-1, -1) == (UNKNOWN_SERVER_ERROR, [])         # Kafka 3.9: negative array size
    assert offsets(-1, 1, partition=7)[0] == UNKNOWN_TOPIC_OR_PARTITION
    other = port_of(obroker, 0)
    conn = Connection(other)
    try:
        r = conn.call(kp_list_offsets.ListOffsetsRequest_v0(
            replica_id=-1, topics=[(topic, [(0, -1, 1)])]), kp_list_offsets.ListOffsetsResponse_v0)
    finally:
        conn.close()
    assert r.topics[0].partitions[0].error_code == NOT_LEADER  # node 0 leads no data partition
    # the same answer as ListOffsets v1+ from a current client
    c = Consumer({"bootstrap.servers": obroker.bootstrap, "group.id": "w"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), 10) == (0, 40)
    finally:
        c.close()


# -- offsets of groups ------------------------------------------------------------------------


def test_offset_commit_v0_v1_and_offset_fetch_v0(obroker: RunningBroker) -> None:
    topic = create_topic(obroker, 2)
    group = f"old-{uuid.uuid4().hex[:6]}"
    conn = Connection(port_of(obroker, 0))
    try:
        r = conn.call(kp_commit.OffsetCommitRequest_v0(
            group_id=group, topics=[(topic, [(0, 42, "v0 meta"), (5, 1, None)])]),
            kp_commit.OffsetCommitResponse_v0)
        assert [(p.partition_index, p.error_code) for p in r.topics[0].partitions] == [
            (0, NONE), (5, UNKNOWN_TOPIC_OR_PARTITION)]
        r = conn.call(kp_commit.OffsetCommitRequest_v1(
            group_id=group, generation_id_or_member_epoch=-1, member_id="",
            topics=[(topic, [(1, 77, 1_700_000_000_000, "v1 meta")])]),
            kp_commit.OffsetCommitResponse_v1)
        assert r.topics[0].partitions[0].error_code == NONE
        # a generation that does not exist (v1+ carry one): ILLEGAL_GENERATION before v9
        r = conn.call(kp_commit.OffsetCommitRequest_v1(
            group_id=f"{group}-x", generation_id_or_member_epoch=3, member_id="m",
            topics=[(topic, [(1, 5, -1, "")])]), kp_commit.OffsetCommitResponse_v1)
        assert r.topics[0].partitions[0].error_code == ILLEGAL_GENERATION
        r = conn.call(kp_commit.OffsetFetchRequest_v0(
            group_id=group, topics=[(topic, [0, 1, 3])]), kp_commit.OffsetFetchResponse_v0)
        assert [(p.partition_index, p.committed_offset, p.metadata, p.error_code)
                for p in r.topics[0].partitions] == [
            (0, 42, "v0 meta", NONE), (1, 77, "v1 meta", NONE), (3, -1, "", NONE)]
    finally:
        conn.close()
    # one store: a current client sees what the old versions committed
    c = Consumer({"bootstrap.servers": obroker.bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=20)
    finally:
        c.close()
    assert [(tp.offset, tp.metadata) for tp in got] == [(42, "v0 meta"), (77, "v1 meta")]


def test_an_old_clients_group_life_cycle(obroker: RunningBroker) -> None:
    """Metadata v0, FindCoordinator v0, JoinGroup v0 and v1, SyncGroup v0, Heartbeat v0,
    OffsetCommit v1 as a member, OffsetFetch v0, LeaveGroup v0: a pre-0.10.1 consumer."""
    topic = create_topic(obroker, 2)
    group = f"old-{uuid.uuid4().hex[:6]}"
    conn = Connection(port_of(obroker, 0))
    try:
        meta = conn.call(kp_metadata.MetadataRequest_v0(topics=[topic]),
                         kp_metadata.MetadataResponse_v0)
        assert [(t.error_code, t.name, len(t.partitions)) for t in meta.topics] == [
            (NONE, topic, 2)]
        assert {b.node_id for b in meta.brokers} == {0, 1, 2}
        found = conn.call(kp_find.FindCoordinatorRequest_v0(key=group),
                          kp_find.FindCoordinatorResponse_v0)
        assert (found.error_code, found.node_id, found.port) == (NONE, 0, port_of(obroker, 0))
        subscription = struct.pack(">hih", 0, 1, len(topic)) + topic.encode() + b"\xff\xff\xff\xff"
        for version, request in (
                (0, kp_group.JoinGroupRequest_v0(group_id=group, session_timeout_ms=6000,
                                                 member_id="", protocol_type="consumer",
                                                 protocols=[("range", subscription)])),
                (1, kp_group.JoinGroupRequest_v1(group_id=group, session_timeout_ms=6000,
                                                 rebalance_timeout_ms=6000, member_id="",
                                                 protocol_type="consumer",
                                                 protocols=[("range", subscription)]))):
            response_cls = getattr(kp_group, f"JoinGroupResponse_v{version}")
            joined = conn.call(request, response_cls)
            assert joined.error_code == NONE and joined.leader == joined.member_id, joined
            assert [m.member_id for m in joined.members] == [joined.member_id]
            synced = conn.call(kp_group.SyncGroupRequest_v0(
                group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
                assignments=[(joined.member_id, b"assignment")]), kp_group.SyncGroupResponse_v0)
            assert (synced.error_code, synced.assignment) == (NONE, b"assignment")
            beat = conn.call(kp_group.HeartbeatRequest_v0(
                group_id=group, generation_id=joined.generation_id, member_id=joined.member_id),
                kp_group.HeartbeatResponse_v0)
            assert beat.error_code == NONE
            committed = conn.call(kp_commit.OffsetCommitRequest_v1(
                group_id=group, generation_id_or_member_epoch=joined.generation_id,
                member_id=joined.member_id, topics=[(topic, [(0, 10 + version, -1, "")])]),
                kp_commit.OffsetCommitResponse_v1)
            assert committed.topics[0].partitions[0].error_code == NONE
            # a v0 commit names no member: refused while the group has one, as for v1+ with -1
            anonymous = conn.call(kp_commit.OffsetCommitRequest_v0(
                group_id=group, topics=[(topic, [(0, 999, "")])]), kp_commit.OffsetCommitResponse_v0)
            assert anonymous.topics[0].partitions[0].error_code == UNKNOWN_MEMBER_ID
            fetched = conn.call(kp_commit.OffsetFetchRequest_v0(
                group_id=group, topics=[(topic, [0])]), kp_commit.OffsetFetchResponse_v0)
            assert fetched.topics[0].partitions[0].committed_offset == 10 + version
            left = conn.call(kp_group.LeaveGroupRequest_v0(group_id=group,
                                                           member_id=joined.member_id),
                             kp_group.LeaveGroupResponse_v0)
            assert left.error_code == NONE
    finally:
        conn.close()


# -- admin ------------------------------------------------------------------------------------


def test_create_and_delete_topics_v0_v1(obroker: RunningBroker) -> None:
    names = [f"old-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    conn = Connection(port_of(obroker, 1))  # a worker forwards to the controller
    try:
        r = conn.call(kp_admin.CreateTopicsRequest_v0(
            topics=[(names[0], 3, 1, [], [("retention.ms", "60000")])], timeout_ms=10000),
            kp_admin.CreateTopicsResponse_v0)
        assert [(t.name, t.error_code) for t in r.topics] == [(names[0], NONE)]
        r = conn.call(kp_admin.CreateTopicsRequest_v1(
            topics=[(names[1], 1, 1, [], []), (names[0], 1, 1, [], [])], timeout_ms=10000,
            validate_only=True), kp_admin.CreateTopicsResponse_v1)
        assert [(t.name, t.error_code, t.error_message) for t in r.topics] == [
            (names[1], NONE, None),
            (names[0], TOPIC_ALREADY_EXISTS, f"Topic '{names[0]}' already exists.")]
        r = conn.call(kp_admin.CreateTopicsRequest_v1(
            topics=[(names[2], 2, 1, [], [])], timeout_ms=10000, validate_only=False),
            kp_admin.CreateTopicsResponse_v1)
        assert r.topics[0].error_code == NONE
        admin = AdminClient({"bootstrap.servers": obroker.bootstrap})
        listed = admin.list_topics(timeout=10)
        assert {n: len(listed.topics[n].partitions) for n in names if n in listed.topics} == {
            names[0]: 3, names[2]: 2}  # validate_only created nothing
        r = conn.call(kp_admin.DeleteTopicsRequest_v0(
            topic_names=[names[0], names[2], "no-such-topic"], timeout_ms=10000),
            kp_admin.DeleteTopicsResponse_v0)
        assert sorted((t.name, t.error_code) for t in r.responses) == sorted([
            (names[0], NONE), (names[2], NONE), ("no-such-topic", UNKNOWN_TOPIC_OR_PARTITION)])
    finally:
        conn.close()
    assert not set(names) & set(admin.list_topics(timeout=10).topics)


def test_describe_configs_v0_says_what_is_default(obroker: RunningBroker) -> None:
    topic = create_topic(obroker, 1, **{"retention.ms": "60000"})
    conn = Connection(port_of(obroker, 2))
    try:
        r = conn.call(kp_admin.DescribeConfigsRequest_v0(
            resources=[(2, topic, ["retention.ms", "segment.bytes"]), (2, "no-such", None),
                       (4, "1", ["num.partitions"])]), kp_admin.DescribeConfigsResponse_v0)
    finally:
        conn.close()
    by_name = {(res.resource_name, c.name): (c.value, c.is_default, c.read_only)
               for res in r.results for c in res.configs}
    assert by_name[(topic, "retention.ms")] == ("60000", False, False)
    assert by_name[(topic, "segment.bytes")] == ("1073741824", True, False)
    assert [res.error_code for res in r.results] == [NONE, UNKNOWN_TOPIC_OR_PARTITION, NONE]
    assert by_name[("1", "num.partitions")][1] is True
    # the same values as DescribeConfigs v1+ from a current client
    admin = AdminClient({"bootstrap.servers": obroker.bootstrap})
    entries = admin.describe_configs([ConfigResource("topic", topic)])
    current = next(iter(entries.values())).result(10)
    assert current["retention.ms"].value == "60000" and not current["retention.ms"].is_default
    assert current["segment.bytes"].is_default


def test_offset_for_leader_epoch_v0_v1(obroker: RunningBroker) -> None:
    topic = create_topic(obroker, 1)
    produce(obroker, topic, 0, 5)
    conn = Connection(leader_port(obroker, topic, 0))
    try:
        r0 = conn.call(kp_epoch.OffsetForLeaderEpochRequest_v0(topics=[(topic, [(0, 0), (3, 0)])]),
                       kp_epoch.OffsetForLeaderEpochResponse_v0)
        r1 = conn.call(kp_epoch.OffsetForLeaderEpochRequest_v1(topics=[(topic, [(0, 0)])]),
                       kp_epoch.OffsetForLeaderEpochResponse_v1)
    finally:
        conn.close()
    assert [(p.error_code, p.partition, p.end_offset) for p in r0.topics[0].partitions] == [
        (NONE, 0, 5), (UNKNOWN_TOPIC_OR_PARTITION, 3, -1)]
    assert [(p.error_code, p.partition, p.leader_epoch, p.end_offset)
            for p in r1.topics[0].partitions] == [(NONE, 0, 0, 5)]


# -- bad input --------------------------------------------------------------------------------


def _old_request(api_key: int, version: int, topic: str) -> Any:
    """A well-formed request of every newly served version, built with kafka-python."""
    return {
        (2, 0): lambda: kp_list_offsets.ListOffsetsRequest_v0(
            replica_id=-1, topics=[(topic, [(0, -1, 3)])]),
        (8, 0): lambda: kp_commit.OffsetCommitRequest_v0(
            group_id="bad", topics=[(topic, [(0, 1, "m")])]),
        (8, 1): lambda: kp_commit.OffsetCommitRequest_v1(
            group_id="bad", generation_id_or_member_epoch=-1, member_id="",
            topics=[(topic, [(0, 1, -1, "m")])]),
        (9, 0): lambda: kp_commit.OffsetFetchRequest_v0(group_id="bad", topics=[(topic, [0])]),
        (19, 0): lambda: kp_admin.CreateTopicsRequest_v0(
            topics=[(topic, 1, 1, [], [])], timeout_ms=1000),
        (19, 1): lambda: kp_admin.CreateTopicsRequest_v1(
            topics=[(topic, 1, 1, [], [])], timeout_ms=1000, validate_only=True),
        (20, 0): lambda: kp_admin.DeleteTopicsRequest_v0(topic_names=["absent"], timeout_ms=1000),
        (32, 0): lambda: kp_admin.DescribeConfigsRequest_v0(resources=[(2, topic, None)]),
        (23, 0): lambda: kp_epoch.OffsetForLeaderEpochRequest_v0(topics=[(topic, [(0, 0)])]),
        (23, 1): lambda: kp_epoch.OffsetForLeaderEpochRequest_v1(topics=[(topic, [(0, 0)])]),
    }[(api_key, version)]()


@pytest.mark.parametrize(("api_key", "version"), sorted(legacy.MODULES))
def test_malformed_old_requests_end_only_their_connection(obroker: RunningBroker, api_key: int,
                                                          version: int) -> None:
    topic = create_topic(obroker, 1)
    request = _old_request(api_key, version, topic)
    request.with_header(correlation_id=1, client_id="bad")
    whole = request.encode(header=True, framed=False)
    header_size = len(request.header.encode())
    body = whole[header_size:]
    mutations = [whole[: header_size + cut] for cut in range(0, len(body) - 1, 3)]
    # the first array count (every one of these bodies has one within its first 10 bytes)
    # made huge: rejected from the bytes present before anything is allocated
    for at in range(header_size, min(header_size + 10, len(whole) - 3)):
        if struct.unpack_from(">i", whole, at)[0] in (1, 3):
            mutations.append(whole[:at] + struct.pack(">i", 0x7FFFFFFF) + whole[at + 4:])
    port = leader_port(obroker, topic, 0)
    for payload in mutations:
        conn = Connection(port)
        try:
            conn.send_raw(payload)
            assert conn.read() is None, f"{payload.hex()} was answered"
        finally:
            conn.close()
    conn = Connection(port)  # the broker still answers the well-formed request
    try:
        conn.send_raw(whole)
        assert conn.read() is not None
    finally:
        conn.close()
    assert all(p["pid"] for p in obroker.run_info["workers"])


@pytest.mark.parametrize(("request_cls", "fields"), [
    (kp_produce.ProduceRequest_v0, {"acks": 1, "timeout_ms": 1000, "topic_data": []}),
    (kp_produce.ProduceRequest_v1, {"acks": 1, "timeout_ms": 1000, "topic_data": []}),
    (kp_produce.ProduceRequest_v2, {"acks": 1, "timeout_ms": 1000, "topic_data": []}),
    (kp_fetch.FetchRequest_v0, {"replica_id": -1, "max_wait_ms": 10, "min_bytes": 1,
                                "topics": []}),
    (kp_fetch.FetchRequest_v3, {"replica_id": -1, "max_wait_ms": 10, "min_bytes": 1,
                                "max_bytes": 1000, "topics": []}),
])
def test_record_versions_kafka_4_removed_are_refused_like_kafka_4(
        obroker: RunningBroker, request_cls: Any, fields: dict) -> None:
    """Message format v0/v1 would need conversion: Kafka 4 closes the connection ("... which is
    not enabled"), and so does shmq, on every node."""
    for node in (0, 1):
        conn = Connection(port_of(obroker, node))
        try:
            request = request_cls(**fields)
            request.with_header(correlation_id=1, client_id="old")
            conn.sock.sendall(request.encode(header=True, framed=True))
            assert conn.read() is None
        finally:
            conn.close()
    assert os.kill(obroker.proc.pid, 0) is None  # still running
