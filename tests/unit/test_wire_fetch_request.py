"""Fetch request parsing (v4..v12): the compiled ``wire.parse_fetch_request`` against its twin
``fetch_request.parse_fetch_request_py``, and both against two independent encoders.

Oracles: kio 0.6.5 and kafka-python 3.x encode Fetch requests from random field values; both
parsers must return exactly those values (and kio's defaults for fields a version lacks), and
agree with what kio itself decodes from the same bytes (the path the parser replaced).  Hostile
input (every truncation, negative and huge counts, over-long varints, unknown and broken tagged
fields, random mutations) must raise ``RemoteProtocolError`` from both, or be accepted by both
with the same result: never another exception, never a crash.  The compiled half is skipped when
the extension is not loaded (not built, or ``SHMQ_PURE=1``).
"""

from __future__ import annotations

import datetime
import struct
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema

import shmq._fast as fast
from shmq.errors import RemoteProtocolError
from shmq.protocol import codec
from shmq.protocol.fetch_request import (
    FetchPartition,
    FetchRequest,
    FetchTopic,
    ForgottenTopic,
    parse_fetch_request_py,
)
from shmq.protocol.request_header import request_header_size_py

sys.path.insert(0, str(Path(__file__).parent / "protocol"))
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from _protocol_util import kafka_python_class, kio_request_frame_payload  # noqa: E402

    KP_FETCH = kafka_python_class(1, "request")

if fast.HAVE_FAST:
    from shmq._fast import wire

    PARSERS = [parse_fetch_request_py, wire.parse_fetch_request]
    HEADER_SIZERS = [request_header_size_py, wire.request_header_size]
else:  # the twin alone still meets the oracles
    PARSERS = [parse_fetch_request_py]
    HEADER_SIZERS = [request_header_size_py]

VERSIONS = range(4, 13)
INT8 = st.integers(-(2**7), 2**7 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

names = st.text(max_size=10)
partitions = st.lists(st.tuples(INT32, INT32, INT64, INT32, INT64, INT32), max_size=4)
requests = st.builds(
    FetchRequest,
    replica_id=INT32, max_wait_ms=INT32, min_bytes=INT32, max_bytes=INT32, isolation_level=INT8,
    session_id=INT32, session_epoch=INT32,
    topics=st.lists(st.builds(FetchTopic, topic=names,
                              partitions=partitions.map(lambda ps: [FetchPartition(*p)
                                                                    for p in ps])), max_size=3),
    forgotten_topics_data=st.lists(st.builds(ForgottenTopic, topic=names,
                                             partitions=st.lists(INT32, max_size=4)), max_size=3),
    rack_id=names,
)


def for_version(req: FetchRequest, version: int) -> FetchRequest:
    """``req`` as a parser must return it at ``version``: absent fields hold kio's defaults."""
    def part(p: FetchPartition) -> FetchPartition:
        return p._replace(
            current_leader_epoch=p.current_leader_epoch if version >= 9 else -1,
            last_fetched_epoch=p.last_fetched_epoch if version >= 12 else -1,
            log_start_offset=p.log_start_offset if version >= 5 else -1)
    return req._replace(
        session_id=req.session_id if version >= 7 else 0,
        session_epoch=req.session_epoch if version >= 7 else -1,
        topics=[FetchTopic(t.topic, [part(p) for p in t.partitions]) for t in req.topics],
        forgotten_topics_data=req.forgotten_topics_data if version >= 7 else [],
        rack_id=req.rack_id if version >= 11 else "")


def parse_all(payload: bytes, version: int, header_size: int | None = None) -> Any:
    """Every parser on the same frame: equal results, or RemoteProtocolError from all."""
    results = []
    for sizer, parse in zip(HEADER_SIZERS, PARSERS, strict=True):
        frame = memoryview(payload)
        try:
            size = sizer(frame, version >= 12) if header_size is None else header_size
            results.append(parse(frame, size, version))
        except RemoteProtocolError as exc:
            results.append(exc)
    first = results[0]
    for other in results[1:]:
        if isinstance(first, Exception) or isinstance(other, Exception):
            assert type(first) is type(other), results
        else:
            assert other == first
            assert type(other) is FetchRequest
            assert all(type(t) is FetchTopic for t in other.topics)
            assert all(type(p) is FetchPartition for t in other.topics for p in t.partitions)
            assert all(type(t) is ForgottenTopic for t in other.forgotten_topics_data)
    return first


# --- independent encoders -----------------------------------------------------------------------


def partition_fields(p: FetchPartition, version: int) -> dict[str, int]:
    """A partition's fields as Fetch ``version`` has them (both encoders take these names)."""
    fields = dict(partition=p.partition, fetch_offset=p.fetch_offset,
                  partition_max_bytes=p.partition_max_bytes)
    if version >= 5:
        fields["log_start_offset"] = p.log_start_offset
    if version >= 9:
        fields["current_leader_epoch"] = p.current_leader_epoch
    if version >= 12:
        fields["last_fetched_epoch"] = p.last_fetched_epoch
    return fields


def kafka_python_fetch(req: FetchRequest, version: int, client_id: str | None = "c") -> bytes:
    """Header + body (no size prefix) encoded by kafka-python 3.x."""
    F = KP_FETCH
    def part(p: FetchPartition) -> Any:
        return F.FetchTopic.FetchPartition(**partition_fields(p, version))
    kw: dict[str, Any] = dict(
        replica_id=req.replica_id, max_wait_ms=req.max_wait_ms, min_bytes=req.min_bytes,
        max_bytes=req.max_bytes, isolation_level=req.isolation_level,
        topics=[F.FetchTopic(topic=t.topic, partitions=[part(p) for p in t.partitions])
                for t in req.topics])
    if version >= 7:
        kw.update(session_id=req.session_id, session_epoch=req.session_epoch,
                  forgotten_topics_data=[F.ForgottenTopic(topic=t.topic, partitions=t.partitions)
                                         for t in req.forgotten_topics_data])
    if version >= 11:
        kw["rack_id"] = req.rack_id
    out = F[version](**kw)
    out.with_header(correlation_id=9, client_id=client_id)
    return bytes(out.encode(header=True, framed=True))[4:]


def kio_fetch(req: FetchRequest, version: int, cluster_id: str | None = None) -> bytes:
    """Header + body (no size prefix) encoded by kio; v12 may carry ``cluster_id`` (tag 0)."""
    cls = load_request_schema(1, version)
    mod = sys.modules[cls.__module__]
    def part(p: FetchPartition) -> Any:
        return mod.FetchPartition(**partition_fields(p, version))
    kw: dict[str, Any] = dict(
        replica_id=req.replica_id, max_wait=datetime.timedelta(milliseconds=req.max_wait_ms),
        min_bytes=req.min_bytes, max_bytes=req.max_bytes, isolation_level=req.isolation_level,
        topics=tuple(mod.FetchTopic(topic=t.topic, partitions=tuple(part(p) for p in t.partitions))
                     for t in req.topics))
    if version >= 7:
        kw.update(session_id=req.session_id, session_epoch=req.session_epoch,
                  forgotten_topics_data=tuple(
                      mod.ForgottenTopic(topic=t.topic, partitions=tuple(t.partitions))
                      for t in req.forgotten_topics_data))
    if version >= 11:
        kw["rack_id"] = req.rack_id
    if version >= 12:
        kw["cluster_id"] = cluster_id
    return kio_request_frame_payload(cls(**kw), correlation_id=9, client_id="kio")


def kio_view(body: Any) -> FetchRequest:
    """What the kio path handed the Fetch handler, in the parser's shape and defaults."""
    return FetchRequest(
        getattr(body, "replica_id", -1), body.max_wait // datetime.timedelta(milliseconds=1),
        body.min_bytes, body.max_bytes, body.isolation_level, getattr(body, "session_id", 0),
        getattr(body, "session_epoch", -1),
        [FetchTopic(t.topic, [FetchPartition(
            p.partition, getattr(p, "current_leader_epoch", -1), p.fetch_offset,
            getattr(p, "last_fetched_epoch", -1), getattr(p, "log_start_offset", -1),
            p.partition_max_bytes) for p in t.partitions]) for t in body.topics],
        [ForgottenTopic(t.topic, list(t.partitions))
         for t in getattr(body, "forgotten_topics_data", ())],
        getattr(body, "rack_id", ""))


@pytest.mark.parametrize("version", VERSIONS)
@SETTINGS
@given(req=requests)
def test_requests_encoded_by_kafka_python(version: int, req: FetchRequest) -> None:
    payload = kafka_python_fetch(req, version)
    assert parse_all(payload, version) == for_version(req, version)


@pytest.mark.parametrize("version", VERSIONS)
@SETTINGS
@given(req=requests, cluster_id=st.one_of(st.none(), names))
def test_requests_encoded_by_kio_match_kio_decode(version: int, req: FetchRequest,
                                                  cluster_id: str | None) -> None:
    payload = kio_fetch(req, version, cluster_id)
    parsed = parse_all(payload, version)
    assert parsed == for_version(req, version)
    header, body = codec.decode_request(memoryview(payload))  # the path the parser replaced
    assert (header.api_key, header.api_version, header.correlation_id) == (1, version, 9)
    assert kio_view(body) == parsed


@pytest.mark.parametrize("client_id", [None, "", "consumer-1", "é" * 40])
@pytest.mark.parametrize("version", [11, 12])
def test_header_sizes(version: int, client_id: str | None) -> None:
    req = FetchRequest(-1, 500, 1, 1 << 20, 0, 0, -1,
                       [FetchTopic("t", [FetchPartition(0, -1, 5, -1, -1, 1 << 20)])], [], "")
    payload = kafka_python_fetch(req, version, client_id)
    expected = 10 + len((client_id or "").encode()) + (version >= 12)
    for sizer in HEADER_SIZERS:
        assert sizer(memoryview(payload), version >= 12) == expected
    assert parse_all(payload, version) == req


# --- hostile input ------------------------------------------------------------------------------

SAMPLE = FetchRequest(
    -1, 500, 1, 52428800, 1, 7, 3,
    [FetchTopic("orders", [FetchPartition(0, 4, 100, 3, -1, 1 << 20),
                           FetchPartition(5, 4, 200, 3, 0, 1 << 20)]),
     FetchTopic("t2", [FetchPartition(1, 0, 0, 0, 0, 0)])],
    [ForgottenTopic("gone", [1, 2, 3])], "rack-a")


def sample(version: int) -> tuple[bytes, int]:
    payload = kafka_python_fetch(SAMPLE, version)
    return payload, request_header_size_py(memoryview(payload), version >= 12)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_rejected(version: int) -> None:
    payload, header_size = sample(version)
    assert parse_all(payload, version) == for_version(SAMPLE, version)
    for cut in range(len(payload)):
        result = parse_all(payload[:cut], version)
        assert isinstance(result, RemoteProtocolError), (cut, result)


@pytest.mark.parametrize("version", VERSIONS)
def test_trailing_bytes_are_ignored(version: int) -> None:
    """As on the kio path (``codec.decode_request``) and in Kafka's parser."""
    payload, _ = sample(version)
    assert parse_all(payload + b"\x00\x01\x02", version) == for_version(SAMPLE, version)


def legacy(version: int, *, topics: bytes | None = None, name_len: int = 1,
           parts: int = 1, forgotten: int = 0, forgotten_parts: int = 0) -> bytes:
    """A hand-built non-flexible request with one of its counts or lengths replaced."""
    head = struct.pack(">hhih", 1, version, 1, 1) + b"c"
    body = struct.pack(">iiiib", -1, 0, 1, 100, 0)
    if version >= 7:
        body += struct.pack(">ii", 0, -1)
    part = struct.pack(">i", 0) + (struct.pack(">i", -1) if version >= 9 else b"")
    part += struct.pack(">q", 0) + (struct.pack(">q", -1) if version >= 5 else b"")
    part += struct.pack(">i", 100)
    if topics is None:
        topics = struct.pack(">i", 1) + struct.pack(">h", name_len) + b"t" * max(name_len, 0)
        topics += struct.pack(">i", parts) + part * max(min(parts, 2), 0)
    body += topics
    if version >= 7:
        body += struct.pack(">i", forgotten)
        if forgotten > 0:
            body += struct.pack(">h", 1) + b"f" + struct.pack(">i", forgotten_parts)
            body += struct.pack(">i", 7) * max(min(forgotten_parts, 2), 0)
    if version >= 11:
        body += struct.pack(">h", 0)
    return head + body


BAD_LEGACY = [
    (4, dict(topics=struct.pack(">i", -1))),  # null topic array
    (4, dict(topics=struct.pack(">i", -2))),  # negative count
    (11, dict(topics=struct.pack(">i", 0x7FFFFFFF))),  # huge count
    (4, dict(name_len=-1)),  # null topic name
    (9, dict(name_len=-7)),  # negative length
    (9, dict(topics=struct.pack(">ih", 1, 0x7FFF) + b"t")),  # string past the end
    (5, dict(parts=-1)),  # null partition array
    (8, dict(parts=-3)),
    (10, dict(parts=0x7FFFFFFF)),  # huge partition count
    (10, dict(parts=3)),  # one partition short
    (7, dict(forgotten=-2)),
    (7, dict(forgotten=0x40000000)),
    (11, dict(forgotten=1, forgotten_parts=-2)),
    (11, dict(forgotten=1, forgotten_parts=0x7FFFFFFF)),
    (11, dict(forgotten=1, forgotten_parts=3)),
]


@pytest.mark.parametrize("version, kw", BAD_LEGACY)
def test_bad_counts_and_lengths(version: int, kw: dict) -> None:
    assert isinstance(parse_all(legacy(version), version), FetchRequest)  # the unaltered base
    assert isinstance(parse_all(legacy(version, **kw), version), RemoteProtocolError)


def test_invalid_utf8_topic_is_rejected() -> None:
    payload = legacy(9).replace(b"\x00\x01t", b"\x00\x01\xff")
    assert isinstance(parse_all(payload, 9), RemoteProtocolError)


V12_HEAD = struct.pack(">hhih", 1, 12, 1, 1) + b"c" + b"\x00"
V12_FIXED = struct.pack(">iiiibii", -1, 0, 1, 100, 0, 0, -1)
V12_PART = struct.pack(">iiqiqi", 0, -1, 0, -1, -1, 100)


def v12(topics: bytes, tail: bytes = b"\x01\x01\x00") -> bytes:
    """forgotten [] (0x01), rack_id "" (0x01), no tags (0x00) unless ``tail`` says otherwise."""
    return V12_HEAD + V12_FIXED + topics + tail


@pytest.mark.parametrize("payload", [
    v12(b"\x00"),  # null topic array
    v12(b"\x02\x00\x02\x00\x00"),  # null topic name
    v12(b"\xff\xff\xff\xff\x0f"),  # huge count (2**32 - 2)
    v12(b"\x80\x80\x80\x80\x80\x01"),  # six-byte varint
    v12(b"\x80\x80"),  # varint cut short
    v12(b"\x02\x02t\x02" + V12_PART + b"\x05\x00\x00"),  # partition tag count past the end
    v12(b"\x02\x02t\x02" + V12_PART + b"\x01\x00\x20xx\x00"),  # tag size past the end
    v12(b"\x02\x02t\x02" + V12_PART + b"\x01\x00\x80\x80\x80\x80\x80\x01\x00"),  # bad size
    v12(b"\x01", tail=b"\x01\x01\x81\x00"),  # request tag count varint cut short
    v12(b"\x01", tail=b"\x02\x02f\x00\x00\x01\x00"),  # forgotten partitions null
    v12(b"\x01", tail=b"\x01\x00\x00"),  # null rack_id
    v12(b"\x01", tail=b"\x01"),  # rack_id missing
    v12(b"\x01", tail=b"\x01\x01"),  # request tags missing
])
def test_flexible_hostile_input(payload: bytes) -> None:
    assert isinstance(parse_all(payload, 12), RemoteProtocolError), payload.hex()


UNKNOWN_TAGS = b"\x02\x05\x03abc\x7f\x00"  # tags 5 (3 bytes) and 127 (empty)


@pytest.mark.parametrize("where", ["header", "partition", "topic", "forgotten", "request"])
def test_unknown_tagged_fields_are_skipped(where: str) -> None:
    tags = {w: (UNKNOWN_TAGS if w == where else b"\x00")
            for w in ("header", "partition", "topic", "forgotten", "request")}
    payload = (struct.pack(">hhih", 1, 12, 1, 1) + b"c" + tags["header"] + V12_FIXED
               + b"\x02\x02t\x02" + V12_PART + tags["partition"] + tags["topic"]
               + b"\x02\x02f\x02" + struct.pack(">i", 3) + tags["forgotten"]
               + b"\x03rk" + tags["request"])
    expected = FetchRequest(-1, 0, 1, 100, 0, 0, -1,
                            [FetchTopic("t", [FetchPartition(0, -1, 0, -1, -1, 100)])],
                            [ForgottenTopic("f", [3])], "rk")
    assert parse_all(payload, 12) == expected


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_mutations(version: int, data: st.DataObject) -> None:
    payload, header_size = sample(version)
    mutated = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(mutated) - 1))
        mutated[at] = data.draw(st.integers(0, 255))
    parse_all(bytes(mutated), version)  # equal results or RemoteProtocolError from all


@SETTINGS
@given(frame=st.binary(max_size=40), flexible=st.booleans())
def test_header_size_on_random_bytes(frame: bytes, flexible: bool) -> None:
    results = []
    for sizer in HEADER_SIZERS:
        try:
            results.append(sizer(memoryview(frame), flexible))
        except RemoteProtocolError as exc:
            results.append(type(exc))
    assert len(set(results)) == 1, results


@pytest.mark.parametrize("version", [3, 13, -1])
def test_versions_outside_4_12_are_the_callers_bug(version: int) -> None:
    for parse in PARSERS:
        with pytest.raises(ValueError):
            parse(memoryview(b"\x00" * 32), 10, version)
