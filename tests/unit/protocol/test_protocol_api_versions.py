"""api_versions: the advertised table, its responses as clients read them, the KIP-511 fallback."""

from __future__ import annotations

import struct

import pytest
from _protocol_util import kafka_python_class, kio_encode
from kafka.protocol.broker_version_data import infer_broker_version_from_api_versions
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from shmq.protocol import api_versions
from shmq.protocol.api_versions import (
    API_NAMES,
    SUPPORTED,
    api_versions_response,
    implemented_min,
    is_supported,
)
from shmq.protocol.codec import (
    UnsupportedVersionError,
    decode_request,
    encode_api_versions_unsupported,
    encode_response,
)

# protocol.md §6.1, for the APIs implemented now, with Kafka 3.9's minimum where the versions
# Kafka 4.0 removed carry no records (ListOffsets 0, OffsetForLeaderEpoch 0-1, CreateTopics 0-1,
# DeleteTopics 0; issue 20)
EXPECTED = {
    18: (0, 4), 3: (0, 12), 0: (0, 12), 1: (4, 12), 2: (0, 8),
    23: (0, 4), 22: (0, 5), 19: (0, 7), 20: (0, 6), 10: (0, 6),
}  # fmt: skip
# admin APIs (issue 5; DescribeConfigs 0 with issue 20)
EXPECTED_ADMIN = {37: (0, 3), 32: (0, 4), 33: (0, 2), 44: (0, 1), 21: (0, 2), 60: (0, 1),
                  61: (0, 0)}  # fmt: skip


def test_table_is_protocol_md():
    assert {k: v for k, v in SUPPORTED.items() if k in EXPECTED} == EXPECTED
    assert {k: v for k, v in SUPPORTED.items() if k in EXPECTED_ADMIN} == EXPECTED_ADMIN
    assert all(lo <= hi for lo, hi in SUPPORTED.values())  # aiokafka asserts this
    names = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 18: "ApiVersions",
             19: "CreateTopics", 20: "DeleteTopics", 22: "InitProducerId",
             23: "OffsetForLeaderEpoch", 10: "FindCoordinator", 37: "CreatePartitions",
             32: "DescribeConfigs", 33: "AlterConfigs", 44: "IncrementalAlterConfigs",
             21: "DeleteRecords", 60: "DescribeCluster", 61: "DescribeProducers"}  # fmt: skip
    assert {k: API_NAMES[k] for k in SUPPORTED if k in names} == names
    assert api_versions.PRODUCE == 0 and api_versions.FETCH == 1 and api_versions.API_VERSIONS == 18


def test_implemented_ranges():
    assert implemented_min(0) == 3
    for key, (lo, hi) in SUPPORTED.items():
        if key != 0:
            assert implemented_min(key) == lo
        for version in range(-1, hi + 3):
            assert is_supported(key, version) == (implemented_min(key) <= version <= hi)
    assert not is_supported(57, 0)


def test_every_served_version_has_classes():
    """kio's, or for the versions Kafka 4 removed, ``protocol.legacy``'s (and only those)."""
    from shmq.protocol import legacy
    from shmq.protocol.codec import request_class, response_class

    for key, (_, hi) in SUPPORTED.items():
        for version in range(implemented_min(key), hi + 1):
            assert request_class(key, version).__version__ == version
            assert response_class(key, version).__version__ == version
            if (key, version) not in legacy.MODULES:
                load_request_schema(key, version)
                load_response_schema(key, version)
    for key, version in legacy.MODULES:
        assert is_supported(key, version)
        with pytest.raises(Exception, match="entity path"):
            load_request_schema(key, version)  # kio has no schema for it


@pytest.mark.parametrize("version", range(5))
def test_api_versions_response_decodes_with_kafka_python(version):
    wire = encode_response(18, version, 31, api_versions_response(version))
    assert wire[4:8] == struct.pack(">i", 31)
    assert wire[8:10] == b"\x00\x00"  # header v0: error_code follows the correlation id
    decoded = kafka_python_class(18, "response")[version].decode(wire, header=True, framed=True)
    assert decoded.header.correlation_id == 31
    assert decoded.error_code == 0
    assert {k.api_key: (k.min_version, k.max_version) for k in decoded.api_keys} == SUPPORTED
    if version >= 1:
        assert decoded.throttle_time_ms == 0
    if version >= 3:  # transaction.version (KIP-890 part 2), as Kafka 4.3 advertises it
        supported = [(f.name, f.min_version, f.max_version) for f in decoded.supported_features]
        # v3 leaves out features whose minimum is 0 (clients before KIP-1022)
        assert supported == ([("transaction.version", 0, 2)] if version >= 4 else [])
        assert [(f.name, f.max_version_level, f.min_version_level)
                for f in decoded.finalized_features] == [("transaction.version", 2, 2)]
        assert decoded.finalized_features_epoch == 1


def test_api_versions_error_answer_has_no_features():
    body = api_versions_response(3, error_code=35)
    assert body.supported_features == () and body.finalized_features == ()
    assert body.finalized_features_epoch == -1


def test_kafka_python_infers_kafka_3_8():
    # (3, 8) from Produce 12 as from 11: kafka-python turns on its modern features (protocol.md
    # §2.3) and drives EndTxn <= 3, so transaction version 2 changes nothing for it.
    assert infer_broker_version_from_api_versions(dict(SUPPORTED)) == (3, 8)


def test_response_is_cached_and_immutable():
    assert api_versions_response(3) is api_versions_response(3)


@pytest.mark.parametrize("version", [5, 99, 32767])
def test_unknown_api_versions_version(version):
    # kafka-python's header is v2 for ApiVersions v3+; a future client sends the same shape
    payload = struct.pack(">hhih", 18, version, 12345, 6) + b"client" + b"\x00" + b"\x05junk"
    with pytest.raises(UnsupportedVersionError) as info:
        decode_request(memoryview(payload))
    assert info.value.correlation_id == 12345 and info.value.api_key == 18
    wire = encode_api_versions_unsupported(info.value.correlation_id)
    decoded = kafka_python_class(18, "response")[0].decode(wire, header=True, framed=True)
    assert decoded.header.correlation_id == 12345
    assert decoded.error_code == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in decoded.api_keys] == [(18, 0, 4)]


def test_unsupported_answer_matches_kio_v0_encoding():
    cls = load_response_schema(18, 0)
    mod = __import__(cls.__module__, fromlist=["ApiVersion"])
    body = cls(
        error_code=ErrorCode.unsupported_version,
        api_keys=(mod.ApiVersion(api_key=18, min_version=0, max_version=4),),
    )
    expected = struct.pack(">i", 7) + kio_encode(body)
    assert encode_api_versions_unsupported(7) == struct.pack(">i", len(expected)) + expected
    assert encode_api_versions_unsupported(7) == encode_response(18, 0, 7, body)


@pytest.mark.parametrize("version", range(5))
def test_the_handlers_answer_is_encoded_once_per_version_with_each_correlation_id(version):
    """The ApiVersions handler keeps each version's encoded answer and patches the correlation
    id in: the bytes are kio's encoding of the same body, for any id."""
    import asyncio
    from types import SimpleNamespace

    from shmq.broker.handlers import api_versions as handler

    handler._ANSWERS.pop(version, None)
    for cid in (0, 7, -5, 2**31 - 1):
        (got,) = asyncio.run(handler.handle(
            None, SimpleNamespace(api_version=version, correlation_id=cid), None))
        assert got == encode_response(18, version, cid, api_versions_response(version))
        assert version in handler._ANSWERS  # kept after the first
    framed = handler._ANSWERS[version]
    assert handler.answer(version, 3) is not framed and framed[4:8] == b"\x00" * 4
