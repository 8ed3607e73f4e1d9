"""The size of a request header, for the hand-parsed APIs (Produce, Fetch) whose handlers need
only the api key, version and correlation id (read by the router) and where the body starts.

Layout (protocol.md §2.1)::

    request header v1   int16 api_key | int16 api_version | int32 correlation_id
                        | int16 len + client_id (-1 = null)
    request header v2   v1 + tagged fields (uvarint count, (uvarint tag, uvarint size, bytes)...)
                        for flexible API versions; client_id stays an int16-length string

The code here is the pure-Python twin of ``shmq._fast.wire.request_header_size`` (STYLE.md §4),
which runs unless ``SHMQ_PURE=1`` or the extension is not built (python 1.3-2.3 us, compiled
0.07-0.15 us a call on the loaded 2-core box).  Malformed input raises ``RemoteProtocolError``.
"""

from __future__ import annotations

import struct

from shmq import _fast
from shmq.errors import RemoteProtocolError
from shmq.protocol.kio_guard import skip_tagged_fields

_INT16 = struct.Struct(">h")


def request_header_size_py(frame: memoryview, flexible: bool) -> int:
    """Bytes of the request header at the start of ``frame`` (header v2 when ``flexible``)."""
    if len(frame) < 10:
        raise RemoteProtocolError("request header is truncated")
    client_len = _INT16.unpack_from(frame, 8)[0]
    if client_len < -1:
        raise RemoteProtocolError(f"invalid client_id length {client_len}")
    pos = 10 + max(client_len, 0)
    if pos > len(frame):
        raise RemoteProtocolError("request header runs past the frame")
    if flexible:
        pos = skip_tagged_fields(frame, pos, len(frame))
    return int(pos)


if _fast.HAVE_FAST:
    from shmq._fast import wire as _wire

    request_header_size = _wire.request_header_size
else:
    request_header_size = request_header_size_py
