"""ApiVersions (18): the supported-versions table (protocol.api_versions).

The answer is the same bytes for every request of a version but for the correlation id, so each
version's is encoded once (kio: ~60 us warm for v3's 60-odd entries, more in a cold process) and
copied with the id patched in.  Every client connection starts with one: 14 in a suite cell of
four confluent-kafka producers (their bootstrap connections and one to each worker)."""

from __future__ import annotations

import struct
from typing import Any

from shmq.protocol import api_versions
from shmq.protocol.codec import encode_response

_CORRELATION = struct.Struct(">i")
# framed answers (size, correlation id 0, header, body) by request version
_ANSWERS: dict[int, bytes] = {}


async def handle(ctx: Any, header: Any, request: Any) -> list[bytes]:
    return [answer(header.api_version, header.correlation_id)]


def answer(version: int, correlation_id: int) -> bytes:
    """The framed ApiVersions response of ``version`` to the request ``correlation_id``."""
    framed = _ANSWERS.get(version)
    if framed is None:
        framed = _ANSWERS[version] = encode_response(
            api_versions.API_VERSIONS, version, 0, api_versions.api_versions_response(version))
    out = bytearray(framed)
    _CORRELATION.pack_into(out, 4, correlation_id)
    return bytes(out)
