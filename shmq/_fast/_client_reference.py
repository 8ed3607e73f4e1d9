"""Pure-Python twin of ``shmq._fast.client``: the client's per-record helpers (the oracle).

* **Partitioners** as Kafka's Java client and librdkafka compute them: ``murmur2`` (Java's
  ``Utils.murmur2``, librdkafka's ``rd_murmur2``), ``crc32`` (librdkafka's ``consistent``),
  ``fnv1a`` (librdkafka's ``rd_fnv1a``, made positive as Sarama does).
* **Message**: confluent-kafka's ``Message`` accessors (methods, not attributes), for consumed
  records and delivery reports.
* **as_bytes / normalize_headers**: confluent-kafka's argument checks of ``produce``.
* **Batch / ProducerCore**: the producer's open batches and ``produce``'s common case.

The compiled module has the same names and behaviour; the parity tests hold them to it.
"""

from __future__ import annotations

import struct
import threading
import zlib
from typing import Any

# confluent-kafka's (librdkafka's) constants, repeated so this leaf imports nothing
TIMESTAMP_NOT_AVAILABLE, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME = 0, 1, 2
ERR_MSG_SIZE_TOO_LARGE = 10
ERR__UNKNOWN_PARTITION = -190

# Partitioners by librdkafka's names (the ``partitioner`` config), plus "custom" (a callable)
MURMUR2_RANDOM, MURMUR2, CONSISTENT_RANDOM, CONSISTENT, FNV1A_RANDOM, FNV1A, RANDOM, CUSTOM = \
    range(8)
PARTITIONERS = {"murmur2_random": MURMUR2_RANDOM, "murmur2": MURMUR2,
                "consistent_random": CONSISTENT_RANDOM, "consistent": CONSISTENT,
                "fnv1a_random": FNV1A_RANDOM, "fnv1a": FNV1A, "random": RANDOM}

BATCH_HEADER_SIZE = 61
# librdkafka's estimate of a record's largest size on the wire (rd_kafka_msg_max_wire_size:
# the v2 batch header and a record's varints at their widest), checked against
# message.max.bytes before a record is accepted
RECORD_MAX_OVERHEAD = BATCH_HEADER_SIZE + 5 + 1 + 10 + 5 + 5 + 5 + 5

_MASK32 = 0xFFFFFFFF


# --- partitioners ----------------------------------------------------------------------------

def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` as a signed 32-bit int (Java ``Utils.murmur2``)."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK32
    n4 = length // 4
    for (k,) in struct.iter_unpack("<I", data[: n4 * 4]):
        k = (k * m) & _MASK32
        k ^= k >> r
        k = (k * m) & _MASK32
        h = (h * m) & _MASK32
        h ^= k
    rest = length & 3
    tail = n4 * 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_partition(key: bytes, partition_count: int) -> int:
    """The partition Kafka's Java client (and librdkafka's ``murmur2``) picks for ``key``:
    ``toPositive(murmur2(key)) % partition_count``."""
    return (murmur2(key) & 0x7FFFFFFF) % partition_count


def fnv1a(data: bytes) -> int:
    """librdkafka's ``rd_fnv1a``: 32-bit FNV-1a, made positive as Sarama's hash partitioner."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & _MASK32
    if h & 0x80000000:
        h = (-(h - (1 << 32))) & _MASK32
    return h


def partition_for(kind: int, key: bytes | None, partition_count: int) -> int:
    """The partition of a keyed choice (-1: the sticky / random choice applies)."""
    if kind == MURMUR2_RANDOM:
        return -1 if key is None else murmur2_partition(key, partition_count)
    if kind == MURMUR2:
        return murmur2_partition(key or b"", partition_count)
    if kind == CONSISTENT_RANDOM:
        return -1 if not key else zlib.crc32(key) % partition_count
    if kind == CONSISTENT:
        return zlib.crc32(key or b"") % partition_count
    if kind == FNV1A_RANDOM:
        return -1 if key is None else fnv1a(key) % partition_count
    if kind == FNV1A:
        return fnv1a(key or b"") % partition_count
    return -1


# --- messages --------------------------------------------------------------------------------

class Message:
    """A consumed record, a delivery report or an event, with confluent-kafka's accessors."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_headers", "_error",
                 "_ts_type", "_timestamp", "_latency", "_leader_epoch")

    def __init__(self, topic: str | None = None, partition: int = -1, offset: int = -1001,
                 key: Any = None, value: Any = None, headers: Any = None, error: Any = None,
                 timestamp: tuple[int, int] = (TIMESTAMP_NOT_AVAILABLE, -1),
                 latency: float = -1.0, leader_epoch: int = -1) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._error = error
        self._ts_type, self._timestamp = timestamp
        self._latency = latency
        self._leader_epoch = leader_epoch

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return None if self._partition < 0 else self._partition

    def offset(self) -> int | None:
        return None if self._offset < 0 else self._offset

    def key(self) -> Any:
        return self._key

    def value(self) -> Any:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def error(self) -> Any:
        return self._error

    def timestamp(self) -> tuple[int, int]:
        return (self._ts_type, self._timestamp)

    def latency(self) -> float | None:
        return None if self._latency < 0 else self._latency

    def leader_epoch(self) -> int | None:
        return None if self._leader_epoch < 0 else self._leader_epoch

    def set_key(self, key: Any) -> None:
        self._key = key

    def set_value(self, value: Any) -> None:
        self._value = value

    def set_headers(self, headers: Any) -> None:
        self._headers = headers

    def __len__(self) -> int:
        v = self._value
        return 0 if v is None else len(v)

    def __repr__(self) -> str:
        if self._error is not None:
            return f"<Message {self._topic}[{self._partition}]@{self._offset} error={self._error}>"
        return f"<Message {self._topic}[{self._partition}]@{self._offset}>"


# --- produce() arguments ----------------------------------------------------------------------------

def as_bytes(obj: Any, what: str = "") -> bytes | None:
    """``None``, ``bytes``, a str as UTF-8 or another bytes-like object as bytes; anything else
    is confluent-kafka's TypeError."""
    if obj is None or type(obj) is bytes:
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, bytes):
        return bytes(obj)
    try:
        return bytes(memoryview(obj))
    except TypeError:
        raise TypeError(f"a bytes-like object is required, not '{type(obj).__name__}'") from None


def normalize_headers(headers: Any) -> list[tuple[bytes, bytes | None]]:
    """confluent-kafka's header forms (a dict or a list of (key, value) pairs; keys str or
    bytes, values None, bytes or str) as encoded pairs, with confluent-kafka's TypeErrors."""
    if isinstance(headers, dict):
        items = list(headers.items())
    elif isinstance(headers, list | tuple):
        items = list(headers)
    else:
        raise TypeError("expected headers to be dict or list of (key, value) tuples, not "
                        f"{type(headers).__name__}")
    out = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError("expected headers to be dict or list of (key, value) tuples")
        k, v = item
        if isinstance(k, str):
            kb = k.encode("utf-8")
        elif isinstance(k, bytes):
            kb = bytes(k)
        else:
            raise TypeError(f"expected header key to be unicode string, not {type(k).__name__}")
        if v is None or type(v) is bytes:
            vb = v
        elif isinstance(v, str):
            vb = v.encode("utf-8")
        elif isinstance(v, bytes | bytearray | memoryview):
            vb = bytes(v)
        else:
            raise TypeError("expected header value to be None, binary, or unicode string, not "
                            f"{type(v).__name__}")
        out.append((kb, vb))
    return out


# --- the producer's per-record path ------------------------------------------------------------

RLock = threading.RLock
_FIRST_CAPACITY = 4096


def _zigzag(v: int) -> bytes:
    z = ((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _field(b: bytes | None) -> bytes:
    return _zigzag(-1) if b is None else _zigzag(len(b)) + b


def _header_bytes(s: Any) -> bytes | None:
    if s is None or type(s) is bytes:
        return s
    if isinstance(s, str):
        return s.encode("utf-8")
    return bytes(s)


class Batch:
    """A partition's open batch, records encoded as they come (see
    ``shmq._fast.client.Batch``)."""

    __slots__ = ("data", "used", "n", "nbytes", "base_ts", "max_ts", "opened", "cbs", "keys",
                 "values", "stamps", "headers")

    def __init__(self, opened: float, spare: bytearray | None = None) -> None:
        self.data: bytearray | None = spare if spare is not None else bytearray(_FIRST_CAPACITY)
        self.used = BATCH_HEADER_SIZE
        self.n = 0
        self.nbytes = 0
        self.base_ts = self.max_ts = 0
        self.opened = opened
        self.cbs: list[Any] | None = None
        self.keys: list[Any] | None = None
        self.values: list[Any] | None = None
        self.stamps: list[int] | None = None
        self.headers: list[Any] | None = None

    def count(self) -> int:
        return self.n

    def size(self) -> int:
        return self.used

    def append(self, key: Any, value: Any, ts: int, headers: Any, cb: Any) -> None:
        if (key is not None and type(key) is not bytes) or (
                value is not None and type(value) is not bytes):
            raise TypeError("keys and values must be bytes or None")
        hdrs = None
        if headers is not None:
            hdrs = [(_header_bytes(h[0]), _header_bytes(h[1])) for h in headers]
            if any(h[0] is None for h in hdrs):
                raise ValueError("header keys may not be None")
        if self.data is None:
            raise ValueError("the batch was released")
        if self.n >= 0x7FFFFFFF:
            raise ValueError("too many records for one batch")
        if self.n == 0:
            self.base_ts = self.max_ts = ts
        elif ts > self.max_ts:
            self.max_ts = ts
        body = bytearray(b"\x00")
        body += _zigzag(ts - self.base_ts) + _zigzag(self.n) + _field(key) + _field(value)
        body += _zigzag(len(hdrs) if hdrs else 0)
        for hk, hv in hdrs or ():
            body += _field(hk) + _field(hv)
        rec = _zigzag(len(body)) + body
        end = self.used + len(rec)
        if end > len(self.data):
            self.data.extend(bytes(max(len(self.data), end - len(self.data))))
        self.data[self.used : end] = rec
        self.used = end
        self.n += 1
        before = self.n - 1
        if self.cbs is None:
            if cb is None:
                return
            self.cbs, self.keys, self.values = [None] * before, [None] * before, [None] * before
            self.stamps, self.headers = [0] * before, [None] * before
        assert self.keys is not None and self.values is not None
        assert self.stamps is not None and self.headers is not None
        self.cbs.append(cb)
        self.keys.append(key)
        self.values.append(value)
        self.stamps.append(ts)
        self.headers.append(headers)

    def extend(self, values: list[Any], start: int, stop: int, ts: int) -> None:
        if start < 0 or stop > len(values) or start > stop:
            raise IndexError("rows outside the list")
        if self.cbs is not None:
            raise ValueError("a batch with delivery callbacks keeps its records one by one")
        for v in values[start:stop]:
            if v is not None and type(v) is not bytes:
                raise TypeError("values must be bytes or None")
            self.append(None, v, ts, None, None)

    def load(self, data: bytearray, used: int, n: int, base_ts: int, max_ts: int) -> None:
        if self.n:
            raise ValueError("the batch already holds records")
        if type(data) is not bytearray or not BATCH_HEADER_SIZE < used <= len(data) or n <= 0:
            raise ValueError("a bytearray holding a batch of at least one record is needed")
        self.data, self.used, self.n = data, used, n
        self.base_ts, self.max_ts = base_ts, max_ts

    def _seal(self, producer_id: int, producer_epoch: int, base_sequence: int) -> bytearray:
        from shmq._fast import _reference

        if self.n == 0:
            raise ValueError("a record batch holds at least one record")
        if self.data is None:
            raise ValueError("the batch was released")
        if self.used - 12 > 0x7FFFFFFF:
            raise ValueError("record batch larger than 2 GiB")
        out = _reference.build_batch(self.data[BATCH_HEADER_SIZE : self.used], self.n,
                                     self.n - 1, 0, 0, -1, self.base_ts, self.max_ts,
                                     producer_id, producer_epoch, base_sequence)
        self.data[: self.used] = out
        return out

    def write(self, view: Any, at: int, size: int, producer_id: int = -1,
              producer_epoch: int = -1, base_sequence: int = -1) -> int:
        if size < 0:
            return self.used
        mv = memoryview(view).cast("B")
        if size != self.used or at < 0 or at > mv.nbytes - size:
            raise IndexError("the batch does not fit the window it is written to")
        mv[at : at + size] = self._seal(producer_id, producer_epoch, base_sequence)
        return size

    def encoded(self, producer_id: int = -1, producer_epoch: int = -1,
                base_sequence: int = -1) -> bytearray:
        return self._seal(producer_id, producer_epoch, base_sequence)

    def release(self) -> bytearray | None:
        data, self.data = self.data, None
        return data

    def reports(self) -> list[Any] | None:
        if self.cbs is None:
            return None
        assert self.keys is not None and self.values is not None
        assert self.stamps is not None and self.headers is not None
        return [None if cb is None else (cb, k, v, t, h)
                for cb, k, v, t, h in zip(self.cbs, self.keys, self.values, self.stamps,
                                          self.headers, strict=True)]


def bytes_stats(values: list[Any], stop: int = -1) -> tuple[int, int]:
    """``(total bytes, longest)`` of ``values[:stop]`` (all when ``stop`` < 0), every item
    checked: else ``(-1, index)`` of the first item neither bytes nor None (see
    ``shmq._fast.client.bytes_stats``)."""
    if stop < 0 or stop > len(values):
        stop = len(values)
    total = longest = 0
    for i, v in enumerate(values):
        if v is None:
            continue
        if type(v) is not bytes:
            return -1, i
        if i < stop:
            total += len(v)
            longest = max(longest, len(v))
    return total, longest


class ProducerCore:
    """The twin of the compiled ``ProducerCore``: ``produce`` is the subclass's
    ``_produce_slow`` for every record (it handles every case the compiled fast path does)."""

    _n_open = 0
    _lock: Any
    _slots: dict[str, list[Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        obj = super().__new__(cls)
        obj._lock = RLock()
        obj._slots = {}
        obj._n_open = 0
        return obj

    def _open_get(self, k: tuple[str, int]) -> Any:
        slots = self._slots.get(k[0])
        if slots is None or not 0 <= k[1] < len(slots):
            return None
        return slots[k[1]]

    def _open_set(self, k: tuple[str, int], batch: Any) -> None:
        topic, p = k
        slots = self._slots.setdefault(topic, [])
        if p >= len(slots):
            slots.extend([None] * (p + 1 - len(slots)))
        if slots[p] is None:
            self._n_open += 1
        slots[p] = batch

    def _open_pop(self, k: tuple[str, int]) -> Any:
        slots = self._slots.get(k[0])
        if slots is None or not 0 <= k[1] < len(slots) or slots[k[1]] is None:
            return None
        batch, slots[k[1]] = slots[k[1]], None
        self._n_open -= 1
        return batch

    def _open_items(self) -> list[tuple[tuple[str, int], Any]]:
        return [((topic, p), b) for topic, slots in self._slots.items()
                for p, b in enumerate(slots) if b is not None]

    def _open_clear(self) -> None:
        for slots in self._slots.values():
            slots[:] = [None] * len(slots)
        self._n_open = 0

    def produce(self, topic: Any, value: Any = None, key: Any = None, partition: int = -1,
                on_delivery: Any = None, timestamp: int = 0, headers: Any = None, *,
                callback: Any = None) -> None:
        """Queue one record (confluent-kafka's ``Producer.produce``)."""
        return self._produce_slow(topic, value, key, partition,  # type: ignore[attr-defined]
                                  on_delivery, timestamp, headers, callback)


class ConsumerCore:
    """The twin of the compiled ``ConsumerCore``: ``poll`` is the subclass's ``_poll_slow``."""

    _buffer: list[Any]
    _index: int
    _service_at: float

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        obj = super().__new__(cls)
        obj._buffer = []
        obj._index = 0
        obj._service_at = 0.0
        return obj

    def poll(self, timeout: float | None = None) -> Any:
        """One message or event, or None after ``timeout`` seconds (None or -1: no limit)."""
        return self._poll_slow(timeout)  # type: ignore[attr-defined]
