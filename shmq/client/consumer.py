"""``shmq.Consumer``: confluent-kafka's ``Consumer`` API; records of a local broker are read from
its mapped log, everything else is confluent-kafka's.

    c = shmq.Consumer({"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"})
    c.subscribe(["events"])
    msg = c.poll(1.0)

Theory of operation (shared memory)
-----------------------------------
* **Groups are librdkafka's.**  A confluent-kafka consumer made with the user's configuration
  joins the group through the broker's group coordinator, heartbeats, runs the assignor
  (``partition.assignment.strategy``, eager or cooperative) and commits offsets.  Its rebalance
  callbacks are wrapped: the user's ``on_assign`` / ``on_revoke`` / ``on_lost`` get this
  consumer, and every partition it is given is assigned **paused**, so librdkafka fetches
  nothing: the records come from the mapped log.
* **Positions are ours.**  A partition's position starts at the offset the assignment names,
  else its committed offset, else ``auto.offset.reset`` against the state table's log start /
  high watermark.  ``poll`` hands out messages decoded in bulk (``shmq.ipc.reader``: whole
  batches, never past the high watermark, or the last stable offset for ``read_committed``)
  from a buffer; the slow path runs when the buffer is empty and at least every
  ``SERVICE_S``, and serves librdkafka's queue (rebalances, errors, the liveness
  ``max.poll.interval.ms`` expects).
* **Commits.**  With ``enable.auto.offset.store`` (the default) the positions of the messages
  handed out are stored at the next slow path -- Kafka's commit-on-the-next-poll: a record is
  committed only after a later ``poll`` -- and librdkafka's auto-commit commits them every
  ``auto.commit.interval.ms``, and synchronously when partitions are revoked or the consumer
  closes.  ``commit(message=/offsets=)`` goes to librdkafka as it is.
"""

from __future__ import annotations

import time
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, TopicPartition

from shmq._fast import ConsumerCore, decode_sections
from shmq._fast._client_reference import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
from shmq.client._common import Interceptors, Message, Serdes, kafka_exception
from shmq.client.config import RESET, ClientConfig, invalid, parse_bool
from shmq.client.transport import local_data_dir
from shmq.protocol.compression import DEFAULT_MAX_DECOMPRESSED_BYTES as MAX_DECOMPRESSED
from shmq.protocol.records import _records_sections

OFFSET_BEGINNING, OFFSET_END, OFFSET_STORED, OFFSET_INVALID = -2, -1, -1000, -1001
SERVICE_S = 0.1          # the slow path runs at least this often while messages are buffered
WAIT_SLICE_S = 0.1       # the longest futex wait before librdkafka's queue is served again
MAX_RECORDS_PER_READ = 10_000


class Consumer:
    """A Kafka consumer with confluent-kafka's API (see the module docstring).  The object is a
    ``ShmConsumer`` (broker on this host) or a ``KafkaConsumer``."""

    transport = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Consumer:
        if cls is not Consumer:
            return super().__new__(cls)
        if len(args) > 1:
            raise TypeError("expected configuration dict")
        config = ClientConfig(args[0] if args else {}, "consumer", kwargs)
        data_dir = local_data_dir(config)
        impl = ShmConsumer if data_dir is not None else KafkaConsumer
        obj: Consumer = impl.__new__(impl)
        obj._setup(config, data_dir)
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # set up by __new__ (_setup)

    def _setup(self, config: ClientConfig, data_dir: Any) -> None:
        raise NotImplementedError

    # the API, as each transport provides it (the rest comes from confluent-kafka's Consumer)
    def subscribe(self, topics: Any, on_assign: Any = None, on_revoke: Any = None,
                  on_lost: Any = None) -> None:
        raise NotImplementedError

    def poll(self, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _common_setup(self, config: ClientConfig) -> None:
        self.config = config
        self.serdes = Serdes(config, "deserializer")
        self.interceptors = Interceptors(config)
        self.closed = False
        self._user_cbs: dict[str, Any] = {}

    def _deliver(self, msgs: list[Any]) -> list[Any]:
        """Deserializers and ``on_consume`` interceptors on messages on their way out."""
        if self.serdes.active:
            s = self.serdes
            for m in msgs:
                if m.error() is None:
                    k, v = s.apply(m.topic(), m.key(), m.value(), m.headers())
                    m.set_key(k)
                    m.set_value(v)
        if self.interceptors:
            msgs = self.interceptors.chain("on_consume", msgs)
        return msgs

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class KafkaConsumer(Consumer):
    """The remote transport: confluent-kafka's consumer, with the rebalance callbacks given
    this object and shmq's Python-side keys (deserializers, interceptors)."""

    transport = "kafka"

    def _setup(self, config: ClientConfig, data_dir: Any) -> None:
        self._common_setup(config)
        config.py.pop("max.poll.records", None)
        self._c = confluent_kafka.Consumer(config.rd)

    def subscribe(self, topics: Any, on_assign: Any = None, on_revoke: Any = None,
                  on_lost: Any = None) -> None:
        kw = {}
        for name, cb in (("on_assign", on_assign), ("on_revoke", on_revoke),
                         ("on_lost", on_lost)):
            if cb is not None:
                if not callable(cb):
                    raise TypeError(f"{name} expects a callable")
                kw[name] = (lambda f: lambda _c, parts: f(self, parts))(cb)
        self._c.subscribe(topics, **kw)

    def poll(self, timeout: float | None = None) -> Any:
        msg = self._c.poll(-1 if timeout is None else timeout)
        if msg is None or not (self.serdes.active or self.interceptors):
            return msg
        out = self._deliver([msg])
        return out[0] if out else None

    def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Any]:
        msgs = self._c.consume(num_messages, -1 if timeout is None else timeout)
        return self._deliver(msgs) if msgs and (self.serdes.active or self.interceptors) \
            else msgs

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        got = self._c.commit(*args, **kwargs)
        if self.interceptors and got:
            self.interceptors.notify("on_commit", got)
        return got

    def close(self) -> None:
        if not self.closed:
            self._c.close()
            self.interceptors.close()
            self.closed = True

    def __getattr__(self, name: str) -> Any:  # the rest of confluent-kafka's Consumer
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._c, name)


class PartitionMessage(tuple):
    """A consumed record with confluent-kafka's ``Message`` accessors, built in C by
    ``_fast.decode_sections`` straight from the mapped log (a 5-field tuple: offset, timestamp,
    key, value, headers).  Topic and partition are attributes of a subclass made once per
    partition (``message_type``), so a record costs one tuple.  ``set_key`` / ``set_value``
    (deserializers) turn it into a ``Message``, which the consumer hands out instead."""

    __slots__ = ()
    _fields = ("offset", "timestamp", "key", "value", "headers")
    _topic: str = ""
    _partition: int = -1

    def __new__(cls, offset: int, timestamp: int, key: Any, value: Any, headers: Any
                ) -> PartitionMessage:  # the pure-Python decoder builds them this way
        return tuple.__new__(cls, (offset, timestamp, key, value, headers))

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self[0]

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_CREATE_TIME, self[1])

    def key(self) -> Any:
        return self[2]

    def value(self) -> Any:
        return self[3]

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        h = self[4]
        return list(h) if h else None

    def error(self) -> None:
        return None

    def latency(self) -> None:
        return None

    def leader_epoch(self) -> None:
        return None

    def __len__(self) -> int:
        v = self[3]
        return 0 if v is None else len(v)

    def __repr__(self) -> str:
        return f"<Message {self._topic}[{self._partition}]@{self[0]}>"

    def as_message(self) -> Message:
        return Message(self._topic, self._partition, self[0], self[2], self[3], self.headers(),
                       None, (TIMESTAMP_CREATE_TIME, self[1]))


_message_types: dict[tuple[str, int], type] = {}


def message_type(topic: str, partition: int) -> type:
    t = _message_types.get((topic, partition))
    if t is None:
        t = _message_types[(topic, partition)] = type(
            "Message", (PartitionMessage,), {"__slots__": (), "_topic": topic,
                                             "_partition": partition})
    return t


class _Part:
    """One assigned partition: where the next message to hand out is, and where reading
    continues."""

    __slots__ = ("topic", "partition", "position", "fetch", "paused", "eof_sent", "stored")

    def __init__(self, topic: str, partition: int, position: int | None) -> None:
        self.topic = topic
        self.partition = partition
        self.position = position   # None: not resolved yet (committed / auto.offset.reset)
        self.fetch = position      # the offset the next read starts at
        self.paused = False
        self.eof_sent = False
        self.stored = -1


class ShmConsumer(Consumer, ConsumerCore):
    """The local transport (see the module docstring)."""

    transport = "shm"
    poll = ConsumerCore.poll  # the compiled common case, not the base's declaration

    def _setup(self, config: ClientConfig, data_dir: Any) -> None:
        from shmq.ipc.client import LocalBroker

        self._common_setup(config)
        rd = config.rd
        self._auto_store = parse_bool("enable.auto.offset.store",
                                      rd.get("enable.auto.offset.store", True))
        self._auto_commit = parse_bool("enable.auto.commit", rd.get("enable.auto.commit", True))
        reset = str(config.raw("auto.offset.reset", "largest")).strip().lower()
        if reset not in RESET:
            raise invalid("auto.offset.reset", reset)
        self._reset = RESET[reset]
        self._eof = config.get_bool("enable.partition.eof")
        self._isolation = config.get_str("isolation.level")
        self._max_bytes = config.get_int("max.partition.fetch.bytes")
        # librdkafka's default (false): the broker checked each batch's CRC when it appended it
        self._check_crcs = config.get_bool("check.crcs")
        try:
            self._max_records = max(1, int(config.py.pop("max.poll.records",
                                                         MAX_RECORDS_PER_READ)))
        except (TypeError, ValueError):
            raise invalid("max.poll.records", None) from None
        inner = dict(rd)
        inner["enable.auto.offset.store"] = False  # the positions are ours: stored explicitly
        self._c = confluent_kafka.Consumer(inner)
        self._broker = LocalBroker(data_dir)
        self._parts: dict[tuple[str, int], _Part] = {}
        self._buffer: list[Any] = []
        self._index = 0
        self._runs: list[tuple[int, int, _Part, int]] = []  # (start, end, part, next offset)
        self._events: list[Any] = []
        self._service_at = 0.0
        self._rr = 0
        self._assigned_in_cb = False

    # -- rebalance ------------------------------------------------------------------------------

    def subscribe(self, topics: Any, on_assign: Any = None, on_revoke: Any = None,
                  on_lost: Any = None) -> None:
        """Subscribe to topics (``^regex`` patterns too); the callbacks get ``(consumer,
        partitions)`` as confluent-kafka's do."""
        self._check_open()
        for name, cb in (("on_assign", on_assign), ("on_revoke", on_revoke),
                         ("on_lost", on_lost)):
            if cb is not None and not callable(cb):
                raise TypeError(f"{name} expects a callable")
        self._user_cbs = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}
        self._c.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                          on_lost=self._on_lost)

    def unsubscribe(self) -> None:
        self._check_open()
        self._c.unsubscribe()

    def _cooperative(self) -> bool:
        try:
            return bool(self._c.rebalance_protocol()  # type: ignore[attr-defined]
                        == "COOPERATIVE")
        except Exception:  # noqa: BLE001  (not in a group)
            return False

    def _on_assign(self, _inner: Any, partitions: list[TopicPartition]) -> None:
        self._assigned_in_cb = False
        cb = self._user_cbs.get("on_assign")
        if cb is not None:
            cb(self, partitions)
        if not self._assigned_in_cb:
            if self._cooperative():
                self.incremental_assign(partitions)
            else:
                self.assign(partitions)

    def _on_revoke(self, _inner: Any, partitions: list[TopicPartition], lost: bool = False
                   ) -> None:
        if not lost and self._auto_commit:
            self._commit_positions([(p.topic, p.partition) for p in partitions])
        self._assigned_in_cb = False
        cb = self._user_cbs.get("on_lost" if lost else "on_revoke")
        if lost and cb is None:
            cb = self._user_cbs.get("on_revoke")
        if cb is not None:
            cb(self, partitions)
        if not self._assigned_in_cb:
            if self._cooperative():
                self.incremental_unassign(partitions)
            else:
                self.unassign()

    def _on_lost(self, inner: Any, partitions: list[TopicPartition]) -> None:
        self._on_revoke(inner, partitions, lost=True)

    def _set_assignment(self, partitions: list[TopicPartition], incremental: bool) -> None:
        self._settle()
        if not incremental:
            self._parts.clear()
        for tp in partitions:
            off = tp.offset
            pos = off if off >= 0 else None
            part = _Part(tp.topic, tp.partition, pos)
            if off in (OFFSET_BEGINNING, OFFSET_END):
                part.position = part.fetch = self._edge(part, off == OFFSET_BEGINNING)
            self._parts[(tp.topic, tp.partition)] = part
        self._drop_buffer()
        self._service_at = 0.0  # positions to resolve: the slow path runs on the next call

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Assign exactly these partitions (offsets in them are start positions)."""
        self._check_open()
        self._c.assign(partitions)
        self._pause_inner(partitions)
        self._set_assignment(partitions, incremental=False)
        self._assigned_in_cb = True

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        self._c.incremental_assign(partitions)
        self._pause_inner(partitions)
        self._set_assignment(partitions, incremental=True)
        self._assigned_in_cb = True

    def unassign(self) -> None:
        self._check_open()
        self._c.unassign()
        self._settle()
        self._parts.clear()
        self._drop_buffer()
        self._assigned_in_cb = True

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        self._c.incremental_unassign(partitions)
        self._settle()
        for tp in partitions:
            self._parts.pop((tp.topic, tp.partition), None)
        self._drop_buffer()
        self._assigned_in_cb = True

    def _pause_inner(self, partitions: list[TopicPartition]) -> None:
        if partitions:
            self._c.pause([TopicPartition(p.topic, p.partition) for p in partitions])

    def assignment(self) -> list[TopicPartition]:
        self._check_open()
        return self._c.assignment()

    # -- positions ------------------------------------------------------------------------------

    def _settle(self) -> None:
        """Positions from the messages handed out; the buffer keeps the rest."""
        index = self._index
        for start, end, part, nxt in self._runs:
            if index >= end:
                part.position = nxt
            elif index > start:
                part.position = self._buffer[index].offset()
        if index:
            del self._buffer[:index]
            self._runs = [(max(0, s - index), e - index, p, n) for s, e, p, n in self._runs
                          if e > index]
            self._index = 0

    def _drop_buffer(self) -> None:
        """Forget buffered messages (positions settled first): reads continue at positions."""
        self._settle()
        self._buffer = []
        self._runs = []
        self._index = 0
        for part in self._parts.values():
            part.fetch = part.position

    def _edge(self, part: _Part, beginning: bool) -> int:
        st = self._broker.reader(part.topic, part.partition).state()
        if beginning:
            return st.log_start
        return st.last_stable if self._isolation == "read_committed" else st.high_watermark

    def _resolve(self) -> None:
        """Committed offsets, else auto.offset.reset, for partitions without a position."""
        todo = [p for p in self._parts.values() if p.position is None]
        if not todo:
            return
        try:
            committed = self._c.committed([TopicPartition(p.topic, p.partition) for p in todo],
                                          timeout=10)
        except confluent_kafka.KafkaException:
            committed = [TopicPartition(p.topic, p.partition, OFFSET_INVALID) for p in todo]
        for part, tp in zip(todo, committed, strict=True):
            if tp.offset >= 0:
                part.position = part.fetch = tp.offset
            elif self._reset == "error":
                self._events.append(Message(part.topic, part.partition, OFFSET_INVALID,
                                            error=KafkaError(KafkaError._AUTO_OFFSET_RESET,
                                                             "no committed offset and "
                                                             "auto.offset.reset=error")))
                self._parts.pop((part.topic, part.partition), None)
            else:
                part.position = part.fetch = self._edge(part, self._reset == "earliest")

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The offset of the next message ``poll`` returns, per partition."""
        self._check_open()
        self._settle()
        out = []
        for tp in partitions:
            part = self._parts.get((tp.topic, tp.partition))
            pos = part.position if part is not None and part.position is not None \
                else OFFSET_INVALID
            out.append(TopicPartition(tp.topic, tp.partition, pos))
        return out

    def seek(self, partition: TopicPartition) -> None:
        self._check_open()
        part = self._parts.get((partition.topic, partition.partition))
        if part is None:
            raise kafka_exception(KafkaError._STATE, "Erroneous state")
        self._settle()
        off = partition.offset
        if off in (OFFSET_BEGINNING, OFFSET_END):
            off = self._edge(part, off == OFFSET_BEGINNING)
        elif off < 0:
            raise kafka_exception(KafkaError._INVALID_ARG, f"invalid offset {off}")
        part.position = off
        part.eof_sent = False
        self._drop_buffer()

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        for tp in partitions:
            part = self._parts.get((tp.topic, tp.partition))
            if part is not None:
                part.paused = True
        self._drop_buffer()

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        for tp in partitions:
            part = self._parts.get((tp.topic, tp.partition))
            if part is not None:
                part.paused = False

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        """(low, high) watermarks, read from the state table."""
        self._check_open()
        st = self._broker.reader(partition.topic, partition.partition).state()
        return st.log_start, st.high_watermark

    # -- commits --------------------------------------------------------------------------------

    def _store(self) -> None:
        """Store the positions of what was handed out (enable.auto.offset.store)."""
        self._settle()
        if not self._auto_store:
            return
        tps = [TopicPartition(p.topic, p.partition, p.position) for p in self._parts.values()
               if p.position is not None and p.position != p.stored]
        if tps:
            try:
                self._c.store_offsets(offsets=tps)
            except confluent_kafka.KafkaException:
                return  # a partition being revoked: its offsets were committed there
            for tp in tps:
                self._parts[(tp.topic, tp.partition)].stored = tp.offset

    def _commit_positions(self, keys: list[tuple[str, int]]) -> None:
        self._settle()
        tps = []
        for k in keys:
            part = self._parts.get(k)
            if part is not None and part.position is not None and part.position != part.stored:
                tps.append(TopicPartition(k[0], k[1], part.position))
        if tps:
            try:
                self._c.commit(offsets=tps, asynchronous=False)
            except confluent_kafka.KafkaException:
                pass  # as librdkafka's commit on revoke: the next owner starts earlier

    def commit(self, message: Any = None, offsets: Any = None, asynchronous: bool = True
               ) -> Any:
        """confluent-kafka's ``commit``: a message's offset + 1, explicit offsets, or (neither)
        the offset store: the positions of everything handed out, unless
        ``enable.auto.offset.store`` is off, then what ``store_offsets`` stored."""
        self._check_open()
        if message is not None and offsets is not None:
            raise kafka_exception(KafkaError._INVALID_ARG,
                                  "Commit with message and offsets is not supported")
        if message is not None:
            if message.error() is not None:
                raise kafka_exception(KafkaError._INVALID_ARG, "Cannot commit offsets for "
                                      "message with error: '" + str(message.error()) + "'")
            offsets = [TopicPartition(message.topic(), message.partition(),
                                      message.offset() + 1)]
        if offsets is None:  # the offset store, as librdkafka: with enable.auto.offset.store
            self._store()    # off only what store_offsets put there (_NO_OFFSET if nothing)
            got = self._c.commit(asynchronous=asynchronous)  # type: ignore[call-overload]
        else:
            got = self._c.commit(offsets=offsets,  # type: ignore[call-overload]
                                 asynchronous=asynchronous)
        if self.interceptors:
            self.interceptors.notify("on_commit", got if got is not None else offsets)
        return got

    def store_offsets(self, message: Any = None, offsets: Any = None) -> None:
        self._check_open()
        if message is not None:
            self._c.store_offsets(offsets=[TopicPartition(message.topic(), message.partition(),
                                                          message.offset() + 1)])
        else:
            self._c.store_offsets(offsets=offsets)

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> Any:
        self._check_open()
        return self._c.committed(partitions, timeout=-1 if timeout is None else timeout)

    # -- reading --------------------------------------------------------------------------------

    def _service(self) -> Any:
        """librdkafka's queue (rebalance callbacks, errors) and the offsets store."""
        self._store()
        while True:
            msg = self._c.poll(0)
            if msg is None:
                break
            if msg.error() is not None:
                self._events.append(msg)
            # a record fetched before its partition was paused: ours come from the log
        self._resolve()
        self._service_at = time.monotonic() + SERVICE_S
        return self._events.pop(0) if self._events else None

    def _service_due(self) -> bool:
        """Every SERVICE_S, and at once while no partition is assigned or resolved."""
        return time.monotonic() >= self._service_at or not self._parts

    def _fill(self) -> int:
        """Read the next batches of the assigned partitions into the (empty) buffer."""
        from shmq.errors import OffsetOutOfRangeError

        added = 0
        parts = [p for p in self._parts.values() if not p.paused and p.fetch is not None]
        if not parts:
            return 0
        n = len(parts)
        self._rr = (self._rr + 1) % n
        buf = self._buffer
        for i in range(n):
            part = parts[(self._rr + i) % n]
            fetch = part.fetch
            assert fetch is not None
            try:
                got = self._broker.read(part.topic, part.partition, fetch,
                                        self._max_records, max_bytes=self._max_bytes,
                                        isolation=self._isolation)
            except OffsetOutOfRangeError:
                if self._reset == "error":
                    self._events.append(Message(part.topic, part.partition, fetch,
                                                error=KafkaError(KafkaError._AUTO_OFFSET_RESET)))
                    part.fetch = None
                    continue
                part.fetch = part.position = self._edge(part, self._reset == "earliest")
                continue
            if not len(got):
                if self._eof and not part.eof_sent and part.fetch == got.high_watermark:
                    part.eof_sent = True
                    self._events.append(Message(part.topic, part.partition, part.fetch,
                                                error=KafkaError(KafkaError._PARTITION_EOF)))
                continue
            part.eof_sent = False
            start = len(buf)
            bodies, meta = _records_sections(got.buffer, verify_crc=self._check_crcs,
                                             max_decompressed=MAX_DECOMPRESSED,
                                             skip_control=True)
            recs = decode_sections(bodies, meta, message_type(part.topic, part.partition))
            lo, hi, nxt = 0, len(recs), got.next_offset
            while lo < hi and recs[lo][0] < part.fetch:
                lo += 1
            while hi > lo and recs[hi - 1][0] >= nxt:
                hi -= 1
            buf.extend(recs if lo == 0 and hi == len(recs) else recs[lo:hi])
            end = len(buf)
            if end > start:
                self._runs.append((start, end, part, got.next_offset))
                added += end - start
            part.fetch = got.next_offset
        if added and (self.serdes.active or self.interceptors):
            msgs = [m.as_message() if type(m) is not Message else m
                    for m in self._buffer[self._index:]]
            self._buffer[self._index:] = self._deliver(msgs)
        return added

    def _wait(self, timeout: float) -> None:
        parts = [p for p in self._parts.values() if not p.paused and p.fetch is not None]
        if not parts:
            time.sleep(min(timeout, 0.01))
            return
        if len(parts) == 1:
            p = parts[0]
            assert p.fetch is not None
            self._broker.reader(p.topic, p.partition).wait(p.fetch, timeout, self._isolation)
            return
        time.sleep(min(timeout, 0.001))

    def _next(self, num: int, timeout: float) -> list[Any]:
        """Up to ``num`` messages or events, waiting up to ``timeout`` (< 0: no limit) for the
        first."""
        deadline = time.monotonic() + timeout if timeout >= 0 else float("inf")
        out: list[Any] = []
        while True:
            # librdkafka's queue and the offset store when due (every SERVICE_S, and before
            # every wait), not on every call: a record handed out costs no librdkafka call
            ev = self._service() if self._service_due() else \
                (self._events.pop(0) if self._events else None)
            if ev is not None:
                out.append(ev)
                if len(out) >= num:
                    return out
            if self._index >= len(self._buffer):
                self._settle()
                self._fill()
            take = min(num - len(out), len(self._buffer) - self._index)
            if take > 0:
                out.extend(self._buffer[self._index:self._index + take])
                self._index += take
            if len(out) >= num:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            if self._index >= len(self._buffer):
                self._wait(min(left, WAIT_SLICE_S))

    def _poll_slow(self, timeout: float | None = None) -> Any:
        """``poll`` in full (``ConsumerCore.poll`` hands out buffered messages in C)."""
        i = self._index
        if i < len(self._buffer) and time.monotonic() < self._service_at:
            self._index = i + 1
            return self._buffer[i]
        self._check_open()
        got = self._next(1, -1.0 if timeout is None else float(timeout))
        return got[0] if got else None

    def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Any]:
        """Up to ``num_messages`` messages, waiting up to ``timeout`` seconds for them."""
        n = num_messages if type(num_messages) is int else int(num_messages)
        if not 0 <= n <= 1_000_000:
            raise ValueError("num_messages must be between 0 and 1000000 (1M)")
        i = self._index
        if i + n <= len(self._buffer) and time.monotonic() < self._service_at:
            self._index = i + n
            return self._buffer[i:i + n]
        self._check_open()
        return self._next(n, -1.0 if timeout is None else float(timeout))

    def consume_arrow(self, max_records: int = 100_000, timeout: float = 1.0) -> Any:
        """The next records of one assigned partition as a ``pyarrow.RecordBatch`` in the
        spark_bridge schema (zero-copy decoding of the mapped log; None after ``timeout``).
        Messages already buffered by ``poll`` are handed out first by ``poll``."""
        self._check_open()
        deadline = time.monotonic() + timeout
        while True:
            ev = self._service() if self._service_due() else None
            if ev is not None:  # errors and EOF events are poll's to return
                self._events.insert(0, ev)
            self._settle()
            self._drop_buffer()
            parts = [p for p in self._parts.values() if not p.paused and p.fetch is not None]
            for i in range(len(parts)):
                part = parts[(self._rr + i) % len(parts)]
                assert part.fetch is not None
                batch, nxt = self._broker.read_arrow(part.topic, part.partition, part.fetch,
                                                     max_records, isolation=self._isolation,
                                                     verify_crc=self._check_crcs)
                if batch.num_rows:
                    part.fetch = part.position = nxt
                    self._rr += 1
                    return batch
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._wait(min(left, WAIT_SLICE_S))

    # -- the rest -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("Consumer closed")

    def close(self) -> None:
        """Commit the positions (enable.auto.commit), leave the group, detach."""
        if self.closed:
            return
        if self._auto_commit:
            self._commit_positions(list(self._parts))
        self._c.close()
        self._broker.close(timeout=0)
        self.interceptors.close()
        self.closed = True

    def __getattr__(self, name: str) -> Any:  # list_topics, offsets_for_times, memberid ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._c, name)

    def __del__(self) -> None:
        pass


__all__ = ["Consumer", "KafkaConsumer", "ShmConsumer", "TIMESTAMP_LOG_APPEND_TIME"]
