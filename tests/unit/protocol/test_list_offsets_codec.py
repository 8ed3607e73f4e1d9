"""ListOffsets v1..v8 parsed and answered by hand (``protocol.list_offsets``), with kio as the
oracle: the same fields from kio-encoded requests, byte-identical answers to kio's encoding,
and malformed requests rejected."""

from __future__ import annotations

import dataclasses
import datetime
import random
import struct

import pytest
from _protocol_util import generate, kio_request_frame_payload
from kio.index import load_request_schema, load_response_schema

from shmq.broker.handlers._build import build, response_module
from shmq.errors import RemoteProtocolError
from shmq.protocol import codec
from shmq.protocol.list_offsets import (
    FIRST_FLEXIBLE_VERSION,
    encode_list_offsets_response,
    parse_list_offsets_request,
)
from shmq.protocol.request_header import request_header_size_py

VERSIONS = range(1, 9)


def _request(version: int, seed: int):
    rnd = random.Random(seed * 31 + version)
    return generate(load_request_schema(2, version), rnd)


def _parse(payload: bytes, version: int):
    view = memoryview(payload)
    size = request_header_size_py(view, version >= FIRST_FLEXIBLE_VERSION)
    return parse_list_offsets_request(view, size, version)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("seed", range(12))
def test_requests_encoded_by_kio_parse_to_kio_fields(version: int, seed: int) -> None:
    req = _request(version, seed)
    payload = kio_request_frame_payload(req)
    header, body = codec.decode_request(memoryview(payload))
    assert header.api_version == version
    parsed = _parse(payload, version)
    assert parsed.replica_id == body.replica_id
    assert parsed.isolation_level == getattr(body, "isolation_level", 0)
    assert [(name, [tuple(p) for p in parts]) for name, parts in parsed.topics] == [
        (t.name, [(p.partition_index, getattr(p, "current_leader_epoch", -1), p.timestamp)
                  for p in t.partitions]) for t in body.topics]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("seed", range(12))
def test_answers_are_byte_identical_to_kio(version: int, seed: int) -> None:
    rnd = random.Random(seed * 17 + version)
    body = generate(load_response_schema(2, version), rnd)
    if hasattr(body, "throttle_time"):  # never throttled here
        body = dataclasses.replace(body, throttle_time=datetime.timedelta(0))
    want = codec.encode_response(2, version, 4242, body)
    topics = [(t.name, [(p.partition_index, int(p.error_code), p.timestamp, p.offset,
                         getattr(p, "leader_epoch", -1)) for p in t.partitions])
              for t in body.topics]
    assert encode_list_offsets_response(version, 4242, topics) == want


@pytest.mark.parametrize("version", VERSIONS)
def test_the_consumer_start_shape_is_byte_identical(version: int) -> None:
    """One topic, one partition, latest offset: what librdkafka sends per partition."""
    cls, m = response_module(2, version)
    body = build(cls, topics=(build(m.ListOffsetsTopicResponse, name="orders", partitions=(
        build(m.ListOffsetsPartitionResponse, partition_index=999, error_code=0, timestamp=-1,
              offset=123456, leader_epoch=3),)),))
    assert encode_list_offsets_response(version, 9, [("orders", [(999, 0, -1, 123456, 3)])]) \
        == codec.encode_response(2, version, 9, body)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_rejected(version: int) -> None:
    payload = kio_request_frame_payload(_request(version, 3))
    size = request_header_size_py(memoryview(payload), version >= FIRST_FLEXIBLE_VERSION)
    _parse(payload, version)
    for cut in range(size, len(payload)):
        with pytest.raises(RemoteProtocolError):
            _parse(payload[:cut], version)


@pytest.mark.parametrize("version", [1, 5, 6, 8])
def test_hostile_counts_and_null_names_are_rejected(version: int) -> None:
    flexible = version >= FIRST_FLEXIBLE_VERSION
    req = load_request_schema(2, version)
    payload = kio_request_frame_payload(generate(req, random.Random(1)))
    size = request_header_size_py(memoryview(payload), flexible)
    head = payload[:size] + struct.pack(">i", -1) + (b"\x00" if version >= 2 else b"")
    huge = b"\xff\xff\xff\x7f" if flexible else struct.pack(">i", 2**31 - 1)
    null_name = (b"\x02\x00" if flexible else struct.pack(">ih", 1, -1))
    for body in (huge, null_name + b"\x00" * 40):
        with pytest.raises(RemoteProtocolError):
            _parse(head + body, version)
    _parse(payload + b"\x01\x02\x03", version)  # bytes after the body are ignored
