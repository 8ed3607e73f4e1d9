"""The control channel between the controller and a worker: JSON lines over a socketpair.

Messages are small dicts with a ``type``.  Controller → worker: ``metadata`` (the whole cluster
metadata, with its generation), ``stop``, ``rpc_reply``, ``txn_markers`` (COMMIT/ABORT markers
the transaction coordinator asks the worker to write, answered by ``txn_markers_reply`` with one
error code per marker).  Worker → controller: ``ready`` (its port), ``metadata_ack``, ``rpc``
(create_topics / delete_topics / allocate_producer_ids / verify_txn ...: things only the
controller may do or know).  End of file on either side means the other process is gone.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any


class ControlChannel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def from_socket(cls, sock: socket.socket) -> ControlChannel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=64 << 20)
        return cls(reader, writer)

    def send(self, message: dict[str, Any]) -> None:
        self.writer.write(json.dumps(message).encode() + b"\n")

    def send_line(self, line: str) -> None:
        """A message already written as one line of JSON (no newline inside)."""
        self.writer.write(line.encode() + b"\n")

    async def receive(self) -> dict[str, Any] | None:
        """The next message, or None at end of file (the other side is gone)."""
        try:
            line = await self.reader.readline()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return None
        if not line:
            return None
        return json.loads(line)

    def close(self) -> None:
        self.writer.close()
