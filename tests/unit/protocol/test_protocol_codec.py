"""codec: request decoding and response encoding against kafka-python's protocol module.

Oracle: kafka-python 3.x encodes the request frames (header included) that ``decode_request``
reads, and decodes the responses ``encode_response`` writes; its re-encoding of what it decoded
must give back our bytes.
"""

from __future__ import annotations

import dataclasses
import random
import struct

import pytest
from _protocol_util import (
    SERVED,
    generate,
    kafka_python_class,
    kio_encode,
    kio_request_frame_payload,
)
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from shmq.errors import LocalProtocolError, RemoteProtocolError, ShmqError
from shmq.protocol import api_versions
from shmq.protocol.codec import (
    RequestHeader,
    UnsupportedVersionError,
    decode_request,
    decode_request_header,
    encode_response,
    request_class,
    response_class,
)
from shmq.protocol.framing import FrameDecoder


def _kafka_python_request_frame(obj, api_key, version, correlation_id, client_id) -> bytes:
    kp = kafka_python_class(api_key, "request")[version].decode(kio_encode(obj))
    kp.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(kp.encode(header=True, framed=True))


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_decode_requests_encoded_by_kafka_python(api_key, version):
    rnd = random.Random(api_key * 100 + version)
    for i in range(4):
        expected = generate(request_class(api_key, version), rnd)
        client_id = ["kafka-python", None, "", "clïent"][i]
        wire = _kafka_python_request_frame(expected, api_key, version, 1000 + i, client_id)
        (payload,) = FrameDecoder().feed(wire)
        header, body = decode_request(payload)
        assert header == RequestHeader(api_key, version, 1000 + i, client_id)
        assert body == expected


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_header_matches_kio(api_key, version):
    cls = request_class(api_key, version)
    payload = kio_request_frame_payload(generate(cls, random.Random(1)), 42, "cid")
    header, size = decode_request_header(memoryview(payload))
    kio_header_size = len(
        kio_encode(
            cls.__header_schema__(
                request_api_key=api_key,
                request_api_version=version,
                correlation_id=42,
                client_id="cid",
            )
        )
    )
    assert size == kio_header_size
    assert header == RequestHeader(api_key, version, 42, "cid")


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_encode_responses_decoded_by_kafka_python(api_key, version):
    rnd = random.Random(api_key * 1000 + version)
    cls = response_class(api_key, version)
    kp_cls = kafka_python_class(api_key, "response")[version]
    header_size = 4 + (1 if cls.__header_schema__.__version__ >= 1 else 0)
    for i in range(4):
        body = generate(cls, rnd)
        if api_key == api_versions.API_VERSIONS:
            # kafka-python decodes any ApiVersions body with an error as v0 (see below)
            body = dataclasses.replace(body, error_code=ErrorCode.none)
        wire = encode_response(api_key, version, -5 + i, body)
        assert struct.unpack_from(">i", wire)[0] == len(wire) - 4
        decoded = kp_cls.decode(wire, header=True, framed=True)
        assert decoded.header.correlation_id == -5 + i
        decoded._header = None  # kafka-python quirk: some encode() overrides touch the header
        assert bytes(decoded.encode()) == wire[4 + header_size :]
        assert wire[4 + header_size :] == kio_encode(body)


def test_kafka_python_reads_every_api_versions_error_as_v0():
    """Client quirk: kafka-python parses an ApiVersions body whose error_code is not 0 as v0,
    whatever version it asked for; an error answer must therefore be v0-shaped for it."""
    body = dataclasses.replace(
        api_versions.api_versions_response(3), error_code=ErrorCode.invalid_request
    )
    wire = encode_response(18, 3, 1, body)
    with pytest.raises(struct.error):  # the v3 body misread as v0
        kafka_python_class(18, "response")[3].decode(wire, header=True, framed=True)
    v0 = api_versions.api_versions_response(0, error_code=ErrorCode.invalid_request)
    decoded = kafka_python_class(18, "response")[3].decode(
        encode_response(18, 0, 1, v0), header=True, framed=True
    )
    assert decoded.error_code == 42 and len(decoded.api_keys) == len(api_versions.SUPPORTED)


def test_response_header_versions():
    # ApiVersions keeps header v0 even for its flexible versions (KIP-511).
    for version in range(5):
        assert response_class(18, version).__header_schema__.__version__ == 0
    assert response_class(3, 8).__header_schema__.__version__ == 0
    assert response_class(3, 9).__header_schema__.__version__ == 1
    wire = encode_response(18, 3, 9, api_versions.api_versions_response(3))
    assert wire[4:8] == struct.pack(">i", 9) and wire[8:10] == b"\x00\x00"  # no tag byte
    wire = encode_response(3, 9, 9, generate(response_class(3, 9), random.Random(0)))
    assert wire[4:9] == struct.pack(">ib", 9, 0)


def test_encode_response_rejects_wrong_body_class():
    body = api_versions.api_versions_response(3)
    with pytest.raises(LocalProtocolError):
        encode_response(18, 2, 1, body)
    with pytest.raises(LocalProtocolError):
        encode_response(3, 3, 1, body)
    with pytest.raises(LocalProtocolError):
        encode_response(18, 3, 1, generate(request_class(18, 3), random.Random(0)))


def test_encode_response_invalid_value_is_local_error():
    with pytest.raises(LocalProtocolError):
        encode_response(18, 3, 2**31, api_versions.api_versions_response(3))


def test_unknown_api_and_version_raise_unsupported():
    for api_key, version in [(57, 0), (-1, 0), (3, 13), (1, 3), (0, 0), (0, 2), (0, 13), (18, 5)]:
        payload = struct.pack(">hhih", api_key, version, 77, 3) + b"abc" + b"\x00" * 10
        with pytest.raises(UnsupportedVersionError) as info:
            decode_request(memoryview(payload))
        err = info.value
        assert isinstance(err, ShmqError) and not isinstance(err, RemoteProtocolError)
        assert (err.api_key, err.api_version, err.correlation_id) == (api_key, version, 77)
        assert err.header == RequestHeader(api_key, version, 77, "abc")


def test_unsupported_with_unreadable_client_id():
    with pytest.raises(UnsupportedVersionError) as info:
        decode_request(memoryview(struct.pack(">hhi", 18, 99, 5)))
    assert info.value.header == RequestHeader(18, 99, 5, None)


def test_produce_v0_to_v2_advertised_but_unsupported():
    assert api_versions.SUPPORTED[0] == (0, 12)
    for version in range(3):
        assert not api_versions.is_supported(0, version)
    assert api_versions.is_supported(0, 3) and api_versions.is_supported(0, 12)


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\x00\x03\x00\x0c\x00\x00\x00"])
def test_short_frames(payload):
    with pytest.raises(RemoteProtocolError):
        decode_request(memoryview(payload))


def test_truncated_client_id_and_header_tags():
    with pytest.raises(RemoteProtocolError):
        decode_request(memoryview(struct.pack(">hhih", 3, 1, 1, 10) + b"abc"))
    with pytest.raises(RemoteProtocolError):
        decode_request(memoryview(struct.pack(">hhih", 3, 1, 1, -2)))
    # Metadata v12 uses header v2: a tag section claiming 3 tags with nothing after it
    with pytest.raises(RemoteProtocolError):
        decode_request(memoryview(struct.pack(">hhih", 3, 12, 1, -1) + b"\x03"))


def test_trailing_bytes_are_ignored_like_kafka():
    # librdkafka 2.16 sends Metadata v12 with 3 bytes after the body; Kafka's parser ignores them
    captured = bytes.fromhex("0003000c00000004000772646b61666b610000000000010000")
    header, body = decode_request(memoryview(captured))
    assert (header.api_key, header.api_version, header.client_id) == (3, 12, "rdkafka")
    assert body.topics is None and body.allow_auto_topic_creation is False
    req = generate(load_request_schema(3, 4), random.Random(3))
    payload = kio_request_frame_payload(req)
    assert decode_request(memoryview(payload + b"\x00"))[1] == decode_request(memoryview(payload))[1]


def test_unknown_tagged_fields_in_flexible_request_are_skipped():
    cls = load_request_schema(3, 12)
    mod = __import__(cls.__module__, fromlist=["MetadataRequestTopic"])
    req = cls(
        topics=(mod.MetadataRequestTopic(topic_id=None, name="a"),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )
    payload = kio_request_frame_payload(req, 5, "c")
    assert payload[-1] == 0  # the body's empty tag section is last
    # one unknown tag (99, 3 bytes) at the top level
    extended = payload[:-1] + bytes([1, 99, 3]) + b"xyz"
    header, body = decode_request(memoryview(extended))
    assert body == req and header.correlation_id == 5
    # kio on its own refuses it
    from kio.serial import entity_reader

    _, header_size = decode_request_header(memoryview(extended))
    with pytest.raises(KeyError, match="Unknown tagged field"):
        entity_reader(cls)(extended, header_size)


def test_unknown_tagged_fields_in_nested_struct_and_header():
    cls = load_request_schema(3, 12)
    mod = __import__(cls.__module__, fromlist=["MetadataRequestTopic"])
    req = cls(
        topics=(mod.MetadataRequestTopic(topic_id=None, name="ab"),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    header = struct.pack(">hhih", 3, 12, 8, 1) + b"c"
    body = kio_encode(req)
    # body: topics count(2) | uuid(16) | name(1+2) | topic tags(0) | bool | bool | tags(0)
    topic_tags_at = 1 + 16 + 3
    assert body[topic_tags_at] == 0
    body2 = (
        body[:topic_tags_at]
        + bytes([2, 5, 1])
        + b"!"
        + bytes([200, 1, 0])
        + body[topic_tags_at + 1 :]
    )
    for header_tags in (b"\x00", bytes([1, 0, 2]) + b"hi"):
        h, decoded = decode_request(memoryview(header + header_tags + body2))
        assert decoded == req and h == RequestHeader(3, 12, 8, "c")


def test_wrong_size_of_known_tag_rejected():
    # Fetch v12's cluster_id is tag 0 (compact string); claim 5 bytes for a 4-byte value.
    cls = load_request_schema(1, 12)
    req = generate(cls, random.Random(5))
    req = dataclasses.replace(req, cluster_id="abc")
    payload = kio_request_frame_payload(req)
    assert payload.endswith(bytes([1, 0, 4, 4]) + b"abc")
    decode_request(memoryview(payload))
    bad = payload[:-5] + bytes([5, 4]) + b"abc" + b"!"
    with pytest.raises(RemoteProtocolError, match="does not fill"):
        decode_request(memoryview(bad))


def test_value_errors_from_kio_become_remote_protocol_errors():
    header = struct.pack(">hhih", 3, 12, 1, -1) + b"\x00"
    with pytest.raises(RemoteProtocolError):  # boolean byte 2
        decode_request(memoryview(header + bytes([0, 2, 0, 0])))
    header = struct.pack(">hhih", 20, 4, 1, -1) + b"\x00"
    with pytest.raises(RemoteProtocolError):  # invalid UTF-8 in a topic name
        decode_request(memoryview(header + bytes([2, 2, 0xFF]) + struct.pack(">i", 5) + b"\x00"))


def test_null_in_non_nullable_fields_rejected():
    header = struct.pack(">hhih", 20, 1, 1, -1)  # DeleteTopics v1: topic_names array(string)
    with pytest.raises(RemoteProtocolError):
        decode_request(memoryview(header + struct.pack(">ii", -1, 5)))
    with pytest.raises(RemoteProtocolError):
        decode_request(memoryview(header + struct.pack(">ihi", 1, -1, 5)))


def test_hostile_compact_array_count_rejected_before_kio():
    # Metadata v12, topics count ff ff ff ff 0f: kio's native reader would abort the process.
    payload = struct.pack(">hhih", 3, 12, 1, -1) + b"\x00" + bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F])
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        decode_request(memoryview(payload))
    # DeleteTopics v4: compact array of strings
    payload = struct.pack(">hhih", 20, 4, 1, -1) + b"\x00" + bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F])
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        decode_request(memoryview(payload))


def test_decode_accepts_bytes_and_memoryview_slices():
    payload = kio_request_frame_payload(generate(load_request_schema(3, 12), random.Random(9)))
    padded = b"XXXX" + payload + b"YY"
    assert decode_request(memoryview(padded)[4:-2]) == decode_request(payload)
