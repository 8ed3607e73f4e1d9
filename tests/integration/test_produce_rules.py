"""Produce and ListOffsets answers in detail, each from Kafka's rule (issue 21 items 3 and 5).

Where only a hand-built request can trigger a case, the request is raw: batches are built by
kafka-python's ``DefaultRecordBatchBuilder`` and then patched (header fields, CRC with the
``crc32c`` package); Produce requests and responses go through kafka-python's protocol classes;
ListOffsets through kio.  Real clients (confluent-kafka, kafka-python) cover what they can send.

Kafka sources: ``LogValidator.validateBatch / validateTimestamp``, ``ProduceRequest.validateRecords``,
``UnifiedLog.append`` (a duplicate's answer), ``UnifiedLog.fetchOffsetByTimestamp``,
``ReplicaManager.fetchOffset``.
"""

from __future__ import annotations

import shutil
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import crc32c
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import RunningBroker, start_broker
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

NONE, CORRUPT_MESSAGE, INVALID_TIMESTAMP, INVALID_RECORD = 0, 2, 32, 87
HOUR = 3_600_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    home = tmp_path_factory.mktemp("rules")
    b = start_broker(home / "data", workers=1)
    try:
        yield b
    finally:
        code = b.stop()
        log = b.log_path.read_text()
        shutil.rmtree(home, ignore_errors=True)
        assert code == 0, log
        assert "Traceback" not in log, log[-5000:]


def new_topic(b: RunningBroker, **configs: str) -> str:
    name = f"rules-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(30)
    return name


def port_of(b: RunningBroker) -> int:
    return int(b.run_info["workers"][0]["port"])


def now_ms() -> int:
    return int(time.time() * 1000)


# -- batches --------------------------------------------------------------------------------------


def kbatch(values: list[bytes | None], timestamps: list[int], *, pid: int = -1, epoch: int = -1,
           seq: int = -1, compression: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression,
                                        is_transactional=False, producer_id=pid,
                                        producer_epoch=epoch, base_sequence=seq,
                                        batch_size=1 << 22)
    for i, (v, ts) in enumerate(zip(values, timestamps, strict=True)):
        builder.append(i, timestamp=ts, key=None, value=v, headers=[])
    return bytes(builder.build())


_FIELDS = {  # name: (offset, struct format) of the RecordBatch v2 header
    "batch_length": (8, ">i"), "magic": (16, ">b"), "attributes": (21, ">h"),
    "last_offset_delta": (23, ">i"), "base_timestamp": (27, ">q"), "max_timestamp": (35, ">q"),
    "producer_id": (43, ">q"), "producer_epoch": (51, ">h"), "base_sequence": (53, ">i"),
    "records_count": (57, ">i"),
}


def patch(batch: bytes, *, crc: bool = True, **fields: int) -> bytes:
    """The batch with header fields replaced and (unless ``crc`` False) its CRC redone."""
    out = bytearray(batch)
    for name, value in fields.items():
        pos, fmt = _FIELDS[name]
        struct.pack_into(fmt, out, pos, value)
    if crc:
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def header(batch: bytes, name: str) -> int:
    pos, fmt = _FIELDS[name]
    return struct.unpack_from(fmt, batch, pos)[0]


# -- raw requests ---------------------------------------------------------------------------------


def _exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(payload)
        size = struct.unpack(">i", _recv(s, 4))[0]
        return _recv(s, size)


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def produce(b: RunningBroker, topic: str, records: bytes, version: int = 8) -> Any:
    """One Produce (acks=all) through kafka-python's encoder; the partition's response."""
    P = ProduceRequest[version]
    request = P(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        P.TopicProduceData(name=topic, partition_data=[
            P.TopicProduceData.PartitionProduceData(index=0, records=records)])])
    request.with_header(correlation_id=5, client_id="rules")
    body = _exchange(port_of(b), bytes(request.encode(header=True, framed=True)))
    response = ProduceResponse[version].decode(body, header=True)
    return response.responses[0].partition_responses[0]


def list_offsets(b: RunningBroker, topic: str, timestamp: int, version: int = 7,
                 partition: int = 0) -> Any:
    import importlib

    from shmq.cli.configs import kafka_call

    m = importlib.import_module(f"kio.schema.list_offsets.v{version}.request")
    epoch = {"current_leader_epoch": -1} if version >= 4 else {}
    request = m.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
        m.ListOffsetsTopic(name=topic, partitions=(
            m.ListOffsetsPartition(partition_index=partition, timestamp=timestamp,
                                   **epoch),)),))
    response = kafka_call(f"127.0.0.1:{port_of(b)}", request, 30)
    p = response.topics[0].partitions[0]
    return (int(p.error_code), p.offset, p.timestamp,
            p.leader_epoch if version >= 4 else -1)


def end_offset(b: RunningBroker, topic: str) -> int:
    return list_offsets(b, topic, -1)[1]


# -- item 5: a duplicate's log append time --------------------------------------------------------


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_a_duplicate_answers_its_original_timestamp(broker: RunningBroker,
                                                    timestamp_type: str) -> None:
    """``UnifiedLog.append``: a retried batch gets the original offsets and, as log append time,
    the original batch's timestamp (its max timestamp as stored: the append time on a
    LogAppendTime topic), whatever the topic's timestamp type."""
    topic = new_topic(broker, **{"message.timestamp.type": timestamp_type})
    ts = now_ms() - 1000
    sent = kbatch([b"a", b"b"], [ts - 5, ts], pid=4242, epoch=0, seq=0)
    first = produce(broker, topic, sent)
    assert (first.error_code, first.base_offset) == (NONE, 0)
    if timestamp_type == "CreateTime":
        assert first.log_append_time_ms == -1
        original = ts
    else:
        original = first.log_append_time_ms
        assert abs(original - now_ms()) < 60_000
    time.sleep(0.01)
    again = produce(broker, topic, sent)
    assert (again.error_code, again.base_offset, again.log_append_time_ms) == (NONE, 0, original)
    assert end_offset(broker, topic) == 2  # nothing appended


# -- item 5: INVALID_RECORD where Kafka answers it ------------------------------------------------


def _good() -> bytes:
    return kbatch([b"x", b"y", b"z"], [now_ms()] * 3)


@pytest.mark.parametrize("case", ["sequence", "count", "delta", "control", "magic1",
                                  "truncated", "crc", "short"])
@pytest.mark.parametrize("version", [3, 8])
def test_batch_checks_answer_kafkas_error_codes(broker: RunningBroker, case: str,
                                                version: int) -> None:
    """``LogValidator.validateBatch`` and ``ProduceRequest.validateRecords`` throw
    InvalidRecordException (INVALID_RECORD): a producer id with base sequence -1, a record
    count that does not match the offsets, a client-written control batch, magic 0/1, no whole
    batch in the bytes.  A bad CRC or a length under the header is CorruptRecordException
    (CORRUPT_MESSAGE).  Nothing is appended either way."""
    topic = new_topic(broker)
    good = _good()
    bad = {
        "sequence": patch(kbatch([b"x"], [now_ms()], pid=7, epoch=0, seq=0), base_sequence=-1),
        "count": patch(good, records_count=4),
        "delta": patch(good, last_offset_delta=1),
        "control": patch(good, attributes=0x20),
        "magic1": patch(good, magic=1),
        "truncated": good[:-1],
        "crc": patch(good, crc=False, max_timestamp=header(good, "max_timestamp") + 1),
        "short": patch(good, crc=False, batch_length=40)[:52],
    }[case]
    expected = CORRUPT_MESSAGE if case in ("crc", "short") else INVALID_RECORD
    r = produce(broker, topic, bad, version)
    assert r.error_code == expected, (case, r)
    assert r.base_offset == -1
    if version >= 8:
        assert r.error_message
    assert end_offset(broker, topic) == 0
    assert produce(broker, topic, good, version).error_code == NONE  # the partition is fine


# -- item 5: ListOffsets leader epochs and MAX_TIMESTAMP ------------------------------------------


def test_max_timestamp_over_records_without_timestamps(broker: RunningBroker) -> None:
    """All records carry timestamp -1: Kafka's MAX_TIMESTAMP lookup finds the first batch whose
    max timestamp is -1 and its first record: offset 0, timestamp -1, that batch's epoch."""
    topic = new_topic(broker)
    assert list_offsets(broker, topic, -3) == (NONE, -1, -1, -1)  # empty: nothing found
    for _ in range(2):
        assert produce(broker, topic, kbatch([b"a", b"b"], [-1, -1])).error_code == NONE
    assert list_offsets(broker, topic, -3) == (NONE, 0, -1, 0)
    assert list_offsets(broker, topic, -3, version=6)[0] == 35  # UNSUPPORTED_VERSION before v7


def test_list_offsets_answers_the_batch_epoch_or_none(broker: RunningBroker) -> None:
    """The leader epoch in ListOffsets (v4+) is the found batch's for a timestamp or
    max-timestamp lookup, the current one for "latest", the one covering the log start for
    "earliest", and -1 when nothing is found or on an error (it was the current epoch in all
    cases).  The found batch's epoch against a newer current one: test_log.py."""
    topic = new_topic(broker)
    t0 = now_ms() - 10_000
    assert produce(broker, topic, kbatch([b"a", b"b"], [t0, t0 + 1])).error_code == NONE
    assert list_offsets(broker, topic, t0) == (NONE, 0, t0, 0)
    assert list_offsets(broker, topic, t0 + 10_000) == (NONE, -1, -1, -1)  # nothing found
    assert list_offsets(broker, topic, -1) == (NONE, 2, -1, 0)
    assert list_offsets(broker, topic, -2) == (NONE, 0, -1, 0)
    assert list_offsets(broker, topic, -3) == (NONE, 1, t0 + 1, 0)
    assert list_offsets(broker, topic, -1, partition=9) == (3, -1, -1, -1)  # an error
    assert list_offsets(broker, topic, t0, version=3) == (NONE, 0, t0, -1)  # no epoch before v4
