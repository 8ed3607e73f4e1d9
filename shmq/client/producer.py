"""``shmq.Producer``: confluent-kafka's ``Producer`` API, over shared memory when the broker is
local, over confluent-kafka itself otherwise.

    p = shmq.Producer({"bootstrap.servers": "127.0.0.1:9092"})
    p.produce("events", b"value", key=b"key", on_delivery=lambda err, msg: ...)
    p.flush()

Theory of operation (shared memory)
-----------------------------------
* ``produce`` checks its arguments as confluent-kafka does (same exceptions), serializes, picks
  the partition (explicit; a callable partitioner; else Java's murmur2 of the key; else sticky
  for keyless records) and encodes the record into its partition's open batch there and then
  (``shmq._fast.client.Batch``: RecordBatch v2 records after room for the header; the common
  case of ``produce`` is compiled, ``ProducerCore.produce``).  When the batch goes, its header
  gets the producer id and sequence of that moment and the bytes are copied into the ring
  (``LocalBroker.send_with``), compressed first with ``compression.type``.  Keys and values
  are kept as objects only once a record has a delivery callback (its report needs them).
* ``produce_batch`` turns lists, numpy and Arrow arrays into Arrow binary columns, checks them
  whole (nothing is half-sent) and encodes each batch from the columns in one Cython pass
  (``_fast.encode_arrow_batch_into``); Arrow input straight into the ring when the batch goes
  (``ArrowBatch``), numpy ``S`` arrays (views of the caller's memory) into a buffer at once.
* A batch goes when it reaches ``batch.num.messages`` / ``batch.size``, when ``linger.ms`` has
  passed since its first record (a daemon thread watches the open batches, so records go out
  without ``poll`` as librdkafka's do; ``poll`` sends what may go as well, since the thread waits
  for the GIL, which a busy caller gives up only every ``sys.getswitchinterval()``), or -- unless the user set ``linger.ms`` -- as soon as
  its partition has fewer than ``max.in.flight`` (5) batches unanswered: a lone record does not
  wait for the linger (the ring costs no round trip), and records produced while five batches
  are in flight gather into the next one, so batches grow with the rate.
* **Never blocking** (librdkafka's model: ``produce`` only queues).  Two locks: ``_lock`` (the
  C lock ``produce`` takes) guards the open batches, the per-partition backlogs, the counts and
  the reports and is never held across a wait; ``_io`` guards the ``LocalBroker`` and is held
  across its waits.  A sealed batch joins its partition's backlog; ``produce`` then hands the
  backlog to the ring only if ``_io`` is free at once and the ring takes each batch without
  waiting (``LocalBroker.try_send_with``: a live session, a producer id, fewer than
  ``max.in.flight`` unanswered, room).  Whatever may block -- attaching, reattaching to a
  restarted worker and resending what it had not answered (``revive`` / ``prepare``),
  ``InitProducerId`` -- runs on the daemon thread, which holds ``_io`` but not ``_lock``, so a
  stopped or restarting worker never stalls ``produce``: its batches wait, in order, until
  ``message.timeout.ms`` or ``BufferError`` once the buffer is full.  ``poll`` / ``flush`` read
  answers (waiting on the completion eventfd at most their timeout) and never wait for a worker.
* Answers come back on the completion ring; each batch's delivery reports (``(err, msg)`` with
  the record's offset, timestamp and confluent-kafka's ``KafkaError``) wait in a queue that
  ``poll`` / ``flush`` serve on the caller's thread, as confluent-kafka's do.
* ``len(producer)`` counts records not yet reported; ``queue.buffering.max.messages`` /
  ``.kbytes`` (or Java's ``buffer.memory``) bound it: a full buffer raises ``BufferError``.
* Metadata (partition counts, ``list_topics``, topic auto-creation) and the validation of every
  librdkafka key come from a confluent-kafka producer made with the same configuration, which
  sends no records.
"""

from __future__ import annotations

import operator
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException

from shmq import _fast
from shmq._fast import Batch, ProducerCore
from shmq._fast._client_reference import (
    BATCH_HEADER_SIZE,
    PARTITIONERS,
    RECORD_MAX_OVERHEAD,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    as_bytes,
    normalize_headers,
    partition_for,
)
from shmq.client._common import Interceptors, Message, Serdes, kafka_exception
from shmq.client.config import COMPRESSION, ClientConfig, invalid, resolve_callable
from shmq.client.transport import local_data_dir
from shmq.errors import KafkaApiError
from shmq.supervisor.forkserver import prctl

ERR_PURGE_QUEUE = KafkaError._PURGE_QUEUE
ERR_MSG_TIMED_OUT = KafkaError._MSG_TIMED_OUT
METADATA_TIMEOUT_S = 10.0
MAX_BATCH_BYTES = 2 << 20
SPARE_MAX = 4 << 20        # a sent batch's buffer up to this size is kept for the next batch
# ... and up to this many of them: a produce_batch of 100,000 values (the default
# queue.buffering.max.messages) makes 12 batches of ~1 MB (batch.size) at once, and with one
# spare the other eleven grew from 4 KiB by doubling (a realloc and a copy each step, on fresh
# pages): a third of the client's memmove (perf).  ~12 MB kept with the defaults.
SPARES = 12
# Without linger.ms, a partition's new batch goes at once when fewer than max.in.flight batches
# are unanswered and its previous batch went at least this long ago: a send costs ~20 us of
# Python, and with quick answers (acks=1, 0) every record went alone (measured: 14,000
# records/s at acks=1, 20 us CPU a record); records produced within the gap gather in one
# batch, which the linger thread sends when the gap is over.
EAGER_GAP_S = 0.0002
EAGER_CHECK_S = 0.001      # how often the linger thread looks for room in flight (linger.ms unset):
#                            often enough for latency, seldom enough that batches amortise a send
# the linger thread's timer slack (``prctl(PR_SET_TIMERSLACK)``): its timed waits for
# EAGER_GAP_S / linger.ms end within this of their due time instead of the default 50 us later
# (bench_client --stages, acks=1 on an idle box: produce() -> hand-over p50 182 -> 110 us)
LINGER_TIMER_SLACK_NS = 1000
PR_SET_TIMERSLACK = 29
INF = float("inf")
UNKNOWN_RETRY_S = 1.0      # how often metadata of an unknown topic is asked for again
UNSENT_CHECK_S = 0.01      # how often unsent batches are checked against message.timeout.ms


def _as_int(obj: Any) -> int:
    return obj if type(obj) is int else operator.index(obj)


def as_record_list(obj: Any, what: str) -> list[Any]:
    """A list, a numpy array (fixed-width ``S`` bytes kept whole, trailing NULs included;
    object arrays as they are) or a pyarrow array / chunked array, as a list."""
    if type(obj) is list:
        return obj
    mod = type(obj).__module__
    if mod.startswith("pyarrow"):
        return obj.to_pylist()
    if mod.startswith("numpy"):
        if obj.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional")
        if obj.dtype.kind == "S":
            raw, w = obj.tobytes(), obj.itemsize
            return [raw[i : i + w] for i in range(0, len(raw), w)]
        return obj.tolist()
    if isinstance(obj, (bytes, str)):
        raise TypeError(f"{what} must be a sequence of records, not {type(obj).__name__}")
    return list(obj)


_EMPTY = bytearray()


def _message_failed(code: int) -> KafkaError:
    """The ``_error`` confluent-kafka's ``produce_batch`` puts in a dict it could not queue."""
    return KafkaError(code, f"Message failed: {KafkaError(code).str()}")


_ARROW_BINARY_KINDS = ("string", "large_string", "large_binary", "fixed_size_binary",
                       "binary_view", "string_view", "null")


def binary_column(obj: Any, what: str) -> Any:
    """``produce_batch``'s values or keys as one ``pyarrow`` binary array: a pyarrow array or
    chunked array of binary, string (their UTF-8 bytes), large, fixed-size, view or null type
    (dictionary-encoded too); a numpy array of fixed-width bytes (``S``: each item whole,
    trailing NULs included), str (``U``) or objects; a list or other sequence of bytes-like
    objects, str or None.  Anything else raises ``TypeError`` (``ValueError`` for a shape or
    size Arrow cannot take), before a record is queued."""
    import numpy as np
    import pyarrow as pa

    mod = type(obj).__module__
    if mod.startswith("pyarrow"):
        arr = obj
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if not isinstance(arr, pa.Array):
            raise TypeError(f"{what} must be an array, not {type(obj).__name__}")
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        t = arr.type
        if pa.types.is_binary(t):
            return arr
        if not any(getattr(pa.types, f"is_{kind}")(t) for kind in _ARROW_BINARY_KINDS):
            raise TypeError(f"{what} must be binary or string, not Arrow {t}")
        try:
            return arr.cast(pa.binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ValueError(f"{what}: {exc}") from None
    if mod.startswith("numpy"):
        if obj.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional")
        kind = obj.dtype.kind
        if kind == "S":
            width, count = obj.dtype.itemsize, len(obj)
            if width * count > 0x7FFFFFFF:
                raise ValueError(f"{what}: more than 2 GiB in one call")
            data = np.ascontiguousarray(obj).view(np.uint8)
            offsets = np.arange(0, (count + 1) * width, width, dtype=np.int32)
            return pa.Array.from_buffers(pa.binary(), count,
                                         [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        if kind == "U":
            return binary_column(pa.array(obj, pa.string()), what)
        if kind != "O":
            raise TypeError(f"{what} must hold bytes or str, not numpy {obj.dtype}")
        obj = obj.tolist()
    if isinstance(obj, (bytes, bytearray, str, memoryview)):
        raise TypeError(f"{what} must be a sequence of records, not {type(obj).__name__}")
    seq = obj if type(obj) is list else list(obj)
    try:
        return pa.array(seq, pa.binary())
    except (pa.ArrowTypeError, pa.ArrowInvalid, TypeError):
        pass  # bytes-like objects Arrow does not take, or a wrong type: say which
    conv = []
    for i, v in enumerate(seq):
        try:
            conv.append(as_bytes(v))
        except TypeError as exc:
            raise TypeError(f"{what}[{i}]: {exc}") from None
    try:
        return pa.array(conv, pa.binary())
    except (pa.ArrowInvalid, pa.ArrowCapacityError) as exc:
        raise ValueError(f"{what}: {exc}") from None


def _column_buffers(arr: Any) -> tuple[Any, Any, Any, Any]:
    """(offsets, data, validity bitmap or None, lengths with -1 for null) of a binary array,
    realigned to its first row (what ``encode_arrow_batch_into`` takes)."""
    import numpy as np

    valid, offsets, data = arr.buffers()
    n = len(arr)
    off = np.frombuffer(offsets, np.int32, n + 1, arr.offset * 4) if offsets is not None \
        else np.zeros(n + 1, np.int32)
    lengths = np.diff(off).astype(np.int64)
    bits: Any = None
    if arr.null_count:
        if arr.offset % 8 == 0:
            bits = memoryview(valid).cast("B")[arr.offset // 8 : arr.offset // 8 + (n + 7) // 8]
        else:
            flags = np.unpackbits(np.frombuffer(valid, np.uint8),
                                  bitorder="little")[arr.offset : arr.offset + n]
            bits = np.packbits(flags, bitorder="little")
        lengths[~arr.is_valid().to_numpy(zero_copy_only=False)] = -1
    body = memoryview(data).cast("B") if data is not None else np.zeros(0, np.uint8)
    return off, body, bits, lengths


def _varint_size(n: int) -> int:
    """Bytes of Kafka's zigzag varint of ``n``."""
    return max(1, (((n << 1) ^ (n >> 63)).bit_length() + 6) // 7)


def batch_rows(batch_bytes: int, batch_records: int, longest_key: int, longest_value: int) -> int:
    """How many records ``produce_batch`` puts in one batch: at most ``batch_records``, and as
    many as surely fit ``batch_bytes`` (header included) when no key is longer than
    ``longest_key`` and no value than ``longest_value`` (-1: all null).  Its records have no
    headers and one timestamp (delta 0), so each takes at most the bytes computed here: 111
    for a 100 B value without key, where librdkafka's per-record estimate (``size - 61`` of
    ``RECORD_MAX_OVERHEAD``) says 136 and filled batches to 80 % of ``batch.size``."""
    rows = max(1, batch_records)
    body = (1 + 1 + _varint_size(rows - 1)                     # attributes, deltas
            + _varint_size(longest_key) + max(longest_key, 0)
            + _varint_size(longest_value) + max(longest_value, 0) + 1)  # no headers
    return max(1, min(rows, (batch_bytes - BATCH_HEADER_SIZE) // (_varint_size(body) + body)))


class ArrowBatch:
    """One batch of ``produce_batch``'s Arrow columns (rows ``rows``), encoded only when it goes:
    straight into the ring (``write``, what ``LocalBroker.send_with`` calls), not into a buffer
    that is then copied into the ring.  The columns are Arrow arrays, which nobody changes, so
    a batch that waits in a backlog encodes the same bytes later.  It quacks like ``Batch`` as
    far as ``ShmProducer`` sends, expires and fails batches."""

    __slots__ = ("opened", "nbytes", "_rows", "_cols", "_size", "_now")

    def __init__(self, opened: float, rows: Any, cols: tuple, size: int, now: int) -> None:
        self.opened = opened
        self.nbytes = 0
        self._rows, self._cols, self._size, self._now = rows, cols, size, now

    def count(self) -> int:
        return len(self._rows)

    def size(self) -> int:
        return self._size

    def reports(self) -> None:
        return None  # produce_batch's own path has no delivery callbacks

    def write(self, view: Any, at: int, size: int, producer_id: int = -1,
              producer_epoch: int = -1, base_sequence: int = -1) -> int:
        if size < 0:
            return self._size
        k_off, k_data, k_valid, v_off, v_data, v_valid = self._cols
        got = _fast.encode_arrow_batch_into(view, at, size, self._rows, k_off, k_data, k_valid,
                                            v_off, v_data, v_valid, self._now, producer_id,
                                            producer_epoch, base_sequence)
        if got != size:
            raise ValueError(f"an Arrow batch encoded to {got} bytes, {size} were reserved")
        return size

    def encoded(self) -> bytearray:
        out = bytearray(self._size)
        self.write(out, 0, self._size)
        return out

    def release(self) -> None:
        return None  # no buffer of its own to hand to the next batch


def _checked_bytes(items: list[Any], what: str) -> list[Any]:
    """``as_bytes`` of every item, naming the first that is not bytes-like, str or None."""
    out = []
    for i, v in enumerate(items):
        try:
            out.append(as_bytes(v))
        except TypeError as exc:
            raise TypeError(f"{what}[{i}]: {exc}") from None
    return out


def _check_topic(topic: Any) -> str:
    if type(topic) is not str:
        raise TypeError(f"argument 1 must be str, not {type(topic).__name__}")
    return topic


class Producer:
    """A Kafka producer with confluent-kafka's API (see the module docstring).

    ``shmq.transport`` chooses: ``auto`` (shared memory when the broker is on this host),
    ``shm`` or ``kafka``.  The object is a ``ShmProducer`` or a ``KafkaProducer``."""

    transport = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Producer:
        if cls is not Producer:
            return super().__new__(cls)
        if len(args) > 1:
            raise TypeError("expected configuration dict")
        config = ClientConfig(args[0] if args else {}, "producer", kwargs)
        data_dir = local_data_dir(config)
        impl = ShmProducer if data_dir is not None else KafkaProducer
        obj: Producer = impl.__new__(impl)
        obj._setup(config, data_dir)
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # set up by __new__ (_setup)

    def _setup(self, config: ClientConfig, data_dir: Any) -> None:
        raise NotImplementedError

    # the API, as each transport provides it
    def produce(self, topic: Any, value: Any = None, key: Any = None, partition: int = -1,
                on_delivery: Any = None, timestamp: int = 0, headers: Any = None, *,
                callback: Any = None) -> None:
        raise NotImplementedError

    def poll(self, timeout: float | None = None) -> int:
        raise NotImplementedError

    def flush(self, timeout: float | None = None) -> int:
        raise NotImplementedError

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        raise NotImplementedError

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def _common_setup(self, config: ClientConfig) -> None:
        self.config = config
        self.serdes = Serdes(config, "serializer")
        self.interceptors = Interceptors(config)
        spec = config.py.get("partitioner", config.py.get("partitioner.class"))
        self.custom_partitioner: Callable[..., int] | None = resolve_callable(spec, "partitioner")
        rd = config.rd
        try:
            rd.setdefault("enable.idempotence", config.idempotence())
        except confluent_kafka.KafkaException:
            pass  # a bad acks / max.in.flight value: librdkafka names it below
        rd.setdefault("partitioner", "murmur2_random")  # Java's partitioner, not librdkafka's
        self.closed = False

    def _prepare(self, topic: Any, value: Any, key: Any, partition: Any, timestamp: Any,
                 headers: Any) -> tuple[str, Any, Any, int, int, Any]:
        """Interceptors' on_send and the serializers (the slow path of produce)."""
        if self.interceptors:
            msg = Message(topic, partition, -1, key, value, headers, None,
                          (TIMESTAMP_CREATE_TIME, timestamp))
            msg = self.interceptors.chain("on_send", msg)
            topic, key, value, headers = msg.topic(), msg.key(), msg.value(), msg.headers()
            partition = -1 if msg.partition() is None else msg.partition()
            timestamp = msg.timestamp()[1]
        if self.serdes.active:
            key, value = self.serdes.apply(topic, key, value, headers)
        return topic, value, key, partition, timestamp, headers

    def _wrap_delivery(self, cb: Any) -> Any:
        if not self.interceptors:
            return cb
        ack = self.interceptors

        def delivered(err: Any, msg: Any) -> None:
            ack.notify("on_acknowledgement", err, msg)
            if cb is not None:
                cb(err, msg)
        return delivered

    def produce_batch(self, topic: str, values: Any = None, keys: Any = None,
                      partition: int | None = None, headers: Any = None,
                      on_delivery: Any = None) -> int:
        """Queue many records at once; returns how many were queued, as confluent-kafka's
        ``produce_batch`` does: the records go in order while the queue
        (``queue.buffering.max.messages`` / ``.kbytes``) has room, and a call that does not fit
        whole queues the longest prefix that does and returns its length (the caller goes on
        from there after ``poll``); ``BufferError`` when not one record fits.

        ``values`` (and ``keys``, the same length) are lists, numpy arrays or Arrow arrays;
        ``partition`` sends them all to one partition (else each key's murmur2 partition, or one
        sticky partition for keyless records); ``headers`` is one list of ``(key, value)`` for
        every record.  confluent-kafka's form -- a list of dicts with ``value`` / ``key`` /
        ``partition`` / ``timestamp`` / ``callback`` -- is accepted as well, with its rules:
        a record that cannot be queued gets its error as ``_error`` in its dict (a full queue
        ``_QUEUE_FULL``), the others are queued, and nothing is raised for them."""
        if type(values) is list and values and type(values[0]) is dict:
            return self._produce_dicts(topic, values, partition, on_delivery)
        vals = as_record_list(values, "values")
        ks = None if keys is None else as_record_list(keys, "keys")
        if ks is not None and len(ks) != len(vals):
            raise ValueError(f"{len(ks)} keys for {len(vals)} values")
        if not self.serdes.active:  # every record checked before one is queued
            vals = _checked_bytes(vals, "values")
            ks = None if ks is None else _checked_bytes(ks, "keys")
        part = -1 if partition is None else partition
        for i, v in enumerate(vals):
            try:
                self.produce(topic, v, None if ks is None else ks[i], part, on_delivery, 0,
                             headers)
            except BufferError:
                if i == 0:
                    raise
                return i
        return len(vals)

    def _produce_dicts(self, topic: str, messages: list[dict[str, Any]], partition: Any,
                       on_delivery: Any) -> int:
        """confluent-kafka's ``produce_batch(topic, messages)``: each dict's record queued, or
        its error (``KafkaError``, "Message failed: ...") put in the dict as ``_error``; the
        number queued.  A wrong type raises ``TypeError`` as there."""
        queued = 0
        for m in messages:
            if type(m) is not dict:
                raise TypeError("Message must be a dictionary")
            part = m.get("partition", -1 if partition is None else partition)
            try:
                self.produce(topic, m.get("value"), m.get("key"), part,
                             m.get("callback", on_delivery), m.get("timestamp", 0))
            except BufferError:
                m["_error"] = _message_failed(KafkaError._QUEUE_FULL)
                continue
            except KafkaException as exc:
                m["_error"] = _message_failed(exc.args[0].code())
                continue
            m.pop("_error", None)
            queued += 1
        return queued

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, timeout: float | None = None) -> bool:
        raise NotImplementedError


class KafkaProducer(Producer):
    """The remote transport: confluent-kafka's producer, with Java's partitioner and idempotence
    defaults and shmq's Python-side keys (serializers, interceptors, a callable partitioner)."""

    transport = "kafka"

    def _setup(self, config: ClientConfig, data_dir: Any) -> None:
        self._common_setup(config)
        self._p = confluent_kafka.Producer(config.rd)
        self._counts: dict[str, int] = {}

    def produce(self, topic: Any, value: Any = None, key: Any = None, partition: int = -1,
                on_delivery: Any = None, timestamp: int = 0, headers: Any = None, *,
                callback: Any = None) -> None:
        if self.closed:
            raise RuntimeError("Producer has been closed")
        _check_topic(topic)
        partition, timestamp = _as_int(partition), _as_int(timestamp)
        if self.interceptors or self.serdes.active:
            topic, value, key, partition, timestamp, headers = self._prepare(
                topic, value, key, partition, timestamp, headers)
        if partition == -1 and self.custom_partitioner is not None:
            n = self._partition_count(topic)
            partition = self.custom_partitioner(as_bytes(key), list(range(n)), list(range(n)))
        cb = on_delivery if on_delivery is not None else callback
        cb = self._wrap_delivery(cb)
        kw: dict[str, Any] = {}
        if cb is not None:
            kw["on_delivery"] = cb
        if headers is not None:
            kw["headers"] = headers
        self._p.produce(topic, value, key, partition=partition, timestamp=timestamp, **kw)

    def _partition_count(self, topic: str) -> int:
        n = self._counts.get(topic)
        if n is None:
            md = self._p.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
            if md is None or md.error is not None or not md.partitions:
                raise kafka_exception(KafkaError._UNKNOWN_TOPIC)
            n = self._counts[topic] = len(md.partitions)
        return n

    def poll(self, timeout: float | None = None) -> int:
        if self.closed:
            raise RuntimeError("Producer has been closed")
        return self._p.poll(-1 if timeout is None else timeout)

    def flush(self, timeout: float | None = None) -> int:
        if self.closed:
            raise RuntimeError("Producer has been closed")
        return self._p.flush(-1 if timeout is None else timeout)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self._p.purge(in_queue=in_queue, in_flight=in_flight, blocking=blocking)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self._p.list_topics(topic, timeout)

    def __len__(self) -> int:
        return len(self._p)

    def __getattr__(self, name: str) -> Any:  # the rest of confluent-kafka's Producer
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._p, name)

    def close(self, timeout: float | None = None) -> bool:
        if self.closed:
            return True
        self.closed = True
        done = self._p.close(-1 if timeout is None else timeout)  # type: ignore[call-arg]
        self.interceptors.close()
        return done


class ShmProducer(Producer, ProducerCore):
    """The local transport (see the module docstring)."""

    transport = "shm"
    produce = ProducerCore.produce  # the compiled common case, not the base's declaration

    def _setup(self, config: ClientConfig, data_dir: Any) -> None:
        from shmq.ipc.client import REATTACH_TIMEOUT_S, LocalBroker

        self._common_setup(config)
        self._meta = confluent_kafka.Producer(config.rd)  # validates every key; metadata
        rd_partitioner = config.get_str("partitioner")
        if rd_partitioner not in PARTITIONERS:
            raise invalid("partitioner", rd_partitioner)
        self._partitioner = PARTITIONERS[rd_partitioner]
        self._linger = max(0.0, config.get_float("queue.buffering.max.ms")) / 1000.0
        # linger.ms as the user set it is kept to the letter; by default a new batch of a
        # partition with nothing in flight goes at once (see the module docstring)
        self._eager = not config.given("queue.buffering.max.ms")
        self._batch_records = max(1, config.get_int("batch.num.messages"))
        # a batch is one ring entry: at most half the submit ring (4 MiB entries of 8 MiB)
        self._batch_bytes = max(1, min(config.get_int("batch.size"), MAX_BATCH_BYTES))
        self._max_messages = config.get_int("queue.buffering.max.messages")
        self._max_bytes = config.get_int("queue.buffering.max.kbytes") * 1024
        self._message_max = config.get_int("message.max.bytes")
        self._acks = config.acks()
        self._default_cb = config.rd.get("on_delivery", config.rd.get("delivery.report.callback"))
        self._only_errors = config.get_bool("delivery.report.only.error")
        codec = config.get_str("compression.codec")
        if codec not in COMPRESSION:  # librdkafka accepted it: "inherit", say
            codec = "none"
        self._codec = COMPRESSION[codec]
        level = config.get_int("compression.level")
        self._codec_level = None if level < 0 else level
        idempotent = config.idempotence()
        in_flight = config.get_int("max.in.flight.requests.per.connection")
        message_timeout = config.get_int("message.timeout.ms") / 1000.0
        if message_timeout <= 0:  # librdkafka's 0: no limit
            message_timeout = float("inf")
        self._broker = LocalBroker(
            data_dir, idempotent=idempotent,
            max_in_flight=max(1, min(in_flight, 5)) if idempotent else max(1, in_flight),
            delivery_timeout=message_timeout,
            # a worker that does not come back fails its batches when their time is up
            # (_MSG_TIMED_OUT); past 30 s they fail NETWORK_EXCEPTION, a retriable error
            reattach_timeout=min(REATTACH_TIMEOUT_S, message_timeout + 0.1),
            retry_backoff=config.get_int("retry.backoff.ms") / 1000.0)
        self._plain = not (self.interceptors or self.serdes.active)
        self._counts: dict[str, int] = {}
        self._unknown_until: dict[str, float] = {}
        self._held: list[tuple] = []   # records to topics not known yet (deadline, args...)
        self._message_timeout = message_timeout
        # the open batches: ProducerCore._open_* (a list per topic, indexed by partition)
        # sealed batches the ring did not take yet (full ring, worker restarting), in order
        self._backlog: dict[tuple[str, int], deque[Batch]] = {}
        self._sticky: dict[str, tuple[int, int]] = {}  # partition, bytes left
        self._reports: deque[tuple[Any, Any]] = deque()
        self._queued = 0          # records not yet reported (len())
        self._queued_bytes = 0
        self._reported = 0        # records of batches without callbacks answered since poll
        self._spares: list[bytearray] = []  # sent batches' buffers, for the next batches
        self._last_send: dict[tuple[str, int], float] = {}  # when each partition's last batch went
        # The two locks (see "Never blocking" in the module docstring): ``_lock`` (the C lock
        # ProducerCore.produce takes) guards the open batches, the backlogs, the counts and the
        # reports, and is never held while waiting for anything; ``_io`` guards the LocalBroker
        # and is held across its waits.  Taken in that order only by try-acquiring ``_io``.
        self._io = threading.RLock()
        self._unsent_check = 0.0
        self._wake = threading.Event()
        self._look_at = INF  # when the linger thread looks next on its own (INF: looking)
        self._stop = False
        self._detach_at_exit = False
        self._detached = False
        self._thread = threading.Thread(target=self._linger_loop, name="shmq-producer-linger",
                                        daemon=True)
        self._thread.start()

    # -- metadata ---------------------------------------------------------------------------

    def _partition_count(self, topic: str) -> int:
        n = self._counts.get(topic)
        if n is not None:
            return n
        broker = self._broker
        prefix = topic + "/"
        n = sum(1 for k in broker._info.get("slots", {}) if k.startswith(prefix))
        if not n:  # unknown here: ask (auto-creates when the broker allows it), then reload
            if self._unknown_until.get(topic, 0.0) > time.monotonic():
                return 0
            md = self._meta.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
            if md is None or md.error is not None or not md.partitions:
                self._unknown_until[topic] = time.monotonic() + UNKNOWN_RETRY_S
                return 0
            n = len(md.partitions)
            deadline = time.monotonic() + METADATA_TIMEOUT_S
            while broker.slot_of(topic, n - 1) is None:  # broker.json catches up
                if time.monotonic() > deadline:
                    raise kafka_exception(KafkaError._UNKNOWN_TOPIC,
                                          f"{topic} is not in the broker's slot directory")
                time.sleep(0.01)
        self._counts[topic] = n
        return n

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """confluent-kafka's ``ClusterMetadata`` (from the broker, over the Kafka protocol)."""
        md = self._meta.list_topics(topic, timeout)
        for name, t in md.topics.items():
            if t.error is None and t.partitions:
                self._counts[name] = max(self._counts.get(name, 0), len(t.partitions))
        return md

    # -- produce ----------------------------------------------------------------------------

    def _produce_slow(self, topic: Any, value: Any = None, key: Any = None,
                      partition: int = -1, on_delivery: Any = None, timestamp: int = 0,
                      headers: Any = None, callback: Any = None) -> None:
        """``produce`` in full (``ProducerCore.produce`` takes the common case in C)."""
        if self.closed:
            raise RuntimeError("Producer has been closed")
        if type(topic) is not str:
            _check_topic(topic)
        if type(partition) is not int:
            partition = _as_int(partition)
        if type(timestamp) is not int:
            timestamp = _as_int(timestamp)
        if not self._plain:
            topic, value, key, partition, timestamp, headers = self._prepare(
                topic, value, key, partition, timestamp, headers)
        if type(value) is not bytes and value is not None:
            value = as_bytes(value)
        if type(key) is not bytes and key is not None:
            key = as_bytes(key)
        size = RECORD_MAX_OVERHEAD + (0 if value is None else len(value)) + (
            0 if key is None else len(key))
        if headers is not None:
            headers = [(k.decode("utf-8", "replace"), v) for k, v in normalize_headers(headers)]
            size += sum(10 + len(k) + (0 if v is None else len(v)) for k, v in headers) \
                if headers else 0
            if not headers:
                headers = None
        if size > self._message_max:
            raise kafka_exception(KafkaError.MSG_SIZE_TOO_LARGE,
                                  "Unable to produce message: Broker: Message size too large")
        n = self._counts.get(topic)
        if n is None:
            n = self._partition_count(topic)
            if n == 0:  # unknown: librdkafka keeps the record until message.timeout.ms
                cb = on_delivery if on_delivery is not None else callback
                self._hold_unknown(topic, partition, key, value, timestamp, headers, size,
                                   self._wrap_delivery(cb if cb is not None else self._default_cb))
                return
        if partition == -1:
            if self.custom_partitioner is not None:
                partition = self.custom_partitioner(key, list(range(n)), list(range(n)))
                if type(partition) is not int or not 0 <= partition < n:
                    raise kafka_exception(KafkaError._UNKNOWN_PARTITION,
                                          f"partitioner returned {partition!r}")
            elif key is not None and self._partitioner == 0:  # murmur2_random, the default
                partition = _fast.murmur2_partition(key, n)
            else:
                partition = partition_for(self._partitioner, key, n)
                if partition < 0:
                    partition = self._sticky_partition(topic, n, size)
        elif not 0 <= partition < n:
            raise kafka_exception(KafkaError._UNKNOWN_PARTITION,
                                  "Unable to produce message: Local: Unknown partition")
        if self._queued >= self._max_messages or self._queued_bytes + size > self._max_bytes:
            raise BufferError("Local: Queue full")
        if timestamp == 0:
            timestamp = time.time_ns() // 1_000_000
        cb = on_delivery if on_delivery is not None else callback
        if cb is None:
            cb = self._default_cb
        if not self._plain and self.interceptors:
            cb = self._wrap_delivery(cb)
        with self._lock:
            self._append((topic, partition), key, value, timestamp, size, cb, headers)

    def _append(self, k: tuple[str, int], key: Any, value: Any, timestamp: int, size: int,
                cb: Any, headers: Any = None) -> None:
        """The record into its partition's open batch, which may go at once (lock held)."""
        topic, partition = k
        got = self._open_get(k)
        fresh = got is None
        if got is None:
            batch = Batch(time.monotonic(), self._take_spare())
            self._open_set(k, batch)
        elif (got.count() >= self._batch_records
              or got.size() + size - BATCH_HEADER_SIZE > self._batch_bytes):
            self._send(k, got)
            batch = Batch(time.monotonic(), self._take_spare())
            self._open_set(k, batch)
            fresh = True
        else:
            batch = got
        batch.append(key, value, timestamp, headers, cb)
        batch.nbytes += size
        self._queued += 1
        self._queued_bytes += size
        if batch.count() >= self._batch_records or batch.size() >= self._batch_bytes:
            self._send(k, batch)
        elif fresh and self._eager:
            if (time.monotonic() - self._last_send.get(k, 0.0) >= EAGER_GAP_S
                    and k not in self._backlog and self._io.acquire(blocking=False)):
                try:
                    if not self._broker.can_send(topic, partition):
                        self._pump(0)  # answers make room in flight (else poll reads them)
                    if self._broker.can_send(topic, partition):
                        self._send(k, batch)  # room in flight: a lone record does not linger
                        return
                finally:
                    self._io.release()
            if self._look_at > self._last_send.get(k, 0.0) + EAGER_GAP_S:
                self._wake.set()  # else the linger thread looks in time without a wake-up
        elif fresh and self._look_at > batch.opened + self._linger:
            self._wake.set()

    def _hold_unknown(self, topic: str, partition: int, key: Any, value: Any, timestamp: int,
                      headers: Any, size: int, cb: Any) -> None:
        """A record to a topic the broker does not know: kept (counted by ``len``) until the
        topic appears or ``message.timeout.ms`` passes, then reported ``_MSG_TIMED_OUT``, as
        librdkafka does."""
        if self._queued >= self._max_messages or self._queued_bytes + size > self._max_bytes:
            raise BufferError("Local: Queue full")
        with self._lock:
            self._held.append((time.monotonic() + self._message_timeout, topic, partition, key,
                               value, timestamp, headers, size, cb))
            self._queued += 1
            self._queued_bytes += size

    def _retry_held(self) -> None:
        if not self._held:
            return
        held, self._held = self._held, []
        now = time.monotonic()
        for item in held:
            deadline, topic, partition, key, value, ts, hdrs, size, cb = item
            if self._partition_count(topic) or self._counts.get(topic):
                with self._lock:
                    self._queued -= 1
                    self._queued_bytes -= size
                self.produce(topic, value, key, partition, cb, ts, hdrs)
            elif now >= deadline:
                with self._lock:
                    self._queued_bytes -= size
                    self._reports.append((cb, Message(topic, partition, -1001, key, value, None,
                                                      KafkaError(ERR_MSG_TIMED_OUT),
                                                      (TIMESTAMP_CREATE_TIME, ts))))
            else:
                self._held.append(item)

    def _sticky_partition(self, topic: str, n: int, size: int) -> int:
        """Keyless records stick to one partition until ``batch.size`` bytes went to it, then
        move to another (Java's ``BuiltInPartitioner``, KIP-794; librdkafka switches on a timer,
        ``sticky.partitioning.linger.ms``, which a busy machine makes erratic)."""
        import random

        cur = self._sticky.get(topic)
        if cur is not None and cur[1] > 0 and cur[0] < n:
            self._sticky[topic] = (cur[0], cur[1] - size)
            return cur[0]
        p = random.randrange(n) if cur is None or n == 1 else \
            (cur[0] + 1 + random.randrange(n - 1)) % n
        self._sticky[topic] = (p, self._batch_bytes - size)
        return p

    def _send(self, k: tuple[str, int], batch: Batch) -> None:
        """Seal the open batch of ``k`` and hand it to the ring (lock held), if the ring takes
        it now without waiting: otherwise -- the broker busy on another thread, five batches
        unanswered, a full ring, the worker restarting -- it waits in the partition's backlog,
        in order, for the background thread (or ``poll`` / ``flush``) to hand it over, or for
        ``message.timeout.ms`` to fail it (``_expire_unsent``).  Never waits, never raises for
        a worker's death."""
        if self._open_get(k) is batch:
            self._open_pop(k)
        queue = self._backlog.get(k)
        if queue is None:
            queue = self._backlog[k] = deque()
        queue.append(batch)  # after the earlier batches that wait, if any
        if self._io.acquire(blocking=False):
            try:
                if len(queue) > 1 or not self._broker.can_send(*k):
                    self._pump(0)  # answers make room in flight
                self._drain_backlog(k)
            finally:
                self._io.release()
        if k in self._backlog:
            self._wake.set()

    def _drain_backlog(self, k: tuple[str, int]) -> None:
        """Hand over the partition's waiting batches, in order, while the ring takes them
        without waiting (both locks held)."""
        queue = self._backlog[k]
        broker = self._broker
        while queue and broker.can_send(*k) and self._hand_over(k, queue[0]):
            queue.popleft()
        if not queue:
            del self._backlog[k]

    def _hand_over(self, k: tuple[str, int], batch: Batch) -> bool:
        """The batch into the ring (its encoded bytes copied; compressed first with
        ``compression.type``); False when it could not go now and is to be kept."""
        from shmq.ipc.client import NotLocalError, SessionLostError, _restamp, compress_batch
        from shmq.ipc.session import AttachError

        topic, partition = k
        reports = batch.reports()
        nbytes, count = batch.nbytes, batch.count()

        def answered(result: Any) -> None:
            self._answered(result, count, reports, nbytes)

        write: Callable[..., int] = batch.write
        if self._codec:
            packed = compress_batch(batch.encoded(), self._codec, self._codec_level)

            def write_packed(view: Any, at: int, size: int, pid: int, epoch: int,
                             seq: int) -> int:
                if size >= 0:
                    _restamp(packed, pid, epoch, seq)
                    view[at : at + len(packed)] = packed
                return len(packed)

            write = write_packed

        try:
            sent = self._broker.try_send_with(topic, partition, count, write, acks=self._acks,
                                              on_delivery=answered)
        except (SessionLostError, AttachError, NotLocalError, OSError):
            return False  # the worker is away: it goes later
        except Exception as exc:  # noqa: BLE001 - never sendable: every record reported
            self._fail_unsent(k, batch, KafkaError(KafkaError._FAIL, f"not sent: {exc}"))
            return True
        if sent is None:
            return False  # not ready, no room in flight or in the ring: it goes later
        self._last_send[k] = time.monotonic()
        if len(self._spares) < SPARES and batch.size() <= SPARE_MAX:
            spare = batch.release()  # its bytes are in the ring: a next batch's buffer
            if spare is not None:
                self._spares.append(spare)
        return True

    def _take_spare(self) -> bytearray | None:
        try:
            return self._spares.pop()  # the last one kept: its pages are the warmest
        except IndexError:
            return None

    def _pump(self, timeout: float = 0.0) -> int:
        """The broker's answers (``_io`` held), waiting up to ``timeout`` for one from a live
        worker, never for a worker to come back (the background thread reattaches).  A worker
        that did not come back has had its batches answered with errors already: that is
        reported, not raised."""
        from shmq.ipc.client import SessionLostError

        try:
            return self._broker.poll(timeout, reattach=False)
        except SessionLostError:
            return 1

    def _service(self, timeout: float) -> int:
        """(``_io`` held) the answers, then the waiting batches."""
        handled = self._pump(timeout)
        with self._lock:
            self._send_waiting()
        return handled

    def _prepare_waiting(self) -> None:
        """The background thread's part that may block (``_io`` held, ``_lock`` not): attach,
        reattach or take a producer id for every partition whose batches wait for it."""
        from shmq.ipc.client import NotLocalError, SessionLostError
        from shmq.ipc.session import AttachError

        broker = self._broker
        with self._lock:
            keys = list(self._backlog)
        for k in keys + broker.resends_waiting():
            try:
                if not broker.ready(*k):
                    broker.prepare(*k)
            except (OSError, AttachError, SessionLostError, NotLocalError, KafkaApiError):
                pass  # not back yet (or given up: its batches were answered); again later

    def _unsent(self) -> list[tuple[tuple[str, int], Batch]]:
        out = [(k, b) for k, q in self._backlog.items() for b in q]
        return out + self._open_items()

    def _fail_unsent(self, k: tuple[str, int], batch: Batch, err: KafkaError) -> None:
        """Report every record of a batch that never went (lock held)."""
        topic, partition = k
        reports = batch.reports()
        out = self._reports
        for i in range(batch.count()):
            r = reports[i] if reports is not None else None
            if r is None:  # no callback: only counted down by poll
                out.append((None, 0))
                continue
            cb, key, value, ts, hdrs = r
            out.append((cb, Message(topic, partition, -1001, key, value, hdrs, err,
                                    (TIMESTAMP_CREATE_TIME, ts))))
        self._queued_bytes -= batch.nbytes

    def _expire_unsent(self) -> None:
        """Batches that could not go within ``message.timeout.ms`` of their first record are
        reported ``_MSG_TIMED_OUT`` (lock held)."""
        if not (self._backlog or self._n_open):
            return
        limit = time.monotonic() - self._message_timeout
        for k, batch in self._unsent():
            if batch.opened <= limit:
                if self._open_get(k) is batch:
                    self._open_pop(k)
                else:
                    queue = self._backlog[k]
                    queue.remove(batch)
                    if not queue:
                        del self._backlog[k]
                self._fail_unsent(k, batch, KafkaError(ERR_MSG_TIMED_OUT))

    def _send_waiting(self) -> None:
        """The backlogs into the rings, as far as they take them now; every 10 ms, the unsent
        batches past ``message.timeout.ms`` reported (both locks held)."""
        for k in list(self._backlog):
            self._drain_backlog(k)
        now = time.monotonic()
        if now >= self._unsent_check:
            self._unsent_check = now + UNSENT_CHECK_S
            self._expire_unsent()

    def _answered(self, result: Any, count: int, reports: list | None, nbytes: int) -> None:
        with self._lock:  # the broker's thread (_io) answers; produce may hold _lock
            self._answered_locked(result, count, reports, nbytes)

    def _answered_locked(self, result: Any, count: int, reports: list | None,
                         nbytes: int) -> None:
        code = result.error_code
        if reports is None:
            self._queued -= count
            self._queued_bytes -= nbytes
            self._reported += count
            return
        err = None if not code else KafkaError(code, result.error_message or None) \
            if result.error_message else KafkaError(code)
        if result.log_append_time >= 0:
            stamp_type, fixed = TIMESTAMP_LOG_APPEND_TIME, result.log_append_time
        else:
            stamp_type, fixed = TIMESTAMP_CREATE_TIME, -1
        base = result.base_offset
        topic, partition = result.topic, result.partition
        out = self._reports
        for i, r in enumerate(reports):
            if r is None:  # a record without a callback: only counted down by poll
                out.append((None, 0))
                continue
            cb, key, value, ts, hdrs = r
            if err is None and self._only_errors:
                out.append((None, 0))
                continue
            msg = Message(topic, partition, base + i if base >= 0 and not code else -1001,
                          key, value, None, err,  # librdkafka's reports carry no headers
                          (stamp_type, fixed if fixed >= 0 else ts))
            out.append((cb, msg))
        self._queued_bytes -= nbytes
        # the records without reports are counted down when poll() reaches them (in order)

    def produce_batch(self, topic: str, values: Any = None, keys: Any = None,
                      partition: int | None = None, headers: Any = None,
                      on_delivery: Any = None) -> int:
        """See ``Producer.produce_batch``.  Lists, numpy and Arrow arrays become one Arrow binary
        column each, checked whole before anything is queued (a wrong type raises, nothing is
        half-sent), and each batch is encoded from the columns in one Cython pass
        (``_fast.encode_arrow_batch_into``), with no object per record."""
        if (self.closed or (type(values) is list and values and type(values[0]) is dict)
                or self.interceptors or self.serdes.active or on_delivery is not None
                or self._default_cb is not None or headers is not None):
            return super().produce_batch(topic, values, keys, partition, headers, on_delivery)
        import numpy as np

        _check_topic(topic)
        try:
            hint = len(values)
        except TypeError:
            hint = 0
        if hint and (self._queued >= self._max_messages
                     or self._queued_bytes + RECORD_MAX_OVERHEAD > self._max_bytes):
            # not one record fits whatever the values hold: refused before they are looked at
            # (a caller retrying after each BufferError would have them checked every time)
            raise BufferError("Local: Queue full")
        if type(values) is list and keys is None:
            # the prefix that fits by count (the whole list checked: the rest too), in one
            # pass over the list and without a slice of it
            room = self._max_messages - self._queued
            total, longest_value = _fast.bytes_stats(values, room)
            if total >= 0:  # bytes and None only: encoded from the list itself
                count = min(len(values), room)
                if self._queued_bytes + RECORD_MAX_OVERHEAD * count + total <= self._max_bytes:
                    return self._produce_list(topic, values, count, partition, total,
                                              longest_value)
                # else queue.buffering.max.kbytes cuts it shorter: found below, record by record
        vcol = binary_column(values, "values")
        kcol = None if keys is None else binary_column(keys, "keys")
        count = len(vcol)
        if kcol is not None and len(kcol) != count:
            raise ValueError(f"{len(kcol)} keys for {count} values")
        if not count:
            return 0
        explicit = partition is not None and partition != -1
        if kcol is not None and not explicit and (self.custom_partitioner is not None
                                                  or self._partitioner != 0):
            # another partitioner than Java's: record by record (every value is checked)
            return super().produce_batch(topic, vcol.to_pylist(), kcol.to_pylist(), partition,
                                         headers, on_delivery)
        voff, vdata, vvalid, vlen = _column_buffers(vcol)
        sizes = RECORD_MAX_OVERHEAD + np.maximum(vlen, 0)
        kbufs = None
        if kcol is not None:
            kbufs = _column_buffers(kcol)
            sizes += np.maximum(kbufs[3], 0)
        longest = int(sizes.max())
        n = self._admit(topic, longest)
        fit = self._fitting(sizes)
        if fit < count:  # the prefix the queue has room for (the whole call was checked)
            count = fit
            vcol = vcol.slice(0, fit)
            voff, vdata, vvalid, vlen = _column_buffers(vcol)
            if kcol is not None:
                kcol = kcol.slice(0, fit)
                kbufs = _column_buffers(kcol)
            sizes = sizes[:fit]
        nbytes = int(sizes.sum())
        rows = np.arange(count, dtype=np.int64)
        if explicit:
            part = _as_int(partition)
            if not 0 <= part < n:
                raise kafka_exception(KafkaError._UNKNOWN_PARTITION,
                                      "Unable to produce message: Local: Unknown partition")
            plan = [(part, rows)]
        elif kbufs is not None:  # Java's murmur2 of each key; keyless ones stick together
            parts = np.empty(count, np.int32)
            _fast.murmur2_partitions(kbufs[0], kbufs[1], kbufs[2], n, parts)
            if kbufs[2] is not None and (parts < 0).any():
                parts[parts < 0] = self._sticky_partition(topic, n, nbytes // count)
            order = np.argsort(parts, kind="stable")
            cuts = np.flatnonzero(np.diff(parts[order])) + 1
            plan = [(int(parts[g[0]]), g) for g in np.split(order, cuts)]
        else:
            plan = [(self._sticky_partition(topic, n, nbytes), rows)]
        now = time.time_ns() // 1_000_000
        # a batch holds at most batch.num.messages records and batch.size bytes (the broker
        # refuses one over message.max.bytes: MESSAGE_TOO_LARGE for every record of it)
        step = batch_rows(self._batch_bytes, self._batch_records,
                          int(kbufs[3].max()) if kbufs is not None else -1, int(vlen.max()))
        k_off, k_data, k_valid = kbufs[:3] if kbufs is not None else (None, None, None)
        cols = (k_off, k_data, k_valid, voff, vdata, vvalid)
        encode = _fast.encode_arrow_batch_into
        # Arrow arrays are encoded when their batch goes (ArrowBatch); a numpy array of bytes
        # is a view of the caller's memory (binary_column), which may change once we return:
        # encoded now
        lazy = not (type(values).__module__.startswith("numpy")
                    or type(keys).__module__.startswith("numpy"))
        with self._lock:
            self._queued += count
            self._queued_bytes += nbytes
            counted = 0
            for p, group in plan:
                k = (topic, p)
                open_batch = self._open_get(k)
                if open_batch is not None:  # earlier records go first
                    self._send(k, open_batch)
                for at in range(0, len(group), step):
                    chunk = np.ascontiguousarray(group[at : at + step], dtype=np.int64)
                    size = -encode(_EMPTY, 0, 0, chunk, *cols, now)
                    batch: Any
                    if lazy:
                        batch = ArrowBatch(time.monotonic(), chunk, cols, size, now)
                    else:
                        data = self._take_spare()
                        if data is None or len(data) < size:
                            data = bytearray(size)
                        encode(data, 0, size, chunk, *cols, now)
                        batch = Batch(time.monotonic(), data)
                        batch.load(data, size, len(chunk), now, now)
                    # the queued bytes, shared out so that they add up to nbytes exactly
                    batch.nbytes = nbytes * (counted + len(chunk)) // count - \
                        nbytes * counted // count
                    counted += len(chunk)
                    self._send(k, batch)
        return count

    def _admit(self, topic: str, longest: int) -> int:
        """The checks of a ``produce_batch`` before anything is queued (its largest record, the
        topic); the topic's partition count."""
        if longest > self._message_max:
            raise kafka_exception(KafkaError.MSG_SIZE_TOO_LARGE,
                                  "Unable to produce message: Broker: Message size too large")
        n = self._counts.get(topic) or self._partition_count(topic)
        if not n:
            raise kafka_exception(KafkaError._UNKNOWN_TOPIC,
                                  f"Unable to produce messages: {topic} is unknown")
        return n

    def _fitting(self, sizes: Any) -> int:
        """How many of the records (their queue sizes, in order) fit in the queue now, from the
        first: ``BufferError`` when not one does."""
        import numpy as np

        fit = min(len(sizes), self._max_messages - self._queued)
        room = self._max_bytes - self._queued_bytes
        if fit > 0 and int(sizes[:fit].sum()) > room:
            fit = int(np.searchsorted(np.cumsum(sizes[:fit]), room, side="right"))
        if fit <= 0:
            raise BufferError("Local: Queue full")
        return fit

    def _produce_list(self, topic: str, values: list[Any], count: int, partition: Any,
                      total: int, longest_value: int) -> int:
        """``produce_batch`` of ``values[:count]``, a keyless list of bytes or None (``total``
        and ``longest_value`` their bytes): each batch encoded from the list in one Cython pass
        (``Batch.extend``), no Arrow column between."""
        if not count:
            return 0
        longest = RECORD_MAX_OVERHEAD + longest_value
        nbytes = RECORD_MAX_OVERHEAD * count + total
        n = self._admit(topic, longest)
        if partition is not None and partition != -1:
            part = _as_int(partition)
            if not 0 <= part < n:
                raise kafka_exception(KafkaError._UNKNOWN_PARTITION,
                                      "Unable to produce message: Local: Unknown partition")
        else:
            part = self._sticky_partition(topic, n, nbytes)
        now = time.time_ns() // 1_000_000
        longest = longest_value if total else -1
        step = batch_rows(self._batch_bytes, self._batch_records, -1, longest)
        k = (topic, part)
        with self._lock:
            self._queued += count
            self._queued_bytes += nbytes
            start = 0
            open_batch = self._open_get(k)
            if open_batch is not None:  # earlier records go first: into it, or it goes first
                start = min(count, self._room_in(open_batch, now, longest))
                if start:
                    open_batch.extend(values, 0, start, now)
                    open_batch.nbytes += nbytes * start // count
                if start == count and self._room_in(open_batch, now, longest):
                    return count  # the whole call went into it, which may take more still
                self._send(k, open_batch)
            for at in range(start, count, step):
                stop = min(count, at + step)
                batch = Batch(time.monotonic(), self._take_spare())
                batch.extend(values, at, stop, now)
                # the queued bytes, shared out so that they add up to nbytes exactly
                batch.nbytes = nbytes * stop // count - nbytes * at // count
                if stop == count and stop - at < step and k in self._backlog:
                    # a short last batch behind batches that wait (five in flight) would not
                    # go now anyway: it stays open, and the next call (or produce) fills it up
                    # before it goes, instead of taking one of the five places in flight with
                    # a few records (the rest of each call of 100,000: 8 % of the batches)
                    self._open_set(k, batch)
                    self._wake.set()  # the linger thread sends it once it may go
                    continue
                self._send(k, batch)
        return count

    def _room_in(self, batch: Any, now: int, longest_value: int) -> int:
        """How many more keyless records of at most ``longest_value`` bytes, stamped ``now``,
        surely fit the open ``batch`` (``batch.num.messages``, ``batch.size``); 0 for a batch
        that cannot take records from a list (delivery callbacks, an Arrow batch)."""
        if type(batch) is not Batch or batch.cbs is not None:
            return 0
        n = batch.count()
        rows = self._batch_records - n
        if rows <= 0:
            return 0
        delta = _varint_size(now - batch.base_ts) if n else 1
        body = (1 + delta + _varint_size(self._batch_records - 1) + 1
                + _varint_size(longest_value) + max(longest_value, 0) + 1)
        return max(0, min(rows, (self._batch_bytes - batch.size()) // (_varint_size(body) + body)))

    # -- reports ----------------------------------------------------------------------------

    def _serve(self) -> int:
        """Run the waiting delivery reports; how many records were reported (with or without
        a callback), those of batches without callbacks answered since the last call too."""
        served = 0
        while True:
            with self._lock:
                if not self._reports:
                    served += self._reported
                    self._reported = 0
                    return served
                cb, msg = self._reports.popleft()
                self._queued -= 1
            if cb is not None:
                cb(msg.error(), msg)
            served += 1

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery reports; waits up to ``timeout`` seconds for one (None or negative:
        without a limit).  Returns how many records were reported, callback or not: as soon
        as one is, as confluent-kafka's ``poll`` returns once it served a delivery event."""
        if self.closed:
            raise RuntimeError("Producer has been closed")
        t = -1.0 if timeout is None else float(timeout)
        deadline = time.monotonic() + t if t >= 0 else float("inf")
        while True:
            self._retry_held()
            if self._queued and self._io.acquire(blocking=False):
                try:
                    self._pump(0)
                    with self._lock:
                        if self._n_open or self._backlog:
                            # what may go now goes from here, not only from the linger thread:
                            # that thread needs the GIL, which a busy caller hands over only
                            # every sys.getswitchinterval() (5 ms)
                            self._send_waiting()
                            self._send_ready()
                finally:
                    self._io.release()
            served = self._serve()
            if served:
                return served
            left = deadline - time.monotonic()
            if left <= 0:
                return 0
            self._wait_answers(min(left, 0.005) if self._queued else min(left, 0.05))

    def _wait_answers(self, timeout: float) -> None:
        """Up to ``timeout`` for answers from a live worker (read and acted on), else asleep:
        never for a worker to come back, nor for ``_io`` longer than ``timeout``."""
        start = time.monotonic()
        if self._queued and self._io.acquire(timeout=timeout):
            try:
                if self._broker.flush(0) and self._service(timeout):
                    return
            finally:
                self._io.release()
        rest = timeout - (time.monotonic() - start)
        if rest > 0:
            time.sleep(min(rest, 0.001) if self._queued else rest)

    def flush(self, timeout: float | None = None) -> int:
        """Send every open batch and wait for every report; returns how many records are still
        unreported (confluent-kafka's ``flush``)."""
        if self.closed:
            raise RuntimeError("Producer has been closed")
        t = -1.0 if timeout is None else float(timeout)
        deadline = time.monotonic() + t if t >= 0 else float("inf")
        with self._lock:
            for k, batch in self._open_items():
                self._send(k, batch)
        while True:
            self._retry_held()
            if self._io.acquire(blocking=False):
                try:
                    self._service(0)  # with the batches a full ring or a worker held back
                finally:
                    self._io.release()
            self._serve()
            if not self._queued:
                return 0
            left = deadline - time.monotonic()
            if left <= 0:
                return self._queued
            self._wait_answers(min(left, 0.005))

    def __len__(self) -> int:
        return self._queued

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Records not yet sent are reported with ``_PURGE_QUEUE`` on the next ``poll``.
        Batches already in the ring cannot be taken back: they are reported as the broker
        answers them (librdkafka reports them ``_PURGE_INFLIGHT`` though they may be written)."""
        if not in_queue:
            return
        with self._lock:
            err = KafkaError(ERR_PURGE_QUEUE)
            for k, batch in self._unsent():
                self._fail_unsent(k, batch, err)
            self._open_clear()
            self._backlog.clear()

    # -- linger -----------------------------------------------------------------------------

    def _linger_loop(self) -> None:
        """The background thread: reattaches to restarted workers, attaches and takes the
        producer id, reads answers, hands over the batches that wait, and sends open batches
        whose linger passed (by default, any as soon as its partition may send: fewer than
        max.in.flight unanswered) while the caller is busy elsewhere.  Everything that may
        block is done here, holding ``_io`` but not ``_lock``: ``produce`` goes on meanwhile."""
        from shmq.ipc import reader, sched

        sched.request_slice_once(reader.WAIT_SLICE_US)  # woken by a timer: runs when due (i14k)
        # its timed waits end when due, not up to the default 50 us timer slack later: the
        # batches it sends waited that long in the open batch (this thread's, not the caller's)
        prctl(PR_SET_TIMERSLACK, LINGER_TIMER_SLACK_NS)
        try:
            self._run_linger()
        finally:
            if self._detach_at_exit:  # close() could not wait for this thread
                with self._io:
                    self._detach(self._queued)

    def _run_linger(self) -> None:
        due: float | None = None
        while not self._stop:
            now = time.monotonic()
            if due is None or due > now:
                # a batch opened meanwhile wakes the thread only if it is due before it looks
                look = now + 1.0 if due is None else min(max(due, now + 0.0001), now + 1.0)
                self._look_at = look
                self._wake.wait(look - now)
            self._look_at = INF  # looking (under _lock, below): a batch opened after wakes it
            self._wake.clear()  # before looking: a batch opened from now on sets it again
            if self._stop:
                break
            with self._io:
                revive = self._broker.revive()
                self._prepare_waiting()
                self._pump(0)
                with self._lock:
                    self._send_waiting()
                    due = self._send_ready()
                if self._broker.resends_waiting():  # failed batches, sent again by _pump
                    due = min(due or float("inf"), time.monotonic() + EAGER_CHECK_S)
            if revive is not None:
                due = revive if due is None else min(due, revive)

    def _send_ready(self) -> float | None:
        """Send the open batches that may go now (lock held): their linger passed, or by
        default their partition has room in flight and its last batch went EAGER_GAP_S ago.
        Returns when to look again (None: nothing waits)."""
        now = time.monotonic()
        due = now + EAGER_CHECK_S if self._backlog else None
        for k, batch in self._open_items():
            if self._eager:
                gap = self._last_send.get(k, 0.0) + EAGER_GAP_S
                if now >= gap and self._broker.can_send(*k):
                    self._send(k, batch)
                    if k not in self._backlog:
                        # the next batch of a busy partition may go EAGER_GAP_S from now: the
                        # thread looks then, so the record that opens it needs no wake-up
                        at = self._last_send.get(k, now) + EAGER_GAP_S
                        due = at if due is None else min(due, at)
                    continue
                at = gap if now < gap else now + EAGER_CHECK_S
            elif now - batch.opened >= self._linger and self._broker.can_send(*k):
                self._send(k, batch)
                continue
            else:
                at = batch.opened + self._linger
            due = at if due is None else min(due, at)
        return due

    def close(self, timeout: float | None = None) -> bool:
        """Flush (up to ``timeout``), stop the linger thread and detach; True when every
        record was reported (confluent-kafka's ``close``)."""
        if self.closed:
            return True
        t = -1.0 if timeout is None else float(timeout)
        deadline = time.monotonic() + t if t >= 0 else float("inf")
        left = self.flush(timeout)
        self._stop = True
        self._detach_at_exit = True  # the thread detaches if this call cannot (below)
        self._wake.set()
        # the background thread may be inside a call to a worker that does not answer (an
        # attach to a stopped worker waits up to 2 s, InitProducerId longer): waited for only
        # as long as the timeout allows, as the rest of close is; it then detaches on its way
        # out (``_linger_loop``)
        self._thread.join(None if deadline == float("inf")
                          else max(0.0, deadline - time.monotonic()))
        self.closed = True
        if self._io.acquire(timeout=-1 if deadline == float("inf")
                            else max(0.0, deadline - time.monotonic())):
            try:
                self._detach(left)
            finally:
                self._io.release()
        self._meta.close(0)  # type: ignore[call-arg]
        self.interceptors.close()
        return not left

    def _detach(self, left: int) -> None:
        """Close the ``LocalBroker`` once, from ``close`` or the thread's exit (``_io`` held)."""
        from shmq.ipc.client import SessionLostError

        if self._detached:
            return
        self._detached = True
        try:
            self._broker.close(timeout=0 if left else 5.0)
        except SessionLostError:
            pass  # its batches were answered with errors; the rest is released

    def __del__(self) -> None:
        wake = getattr(self, "_wake", None)
        if wake is not None and not self.closed:
            self._stop = True
            wake.set()
