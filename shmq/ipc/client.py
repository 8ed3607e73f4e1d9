"""The low-level local client: produce through shared-memory rings, read mapped segments.

This is what ``shmq.Producer`` / ``Consumer`` (issue 15) and the Spark bridge build on::

    broker = attach("/path/to/data-dir")          # or attach(bootstrap="127.0.0.1:9092")
    done = broker.send_batch("events", 0, [b"v1", (b"key", b"v2"), (None, b"v3", ts, [("h", b"x")])])
    done.result(timeout=5)                       # BatchResult(base_offset=..., error_code=0, ...)
    got = broker.read("events", 0, offset=0, max_records=1000, timeout=1.0)
    got.records() / got.batches / got.to_arrow("events", 0)     # or broker.read_arrow(...)
    broker.close()

Theory of operation
-------------------
* **Finding the broker.**  ``<data-dir>/run/broker.json`` names the state table, the slot of
  each partition and the workers; a bootstrap address is matched against the broker.json of
  ``$SHMQ_DATA_DIR`` / ``~/.local/share/shmq``, else the broker is asked for its log dirs
  (DescribeConfigs ``log.dirs`` of a worker, over the Kafka protocol).  A broker whose files are
  not here raises ``NotLocalError``: use a Kafka client.
* **Producing.**  One session per worker (``shmq.ipc.session``), attached on first use.  A batch
  is encoded in Cython straight into the submit ring (``_fast.ring.encode_batch_into``) as
  RecordBatch v2 with this client's producer id and the partition's next sequence (idempotence is
  on by default, like Kafka's Java and librdkafka producers), then published; the worker answers
  on the completion ring.  At most ``max_in_flight`` (5) batches per partition are unanswered,
  Kafka's bound for idempotent producers (the broker remembers the last five).  A full ring
  waits (eventfd + timeout): back-pressure, then ``BufferError`` after ``timeout``.
* **Worker deaths.**  A session's socket reports the worker's death at once (POLLHUP: every wait
  also watches it).  The client then reattaches to the restarted worker (same node id) and
  resends, in order, every entry that had no answer, byte for byte from the old ring (the worker
  frees an entry's space only when it answers, so those bytes are intact): the producer id and
  sequences make the retry exact; the broker answers batches it had appended with their
  original offsets.  ``send_batch`` / ``poll`` wait for the restarted worker (up to the reattach
  timeout); a caller that must never wait (``shmq.Producer``'s ``produce``) sends with
  ``try_send_with`` (None when the ring cannot take the batch at once), polls with
  ``poll(reattach=False)``, and leaves the attaching to a thread of its own (``prepare``,
  ``revive``: one reattach attempt at a time, backing off).
* **In flight.**  A batch past its delivery timeout is answered ``MSG_TIMED_OUT`` but still
  counts against ``max_in_flight`` while it is in the ring unanswered (its late answer, or the
  worker's death, frees its place), as Java's connection keeps such a request in flight: the
  worker never has more than five unanswered batches of an idempotent partition.
* **Reading** goes through ``shmq.ipc.reader.PartitionReader`` (one per partition, cached).
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from shmq import _fast
from shmq.errors import KafkaApiError, ShmqError
from shmq.ipc import ring as rings
from shmq.ipc.buffers import BufferPool
from shmq.ipc.reader import READ_UNCOMMITTED, PartitionReader, ReadResult, read_state
from shmq.ipc.session import (
    VERSION,
    AttachError,
    ShortPath,
    receive_message,
    send_message,
    socket_path,
)
from shmq.ipc.state_table import StateTable

DEFAULT_SUBMIT_BYTES = 8 << 20
DEFAULT_COMPLETION_BYTES = 1 << 20
MAX_IN_FLIGHT = 5
REATTACH_TIMEOUT_S = 30.0
# Before sleeping on its eventfd for an answer, a client looks at the completion ring for this
# long: the worker usually answers within microseconds, and a sleeping client costs the worker
# an eventfd write per answer and itself a wake-up (measured: 14,760 kicks for 20,000 small
# batches without it).  200 us rather than 50: a 100 KB batch takes ~100 us to append, and with
# 50 us the client slept between answers (0.21-0.27 worker kicks an entry for 1,000-record
# batches, against 0.09-0.10, perf/README.md's bench_shm section).
SPIN_S = 0.0002
# ... but only while answers come that fast: after a wait for answers that lasted longer than
# SPIN_S (the worker lags: a loaded box, an fsync for acks=all) the next wait sleeps at once,
# as a local reader does after a long wait (``reader.SPIN_GAP_S``).  A spin that runs out costs
# its 200 us of sched_yield and the wake-up as well: at 10,000 records/s on the loaded 2-core
# box (load 12) the producer waited at the in-flight bound in ~6 % of its sends, and ~22 % of
# its CPU samples were sched_yield's (perf record of bench_shm's latency row).
# A client that never blocks (poll(0) between sends) peeks at the session socket this often at
# most while answers are due: a worker's death is noticed that fast without a system call per
# batch (a blocking wait watches the socket and notices at once).
PEEK_EVERY_S = 0.02
ACKS = {0: 0, 1: 1, -1: -1, "all": -1}
NOT_LEADER, UNKNOWN_TOPIC_OR_PARTITION, NETWORK_EXCEPTION = 6, 3, 13
OUT_OF_ORDER_SEQUENCE, DUPLICATE_SEQUENCE, REQUEST_TIMED_OUT = 45, 46, 7
# Kafka's retriable produce errors that a resend can cure (RetriableException subclasses the
# Java producer retries until delivery.timeout.ms): the leader moved or is briefly unavailable,
# the fsync failed (the resend is a duplicate when the append had happened: answered with its
# original offsets).  CORRUPT_MESSAGE is retriable in Java for bits flipped on a network; a
# batch corrupt in shared memory would be corrupt again.
RETRIABLE = frozenset({NOT_LEADER, 5, REQUEST_TIMED_OUT, 19, 20, 56})
# Answers after which the broker's state of this producer is unknown to us: take a new id
# (KIP-360's fallback without epoch bumps) once nothing is in flight.
UNKNOWN_PRODUCER_STATE = frozenset({NETWORK_EXCEPTION, OUT_OF_ORDER_SEQUENCE, 47, 59})
DEFAULT_DELIVERY_TIMEOUT_S = 120.0   # Java's delivery.timeout.ms
# A batch not delivered within the delivery timeout (no answer from a live worker, a worker that
# does not come back, retries that ran out of time) is answered with librdkafka's local
# ``_MSG_TIMED_OUT`` (-192), what confluent-kafka reports; Java's is a TimeoutException.
MSG_TIMED_OUT = -192
BATCH_HEADER_SIZE = 61               # RecordBatch v2's fixed part, up to the records count
_NO_VIEW = bytearray()               # what a writer's size pass gets: it writes nothing
EXPIRY_CHECK_S = 0.01                # how often poll looks for batches past their deadline
RETRY_BACKOFF_S = 0.1                # retry.backoff.ms of Java and librdkafka


def _restamp(batch: bytearray, producer_id: int, producer_epoch: int, sequence: int) -> None:
    """Give a RecordBatch v2 another producer id, epoch and base sequence (all inside the CRC,
    which is computed again)."""
    struct.pack_into(">qhi", batch, 43, producer_id, producer_epoch, sequence)
    struct.pack_into(">I", batch, 17, _fast.crc32c(memoryview(batch)[21:]))


def compressed_batch(records: list[Any], now: int, codec: int,
                     level: int | None = None) -> bytearray:
    """``records`` (``send_batch``'s forms) as one RecordBatch v2 whose records are compressed
    with Kafka codec ``codec``, as the Java client writes it: the 61-byte header uncompressed,
    the codec in attribute bits 0-2, the record stream compressed (``shmq.protocol.compression``,
    cramjam).  Producer id, epoch and sequence are stamped (and the CRC computed) by the sender."""
    encode = _fast.ring.encode_batch_into
    size = -encode(_NO_VIEW, 0, 0, records, now, -1, -1, -1)
    plain = bytearray(size)
    encode(plain, 0, size, records, now, -1, -1, -1)
    return compress_batch(plain, codec, level)


def compress_batch(plain: Any, codec: int, level: int | None = None) -> bytearray:
    """An uncompressed RecordBatch v2 with its records compressed with Kafka codec ``codec``
    (the header kept, its length and codec bits set; the CRC is the sender's)."""
    from shmq.protocol import compression as codecs

    body = codecs.compress(codec, memoryview(plain)[BATCH_HEADER_SIZE:], level)
    batch = plain[:BATCH_HEADER_SIZE] + body
    struct.pack_into(">i", batch, 8, len(batch) - 12)                   # batchLength
    attributes = struct.unpack_from(">h", batch, 21)[0]
    struct.pack_into(">h", batch, 21, (attributes & ~0x07) | codec)    # the codec bits
    return batch


def _seq_order(sequence: int, origin: int) -> int:
    """Where ``sequence`` lies after ``origin`` in the wrapping 31-bit sequence space."""
    return (sequence - origin) & 0x7FFFFFFF


class NotLocalError(ShmqError):
    """The broker's files are not on this host (or not readable here): use a Kafka client."""


class SessionLostError(ShmqError):
    """A worker went away and did not come back within the reattach timeout."""


class BatchResult(NamedTuple):
    topic: str
    partition: int
    base_offset: int          # -1 on error
    record_count: int
    error_code: int           # Kafka's code; 0 for success
    error_message: str | None
    log_append_time: int      # -1 unless the topic uses LogAppendTime
    log_start_offset: int


class BatchFuture:
    """The answer to one ``send_batch``; ``result()`` polls the rings until it is there."""

    __slots__ = ("broker", "topic", "partition", "count", "acks", "value", "callback",
                 "_sequence", "_sequenced", "_deadline", "_attempts")

    def __init__(self, broker: LocalBroker, topic: str, partition: int, count: int, acks: int,
                 callback: Callable[[BatchResult], Any] | None) -> None:
        self.broker = broker
        self.topic = topic
        self.partition = partition
        self.count = count
        self.acks = acks
        self.value: BatchResult | None = None
        self.callback = callback
        self._sequence = -1        # the batch's base sequence (idempotent batches)
        self._sequenced = False
        self._deadline = 0.0       # monotonic time after which it is not retried
        self._attempts = 0

    def done(self) -> bool:
        return self.value is not None

    def result(self, timeout: float | None = None) -> BatchResult:
        """The answer (raising ``KafkaApiError`` for an error code), waiting up to ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.value is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no answer for a batch to {self.topic}-{self.partition}")
            self.broker.poll(0.1 if left is None else min(left, 0.1))
        if self.value.error_code:
            raise KafkaApiError(self.value.error_code, self.value.error_message or "")
        return self.value

    def _set(self, value: BatchResult) -> None:
        self.value = value
        if self.callback is not None:
            self.callback(value)


class _InFlight:
    __slots__ = ("corr", "at", "length", "end", "future")

    def __init__(self, corr: int, at: int, length: int, end: int, future: BatchFuture) -> None:
        self.corr = corr
        self.at = at
        self.length = length
        self.end = end
        self.future = future


class _Session:
    """This process's rings on one worker."""

    def __init__(self, broker: LocalBroker, node_id: int, submit_bytes: int,
                 completion_bytes: int, timeout: float) -> None:
        self.node_id = node_id
        path = socket_path(broker.data_dir, node_id)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock = sock
        self.mapping: Any = None
        self.view: memoryview | None = None
        self.worker_efd = self.client_efd = -1
        try:
            sock.settimeout(timeout)
            with ShortPath(path) as where:
                sock.connect(where)
            send_message(sock, {"op": "hello", "version": VERSION, "submit_bytes": submit_bytes,
                                "completion_bytes": completion_bytes, "pid": os.getpid()})
            welcome, fds = receive_message(sock)
            if welcome is None:
                raise AttachError(f"worker {node_id} closed the session")
            if welcome["op"] != "welcome" or len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                raise AttachError(f"worker {node_id} refused the session: "
                                  f"{welcome.get('error', welcome)}")
            region, self.worker_efd, self.client_efd = fds
            try:
                self.mapping, layout, self.worker_pid, self.session_id = rings.map_region(region)
            finally:
                os.close(region)
            self.max_entry = int(welcome["max_entry"])
        except BaseException:
            self.close()
            raise
        sock.setblocking(False)
        self.view = memoryview(self.mapping)
        self.submit, self.completion = rings.session_rings(self.view, layout)
        self.inflight: deque[_InFlight] = deque()
        self.by_corr: dict[int, _InFlight] = {}
        self.alive = True
        self.gone_at = 0.0     # monotonic time the worker's death was noticed
        self.peeked = 0.0      # monotonic time of the last look at the socket
        self.kicks = 0         # eventfd writes to the worker (wake-ups it needed)
        self.answer_wait = 0.0  # how long the last wait for answers lasted (see SPIN_S)
        self._rpc = 0
        # after the worker's death: when to try to reattach next, the back-off, when to give up
        self.retry_at = 0.0
        self.retry_delay = 0.0
        self.give_up_at = 0.0

    def kick(self) -> None:
        self.kicks += 1
        try:
            os.eventfd_write(self.worker_efd, 1)
        except OSError:
            pass

    def worker_gone(self) -> bool:
        """Whether the worker's end of the socket closed (a cheap non-blocking peek)."""
        if not self.alive:
            return True
        try:
            data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.alive = False
            self.gone_at = time.monotonic()
        return not self.alive

    def wait(self, timeout: float) -> None:
        """Sleep on the client eventfd and the socket (the worker's death wakes us too)."""
        p = select.poll()
        p.register(self.client_efd, select.POLLIN)
        p.register(self.sock.fileno(), select.POLLIN | select.POLLHUP)
        # milliseconds rounded up (poll rounds a float up): int() made a wait shorter than 1 ms
        # no wait at all, and the caller's loop (LocalBroker.poll) a busy one, alternating a
        # 200 us spin and a look (produce_batch with acks=all: 45-320 ns of CPU a record)
        for fd, ev in p.poll(max(0.0, timeout * 1000.0)):
            if fd == self.client_efd:
                try:
                    os.eventfd_read(self.client_efd)
                except BlockingIOError:
                    pass
            elif ev & (select.POLLHUP | select.POLLERR | select.POLLIN):
                self.worker_gone()

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._rpc += 1
        message["id"] = self._rpc
        self.sock.settimeout(timeout)
        try:
            send_message(self.sock, message)
            while True:
                reply, fds = receive_message(self.sock)
                for fd in fds:
                    os.close(fd)
                if reply is None:
                    self.alive = False
                    self.gone_at = time.monotonic()
                    raise SessionLostError(f"worker {self.node_id} went away")
                if reply.get("id") == self._rpc:
                    return reply
        finally:
            self.sock.setblocking(False)

    def __del__(self) -> None:
        # a LocalBroker dropped without close(): release the descriptors and the mapping
        if getattr(self, "sock", None) is not None and self.sock.fileno() >= 0:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass

    def close(self) -> None:
        self.alive = False
        self.sock.close()
        for fd in (self.worker_efd, self.client_efd):
            if fd >= 0:
                os.close(fd)
        self.worker_efd = self.client_efd = -1
        if self.view is not None:
            self.view.release()
            self.view = None
        if self.mapping is not None:
            try:
                self.mapping.close()
            except BufferError:
                pass
            self.mapping = None


def _default_data_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("SHMQ_DATA_DIR"):
        dirs.append(Path(os.environ["SHMQ_DATA_DIR"]))
    dirs.append(Path.home() / ".local/share/shmq")
    return dirs


def find_data_dir(bootstrap: str, timeout: float = 10.0) -> Path:
    """The data dir of the local broker serving ``bootstrap`` (see the module docstring)."""
    for d in _default_data_dirs():
        try:
            info = json.loads((d / "run" / "broker.json").read_text())
        except (OSError, ValueError):
            continue
        if info.get("bootstrap") == bootstrap:
            return d
    try:
        from confluent_kafka.admin import AdminClient, ConfigResource

        admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000})
        md = admin.list_topics(timeout=timeout)
        nodes = sorted(b for b in md.brokers if b != md.controller_id) or sorted(md.brokers)
        res = ConfigResource(ConfigResource.Type.BROKER, str(nodes[0]))
        configs = admin.describe_configs([res], request_timeout=timeout)[res].result(timeout)
        log_dirs = configs["log.dirs"].value
    except Exception as exc:  # noqa: BLE001 - no broker, not Kafka, no such config: not local
        raise NotLocalError(f"cannot find the data dir of {bootstrap}: {exc}") from exc
    candidate = Path(log_dirs.split(",")[0]).parent
    try:
        info = json.loads((candidate / "run" / "broker.json").read_text())
    except (OSError, ValueError) as exc:
        raise NotLocalError(f"{bootstrap} keeps its data in {candidate}, not readable here") from exc
    if info.get("bootstrap") != bootstrap:
        raise NotLocalError(f"{candidate} belongs to {info.get('bootstrap')}, not {bootstrap}")
    return candidate


def attach(data_dir: str | Path | None = None, *, bootstrap: str | None = None,
           **options: Any) -> LocalBroker:
    """A ``LocalBroker`` for the broker running in ``data_dir`` or serving ``bootstrap``."""
    if data_dir is None:
        if bootstrap is None:
            data_dir = _default_data_dirs()[0]
        else:
            data_dir = find_data_dir(bootstrap)
    return LocalBroker(Path(data_dir), **options)


class LocalBroker:
    """A local broker's data path (see the module docstring)."""

    def __init__(self, data_dir: Path, *, idempotent: bool = True,
                 submit_bytes: int = DEFAULT_SUBMIT_BYTES,
                 completion_bytes: int = DEFAULT_COMPLETION_BYTES,
                 max_in_flight: int = MAX_IN_FLIGHT,
                 reattach_timeout: float = REATTACH_TIMEOUT_S,
                 delivery_timeout: float = DEFAULT_DELIVERY_TIMEOUT_S,
                 retry_backoff: float = RETRY_BACKOFF_S) -> None:
        self.data_dir = data_dir
        self.delivery_timeout = delivery_timeout
        self.retry_backoff = retry_backoff
        self.idempotent = idempotent
        self.submit_bytes = rings.check_capacity(submit_bytes)
        self.completion_bytes = rings.check_capacity(completion_bytes)
        self.max_in_flight = max_in_flight if idempotent else 1 << 30
        self.reattach_timeout = reattach_timeout
        self._info: dict[str, Any] = {}
        self._load_run_info()
        name = self._info.get("state_table")
        if not name:
            raise NotLocalError(f"the broker in {data_dir} publishes no state table")
        self.table = StateTable.attach(name, readonly=False)
        self.sessions: dict[int, _Session] = {}
        self.readers: dict[tuple[str, int], PartitionReader] = {}
        self.buffers = BufferPool()  # read_arrow's column buffers, reused once released
        self._decoders: Any = None   # iter_arrow's decoding threads
        self._decoders_size = 0
        self.producer_id, self.producer_epoch = -1, -1
        self._sequences: dict[tuple[str, int], int] = {}
        self._unanswered: dict[tuple[str, int], int] = {}
        self._reset_producer = False
        # Resends (see "Failed batches" in the module docstring), per partition: the next
        # sequence the broker expects (after the last batch it appended), the failed batches to
        # send again once every batch of the partition is answered, and when.
        self._confirmed: dict[tuple[str, int], int] = {}
        self._resend: dict[tuple[str, int], list[tuple[BatchFuture, bytearray]]] = {}
        self._resend_at: dict[tuple[str, int], float] = {}
        self._rewinding: set[tuple[str, int]] = set()
        self._corr = 0
        self._scratch: bytearray | None = None  # send_batch's encoding buffer, reused
        self._names: dict[str, bytes] = {}  # topic -> its UTF-8 name (_send_now)
        self._expiry_check = 0.0
        self._may_block = True    # False within calls that must not wait for a worker
        self.reattached = 0
        self.losses: list[tuple[int, float]] = []  # (node id, when its death was noticed)
        self.closed = False

    # -- where things are -------------------------------------------------------------------

    def _load_run_info(self) -> None:
        path = self.data_dir / "run" / "broker.json"
        self._slots: dict[tuple[str, int], int] = {}  # slot_of's answers from this _info
        try:
            self._info = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise NotLocalError(f"no broker runs in {self.data_dir} ({path} is missing)") from exc
        except (OSError, ValueError) as exc:
            raise NotLocalError(f"cannot read {path}: {exc}") from exc

    def slot_of(self, topic: str, partition: int) -> int | None:
        slot = self._slots.get((topic, partition))  # from the broker.json read last
        if slot is not None:
            return slot
        key = f"{topic}/{partition}"
        slot = self._info.get("slots", {}).get(key)
        if slot is None:  # a topic created since: broker.json is rewritten on metadata changes
            self._load_run_info()
            slot = self._info.get("slots", {}).get(key)
        if slot is not None:
            self._slots[(topic, partition)] = slot
        return slot

    def leader_of(self, topic: str, partition: int) -> int | None:
        slot = self.slot_of(topic, partition)
        if slot is None or not 0 <= slot < self.table.slot_count:
            return None
        st = read_state(self.table, slot)
        return st.leader if st is not None and st.leader > 0 else None

    def partition_dir(self, topic: str, partition: int, node_id: int) -> Path:
        return self.data_dir / f"worker-{node_id}" / f"{topic}-{partition}"

    def _nodes(self) -> list[int]:
        return sorted(w["node_id"] for w in self._info.get("workers", []))

    # -- sessions ---------------------------------------------------------------------------

    def _session(self, node_id: int, timeout: float = 10.0) -> _Session:
        session = self.sessions.get(node_id)
        if session is None or not session.alive:
            if session is not None and session.view is not None:
                return self._reattach(session)
            session = _Session(self, node_id, self.submit_bytes, self.completion_bytes, timeout)
            self.sessions[node_id] = session
        return session

    def _ensure_producer(self, session: _Session) -> None:
        if not self.idempotent:
            return
        if self._reset_producer and not any(self._unanswered.values()):
            self.producer_id = -1  # state unknown: a new id, sequences from 0 (KIP-360's
            self._sequences.clear()  # fallback without epoch bumps)
            self._confirmed.clear()
            self._reset_producer = False
        if self.producer_id < 0:
            reply = session.request({"op": "init_producer_id"}, 30)
            if "error" in reply:
                raise KafkaApiError(-1, f"no producer id: {reply['error']}")
            self.producer_id, self.producer_epoch = reply["producer_id"], reply["producer_epoch"]

    def _reattach(self, dead: _Session) -> _Session:
        """The worker went away: a new session with the restarted worker, and every unanswered
        entry resent from the old ring, in order (waiting for it up to the reattach timeout;
        raises ``SessionLostError`` after it)."""
        while True:
            session = self._try_reattach(dead)
            if session is not None:
                return session
            time.sleep(max(0.0, dead.retry_at - time.monotonic()))

    def _try_reattach(self, dead: _Session) -> _Session | None:
        """One attempt of ``_reattach`` when it is due (``dead.retry_at``): the new session, or
        None when the worker is not back yet (the next attempt is due at ``dead.retry_at``,
        backing off from 5 to 100 ms).  Past the reattach timeout every unanswered batch is
        answered with an error and ``SessionLostError`` raised.  Until it succeeds the dead
        session keeps its mapping: the unanswered entries' bytes are read from it."""
        assert dead.view is not None
        now = time.monotonic()
        if not dead.give_up_at:  # the first attempt
            self.losses.append((dead.node_id, dead.gone_at or now))
            dead.give_up_at = now + self.reattach_timeout
            dead.retry_delay = 0.005
            dead.retry_at = now
        if now < dead.retry_at:
            return None
        try:
            session = _Session(self, dead.node_id, self.submit_bytes, self.completion_bytes,
                               max(0.1, min(2.0, dead.give_up_at - now)))
        except (OSError, AttachError) as exc:
            now = time.monotonic()
            if now + dead.retry_delay > dead.give_up_at:
                # every unanswered batch is answered with a retriable error: never silence
                why = f"worker {dead.node_id} did not come back within {self.reattach_timeout} s"
                if self.sessions.get(dead.node_id) is dead:
                    del self.sessions[dead.node_id]
                self._forget(dead)
                for entry in dead.inflight:
                    f = entry.future
                    if f.value is not None:
                        continue
                    code = MSG_TIMED_OUT if now >= f._deadline else NETWORK_EXCEPTION
                    if f._sequenced:  # whether the worker appended it is unknown:
                        self._reset_producer = True  # a new producer id (KIP-360)
                    f._set(BatchResult(f.topic, f.partition, -1, f.count, code, why, -1, -1))
                dead.close()
                raise SessionLostError(f"{why}: {exc}") from exc
            dead.retry_at = now + dead.retry_delay
            dead.retry_delay = min(dead.retry_delay * 2, 0.1)
            self._load_run_info()
            return None
        todo = [(e, bytes(dead.view[e.at : e.at + e.length])) for e in dead.inflight
                if e.future.value is None]
        self._forget(dead, expired_only=True)  # reported already, never to be answered now
        dead.close()
        deadline = time.monotonic() + self.reattach_timeout
        self.sessions[dead.node_id] = session
        self.reattached += 1
        for entry, data in todo:
            # they all fitted the old ring at once: a fresh ring of the same size takes them
            # without waiting (no poll here, which could reattach again halfway through)
            at = session.submit.reserve(len(data))
            if at < 0:
                at = self._reserve(session, len(data), deadline)
            assert session.view is not None
            session.view[at : at + len(data)] = data
            entry.at, entry.length = at, len(data)
            if session.submit.commit(len(data), at):
                session.kick()
            entry.end = session.submit.tail
            session.inflight.append(entry)
            session.by_corr[entry.corr] = entry
        return session

    def _forget(self, dead: _Session, expired_only: bool = False) -> None:
        """A dead session's entries that wait for an answer (those reported already, with
        ``expired_only``) no longer count in flight: their worker is gone."""
        for corr, e in list(dead.by_corr.items()):
            f = e.future
            if not expired_only or f.value is not None:
                del dead.by_corr[corr]
                self._unanswered[(f.topic, f.partition)] -= 1

    def ready(self, topic: str, partition: int) -> bool:
        """Whether a batch to the partition can go without talking to a worker first: a live
        session to its leader and, when idempotent, a producer id that is not to be replaced.
        While it is to be replaced nothing new goes until every batch in flight is answered
        (librdkafka's DRAIN_RESET): a batch sent meanwhile with the old id could follow a
        sequence the broker never appended."""
        return self._ready_node(self._node_for(topic, partition))

    def _ready_node(self, node: int) -> bool:
        """``ready`` of a partition led by worker ``node``."""
        session = self.sessions.get(node)
        if session is None or not session.alive:
            return False
        return not self.idempotent or (self.producer_id >= 0 and not self._reset_producer)

    def prepare(self, topic: str, partition: int) -> bool:
        """What ``ready`` waits for, one step of it (this may block: a connection, a reattach
        attempt with its resends, ``InitProducerId``): attach to the partition's leader, or try
        once to reattach to it (``_try_reattach``), then take a producer id.  Returns whether
        the partition is ready now.  Raises ``OSError`` / ``AttachError`` when the worker is not
        there, ``SessionLostError`` when a reattach gave up."""
        node = self._node_for(topic, partition)
        session = self.sessions.get(node)
        if session is not None and not session.alive and session.view is not None:
            session = self._try_reattach(session)
            if session is None:
                return False
        elif session is None or not session.alive:
            if session is not None:
                session.close()
            session = _Session(self, node, self.submit_bytes, self.completion_bytes, 2.0)
            self.sessions[node] = session
        self._ensure_producer(session)
        return self.ready(topic, partition)

    def revive(self) -> float | None:
        """One reattach attempt (when due) for each session whose worker died with batches
        unanswered; when the next attempt is due (None: no session waits for one).  A session
        that gave up has answered its batches with errors (``SessionLostError`` is not raised
        here)."""
        may_block, self._may_block = self._may_block, False
        try:
            return self._revive_sessions()
        finally:
            self._may_block = may_block

    def _revive_sessions(self) -> float | None:
        due = None
        for session in list(self.sessions.values()):
            if session.alive or session.view is None:
                continue
            self._read_completions(session)  # answers written before it died
            if session.view is None or self.sessions.get(session.node_id) is not session:
                continue
            if not any(e.future.value is None for e in session.inflight):
                self._forget(session)
                session.close()
                del self.sessions[session.node_id]
                continue
            try:
                if self._try_reattach(session) is not None:
                    continue
            except SessionLostError:
                continue
            due = session.retry_at if due is None else min(due, session.retry_at)
        return due

    def _reserve(self, session: _Session, size: int, deadline: float) -> int:
        """Ring space for an entry: back-pressure until ``deadline``."""
        while True:
            at = session.submit.reserve(size)
            if at >= 0:
                return at
            self._poll_session(session)
            if not session.alive:
                raise SessionLostError("worker went away")
            left = deadline - time.monotonic()
            if left <= 0:
                raise BufferError(f"the ring to worker {session.node_id} stayed full "
                                  f"(back-pressure): the batch was not sent")
            session.submit.set_waiting()
            if session.submit.reserve(size) >= 0:
                continue
            session.wait(min(left, 0.05))

    # -- produce ----------------------------------------------------------------------------

    def send_batch(self, topic: str, partition: int, records: list[Any], *,
                   acks: int | str = -1, timeout: float = 30.0,
                   on_delivery: Callable[[BatchResult], Any] | None = None,
                   compression: int = 0, compression_level: int | None = None) -> BatchFuture:
        """Encode ``records`` as one batch into the ring of the partition's leader.

        A record is ``bytes`` (a value) or ``(key, value[, timestamp_ms[, headers]])``.
        ``acks`` is Kafka's (0, 1, -1 / "all"; the default is Kafka's all).  ``compression``
        is Kafka's codec id (``shmq.protocol.compression``: 1 gzip, 2 snappy, 3 lz4, 4 zstd):
        the records are compressed as a Kafka client compresses them.  Returns a
        ``BatchFuture``; ``on_delivery(result)`` runs from ``poll``.  Raises ``BufferError``
        when the ring stays full for ``timeout`` seconds (nothing was sent)."""
        if not isinstance(records, list):
            records = list(records)
        if not records:
            raise ValueError("a batch holds at least one record")
        now = int(time.time() * 1000)
        encode = _fast.ring.encode_batch_into
        if compression:
            batch = compressed_batch(records, now, compression, compression_level)

            def write_compressed(view: Any, at: int, size: int, pid: int, epoch: int,
                                 seq: int) -> int:
                if size >= 0:
                    _restamp(batch, pid, epoch, seq)
                    view[at : at + len(batch)] = batch
                return len(batch)

            return self._submit(topic, partition, write_compressed, len(records), acks, timeout,
                                on_delivery)

        if type(records[0]) is bytes:
            # values: the size pass only sums their lengths (4.7 ns a 100 B record), so the
            # batch is written straight into the ring once its room is reserved, with no
            # second size pass (``encode_values_into``) and no copy from a scratch buffer:
            # 17.6 ns a record against 22.6
            values_into = _fast.ring.encode_values_into

            def write(view: Any, at: int, size: int, pid: int, epoch: int, seq: int) -> int:
                if size < 0:
                    return -encode(_NO_VIEW, 0, 0, records, now, pid, epoch, seq)
                return values_into(view, at, size, records, now, pid, epoch, seq)

            return self._submit(topic, partition, write, len(records), acks, timeout,
                                on_delivery)

        def encode_into(buf: Any, at: int, limit: int, pid: int, epoch: int, seq: int) -> int:
            return encode(buf, at, limit, records, now, pid, epoch, seq)

        return self._send_encoder(topic, partition, len(records), encode_into, acks, timeout,
                                  on_delivery)

    def send_columns(self, topic: str, partition: int, keys: list[bytes | None],
                     values: list[bytes | None], stamps: list[int], *, acks: int | str = -1,
                     timeout: float = 30.0,
                     on_delivery: Callable[[BatchResult], Any] | None = None) -> BatchFuture:
        """``send_batch`` of records kept as parallel lists (a producer's open batch): record
        ``i`` is ``(keys[i], values[i], stamps[i])``, bytes or None and a time in ms, no headers;
        encoded with no object per record (``_fast.ring.encode_columns_into``)."""
        if not values:
            raise ValueError("a batch holds at least one record")
        encode = _fast.ring.encode_columns_into

        def encode_into(buf: Any, at: int, limit: int, pid: int, epoch: int, seq: int) -> int:
            return encode(buf, at, limit, keys, values, stamps, pid, epoch, seq)

        return self._send_encoder(topic, partition, len(values), encode_into, acks, timeout,
                                  on_delivery)

    def _send_encoder(self, topic: str, partition: int, count: int,
                      encode_into: Callable[[Any, int, int, int, int, int], int],
                      acks: int | str, timeout: float,
                      on_delivery: Callable[[BatchResult], Any] | None) -> BatchFuture:
        """``_submit`` with an encoder ``encode_into(buf, at, limit, pid, epoch, seq)`` that
        returns the size written, or ``-size`` when it does not fit.  The batch is encoded once,
        into a reused scratch buffer, when its size is asked for, and the ring gets a copy:
        asking the encoder for the size alone costs its whole first pass, which the write
        would run again (half of produce's CPU)."""
        scratch = self._scratch if self._scratch is not None else bytearray(1 << 16)
        self._scratch = None  # in use (a nested send takes its own)
        encoded = 0

        def write(view: Any, at: int, size: int, pid: int, epoch: int, seq: int) -> int:
            nonlocal scratch, encoded
            if size < 0:
                got = encode_into(scratch, 0, len(scratch), pid, epoch, seq)
                if got < 0:  # larger than any batch before: grow, then once more
                    scratch = bytearray(max(-got, 2 * len(scratch)))
                    got = encode_into(scratch, 0, len(scratch), pid, epoch, seq)
                encoded = got
                return got
            if size != encoded:  # not asked for the size first: encode in place
                return encode_into(view, at, size, pid, epoch, seq)
            view[at : at + size] = memoryview(scratch)[:size]
            return size

        try:
            return self._submit(topic, partition, write, count, acks, timeout, on_delivery)
        finally:
            self._scratch = scratch

    def send_encoded(self, topic: str, partition: int, batch: Any, *, acks: int | str = -1,
                     timeout: float = 30.0,
                     on_delivery: Callable[[BatchResult], Any] | None = None) -> BatchFuture:
        """Send bytes already encoded as a RecordBatch v2 (compressed ones, say) as they are:
        no producer id or sequence is added, and the broker validates them like any Produce."""
        data = bytes(batch)
        count = int.from_bytes(data[57:61], "big", signed=True) if len(data) >= 61 else 0

        def write(view: Any, at: int, size: int, pid: int, epoch: int, seq: int) -> int:
            if size >= 0:
                view[at : at + len(data)] = data
            return len(data)

        return self._submit(topic, partition, write, count, acks, timeout, on_delivery,
                            sequenced=False)

    def send_with(self, topic: str, partition: int, count: int, write: Callable[..., int], *,
                  acks: int | str = -1, timeout: float = 30.0,
                  on_delivery: Callable[[BatchResult], Any] | None = None) -> BatchFuture:
        """``send_batch`` with the caller's encoder (the Spark sink encodes Arrow columns):
        ``write(view, at, size, producer_id, epoch, sequence)`` writes one uncompressed
        RecordBatch v2 of ``count`` records at ``view[at:at + size]`` with that producer id,
        epoch and base sequence and returns its size; called with ``size < 0`` it only returns
        the size it needs."""
        return self._submit(topic, partition, write, count, acks, timeout, on_delivery)

    def try_send_with(self, topic: str, partition: int, count: int, write: Callable[..., int],
                      *, acks: int | str = -1,
                      on_delivery: Callable[[BatchResult], Any] | None = None
                      ) -> BatchFuture | None:
        """``send_with`` that never waits and never talks to a worker over its socket: None,
        with nothing sent, when the batch cannot go into the ring at once -- the partition is
        not ``ready`` (no live session to its leader: attaching and reattaching are
        ``prepare`` / ``revive``'s work; no producer id yet), ``max_in_flight`` batches are
        unanswered or failed ones wait to be sent again, or the ring is full.  A producer's
        ``produce`` sends with it and keeps what it refuses for its background thread."""
        return self._submit(topic, partition, write, count, acks, 0.0, on_delivery, wait=False)

    def _submit(self, topic: str, partition: int, write: Callable[..., int], count: int,
                acks: int | str, timeout: float,
                on_delivery: Callable[[BatchResult], Any] | None,
                sequenced: bool = True, wait: bool = True) -> Any:
        if self.closed:
            raise ValueError("attachment is closed")
        if acks not in ACKS:
            raise ValueError(f"acks must be 0, 1, -1 or 'all', not {acks!r}")
        deadline = time.monotonic() + timeout
        ack = ACKS[acks]
        # the leader, from the state table, once a send (``_enqueue`` takes it from here; once
        # more only after a wait, when it may have moved): 1 us each
        node = self._node_for(topic, partition)
        sent = self._send_now(topic, partition, write, count, ack, on_delivery,
                              sequenced and self.idempotent, node)
        if sent is not None:
            return sent
        reattached = self.reattached
        if not wait:
            if not (self.can_send(topic, partition) and self._ready_node(node)):
                return None
            return self._stamp_and_enqueue(topic, partition, write, count, ack, on_delivery,
                                           sequenced and self.idempotent, deadline, wait, node)
        session = self._session(node)
        sequenced = sequenced and self.idempotent
        known = self.producer_id
        if sequenced:
            try:
                self._ensure_producer(session)
            except SessionLostError:  # the worker died under the request: once more
                session = self._session(node)
                self._ensure_producer(session)
        # at most max_in_flight unanswered batches a partition, and none while the partition's
        # failed batches wait to be sent again with their sequences renumbered
        while not self.can_send(topic, partition):
            self.poll(0)
            known = -2  # a leader found before a wait is looked up again after it
            if self.can_send(topic, partition):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise BufferError(f"{self.max_in_flight} batches to {topic}-{partition} are "
                                  f"unanswered: the batch was not sent")
            session = self._session(node)
            self._await_answer(session, min(left, 0.05))
        if sequenced and self._reset_producer and not any(self._unanswered.values()):
            self._ensure_producer(session)
        if known != self.producer_id or reattached != self.reattached:
            node = -1  # waited (for answers, a producer id, a restarted worker): look again
        return self._stamp_and_enqueue(topic, partition, write, count, ack, on_delivery,
                                       sequenced, deadline, wait, node)

    def _send_now(self, topic: str, partition: int, write: Callable[..., int], count: int,
                  ack: int, on_delivery: Callable[[BatchResult], Any] | None, sequenced: bool,
                  node: int) -> BatchFuture | None:
        """The common send in one call, nothing to wait for: a live session to worker
        ``node`` (the leader), a producer id that stays (when ``sequenced``), room in flight
        and in the ring.  None, with nothing sent, for anything else: ``_submit``'s general
        path (``_stamp_and_enqueue`` / ``_enqueue``, which this inlines) takes it, and waits
        or refuses as it does.  Python layers cost ~0.1-0.3 us each on a warm cache, several
        times that after a sleep: at 10,000 sends a second each send starts cold."""
        session = self.sessions.get(node)
        if session is None or not session.alive or session.view is None:
            return None
        key = (topic, partition)
        unanswered = self._unanswered
        if unanswered.get(key, 0) >= self.max_in_flight or key in self._resend:
            return None
        if sequenced:
            pid = self.producer_id
            if pid < 0 or self._reset_producer:
                return None
            seq = self._sequences.get(key, 0)
            epoch = self.producer_epoch
        else:
            pid = epoch = seq = -1
        name = self._names.get(topic)
        if name is None:
            name = topic.encode("utf-8")
            if len(name) > 0xFFFF:
                raise ValueError("topic name too long")
            self._names[topic] = name
        size = write(_NO_VIEW, 0, -1, pid, epoch, seq)  # the size pass (no ring needed)
        entry_size = rings.PRODUCE_HEADER_SIZE + len(name) + size
        if entry_size > session.max_entry:
            return None  # the general path says why
        submit = session.submit
        at = submit.reserve(entry_size)
        if at < 0:
            return None
        view = session.view
        corr = self._corr = (self._corr + 1) & 0xFFFFFFFF
        rings.PRODUCE_HEADER.pack_into(view, at, entry_size, rings.PRODUCE, 0, corr,
                                       partition, len(name), ack, 0, 0)
        body = at + rings.PRODUCE_HEADER_SIZE
        view[body : body + len(name)] = name
        written = write(view, body + len(name), size, pid, epoch, seq)
        assert written == size
        future = BatchFuture(self, topic, partition, count, ack, on_delivery)
        future._deadline = time.monotonic() + self.delivery_timeout
        future._attempts = 1
        if sequenced:
            future._sequence = seq
            future._sequenced = True
        if submit.commit(entry_size, at):
            session.kick()
        entry = _InFlight(corr, at, entry_size, submit.tail, future)
        session.inflight.append(entry)
        if ack != 0:
            session.by_corr[corr] = entry
            unanswered[key] = unanswered.get(key, 0) + 1
        if sequenced:
            self._sequences[key] = (seq + count) & 0x7FFFFFFF
        return future

    def _stamp_and_enqueue(self, topic: str, partition: int, write: Callable[..., int],
                           count: int, ack: int,
                           on_delivery: Callable[[BatchResult], Any] | None, sequenced: bool,
                           deadline: float, wait: bool, node: int = -1) -> BatchFuture | None:
        """The batch with this moment's producer id, epoch and the partition's next sequence,
        into the ring (``_enqueue``, to worker ``node``, or the leader's when < 0); the
        sequence counts only once it is there."""
        key = (topic, partition)
        seq = self._sequences.get(key, 0) if sequenced else -1
        pid = self.producer_id if sequenced else -1
        epoch = self.producer_epoch if sequenced else -1
        future = BatchFuture(self, topic, partition, count, ack, on_delivery)
        future._deadline = time.monotonic() + self.delivery_timeout
        if sequenced:
            future._sequence = seq
            future._sequenced = True

        def stamped(view: Any, at: int, size: int) -> int:
            return write(view, at, size, pid, epoch, seq)

        if not self._enqueue(topic, partition, stamped, future, deadline, wait, node):
            return None
        if sequenced:
            self._sequences[key] = (seq + count) & 0x7FFFFFFF
        return future

    def can_send(self, topic: str, partition: int) -> bool:
        """Whether a batch to the partition would go out now (fewer than ``max_in_flight``
        unanswered and no failed batch waiting to be sent again)."""
        key = (topic, partition)
        return self._unanswered.get(key, 0) < self.max_in_flight and key not in self._resend

    def unanswered(self, topic: str, partition: int) -> int:
        return self._unanswered.get((topic, partition), 0)

    def _node_for(self, topic: str, partition: int) -> int:
        node = self.leader_of(topic, partition)
        if node is None:  # unknown here: any worker answers UNKNOWN_TOPIC_OR_PARTITION
            nodes = self._nodes()
            if not nodes:
                raise NotLocalError("the broker lists no workers")
            node = nodes[0]
        return node

    def _enqueue(self, topic: str, partition: int, write: Callable[[Any, int, int], int],
                 future: BatchFuture, deadline: float, wait: bool = True,
                 node: int = -1) -> bool:
        """One PRODUCE entry written by ``write(view, at, size)`` (``size`` < 0: only return
        the batch's size) into the ring of worker ``node`` (< 0: the partition's leader),
        answered to ``future``.  Without ``wait``: False (nothing written) when the session is
        not live or the ring has no room now."""
        name = topic.encode("utf-8")
        if len(name) > 0xFFFF:
            raise ValueError("topic name too long")
        if node < 0:
            node = self._node_for(topic, partition)
        size = write(_NO_VIEW, 0, -1)  # the size pass needs no ring (a worker may die now)
        entry_size = rings.PRODUCE_HEADER_SIZE + len(name) + size
        if wait:
            session, at = self._reserve_waiting(node, entry_size, deadline)
        else:
            live = self.sessions.get(node)
            if live is None or not live.alive or live.view is None:
                return False
            session = live
            if entry_size > session.max_entry:
                raise ValueError(f"a batch of {entry_size} bytes does not fit the ring "
                                 f"({session.max_entry} bytes at most): send smaller batches")
            at = session.submit.reserve(entry_size)
            if at < 0:
                return False
        view = session.view
        assert view is not None
        rings.PRODUCE_HEADER.pack_into(view, at, entry_size, rings.PRODUCE, 0, self._next_corr(),
                                       partition, len(name), future.acks, 0, 0)
        body = at + rings.PRODUCE_HEADER_SIZE
        view[body : body + len(name)] = name
        written = write(view, body + len(name), size)
        assert written == size
        future._attempts += 1
        if session.submit.commit(entry_size, at):
            session.kick()
        entry = _InFlight(self._corr, at, entry_size, session.submit.tail, future)
        session.inflight.append(entry)
        if future.acks != 0:
            session.by_corr[self._corr] = entry
            key = (topic, partition)
            self._unanswered[key] = self._unanswered.get(key, 0) + 1
        return True

    def _reserve_waiting(self, node: int, entry_size: int,
                         deadline: float) -> tuple[_Session, int]:
        """Room for an entry in the ring of worker ``node``, waiting for it (back-pressure, a
        reattach) until ``deadline``."""
        while True:
            session = self._session(node)  # reattached when the worker died (or raises
            if entry_size > session.max_entry:  # SessionLostError after the timeout)
                raise ValueError(f"a batch of {entry_size} bytes does not fit the ring "
                                 f"({session.max_entry} bytes at most): send smaller batches")
            try:
                at = self._reserve(session, entry_size, deadline)
            except SessionLostError:
                continue
            if session.view is not None and session.alive:
                return session, at
            # the session was closed while we waited for room: its reservation is void

    def _next_corr(self) -> int:
        self._corr = (self._corr + 1) & 0xFFFFFFFF
        return self._corr

    # -- completions ------------------------------------------------------------------------

    def poll(self, timeout: float = 0.0, *, reattach: bool = True) -> int:
        """Read the answers that arrived (running ``on_delivery`` callbacks); waits up to
        ``timeout`` for one when none is there.  Returns how many were handled.  A worker's
        death is noticed here; with ``reattach`` (the default) the restarted worker is waited
        for and the unanswered batches are sent to it again, without it that is left to
        ``revive`` / ``prepare`` and the call never waits for a worker (only ``timeout`` for
        answers from live ones)."""
        if not reattach and self._may_block:
            self._may_block = False
            try:
                return self.poll(timeout, reattach=False)
            finally:
                self._may_block = True
        deadline = time.monotonic() + timeout
        while True:
            handled = 0
            for session in list(self.sessions.values()):
                handled += self._poll_session(session, reattach)
            if self._resend_at:
                self._due_resends()
            if time.monotonic() >= self._expiry_check:
                handled += self._expire()
            left = deadline - time.monotonic()
            if handled or left <= 0:  # poll(0) between sends: no list of sessions to build
                return handled
            dead = reattach and any(not s.alive and s.view is not None
                                    for s in self.sessions.values())
            waiting = [s for s in self.sessions.values() if s.by_corr and s.alive]
            if not (waiting or dead or self._resend):
                return handled
            if dead:
                continue  # _poll_session reattaches
            if not waiting:  # only resends waiting for their backoff (or a worker)
                time.sleep(min(left, 0.01))
                continue
            self._await_answer(waiting[0], min(left, 0.1))

    def _await_answer(self, session: _Session, timeout: float) -> None:
        """Until the completion ring has an entry (spinning ``SPIN_S`` unless the last wait
        lasted longer, then asleep on the eventfd and the socket) or ``timeout`` passed."""
        completion = session.completion
        began = time.monotonic()
        spin_until = began + min(SPIN_S if session.answer_wait <= SPIN_S else 0.0, timeout)
        while time.monotonic() < spin_until:
            if completion.published() != completion.head:
                session.answer_wait = time.monotonic() - began
                return
            os.sched_yield()  # the worker may be waiting for this CPU (see _seqlock.h)
        if completion.set_sleeping():
            session.wait(timeout)
        completion.clear_sleeping()
        session.answer_wait = time.monotonic() - began

    def _poll_session(self, session: _Session, reattach: bool = True) -> int:
        handled = 0
        if session.alive:
            handled = self._read_completions(session)
            if not handled and session.by_corr:
                now = time.monotonic()
                if now - session.peeked >= PEEK_EVERY_S:  # did the worker die? (every wait
                    session.peeked = now                 # watches the socket anyway)
                    session.worker_gone()
        if not session.alive and session.view is not None:
            handled += self._read_completions(session)  # answers written before it died
            if session.view is None:  # reattached meanwhile (a resend went to its node)
                return handled
            if any(e.future.value is None for e in session.inflight):
                if reattach:
                    self._reattach(session)
            else:
                self._forget(session)
                session.close()
                if self.sessions.get(session.node_id) is session:
                    del self.sessions[session.node_id]
        return handled

    def _read_completions(self, session: _Session) -> int:
        completion, view = session.completion, session.view
        assert view is not None
        handled = 0
        resend: list[tuple[str, int]] = []
        while True:
            try:
                entry = completion.peek()
            except rings.RingCorruptError:
                session.alive = False
                break
            if entry is None:
                break
            at, length, kind, _ = entry
            if kind == rings.COMPLETION and length >= rings.COMPLETION_HEADER_SIZE:
                (_, _, _, corr, code, _, base, lat,
                 start) = rings.COMPLETION_HEADER.unpack_from(view, at)
                message = None
                if length > rings.COMPLETION_HEADER_SIZE:
                    message = str(view[at + rings.COMPLETION_HEADER_SIZE : at + length], "utf-8",
                                  "replace")
                inflight = session.by_corr.pop(corr, None)
                if inflight is not None:
                    f = inflight.future
                    key = (f.topic, f.partition)
                    self._unanswered[key] -= 1
                    if f.value is not None:
                        pass  # expired before (_expire): the late answer only frees its place
                    elif code and code != DUPLICATE_SEQUENCE and self._retry(
                            f, code, view, inflight.at, inflight.length):
                        pass  # sent again once the partition's batches are all answered
                    else:
                        if f._sequenced and (not code or code == DUPLICATE_SEQUENCE):
                            self._confirmed[key] = (f._sequence + f.count) & 0x7FFFFFFF
                        elif f._sequenced:
                            if code in UNKNOWN_PRODUCER_STATE:
                                self._reset_producer = True
                            else:  # refused before its sequence counted: later batches
                                self._rewinding.add(key)  # come back OUT_OF_ORDER; renumber
                        f._set(BatchResult(f.topic, f.partition, base, f.count, code, message,
                                           lat, start))
                        handled += 1
                    if not self._unanswered[key] and (key in self._resend
                                                      or key in self._rewinding):
                        resend.append(key)
            completion.advance(length)
        if handled:
            if completion.release():
                session.kick()
        # acks=0 entries are done once the worker took them (its head passed them)
        queue = session.inflight
        head = _fast.ring.load_u64(view, session.submit.control + rings.HEAD) \
            if queue and (queue[0].future.acks == 0 or len(queue) > 1) else 0
        while queue and (queue[0].future.value is not None or
                         (queue[0].future.acks == 0 and queue[0].end <= head)):
            e = queue.popleft()
            if e.future.value is None:
                f = e.future
                f._set(BatchResult(f.topic, f.partition, -1, f.count, 0, None, -1, -1))
        for key in resend:  # once this ring is read: sending may poll it again
            if not self._unanswered.get(key, 0):
                self._schedule_resend(key)
        return handled

    def _expire(self) -> int:
        """Answer ``MSG_TIMED_OUT`` to every batch in flight past its delivery timeout (a live
        worker that never answers: stopped, wedged), as librdkafka's ``message.timeout.ms`` and
        Java's ``delivery.timeout.ms`` do.  The batch may still be appended if the worker wakes
        up (as with Kafka); its late answer is ignored.  The broker's idea of this producer's
        sequences is then unknown: a new producer id once nothing is in flight (KIP-360's
        fallback)."""
        now = time.monotonic()
        self._expiry_check = now + EXPIRY_CHECK_S
        expired = 0
        for session in list(self.sessions.values()):
            for entry in session.inflight:
                f = entry.future
                if f.value is not None or now < f._deadline:
                    continue
                # the entry stays in by_corr and counted in flight: it is still in the ring,
                # unanswered, until the worker answers it (ignored, it is reported) or dies --
                # what Java's connection does with a request past delivery.timeout.ms
                if f._sequenced:
                    self._reset_producer = True
                f._set(BatchResult(f.topic, f.partition, -1, f.count, MSG_TIMED_OUT,
                                   f"no answer within the delivery timeout "
                                   f"({self.delivery_timeout:g} s)", -1, -1))
                expired += 1
        return expired

    # -- failed batches ---------------------------------------------------------------------

    def _retry(self, f: BatchFuture, code: int, view: Any, at: int, length: int) -> bool:
        """Keep a failed batch to send again (True), or let its error stand (False).

        Retriable errors are retried until the delivery timeout.  An idempotent partition whose
        batch was refused for good (MESSAGE_TOO_LARGE, say) has its later in-flight batches
        answered OUT_OF_ORDER_SEQUENCE_NUMBER (the broker still expects the refused batch's
        sequence): those are sent again with their sequences moved down, as the Java producer's
        ``adjustSequencesDueToFailedBatch`` does, instead of failing them."""
        key = (f.topic, f.partition)
        if time.monotonic() >= f._deadline:
            return False
        if not (code in RETRIABLE or (code == OUT_OF_ORDER_SEQUENCE and f._sequenced
                                      and (key in self._rewinding or key in self._resend))):
            return False
        # the entry's bytes are intact until the ring reuses its space, which only our next
        # reserve does: copy the batch (after the entry header and the topic name) now
        name_len = rings.PRODUCE_HEADER.unpack_from(view, at)[5]
        body = at + rings.PRODUCE_HEADER_SIZE + name_len
        batch = bytearray(view[body : at + length])
        self._resend.setdefault(key, []).append((f, batch))
        if code != OUT_OF_ORDER_SEQUENCE:
            self._resend_at[key] = time.monotonic() + self.retry_backoff
        return True

    def _schedule_resend(self, key: tuple[str, int]) -> None:
        """Every batch of the partition is answered: the next batch takes the sequence the
        broker expects, and the kept ones are sent again, now or after the retry backoff
        (``poll`` sends those whose time came)."""
        if key not in self._resend:
            self._rewinding.discard(key)
            if key in self._sequences:
                self._sequences[key] = self._confirmed.get(key, 0)
        elif time.monotonic() >= self._resend_at.get(key, 0.0) and self._may_resend(key):
            self._send_again(key)
        else:  # after the backoff, or once the partition is ready again: _due_resends
            self._resend_at.setdefault(key, time.monotonic())

    def _send_again(self, key: tuple[str, int]) -> None:
        todo = self._resend.pop(key)
        origin = self._confirmed.get(key, 0)
        todo.sort(key=lambda item: _seq_order(item[0]._sequence, origin))  # stable: unsequenced
        self._resend_at.pop(key, None)
        self._rewinding.discard(key)
        topic, partition = key
        now = time.monotonic()
        if self._reset_producer and not any(self._unanswered.values()):
            node = self._node_for(topic, partition)
            self._ensure_producer(self._session(node))
        seq = self._confirmed.get(key, 0)
        wait = self._may_block
        for i, (f, batch) in enumerate(todo):
            if now >= f._deadline:
                if f._sequenced:
                    self._reset_producer = True
                f._set(BatchResult(f.topic, f.partition, -1, f.count, MSG_TIMED_OUT,
                                   "delivery timeout passed while retrying", -1, -1))
                continue
            if f._sequenced:
                _restamp(batch, self.producer_id, self.producer_epoch, seq)

            def write(view: Any, at: int, size: int, data: bytearray = batch) -> int:
                if size >= 0:
                    view[at : at + len(data)] = data
                return len(data)

            try:
                sent = self._enqueue(topic, partition, write, f, now + 30.0, wait)
            except (BufferError, SessionLostError, NotLocalError, AttachError, OSError) as exc:
                f._set(BatchResult(f.topic, f.partition, -1, f.count, NETWORK_EXCEPTION,
                                   f"could not send the batch again: {exc}", -1, -1))
                continue
            if not sent:
                # a call that must not wait (poll(reattach=False), produce, the producer's
                # thread): the ring has no room now, or the session just went.  This batch and
                # the rest stay, in order, for the next look (_due_resends), which renumbers
                # them from the sequence the broker then expects (numbered on from here
                # meanwhile, so that they keep their order behind the ones sent)
                rest = todo[i:]
                self._resend[key] = rest
                self._resend_at[key] = now
                after = seq
                for g, _ in rest:
                    if g._sequenced:
                        g._sequence = after
                        after = (after + g.count) & 0x7FFFFFFF
                break
            if f._sequenced:
                f._sequence = seq
                seq = (seq + f.count) & 0x7FFFFFFF
        if any(f._sequenced for f, _ in todo):
            self._sequences[key] = seq

    def _due_resends(self) -> None:
        if not self._resend_at:
            return
        now = time.monotonic()
        for key in [k for k, t in self._resend_at.items()
                    if t <= now and not self._unanswered.get(k, 0)]:
            if self._may_resend(key):
                self._send_again(key)

    def _may_resend(self, key: tuple[str, int]) -> bool:
        """Whether failed batches may be sent again now: always from a call that may wait for
        a worker, else only to a ready partition (``prepare`` makes it ready)."""
        return self._may_block or self.ready(*key)

    def resends_waiting(self) -> list[tuple[str, int]]:
        """The partitions whose failed batches wait to be sent again."""
        return list(self._resend)

    def flush(self, timeout: float = 30.0) -> int:
        """Wait until every batch sent has its answer; returns how many are still unanswered."""
        deadline = time.monotonic() + timeout
        while True:
            pending = sum(len(s.inflight) for s in self.sessions.values()) + sum(
                len(v) for v in self._resend.values())
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                return pending
            self.poll(min(left, 0.1))

    # -- read -------------------------------------------------------------------------------

    def reader(self, topic: str, partition: int) -> PartitionReader:
        key = (topic, partition)
        r = self.readers.get(key)
        if r is None:
            slot = self.slot_of(topic, partition)
            if slot is None:
                raise KafkaApiError(UNKNOWN_TOPIC_OR_PARTITION,
                                    f"{topic}-{partition} is not in the broker's slot directory")
            r = PartitionReader(self.table, slot,
                                lambda node: self.partition_dir(topic, partition, node),
                                self.buffers)
            self.readers[key] = r
        return r

    def read(self, topic: str, partition: int, offset: int, max_records: int = 1 << 20, *,
             timeout: float = 0.0, isolation: str = READ_UNCOMMITTED,
             max_bytes: int = 64 << 20) -> ReadResult:
        """Whole batches from ``offset`` on, never past the high watermark (see
        ``PartitionReader.read``); zero-copy views of the mapped segment."""
        return self.reader(topic, partition).read(offset, max_records, max_bytes=max_bytes,
                                                  timeout=timeout, isolation=isolation)

    def read_arrow(self, topic: str, partition: int, offset: int, max_records: int = 1 << 20,
                   *, timeout: float = 0.0, include_headers: bool = False,
                   isolation: str = READ_UNCOMMITTED, verify_crc: bool = True
                   ) -> tuple[Any, int]:
        """``(pyarrow.RecordBatch in the spark_bridge schema, next offset)``; ``verify_crc``
        as ``ReadResult.to_arrow``'s."""
        got = self.read(topic, partition, offset, max_records, timeout=timeout,
                        isolation=isolation)
        return got.to_arrow(topic, partition, include_headers=include_headers,
                            verify_crc=verify_crc), got.next_offset

    def iter_arrow(self, topic: str, partition: int, offset: int, max_records: int = 1 << 16,
                   *, end: int | None = None, timeout: float = 0.0,
                   include_headers: bool = False, isolation: str = READ_UNCOMMITTED,
                   ahead: int = 2) -> Iterator[tuple[Any, int]]:
        """``(RecordBatch, next offset)`` for the records from ``offset`` on, ``max_records`` at
        most each, up to ``end`` (exclusive; waiting up to ``timeout`` for each next one), or
        without ``end`` until a read finds nothing new within ``timeout``.  Reads are made in
        order here; up to ``ahead`` of them are decoded into Arrow meanwhile by threads (the
        decoder runs without the GIL), so a large read uses more than one core.  Every read is
        bounded by the high watermark at its time, as ``read_arrow``'s."""
        from concurrent.futures import ThreadPoolExecutor

        if self._decoders is None or self._decoders_size != ahead:
            if self._decoders is not None:
                self._decoders.shutdown(wait=True)
            self._decoders = ThreadPoolExecutor(max(1, ahead), thread_name_prefix="shmq-arrow")
            self._decoders_size = ahead
        decoders = self._decoders
        pending: deque[tuple[Any, int]] = deque()
        at = offset
        done = False
        while True:
            while not done and len(pending) < ahead and (end is None or at < end):
                want = max_records if end is None else min(max_records, end - at)
                got = self.read(topic, partition, at, want, isolation=isolation,
                                timeout=0.0 if pending else timeout)
                if not len(got):
                    done = not pending  # nothing new: stop once the decoded ones are out
                    break
                pending.append((decoders.submit(got.to_arrow, topic, partition,
                                                include_headers=include_headers),
                                got.next_offset))
                at = got.next_offset
            if not pending:
                return
            future, nxt = pending.popleft()
            yield future.result(), nxt

    # -- end --------------------------------------------------------------------------------

    def close(self, timeout: float = 30.0) -> None:
        if self.closed:
            return
        try:
            self.flush(timeout)
        finally:
            self.closed = True
            for session in self.sessions.values():
                session.close()
            self.sessions.clear()
            for r in self.readers.values():
                r.close()
            self.readers.clear()
            self.buffers.clear()
            if self._decoders is not None:
                self._decoders.shutdown(wait=True)
                self._decoders = None
            self.table.close()

    def __enter__(self) -> LocalBroker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
