"""produce_request: the hand-written Produce parser and response encoder against kio/kafka-python.

Oracles: kio decodes the same frames (its records come back as bytes copies, ours as views of
the frame); kafka-python encodes client-built frames; kio encodes the responses we must equal
byte for byte, and kafka-python decodes ours.
"""

from __future__ import annotations

import datetime
import random
import struct

import pytest
from _protocol_util import (
    batch,
    kafka_python_class,
    kio_encode,
    kio_request_frame_payload,
    module_of,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from shmq.errors import LocalProtocolError, RemoteProtocolError
from shmq.protocol import compression
from shmq.protocol.codec import decode_request, decode_request_header, encode_response
from shmq.protocol.produce_request import (
    ProducePartition,
    ProduceRequest,
    encode_produce_response,
    parse_produce_request,
)
from shmq.protocol.records import decode_batches

VERSIONS = range(3, 13)


def _kio_request(version: int, transactional_id, topics) -> object:
    cls = load_request_schema(0, version)
    mod = module_of(cls)
    return cls(
        transactional_id=transactional_id,
        acks=-1,
        timeout=datetime.timedelta(milliseconds=30_000),
        topic_data=tuple(
            mod.TopicProduceData(
                name=name,
                partition_data=tuple(
                    mod.PartitionProduceData(index=index, records=records)
                    for index, records in partitions
                ),
            )
            for name, partitions in topics
        ),
    )


TOPICS = [
    ("orders", [(0, batch(3, 1)), (7, batch(1, 2, compression_type=compression.GZIP))]),
    ("é-topic", [(2, None)]),
    ("empty", []),
    ("x" * 200, [(2**31 - 1, batch(5, 3, producer_id=9, producer_epoch=1, base_sequence=0))]),
]


def _check_against_kio(payload: bytes, version: int) -> ProduceRequest:
    frame = memoryview(payload)
    header, size = decode_request_header(frame)
    ours = parse_produce_request(frame, size, version)
    _, theirs = decode_request(frame)
    assert ours.transactional_id == theirs.transactional_id
    assert ours.acks == theirs.acks
    assert ours.timeout_ms == theirs.timeout.total_seconds() * 1000
    assert [t.name for t in ours.topics] == [t.name for t in theirs.topic_data]
    for topic, kio_topic in zip(ours.topics, theirs.topic_data, strict=True):
        assert [p.partition_index for p in topic.partitions] == [
            p.index for p in kio_topic.partition_data
        ]
        for p, kio_p in zip(topic.partitions, kio_topic.partition_data, strict=True):
            if kio_p.records is None:
                assert p.records is None
            else:
                assert isinstance(p.records, memoryview) and p.records.obj is frame.obj  # zero-copy
                assert bytes(p.records) == kio_p.records
    return ours


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("transactional_id", [None, "txn-1"])
def test_parse_matches_kio(version, transactional_id):
    payload = kio_request_frame_payload(_kio_request(version, transactional_id, TOPICS), 3, "p")
    ours = _check_against_kio(payload, version)
    assert ours.acks == -1 and ours.timeout_ms == 30_000
    assert ours.topics[0].partitions[0] == ProducePartition(0, ours.topics[0].partitions[0].records)
    records = decode_batches(ours.topics[0].partitions[1].records)  # the gzip batch is intact
    assert len(records) == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_parse_requests_encoded_by_kafka_python(version):
    req = _kio_request(version, None, TOPICS[:2])
    kp = kafka_python_class(0, "request")[version].decode(kio_encode(req))
    kp.with_header(correlation_id=11, client_id="kafka-python")
    wire = bytes(kp.encode(header=True, framed=True))
    _check_against_kio(wire[4:], version)


@pytest.mark.parametrize("version", [9, 10, 11])
def test_unknown_tagged_fields_skipped(version):
    req = _kio_request(version, None, [("t", [(1, batch(1))])])
    body = kio_encode(req)
    header = struct.pack(">hhih", 0, version, 1, -1) + b"\x00"
    records = batch(1)
    # layout: txn(0) acks timeout | topics(2) name(2 't') parts(2) index records(uvarint) tags
    #         | topic tags | request tags
    tail = 1 + 1 + 1  # partition tags, topic tags, request tags
    assert body[-tail:] == b"\x00\x00\x00"
    prefix = body[:-tail]
    tag = bytes([1, 42, 2]) + b"??"
    for variant in [prefix + tag + b"\x00\x00", prefix + b"\x00" + tag + b"\x00",
                    prefix + b"\x00\x00" + tag, prefix + tag + tag + tag]:  # fmt: skip
        parsed = parse_produce_request(memoryview(header + variant), len(header), version)
        assert parsed.topics[0].name == "t"
        assert bytes(parsed.topics[0].partitions[0].records) == records


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_a_remote_protocol_error(version):
    payload = kio_request_frame_payload(_kio_request(version, "tx", TOPICS[:2]))
    _, size = decode_request_header(memoryview(payload))
    for cut in range(size, len(payload)):
        with pytest.raises(RemoteProtocolError):
            parse_produce_request(memoryview(payload[:cut]), size, version)
    with pytest.raises(RemoteProtocolError, match="unexpected bytes"):
        parse_produce_request(memoryview(payload + b"\x00"), size, version)


@pytest.mark.parametrize(
    ("version", "body"),
    [
        (3, struct.pack(">hhi", -1, 1, 1000) + struct.pack(">i", 0x7FFFFFFF)),  # topic count
        (3, struct.pack(">hhi", -1, 1, 1000) + struct.pack(">i", -1)),  # null topics
        (3, struct.pack(">hhi", -2, 1, 1000) + struct.pack(">i", 0)),  # txn id length -2
        (3, struct.pack(">hhiih1si", -1, 1, 1000, 1, 1, b"t", 0x10000000)),  # partition count
        (3, struct.pack(">hhiih1siii", -1, 1, 1000, 1, 1, b"t", 1, 0, 0x7FFFFFF0)),  # records len
        (3, struct.pack(">hhiih1siii", -1, 1, 1000, 1, 1, b"t", 1, 0, -2)),  # records len -2
        (3, struct.pack(">hhiihi", -1, 1, 1000, 1, -1, 0)),  # null topic name
        (3, struct.pack(">hhiih1si", -1, 1, 1000, 1, 1, b"\xff", 0)),  # invalid UTF-8
        (9, b"\x00" + struct.pack(">hi", 1, 1000) + bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F])),
        (9, b"\x00" + struct.pack(">hi", 1, 1000) + bytes([0xFF] * 6)),  # 6-byte varint
        (9, b"\x00" + struct.pack(">hi", 1, 1000) + bytes([0])),  # null topics
        (
            9,
            b"\x00"
            + struct.pack(">hi", 1, 1000)
            + bytes([2, 2])
            + b"t"
            + bytes([2, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0x7F]),
        ),
        (9, b"\x00" + struct.pack(">hi", 1, 1000) + bytes([1, 1, 5, 200])),  # tag past the end
    ],
)
def test_hostile_requests(version, body):
    header = struct.pack(">hhih", 0, version, 1, -1) + (b"\x00" if version >= 9 else b"")
    with pytest.raises(RemoteProtocolError):
        parse_produce_request(memoryview(header + body), len(header), version)


def test_version_outside_range_is_a_caller_bug():
    with pytest.raises(ValueError):
        parse_produce_request(memoryview(b""), 0, 2)
    with pytest.raises(ValueError):
        parse_produce_request(memoryview(b""), 0, 13)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(list(VERSIONS)), data=st.binary(max_size=200))
def test_random_bytes_only_raise_remote_protocol_error(version, data):
    try:
        parse_produce_request(memoryview(data), 0, version)
    except RemoteProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(list(VERSIONS)), seed=st.integers(0, 2**32), flips=st.integers(1, 4))
def test_mutated_requests_only_raise_remote_protocol_error(version, seed, flips):
    payload = bytearray(kio_request_frame_payload(_kio_request(version, "t", TOPICS[:2])))
    _, size = decode_request_header(memoryview(payload))
    rnd = random.Random(seed)
    for _ in range(flips):
        payload[rnd.randrange(size, len(payload))] = rnd.randrange(256)
    try:
        parse_produce_request(memoryview(bytes(payload)), size, version)
    except RemoteProtocolError:
        pass


# --- response ---------------------------------------------------------------------------------

RESULTS = [
    ("orders", [(0, 0, 42, -1, 0, None), (7, 0, 100, 1_700_000_000_123, 5, None)]),
    (
        "é",
        [
            (1, 6, -1, -1, -1, "not leader"),
            (2, 87, -1, -1, 0, "bad batch", [(0, "crc"), (3, None)]),
        ],
    ),
    ("empty", []),
]


def _kio_response(version: int, throttle_ms: int, results) -> object:
    cls = load_response_schema(0, version)
    mod = module_of(cls)
    names = set(mod.PartitionProduceResponse.__dataclass_fields__)
    topics = []
    for name, partitions in results:
        presps = []
        for p in partitions:
            kw = {
                "index": p[0],
                "error_code": ErrorCode(p[1]),
                "base_offset": p[2],
                "log_append_time": None if p[3] == -1 else datetime.datetime.fromtimestamp(
                    p[3] / 1000, tz=datetime.timezone.utc),
                "log_start_offset": p[4],
                "error_message": p[5],
                "record_errors": tuple(
                    mod.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                    for i, m in (p[6] if len(p) > 6 else ())
                ) if "record_errors" in names else (),
            }  # fmt: skip
            presps.append(
                mod.PartitionProduceResponse(**{k: v for k, v in kw.items() if k in names})
            )
        topics.append(mod.TopicProduceResponse(name=name, partition_responses=tuple(presps)))
    return cls(responses=tuple(topics), throttle_time=datetime.timedelta(milliseconds=throttle_ms))


@pytest.mark.parametrize("version", VERSIONS)
def test_response_bytes_equal_kio(version):
    for throttle_ms, results in [(0, RESULTS), (250, []), (2**31 - 1, RESULTS[:1])]:
        if version < 8:
            results = [(t, [p[:6] for p in ps]) for t, ps in results]
        ours = encode_produce_response(version, 99, throttle_ms, results)
        theirs = encode_response(0, version, 99, _kio_response(version, throttle_ms, results))
        assert ours == theirs


@pytest.mark.parametrize("version", VERSIONS)
def test_response_decodes_with_kafka_python(version):
    wire = encode_produce_response(version, -7, 3, RESULTS)
    decoded = kafka_python_class(0, "response")[version].decode(wire, header=True, framed=True)
    assert decoded.header.correlation_id == -7
    assert decoded.throttle_time_ms == 3
    first = decoded.responses[0].partition_responses[1]
    assert (first.index, first.error_code, first.base_offset, first.log_append_time_ms) == (
        7, 0, 100, 1_700_000_000_123)  # fmt: skip
    if version >= 5:
        assert first.log_start_offset == 5
    if version >= 8:
        bad = decoded.responses[1].partition_responses[1]
        assert bad.error_message == "bad batch"
        assert [(e.batch_index, e.batch_index_error_message) for e in bad.record_errors] == [
            (0, "crc"), (3, None)]  # fmt: skip


def test_response_out_of_range_values_are_local_errors():
    with pytest.raises(LocalProtocolError):
        encode_produce_response(9, 2**31, 0, [])
    with pytest.raises(LocalProtocolError):
        encode_produce_response(9, 1, 0, [("t", [(0, 70000, 0, -1, 0, None)])])
    with pytest.raises(LocalProtocolError):
        encode_produce_response(13, 1, 0, [])
