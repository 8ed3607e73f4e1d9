"""Request decoding and response encoding for the control plane, on top of kio 0.6.5.

Theory of operation
-------------------
A frame (from ``framing.FrameDecoder``, size prefix removed) is a request header then a body::

    request header v1   int16 api_key | int16 api_version | int32 correlation_id
                        | int16 len + UTF-8 client_id (-1 = null)
    request header v2   v1 + tagged fields (uvarint count, ...); client_id stays an int16-length
                        string even though the header is "flexible" (RequestHeader.json)

``decode_request_header`` reads the fixed part, checks the (api_key, api_version) pair against
``api_versions.is_supported`` and raises ``UnsupportedVersionError`` (which the connection layer
answers) before looking further.  The header version comes from kio's request class
(``__header_schema__``: v2 for flexible versions).  The body is decoded by kio through
``kio_guard.read_entity``, which first walks the bytes (kio's native reader aborts the process on
hostile array counts and rejects unknown tagged fields).  Bytes left after the body are an error.

Responses are ``int32 size | response header | body``.  The response header is v0 (correlation id)
or v1 (+ an empty tagged-field section) as kio's response class says; ApiVersions always uses v0
(KIP-511), which kio encodes in ``ApiVersionsResponse.__header_schema__``.

Every failure on the way in is ``RemoteProtocolError`` (ends the connection) or
``UnsupportedVersionError`` (answered); on the way out, ``LocalProtocolError``.
"""

from __future__ import annotations

import functools
import io
import struct
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_writer
from kio.serial.errors import SerialError

from shmq.errors import LocalProtocolError, RemoteProtocolError, ShmqError
from shmq.protocol import api_versions, kio_guard, legacy
from shmq.protocol.kio_guard import read_entity, skip_tagged_fields

_HEADER_FIXED = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_INT16 = struct.Struct(">h")
_SIZE_CORRELATION = struct.Struct(">ii")

# ApiVersions v0 body: error_code int16, api_keys array(int32) of (api_key, min, max) int16s.
_API_VERSIONS_V0_UNSUPPORTED = struct.Struct(">iihihhh")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """The request header fields every handler and the connection layer need."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class UnsupportedVersionError(ShmqError):
    """The request's (api_key, api_version) is not served; answer UNSUPPORTED_VERSION (35).

    For ApiVersions the answer is ``encode_api_versions_unsupported`` (KIP-511).  This is not a
    ``ProtocolError``: the connection stays open.
    """

    def __init__(self, header: RequestHeader) -> None:
        name = api_versions.API_NAMES.get(header.api_key, f"api key {header.api_key}")
        super().__init__(f"unsupported {name} version {header.api_version}")
        self.header = header
        self.api_key = header.api_key
        self.api_version = header.api_version
        self.correlation_id = header.correlation_id


@functools.cache
def request_class(api_key: int, version: int) -> Any:
    """The request body class for a version ``is_supported`` accepts: kio's, or for a version
    Kafka 4 removed, the one in ``protocol.legacy``."""
    return legacy.request_class(api_key, version) or load_request_schema(api_key, version)


@functools.cache
def response_class(api_key: int, version: int) -> Any:
    """The response body class (build the handler's response with it)."""
    return legacy.response_class(api_key, version) or load_response_schema(api_key, version)


@functools.cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


# What a client's first requests need besides the hand-parsed Produce, Fetch and ListOffsets:
# Metadata, OffsetCommit, OffsetFetch, FindCoordinator, JoinGroup, Heartbeat, LeaveGroup,
# SyncGroup, ApiVersions, InitProducerId, OffsetForLeaderEpoch at their newest version (the Java
# client's), and the older versions librdkafka 2.x sends (FindCoordinator v2, ApiVersions v3).
CLIENT_APIS = (3, 8, 9, 10, 11, 12, 13, 14, 18, 22, 23)
CLIENT_OLDER_VERSIONS = ((10, 2), (18, 3))


def preload(apis: tuple[int, ...] = CLIENT_APIS,
            older: tuple[tuple[int, int], ...] = CLIENT_OLDER_VERSIONS) -> None:
    """Load the kio schemas, reader and writer of ``apis`` (newest version) and ``older``
    before the process serves: loaded at its first such request, each cost a process 1.5-4.5 ms
    of CPU (a worker's first contact with a librdkafka consumer: ApiVersions, Metadata,
    FindCoordinator, 11-14 ms).  The controller calls it before forking the fork server, so
    every worker inherits them."""
    wanted = [(api, api_versions.SUPPORTED[api][1]) for api in apis] + list(older)
    for api, version in wanted:
        request, response = request_class(api, version), response_class(api, version)
        kio_guard.plan_for(request)
        kio_guard._reader(request)
        _writer(response)


def _read_client_id(frame: memoryview) -> tuple[str | None, int]:
    """The header's client_id (legacy int16 string, -1 = null) and the offset after it."""
    if len(frame) < 10:
        raise RemoteProtocolError("request header is truncated")
    length = _INT16.unpack_from(frame, 8)[0]
    if length == -1:
        return None, 10
    if length < 0 or 10 + length > len(frame):
        raise RemoteProtocolError(f"invalid client_id length {length}")
    # Java decodes malformed UTF-8 with replacement characters; so do we (ids are for logs).
    return str(frame[10 : 10 + length], "utf-8", "replace"), 10 + length


def decode_request_header(frame: memoryview) -> tuple[RequestHeader, int]:
    """Parse the request header: ``(header, header_size)``; the body starts at ``header_size``.

    Raises ``UnsupportedVersionError`` for an API/version the broker does not serve (its header
    carries the client_id when it could be read), ``RemoteProtocolError`` for garbage.
    """
    if len(frame) < 8:
        raise RemoteProtocolError(f"request of {len(frame)} bytes is shorter than a header")
    api_key, api_version, correlation_id = _HEADER_FIXED.unpack_from(frame, 0)
    if not api_versions.is_supported(api_key, api_version):
        try:
            client_id = _read_client_id(frame)[0]
        except RemoteProtocolError:
            client_id = None
        raise UnsupportedVersionError(
            RequestHeader(api_key, api_version, correlation_id, client_id)
        )
    client_id, pos = _read_client_id(frame)
    if request_class(api_key, api_version).__header_schema__.__version__ >= 2:
        pos = skip_tagged_fields(frame, pos, len(frame))  # RequestHeader has no tags
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def decode_request(frame: memoryview) -> tuple[RequestHeader, Any]:
    """Decode a whole request frame into ``(RequestHeader, kio request body)``."""
    if not isinstance(frame, memoryview):
        frame = memoryview(frame)
    header, pos = decode_request_header(frame)
    cls = request_class(header.api_key, header.api_version)
    # Bytes after the body are ignored, as Kafka's parser does: librdkafka 2.16 sends Metadata
    # v12 requests with three of them (captured: "... 00 00 00 00 | 01 00 00").
    body, _ = read_entity(cls, frame, pos)
    return header, body


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """Frame a kio response body: ``int32 size | response header v0/v1 | body``."""
    cls = type(body)
    if getattr(cls, "__api_key__", None) != api_key or cls.__version__ != api_version:
        raise LocalProtocolError(
            f"{cls.__name__} is not the response to api {api_key} v{api_version}"
        )
    if cls is not response_class(api_key, api_version):
        raise LocalProtocolError(f"{cls.__module__}.{cls.__name__} is not a response body")
    out = io.BytesIO()
    try:
        out.write(_SIZE_CORRELATION.pack(0, correlation_id))
        if cls.__header_schema__.__version__ >= 1:
            out.write(b"\x00")  # response header v1: no tagged fields
        _writer(cls)(out, body)
    except (SerialError, ValueError, OverflowError, struct.error) as exc:
        raise LocalProtocolError(f"cannot encode {cls.__name__} v{api_version}: {exc}") from exc
    view = out.getbuffer()
    struct.pack_into(">i", view, 0, len(view) - 4)
    view.release()
    return out.getvalue()


def encode_api_versions_unsupported(correlation_id: int) -> bytes:
    """The KIP-511 answer to an ApiVersions request of an unknown version.

    A v0 body under response header v0 whatever version was asked: ``error_code`` 35
    (UNSUPPORTED_VERSION) and only the ApiVersions entry, so the client can retry with a version
    in range (Kafka ``ApiVersionsRequest.getErrorResponse``)::

        int32 size | int32 correlation_id | int16 error_code | int32 count = 1
        | int16 api_key 18 | int16 min_version | int16 max_version
    """
    lo, hi = api_versions.SUPPORTED[api_versions.API_VERSIONS]
    return _API_VERSIONS_V0_UNSUPPORTED.pack(
        _API_VERSIONS_V0_UNSUPPORTED.size - 4, correlation_id, 35, 1,
        api_versions.API_VERSIONS, lo, hi,
    )  # fmt: skip


__all__ = [
    "RequestHeader",
    "UnsupportedVersionError",
    "decode_request",
    "decode_request_header",
    "encode_api_versions_unsupported",
    "encode_response",
    "request_class",
    "response_class",
]
