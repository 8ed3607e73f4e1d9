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
from _broker import RunningBroker, start_broker
from confluent_kafka.admin import AdminClient, NewTopic
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
    # Kafka's answer carries no message for these (hasCustomErrorMessage is false outside
    # LogValidator's per-record errors): test_kafka_wire_diff.py compares the same cases
    assert r.error_message is None
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


# -- item 3: timestamps are validated and the max timestamp derived --------------------------------


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_gets_invalid_timestamp_beyond_an_hour(broker: RunningBroker,
                                                          compression: str) -> None:
    """Kafka 4's message.timestamp.after.max.ms (1 h): a record stamped 2 h ahead is refused
    with INVALID_TIMESTAMP, compressed or not (the broker reads the records), its batch-mates
    with it; an hour's skew is fine."""
    from confluent_kafka import Producer

    topic = new_topic(broker)
    reports: list[tuple[bytes, int | None]] = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": compression,
                  "linger.ms": 0, "message.send.max.retries": 0})

    def report(err: Any, msg: Any) -> None:
        reports.append((msg.value(), None if err is None else err.code()))

    t = now_ms()
    p.produce(topic, b"in-range" * 20, partition=0, timestamp=t + HOUR - 60_000,
              on_delivery=report)
    assert p.flush(30) == 0
    p.produce(topic, b"future" * 20, partition=0, timestamp=t + 2 * HOUR, on_delivery=report)
    assert p.flush(30) == 0
    assert reports == [(b"in-range" * 20, None), (b"future" * 20, INVALID_TIMESTAMP)]
    assert end_offset(broker, topic) == 1
    _, offset, ts, _ = list_offsets(broker, topic, -3)
    assert (offset, ts) == (0, t + HOUR - 60_000)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_kafka_python_gets_invalid_timestamp(broker: RunningBroker,
                                             compression: str | None) -> None:
    from kafka import KafkaProducer
    from kafka.errors import InvalidTimestampError

    topic = new_topic(broker)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=compression,
                      retries=0)
    try:
        with pytest.raises(InvalidTimestampError):
            p.send(topic, b"future", partition=0, timestamp_ms=now_ms() + 3 * HOUR).get(30)
        meta = p.send(topic, b"now", partition=0, timestamp_ms=now_ms()).get(30)
        assert meta.offset == 0
    finally:
        p.close(30)


def test_invalid_timestamp_names_every_record(broker: RunningBroker) -> None:
    """Produce v8+: record_errors holds each refused record's index and Kafka's message."""
    topic = new_topic(broker)
    t = now_ms()
    r = produce(broker, topic, kbatch([b"a", b"b", b"c"], [t, t + 5 * HOUR, t + 6 * HOUR]))
    assert r.error_code == INVALID_TIMESTAMP and r.base_offset == -1
    assert r.error_message == "One or more records have been rejected due to invalid timestamp"
    assert [e.batch_index for e in r.record_errors] == [1, 2]
    message = r.record_errors[0].batch_index_error_message
    assert message.startswith(f"Timestamp {t + 5 * HOUR} of message with offset 1 is out of "
                              "range. The timestamp should be within [")
    assert produce(broker, topic, kbatch([b"a"], [t]), version=3).error_code == NONE


def test_the_limits_follow_the_topic_config_at_once(broker: RunningBroker) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    topic = new_topic(broker, **{"message.timestamp.before.max.ms": str(HOUR)})
    t = now_ms()
    assert produce(broker, topic, kbatch([b"old"], [t - 2 * HOUR])).error_code == \
        INVALID_TIMESTAMP
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("message.timestamp.before.max.ms", str(3 * HOUR),
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("message.timestamp.after.max.ms", "1000",
                    incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(30)
    assert produce(broker, topic, kbatch([b"old"], [t - 2 * HOUR])).error_code == NONE
    assert produce(broker, topic, kbatch([b"soon"], [now_ms() + 60_000])).error_code == \
        INVALID_TIMESTAMP


def _stored_batches(b: RunningBroker, topic: str) -> list[bytes]:
    data = (b.data_dir / "worker-1" / f"{topic}-0" / "00000000000000000000.log").read_bytes()
    out, pos = [], 0
    while pos + 12 <= len(data):
        size = struct.unpack_from(">i", data, pos + 8)[0] + 12
        out.append(data[pos : pos + size])
        pos += size
    return out


@pytest.mark.parametrize("compression", [0, 3])
def test_a_lying_max_timestamp_is_replaced_by_the_records(broker: RunningBroker,
                                                          compression: int) -> None:
    """The header claims a maxTimestamp from 2100; the records say now.  Kafka derives the
    batch's max timestamp from its records and rewrites the header (CRC too): MAX_TIMESTAMP
    lookups and time retention follow the records."""
    topic = new_topic(broker)
    t = now_ms() - 1000
    honest = kbatch([b"r" * 100, b"s" * 100], [t - 1, t], compression=compression)
    assert header(honest, "attributes") & 7 == compression
    lying = patch(honest, max_timestamp=4_102_444_800_000)
    assert produce(broker, topic, lying).error_code == NONE
    assert list_offsets(broker, topic, -3)[1:3] == (1, t)
    (stored,) = _stored_batches(broker, topic)
    assert header(stored, "max_timestamp") == t
    assert struct.unpack_from(">I", stored, 17)[0] == crc32c.crc32c(stored[21:])
    assert stored[61:] == lying[61:]  # the records as sent


def test_a_producer_set_log_append_time_attribute(broker: RunningBroker) -> None:
    """Kafka refuses a LogAppendTime batch on a LogAppendTime topic (INVALID_TIMESTAMP, each
    record) and stores it as CreateTime on a CreateTime topic (its maxTimestamp validated as
    every record's timestamp)."""
    t = now_ms() - 1000
    sent = patch(kbatch([b"a", b"b"], [t - 5, t - 3]), attributes=0x08, max_timestamp=t)
    lat_topic = new_topic(broker, **{"message.timestamp.type": "LogAppendTime"})
    r = produce(broker, lat_topic, sent)
    assert r.error_code == INVALID_TIMESTAMP
    assert [e.batch_index for e in r.record_errors] == [0, 1]
    assert "Producer should not set timestamp type to LogAppendTime" in \
        r.record_errors[0].batch_index_error_message
    create_topic = new_topic(broker)
    assert produce(broker, create_topic, sent).error_code == NONE
    (stored,) = _stored_batches(broker, create_topic)
    assert header(stored, "attributes") == 0 and header(stored, "max_timestamp") == t
    assert struct.unpack_from(">I", stored, 17)[0] == crc32c.crc32c(stored[21:])
