"""Routes a request frame to its handler and returns the response pieces.

Produce takes the hand-written path (records stay a view of the frame); every other API is
decoded with kio and answered with a kio response object, encoded here.  A malformed request
raises RemoteProtocolError: the connection ends, nothing else is affected.  An unknown API or an
unsupported version of a known one ends the connection too (Kafka's behaviour: the client cannot
decode an answer in a version it does not speak), except ApiVersions, which is answered with a v0
body and UNSUPPORTED_VERSION so the client can retry with a version we have (KIP-511).
"""

from __future__ import annotations

import struct
from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers import HANDLERS
from shmq.broker.handlers import produce as produce_handler
from shmq.errors import RemoteProtocolError
from shmq.protocol import api_versions, codec

_HEAD = struct.Struct(">hhi")


class Router:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def handle(self, frame: memoryview) -> list[Any] | None:
        """Response pieces (bytes and file slices) for one request, or None (acks=0)."""
        if len(frame) < 8:
            raise RemoteProtocolError("request shorter than its header")
        api_key, api_version, correlation_id = _HEAD.unpack_from(frame, 0)
        if api_key == api_versions.PRODUCE and api_versions.is_supported(api_key, api_version):
            header_size = _request_header_size(frame, flexible=api_version >= 9)
            out = await produce_handler.handle(self.ctx, frame, header_size, api_version,
                                               correlation_id)
            return None if out is None else [out]
        try:
            header, body = codec.decode_request(frame)
        except codec.UnsupportedVersionError as exc:
            if exc.api_key == api_versions.API_VERSIONS:
                return [codec.encode_api_versions_unsupported(correlation_id)]
            raise RemoteProtocolError(
                f"unsupported API {exc.api_key} version {exc.api_version}") from None
        handler = HANDLERS.get(header.api_key)
        if handler is None:
            raise RemoteProtocolError(f"API {header.api_key} is not served by this node")
        response = await handler(self.ctx, header, body)
        if isinstance(response, list):
            return response
        return [codec.encode_response(header.api_key, header.api_version, correlation_id,
                                      response)]


def _request_header_size(frame: memoryview, flexible: bool) -> int:
    """Bytes of a request header: v1 (key, version, correlation id, int16 client id) plus, in
    flexible versions (header v2), a tagged-fields section."""
    if len(frame) < 10:
        raise RemoteProtocolError("request header is truncated")
    (client_len,) = struct.unpack_from(">h", frame, 8)
    pos = 10 + max(client_len, 0)
    if flexible:
        count, pos = _uvarint(frame, pos)
        for _ in range(count):
            _, pos = _uvarint(frame, pos)
            size, pos = _uvarint(frame, pos)
            pos += size
    if pos > len(frame):
        raise RemoteProtocolError("request header runs past the frame")
    return pos


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise RemoteProtocolError("bad unsigned varint in the request header")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
