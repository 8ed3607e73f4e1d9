"""kio_guard and decode_request on hostile input.

Invariants: the walk ends exactly where kio's reader ends on every valid message; unknown tagged
fields anywhere are dropped; random or mutated frames only ever raise ``RemoteProtocolError`` or
``UnsupportedVersionError`` (and never reach kio's native reader with a count it would allocate
from: that aborts the whole process, see the canary below).
"""

from __future__ import annotations

import datetime
import random
import struct
import subprocess
import sys
import textwrap

import pytest
from _protocol_util import SERVED, generate, kio_encode, kio_request_frame_payload
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse, SupportedFeatureKey
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from shmq.errors import RemoteProtocolError
from shmq.protocol.codec import (
    UnsupportedVersionError,
    decode_request,
    request_class,
    response_class,
)
from shmq.protocol.kio_guard import plan_for, read_entity, read_uvarint, walk, write_uvarint


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_walk_ends_where_kio_ends(api_key, version):
    rnd = random.Random(api_key * 31 + version)
    for cls in (request_class(api_key, version), response_class(api_key, version)):
        for _ in range(5):
            raw = b"pre" + kio_encode(generate(cls, rnd))
            edits: list = []
            end = walk(plan_for(cls), memoryview(raw), 3, len(raw), edits)
            assert end == len(raw) and edits == []
            value, consumed = entity_reader(cls)(raw, 3)
            assert consumed == end - 3
            assert read_entity(cls, raw, 3) == (value, consumed)


def test_unknown_tag_inside_a_known_tagged_field():
    body = ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=(ApiVersion(api_key=18, min_version=0, max_version=4),),
        throttle_time=datetime.timedelta(0),
        supported_features=(SupportedFeatureKey(name="f", min_version=1, max_version=2),),
    )
    raw = kio_encode(body)
    # ... | tags: count 1 | tag 0 | size | compact array [ name 'f' | min | max | tags 0 ]
    feature = bytes([2, 2]) + b"f" + struct.pack(">hh", 1, 2) + b"\x00"
    section = bytes([1, 0, len(feature)]) + feature
    assert raw.endswith(section)
    feature_with_unknown = feature[:-1] + bytes([1, 77, 2]) + b"??"  # unknown tag in the item
    hostile = (
        raw[: -len(section)]
        + bytes([2, 0, len(feature_with_unknown)]) + feature_with_unknown  # known tag 0
        + bytes([9, 1]) + b"!"  # and an unknown top-level tag after it
    )  # fmt: skip
    with pytest.raises(KeyError):
        entity_reader(ApiVersionsResponse)(hostile, 0)
    assert read_entity(ApiVersionsResponse, hostile) == (body, len(hostile))


def test_uvarint_round_trip_and_limits():
    for value in [0, 1, 127, 128, 300, 2**21, 2**28 - 1, 2**32 - 1, 2**35 - 1]:
        encoded = write_uvarint(value)
        assert read_uvarint(memoryview(encoded), 0, len(encoded)) == (value, len(encoded))
    with pytest.raises(RemoteProtocolError):
        read_uvarint(memoryview(b"\x80" * 5 + b"\x01"), 0, 6)
    with pytest.raises(RemoteProtocolError):
        read_uvarint(memoryview(b"\x80\x80"), 0, 2)


def test_kio_native_reader_still_aborts_on_hostile_counts():
    """Canary for the guard's reason to exist: kio 0.6.5 sizes a compact array from its count
    and the Rust allocator aborts the process.  If this starts passing cleanly, kio was fixed."""
    code = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from kio.index import load_request_schema
        from kio.serial import entity_reader
        try:
            entity_reader(load_request_schema(3, 12))(bytes([0xff, 0xff, 0xff, 0xff, 0x0f]), 0)
        except Exception as exc:
            print("raised", type(exc).__name__)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode < 0 and b"memory allocation" in proc.stderr, proc


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=64))
def test_random_bytes(data):
    try:
        decode_request(memoryview(data))
    except (RemoteProtocolError, UnsupportedVersionError):
        pass


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=st.sampled_from(SERVED), body=st.binary(max_size=96))
def test_random_bodies_behind_valid_headers(target, body):
    api_key, version = target
    flexible_header = request_class(api_key, version).__header_schema__.__version__ >= 2
    header = (
        struct.pack(">hhih", api_key, version, 1, 1) + b"c" + (b"\x00" if flexible_header else b"")
    )
    try:
        decode_request(memoryview(header + body))
    except RemoteProtocolError:
        pass


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    target=st.sampled_from(SERVED),
    seed=st.integers(0, 2**32),
    mutation=st.sampled_from(["flip", "truncate", "insert", "hostile-count"]),
)
def test_mutated_requests(target, seed, mutation):
    api_key, version = target
    rnd = random.Random(seed)
    payload = bytearray(kio_request_frame_payload(generate(request_class(api_key, version), rnd)))
    pos = rnd.randrange(8, len(payload)) if len(payload) > 8 else 8
    if mutation == "flip":
        for _ in range(rnd.randint(1, 3)):
            payload[rnd.randrange(8, len(payload))] = rnd.randrange(256)
    elif mutation == "truncate":
        del payload[pos:]
    elif mutation == "insert":
        payload[pos:pos] = rnd.randbytes(rnd.randint(1, 6))
    else:  # a huge uvarint or int32 count dropped anywhere
        payload[pos:pos] = rnd.choice(
            [b"\xff\xff\xff\xff\x0f", b"\x7f\xff\xff\xff", b"\xfe\xff\xff\xff\x0f"]
        )
    try:
        decode_request(memoryview(bytes(payload)))
    except (RemoteProtocolError, UnsupportedVersionError):
        pass
