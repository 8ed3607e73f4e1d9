"""Routes a request frame to its handler and returns the response pieces.

Produce, Fetch and ListOffsets v1+ take the hand-written path (``protocol.produce_request``:
records stay a view of the frame; ``protocol.fetch_request``: 1-2 us a request where kio took
11-14 us, and consumers send many; ``protocol.list_offsets``: librdkafka sends one per partition
when a consumer starts), their header sized by ``protocol.request_header``; every other API is
decoded with kio and answered with a kio response object, encoded here.  A malformed request
raises RemoteProtocolError: the connection ends, nothing else is affected.  An unknown API or an
unsupported version of a known one ends the connection too (Kafka's behaviour: the client cannot
decode an answer in a version it does not speak), except ApiVersions, which is answered with a v0
body and UNSUPPORTED_VERSION so the client can retry with a version we have (KIP-511).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from shmq.broker.context import BrokerContext
from shmq.broker.handlers import HANDLERS
from shmq.broker.handlers import fetch as fetch_handler
from shmq.broker.handlers import list_offsets as list_offsets_handler
from shmq.broker.handlers import produce as produce_handler
from shmq.errors import RemoteProtocolError
from shmq.protocol import api_versions, codec, fetch_request, list_offsets
from shmq.protocol.fetch_request import parse_fetch_request
from shmq.protocol.request_header import request_header_size

_FETCH_MIN, _FETCH_MAX = api_versions.SUPPORTED[api_versions.FETCH]
_FETCH_FIRST_FLEXIBLE = fetch_request.FIRST_FLEXIBLE_VERSION
_LIST_OFFSETS_MIN = max(list_offsets.MIN_VERSION,
                        api_versions.SUPPORTED[api_versions.LIST_OFFSETS][0])
_LIST_OFFSETS_MAX = min(list_offsets.MAX_VERSION,
                        api_versions.SUPPORTED[api_versions.LIST_OFFSETS][1])

_PRODUCE_MIN = api_versions.implemented_min(api_versions.PRODUCE)
_PRODUCE_MAX = api_versions.SUPPORTED[api_versions.PRODUCE][1]

_HEAD = struct.Struct(">hhi")


class Router:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        # what the last request waited (ns: Produce's group commit, Fetch's long poll, the
        # rebalance of JoinGroup and SyncGroup), for the
        # connection's metrics; read and reset by it as soon as ``handle`` returns
        self.remote_ns = 0

    async def handle(self, frame: memoryview) -> list[Any] | asyncio.Future | None:
        """Response pieces (bytes and file slices) for one request, or None (acks=0); for a
        Produce whose answer waits for an fsync, once its batches are appended, a future of
        ``(response bytes or None, nanoseconds waited, perf_counter_ns when done)``
        (``produce.append``)."""
        if len(frame) < 8:
            raise RemoteProtocolError("request shorter than its header")
        api_key, api_version, correlation_id = _HEAD.unpack_from(frame, 0)
        if api_key == api_versions.FETCH and _FETCH_MIN <= api_version <= _FETCH_MAX:
            header_size = request_header_size(frame, api_version >= _FETCH_FIRST_FLEXIBLE)
            request = parse_fetch_request(frame, header_size, api_version)
            pieces = await fetch_handler.handle(self.ctx, request, api_version, correlation_id)
            self.remote_ns, self.ctx.remote_ns = self.ctx.remote_ns, 0
            return pieces
        if api_key == api_versions.PRODUCE and _PRODUCE_MIN <= api_version <= _PRODUCE_MAX:
            header_size = request_header_size(frame, api_version >= 9)
            out = await produce_handler.append(self.ctx, frame, header_size, api_version,
                                               correlation_id)
            if isinstance(out, asyncio.Future):
                return out  # answered once its fsync is done (the connection pipelines)
            return None if out is None else [out]
        if (api_key == api_versions.LIST_OFFSETS
                and _LIST_OFFSETS_MIN <= api_version <= _LIST_OFFSETS_MAX):
            header_size = request_header_size(
                frame, api_version >= list_offsets.FIRST_FLEXIBLE_VERSION)
            return [await list_offsets_handler.handle_wire(self.ctx, frame, header_size,
                                                           api_version, correlation_id)]
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
        self.remote_ns, self.ctx.remote_ns = self.ctx.remote_ns, 0  # JoinGroup, SyncGroup
        if isinstance(response, list):
            return response
        code = getattr(response, "error_code", 0)
        if code and self.ctx.metrics is not None:  # Kafka's ErrorsPerSec (top-level codes)
            self.ctx.metrics.error(header.api_key, int(code))
        return [codec.encode_response(header.api_key, header.api_version, correlation_id,
                                      response)]

