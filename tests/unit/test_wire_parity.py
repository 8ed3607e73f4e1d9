"""Parity: the compiled wire codec (``shmq._fast.wire``) against its pure-Python twin.

The twins (``shmq.protocol.produce_request`` / ``fetch_response``, the ``*_py`` functions) are
the oracle for every value and every rejection; kafka-python 3.x's ``kafka.protocol`` is the
independent one: it encodes the Produce requests (v3..v11) both parsers read, and decodes the
Fetch responses (v4..v12) both writers produce.  Hostile input (truncations, negative lengths,
huge counts, over-long varints, random mutations) must raise ``RemoteProtocolError`` from both, or
be accepted by both with the same result: never another exception, never a crash.
Skipped when the extension is not loaded (not built, or ``SHMQ_PURE=1``).
"""

from __future__ import annotations

import os
import struct
import sys
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq.errors import LocalProtocolError, RemoteProtocolError
from shmq.protocol import fetch_response, produce_request

if not fast.HAVE_FAST:
    pytest.skip("compiled shmq._fast extensions are not loaded", allow_module_level=True)

from shmq._fast import wire  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "protocol"))
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from _protocol_util import batch, kafka_python_class  # noqa: E402

    KP_PRODUCE = kafka_python_class(0, "request")
    KP_FETCH = kafka_python_class(1, "response")

PRODUCE_VERSIONS = range(3, 12)
FETCH_VERSIONS = range(4, 13)
INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- Produce requests ---------------------------------------------------------------------------

topic_names = st.text(max_size=12)
records = st.one_of(st.none(), st.binary(max_size=80))
produce_topics = st.lists(
    st.tuples(topic_names, st.lists(st.tuples(INT32, records), max_size=4)), max_size=4)


def kafka_python_produce(version: int, txn: str | None, acks: int, timeout_ms: int,
                         topics: list, client_id: str | None = "shmq-test") -> tuple[bytes, int]:
    """A framed Produce request encoded by kafka-python; returns (frame payload, header size)."""
    req = KP_PRODUCE[version](
        transactional_id=txn, acks=acks, timeout_ms=timeout_ms,
        topic_data=[KP_PRODUCE.TopicProduceData(
            name=name,
            partition_data=[KP_PRODUCE.TopicProduceData.PartitionProduceData(index=i, records=r)
                            for i, r in parts])
            for name, parts in topics])  # fmt: skip
    req.with_header(correlation_id=5, client_id=client_id)
    payload = bytes(req.encode(header=True, framed=True))[4:]
    header_size = 8 + 2 + (len(client_id.encode()) if client_id is not None else 0)
    if version >= 9:
        header_size += 1  # header v2: empty tagged fields
    return payload, header_size


def parse_both(payload: bytes, header_size: int, version: int) -> Any:
    """Both parsers on the same frame: equal results, or RemoteProtocolError from both."""
    results = []
    for parse in (produce_request.parse_produce_request_py, wire.parse_produce_request):
        frame = memoryview(payload)
        try:
            results.append(parse(frame, header_size, version))
        except RemoteProtocolError as exc:
            results.append(exc)
    twin, compiled = results
    if isinstance(twin, Exception) or isinstance(compiled, Exception):
        assert type(twin) is type(compiled), (twin, compiled)
        return twin
    assert compiled == twin
    assert type(compiled) is type(twin) is produce_request.ProduceRequest
    for topic in compiled.topics:
        assert type(topic) is produce_request.ProduceTopic
        for p in topic.partitions:
            assert type(p) is produce_request.ProducePartition
            if p.records is not None:
                assert isinstance(p.records, memoryview) and p.records.readonly
    return compiled


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@SETTINGS
@given(txn=st.one_of(st.none(), st.text(max_size=10)), acks=st.sampled_from([-1, 0, 1]),
       timeout_ms=INT32, topics=produce_topics)
def test_produce_requests_encoded_by_kafka_python(version, txn, acks, timeout_ms, topics):
    payload, header_size = kafka_python_produce(version, txn, acks, timeout_ms, topics)
    parsed = parse_both(payload, header_size, version)
    assert not isinstance(parsed, Exception)
    assert (parsed.transactional_id, parsed.acks, parsed.timeout_ms) == (txn, acks, timeout_ms)
    got = [(t.name, [(p.partition_index, None if p.records is None else bytes(p.records))
                     for p in t.partitions]) for t in parsed.topics]
    assert got == [(name, list(parts)) for name, parts in topics]


def test_records_are_views_of_the_frame():
    payload, header_size = kafka_python_produce(9, None, 1, 100, [("t", [(0, batch(3))])])
    frame = memoryview(bytearray(payload))
    parsed = wire.parse_produce_request(frame, header_size, 9)
    records = parsed.topics[0].partitions[0].records
    assert records.obj is frame.obj  # zero copy
    assert bytes(records) == batch(3)


def _with_tags(version: int, topics: list, where: str, tags: bytes) -> tuple[bytes, int, list]:
    """A flexible request with ``tags`` (a whole tagged-field section) replacing the empty
    section at ``where``: "partition", "topic" or "request"."""
    payload, header_size = kafka_python_produce(version, None, 1, 7, topics)
    assert payload.endswith(b"\x00\x00\x00")  # partition, topic, request tags (one partition)
    cut = {"partition": 3, "topic": 2, "request": 1}[where]
    out = payload[:-cut] + tags + payload[-cut + 1:] if cut > 1 else payload[:-1] + tags
    return out, header_size, topics


unknown_tags = st.lists(st.tuples(st.integers(0, 2**20), st.binary(max_size=130)),
                        min_size=1, max_size=3)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@pytest.mark.parametrize("version", [9, 10, 11])
@pytest.mark.parametrize("where", ["partition", "topic", "request"])
@SETTINGS
@given(tags=unknown_tags)
def test_unknown_tagged_fields_are_skipped(version, where, tags):
    section = _uvarint(len(tags)) + b"".join(
        _uvarint(tag) + _uvarint(len(value)) + value for tag, value in sorted(tags))
    payload, header_size, topics = _with_tags(version, [("t", [(2, batch(1))])], where, section)
    parsed = parse_both(payload, header_size, version)
    assert not isinstance(parsed, Exception)
    assert bytes(parsed.topics[0].partitions[0].records) == batch(1)


# --- hostile Produce requests -------------------------------------------------------------------

VALID = {v: kafka_python_produce(v, "txn", -1, 30_000,
                                 [("orders", [(0, batch(2)), (1, None)]), ("x", [(3, b"")])])
         for v in PRODUCE_VERSIONS}


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_every_truncation_is_rejected_by_both(version):
    payload, header_size = VALID[version]
    for cut in range(header_size, len(payload)):
        assert isinstance(parse_both(payload[:cut], header_size, version), RemoteProtocolError)
    assert isinstance(parse_both(payload + b"\x00", header_size, version), RemoteProtocolError)
    assert not isinstance(parse_both(payload, header_size, version), Exception)


def _legacy_body(txn_len: int = -1, topic_count: int = 1, name_len: int = 1,
                 part_count: int = 1, records_len: int = 0) -> bytes:
    body = struct.pack(">h", txn_len) + struct.pack(">hi", 1, 100)
    body += struct.pack(">i", topic_count) + struct.pack(">h", name_len) + b"t"
    body += struct.pack(">i", part_count) + struct.pack(">i", 0) + struct.pack(">i", records_len)
    return body


HEADER_V1 = struct.pack(">hhih", 0, 7, 1, -1)
HEADER_V2 = struct.pack(">hhih", 0, 9, 1, -1) + b"\x00"
HOSTILE = [
    (7, HEADER_V1 + _legacy_body(txn_len=-2)),  # negative string length
    (7, HEADER_V1 + _legacy_body(txn_len=0x7FFF)),  # string past the end
    (7, HEADER_V1 + _legacy_body(topic_count=-1)),  # null topic array
    (7, HEADER_V1 + _legacy_body(topic_count=2**31 - 1)),  # huge count
    (7, HEADER_V1 + _legacy_body(part_count=0x10000000)),  # huge partition count
    (7, HEADER_V1 + _legacy_body(name_len=-1)),  # null topic name
    (7, HEADER_V1 + _legacy_body(records_len=-5)),  # negative records length
    (7, HEADER_V1 + _legacy_body(records_len=2**31 - 1)),  # records past the end
    (7, HEADER_V1 + _legacy_body().replace(b"t", b"\xff")),  # invalid UTF-8 topic name
    (9, HEADER_V2 + b"\x80\x80\x80\x80\x80\x01" + struct.pack(">hi", 1, 1) + b"\x01"),  # 6-byte uvarint
    (9, HEADER_V2 + b"\x00" + struct.pack(">hi", 1, 1) + b"\xff\xff\xff\xff\x0f"),  # 2**32 topics
    (9, HEADER_V2 + b"\x00" + struct.pack(">hi", 1, 1) + b"\x01\xff\xff\xff\xff\x0f"),  # tags count
    (9, HEADER_V2 + b"\x00" + struct.pack(">hi", 1, 1) + b"\x01\x01\x00\x7f"),  # tag past the end
    (9, HEADER_V2 + b"\x00" + struct.pack(">hi", 1, 1) + b"\x02\x02\xff"),  # invalid UTF-8 name
    (9, HEADER_V2 + b"\x00" + struct.pack(">hi", 1, 1) + b"\x02\x02t\x02\x00\x00\x00\x00\x80"),
    (11, HEADER_V2[:2] + b"\x00\x0b" + HEADER_V2[4:]),  # no body at all
    (3, b""),  # header past the frame: header_size is computed from this frame below
]


@pytest.mark.parametrize(("version", "payload"), HOSTILE)
def test_hostile_requests_are_remote_protocol_errors(version, payload):
    header_size = min(len(HEADER_V2 if version >= 9 else HEADER_V1), len(payload))
    if not payload:
        header_size = 1  # past the end of an empty frame
    assert isinstance(parse_both(payload, header_size, version), RemoteProtocolError)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@SETTINGS
@given(data=st.data())
@example(data=None)
def test_mutated_requests_agree(version, data):
    payload, header_size = VALID[version]
    if data is None:
        parse_both(payload, header_size, version)
        return
    buf = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(header_size, len(buf) - 1))
        kind = data.draw(st.sampled_from(["byte", "ff", "80", "cut", "insert"]))
        if kind == "byte":
            buf[pos] = data.draw(st.integers(0, 255))
        elif kind == "ff":
            buf[pos:pos + 4] = b"\xff\xff\xff\xff"
        elif kind == "80":
            buf[pos:pos] = b"\x80" * data.draw(st.integers(1, 6))
        elif kind == "cut":
            del buf[pos:]
            break
        else:
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    parse_both(bytes(buf), header_size, version)


@pytest.mark.parametrize("version", [3, 8, 9, 11])
@SETTINGS
@given(garbage=st.binary(max_size=200))
def test_random_bodies_agree(version, garbage):
    header = HEADER_V2 if version >= 9 else HEADER_V1
    parse_both(header + garbage, len(header), version)


def test_bad_versions_are_caller_bugs():
    for bad in (2, 13):
        with pytest.raises(ValueError):
            wire.parse_produce_request(memoryview(b""), 0, bad)
        with pytest.raises(LocalProtocolError):
            wire.encode_produce_response(bad, 1, 0, [])
    for bad in (3, 13):
        with pytest.raises(LocalProtocolError):
            wire.encode_fetch_response(bad, 1, [])


# --- Produce responses --------------------------------------------------------------------------

record_errors = st.lists(st.tuples(INT32, st.one_of(st.none(), st.text(max_size=8))), max_size=2)
produce_partitions = st.lists(st.one_of(
    st.tuples(INT32, INT16, INT64, INT64, INT64, st.one_of(st.none(), st.text(max_size=20))),
    st.tuples(INT32, INT16, INT64, INT64, INT64, st.one_of(st.none(), st.text(max_size=20)),
              record_errors)), max_size=4)
produce_results = st.lists(st.tuples(topic_names, produce_partitions), max_size=3)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@SETTINGS
@given(correlation_id=INT32, throttle_ms=INT32, results=produce_results)
def test_produce_responses_are_byte_identical(version, correlation_id, throttle_ms, results):
    ours = wire.encode_produce_response(version, correlation_id, throttle_ms, results)
    assert ours == produce_request.encode_produce_response_py(version, correlation_id,
                                                              throttle_ms, results)
    decoded = kafka_python_class(0, "response")[version].decode(ours, header=True, framed=True)
    assert decoded.header.correlation_id == correlation_id
    assert [t.name for t in decoded.responses] == [name for name, _ in results]


@pytest.mark.parametrize("bad", [
    (9, 2**31, 0, []),
    (9, 1, 2**31, []),
    (9, 1, 0, [("t", [(0, 70000, 0, -1, 0, None)])]),
    (5, 1, 0, [("t", [(2**31, 0, 0, -1, 0, None)])]),
    (7, 1, 0, [("t", [(0, 0, 2**63, -1, 0, None)])]),
    (8, 1, 0, [("t" * 40000, [])]),
    (8, 1, 0, [("t", [(0, 0, 0, -1, 0, None, [(2**31, None)])])]),
    (8, 1, 0, [("t", [(0, 0, "x", -1, 0, None)])]),
])
def test_produce_response_values_out_of_range_are_local_errors(bad):
    for encode in (wire.encode_produce_response, produce_request.encode_produce_response_py):
        with pytest.raises(LocalProtocolError):
            encode(*bad)


# --- Fetch responses ----------------------------------------------------------------------------


class FakeSlice(NamedTuple):
    fd: int
    position: int
    length: int


record_pieces = st.lists(st.one_of(
    st.binary(max_size=30),
    st.builds(FakeSlice, st.just(-1), st.integers(0, 2**40), st.integers(0, 2**20))), max_size=4)
fetch_partitions = st.lists(st.builds(
    fetch_response.FetchPartitionData, INT32, INT16, INT64, INT64, INT64,
    st.one_of(st.none(), st.lists(st.tuples(INT64, INT64), max_size=3)), INT32,
    st.one_of(st.none(), record_pieces),
    st.one_of(st.none(), st.tuples(INT32, INT64))), max_size=4)  # diverging_epoch
fetch_topics = st.lists(st.tuples(topic_names, fetch_partitions), max_size=3)


def _normal(pieces: list) -> list:
    return [bytes(p) if isinstance(p, (bytes, bytearray, memoryview)) else p for p in pieces]


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@SETTINGS
@given(correlation_id=INT32, topics=fetch_topics, throttle_ms=INT32, error_code=INT16,
       session_id=INT32)
def test_fetch_responses_send_identical_pieces(version, correlation_id, topics, throttle_ms,
                                               error_code, session_id):
    ours = wire.encode_fetch_response(version, correlation_id, topics, throttle_ms, error_code,
                                      session_id)
    twin = fetch_response.encode_fetch_response_py(version, correlation_id, topics, throttle_ms,
                                                   error_code, session_id)
    assert _normal(ours) == _normal(twin)
    views = ours[::2]
    assert all(isinstance(v, memoryview) for v in views)
    assert len({id(v.obj) for v in views}) == 1  # one bytearray holds every non-slice byte
    slices = ours[1::2]
    assert all(isinstance(s, FakeSlice) and s.length for s in slices)
    total = sum(len(v) for v in views) + sum(s.length for s in slices)
    assert struct.unpack_from(">i", views[0])[0] == total - 4


@pytest.fixture(scope="module")
def segment(tmp_path_factory):
    """A file of three real batches: (fd, [(position, bytes), ...])."""
    batches = [batch(2, 1, base_offset=0), batch(1, 2, base_offset=2), batch(4, 3, base_offset=3)]
    path = tmp_path_factory.mktemp("wire") / "00000000000000000000.log"
    path.write_bytes(b"".join(batches))
    fd = os.open(path, os.O_RDONLY)
    positions, pos = [], 0
    for b in batches:
        positions.append((pos, b))
        pos += len(b)
    yield fd, positions
    os.close(fd)


def _expand(pieces: list) -> bytes:
    out = bytearray()
    for piece in pieces:
        if isinstance(piece, (bytes, bytearray, memoryview)):
            out += piece
        else:
            out += os.pread(piece.fd, piece.length, piece.position)
    return bytes(out)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@SETTINGS
@given(data=st.data())
def test_fetch_responses_decode_with_kafka_python(segment, version, data):
    fd, positions = segment
    chunks = [FakeSlice(fd, pos, len(b)) for pos, b in positions] + [b for _, b in positions]
    topics = data.draw(st.lists(st.tuples(topic_names, st.lists(st.builds(
        fetch_response.FetchPartitionData, INT32, INT16, INT64, INT64, INT64,
        st.one_of(st.none(), st.lists(st.tuples(INT64, INT64), max_size=2)), INT32,
        st.lists(st.sampled_from(chunks), max_size=3),
        st.one_of(st.none(), st.tuples(INT32, INT64))), max_size=3)), max_size=3))
    wire_bytes = _expand(wire.encode_fetch_response(version, 77, topics, 5, 0, 0))
    decoded = KP_FETCH[version].decode(wire_bytes, header=True, framed=True)
    assert decoded.header.correlation_id == 77
    assert decoded.throttle_time_ms == 5
    assert [t.topic for t in decoded.responses] == [name for name, _ in topics]
    for t, (_, parts) in zip(decoded.responses, topics, strict=True):
        for p, exp in zip(t.partitions, parts, strict=True):
            assert (p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset) == \
                tuple(exp[:4])
            if version >= 5:
                assert p.log_start_offset == exp.log_start_offset
            if exp.aborted_transactions is None:
                assert p.aborted_transactions is None
            else:
                assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == \
                    list(exp.aborted_transactions)
            if version >= 11:
                assert p.preferred_read_replica == exp.preferred_read_replica
            if version >= 12:  # tag 0; kafka-python leaves an absent tag None
                d = p.diverging_epoch
                assert (None if d is None else (d.epoch, d.end_offset)) == exp.diverging_epoch
            assert bytes(p.records) == _expand(exp.records)


@pytest.mark.parametrize("bad", [
    (12, 2**31, []),
    (12, 1, [("t", [fetch_response.FetchPartitionData(2**31, 0, 0, 0, 0)])]),
    (11, 1, [("t", [fetch_response.FetchPartitionData(0, 2**15, 0, 0, 0)])]),
    (4, 1, [("t", [fetch_response.FetchPartitionData(0, 0, 2**63, 0, 0)])]),
    (7, 1, [("t", [fetch_response.FetchPartitionData(0, 0, 0, 0, 0, [(2**63, 0)])])]),
    (12, 1, [("t", [fetch_response.FetchPartitionData(0, 0, 0, 0, 0, None, 2**31)])]),
    (12, 1, [("t", [fetch_response.FetchPartitionData(
        0, 0, 0, 0, 0, records=[FakeSlice(-1, 0, 2**30)] * 3)])]),  # too large to frame
    (6, 1, [("t" * 40000, [])]),
])
def test_fetch_response_values_out_of_range_are_local_errors(bad):
    for encode in (wire.encode_fetch_response, fetch_response.encode_fetch_response_py):
        with pytest.raises(LocalProtocolError):
            encode(*bad)
