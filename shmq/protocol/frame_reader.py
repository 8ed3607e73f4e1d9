"""A bounds-checked cursor over one request frame, for the pure-Python twins of the
hand-written parsers (``produce_request``, ``fetch_request``).

Every read checks the bytes left first; anything malformed raises ``RemoteProtocolError`` naming
the API ("Produce request is truncated"), which closes only that connection.
"""

from __future__ import annotations

import struct

from shmq.errors import RemoteProtocolError
from shmq.protocol.kio_guard import read_uvarint, skip_tagged_fields

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class FrameReader:
    """Cursor over ``buf[pos:]``; ``flexible`` selects compact lengths and tagged fields."""

    __slots__ = ("buf", "pos", "end", "flexible", "api")

    def __init__(self, buf: memoryview, pos: int, flexible: bool, api: str) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)
        self.flexible = flexible
        self.api = api

    def truncated(self) -> RemoteProtocolError:
        return RemoteProtocolError(f"{self.api} request is truncated")

    def fixed(self, layout: struct.Struct) -> tuple:
        if self.pos + layout.size > self.end:
            raise self.truncated()
        values = layout.unpack_from(self.buf, self.pos)
        self.pos += layout.size
        return values

    def int32(self) -> int:
        return int(self.fixed(_INT32)[0])

    def length(self, legacy_width: int) -> int:
        """A string/bytes length or an array count (int16 or int32 before flexible versions);
        -1 means null."""
        if self.flexible:
            value, self.pos = read_uvarint(self.buf, self.pos, self.end)
            return int(value) - 1
        value = int(self.fixed(_INT16 if legacy_width == 2 else _INT32)[0])
        if value < -1:
            raise RemoteProtocolError(f"negative length {value} in {self.api} request")
        return value

    def blob(self, length: int) -> memoryview:
        stop = self.pos + length
        if stop > self.end:
            raise self.truncated()
        view = self.buf[self.pos : stop]
        self.pos = stop
        return view

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise RemoteProtocolError(f"null topic name in {self.api} request")
        return value

    def nullable_string(self) -> str | None:
        length = self.length(2)
        if length < 0:
            return None
        try:
            return str(self.blob(length), "utf-8")
        except UnicodeDecodeError as exc:
            raise RemoteProtocolError(f"invalid UTF-8 in {self.api} request: {exc}") from None

    def count(self, min_item_size: int) -> int:
        """An array count the bytes left can hold (``min_item_size`` bytes an item at least)."""
        count = self.length(4)
        if count < 0:
            raise RemoteProtocolError(f"null array in {self.api} request")
        if count * min_item_size > self.end - self.pos:
            raise RemoteProtocolError(f"array count {count} exceeds the bytes left")
        return count

    def skip_tags(self) -> None:
        if self.flexible:
            self.pos = skip_tagged_fields(self.buf, self.pos, self.end)
