"""Raw Kafka requests for the differential tests: the same request to shmq and to Apache Kafka.

``Wire(bootstrap).send(api_key, version, {...})`` builds the request from plain Python values
(dicts for structs, lists for arrays, ints for milliseconds), encodes it with kio (generated from
Kafka's schemas), sends it to the bootstrap broker or to a partition's leader (``to=``), and
returns the response as plain values: dicts, lists, ints (error codes and durations too), ``str``
for uuids.  Plain values compare with ``==`` and print readably in an assertion diff.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import socket
import struct
import types
import typing
import uuid
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_writer

from shmq.protocol.kio_guard import read_entity

Plain = Any


def build(cls: type, value: dict) -> Any:
    """A kio entity of ``cls`` from a dict; lists of dicts become tuples of nested entities.
    Keys the version does not have are left out (as Kafka's generated code ignores fields outside
    a version), so one body serves several versions."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            kwargs[f.name] = _coerce(hints[f.name], value[f.name])
    return cls(**kwargs)


def _coerce(hint: Any, v: Any) -> Any:
    if v is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # X | None
        return _coerce(next(a for a in args if a is not type(None)), v)
    if origin is tuple:
        return tuple(_coerce(args[0], x) for x in v)
    if dataclasses.is_dataclass(hint):
        return build(hint, v)  # type: ignore[arg-type]
    if hint is datetime.timedelta or "Timedelta" in getattr(hint, "__name__", ""):
        return datetime.timedelta(milliseconds=v)  # kio's i32Timedelta / i64Timedelta
    if hint is uuid.UUID:
        return v if isinstance(v, uuid.UUID) else uuid.UUID(v)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(v)
    return v


def plain(value: Any) -> Plain:
    """A kio response as dicts, lists and scalars."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [plain(x) for x in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return bytes(value)
    return value


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        out += chunk
    return bytes(out)


class Wire:
    """Raw requests to one Kafka-compatible broker, one connection per broker node."""

    def __init__(self, bootstrap: str, client_id: str = "shmq-diff") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.bootstrap = (host, int(port))
        self.client_id = client_id.encode()
        self._socks: dict[tuple[str, int], socket.socket] = {}
        self._correlation = 0

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks.clear()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sock(self, addr: tuple[str, int]) -> socket.socket:
        if addr not in self._socks:
            self._socks[addr] = socket.create_connection(addr, timeout=30)
        return self._socks[addr]

    def frame(self, api_key: int, version: int, body: dict) -> bytes:
        cls = load_request_schema(api_key, version)
        buf = io.BytesIO()
        entity_writer(cls)(buf, build(cls, body))
        self._correlation += 1
        flexible = cls.__header_schema__.__version__ >= 2
        head = (struct.pack(">hhih", api_key, version, self._correlation, len(self.client_id))
                + self.client_id + (b"\x00" if flexible else b""))
        return head + buf.getvalue()

    def send(self, api_key: int, version: int, body: dict | None = None, *,
             to: tuple[str, int] | None = None, expect_response: bool = True) -> Plain:
        """One request; the decoded response as plain values."""
        addr = to or self.bootstrap
        payload = self.frame(api_key, version, body or {})
        return self.send_frame(api_key, version, payload, to=addr, expect_response=expect_response)

    def send_frame(self, api_key: int, version: int, payload: bytes, *,
                   to: tuple[str, int] | None = None, expect_response: bool = True) -> Plain:
        addr = to or self.bootstrap
        s = self._sock(addr)
        try:
            s.sendall(struct.pack(">i", len(payload)) + payload)
            if not expect_response:
                return None
            size = struct.unpack(">i", _recv_exact(s, 4))[0]
            data = _recv_exact(s, size)
        except OSError:
            self._socks.pop(addr, None)
            s.close()
            raise
        cls = load_response_schema(api_key, version)
        skip = 4 + (1 if cls.__header_schema__.__version__ >= 1 else 0)
        return plain(read_entity(cls, data, skip)[0])

    def leader(self, topic: str, partition: int = 0) -> tuple[str, int]:
        """The address of a partition's leader (Metadata v12)."""
        md = self.send(3, 12, {"topics": [{"name": topic, "topic_id": str(uuid.UUID(int=0))}],
                               "allow_auto_topic_creation": False,
                               "include_topic_authorized_operations": False})
        nodes = {b["node_id"]: (b["host"], b["port"]) for b in md["brokers"]}
        for t in md["topics"]:
            for p in t["partitions"]:
                if p["partition_index"] == partition and p["leader_id"] in nodes:
                    return nodes[p["leader_id"]]
        raise LookupError(f"no leader for {topic}-{partition}: {md}")


def record_batch(records: list[tuple[bytes | None, bytes | None, int]], *, codec: int = 0,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 transactional: bool = False) -> bytes:
    """A RecordBatch v2 of (key, value, timestamp) built by kafka-python (an independent encoder):
    the same bytes for both brokers."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=transactional,
                                  producer_id=producer_id, producer_epoch=producer_epoch,
                                  base_sequence=base_sequence, batch_size=1 << 30)
    for i, (key, value, ts) in enumerate(records):
        b.append(i, timestamp=ts, key=key, value=value, headers=[])
    return bytes(b.build())


def produce_body(topic: str, partition: int, records: bytes, acks: int = -1,
                 timeout_ms: int = 10_000) -> dict:
    return {"transactional_id": None, "acks": acks, "timeout": timeout_ms,
            "topic_data": [{"name": topic,
                            "partition_data": [{"index": partition, "records": records}]}]}
