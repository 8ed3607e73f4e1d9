"""The transaction coordinator (Kafka's ``TransactionCoordinator`` / ``TransactionStateManager``),
in the controller beside the group coordinator.

Theory of operation
-------------------
A transactional id maps to one ``TxnMetadata``: producer id, epoch, timeout, state, the
partitions of the open transaction and two timestamps.  Every change is first written as a
record of ``__transaction_state`` (Kafka's layout, below) in the controller's log directory,
through the same storage engine (``OffsetsLog``: Kafka segments, recovery, group-committed
fsyncs), and the request is answered once that record is durable.  The state machine is
Kafka's (``TransactionState``)::

    Empty --AddPartitions/AddOffsets--> Ongoing --EndTxn--> PrepareCommit --markers--> CompleteCommit
                                           |                PrepareAbort  --markers--> CompleteAbort
                                           +--timeout / InitProducerId (fence)--> PrepareAbort (epoch+1)
    Empty / Complete* --InitProducerId--> Empty (epoch+1; a new producer id at epoch 32767)

EndTxn writes PrepareCommit/PrepareAbort, then a COMMIT/ABORT marker (a control batch carrying
the coordinator epoch) into every partition of the transaction, through ``write_markers``
(the controller sends them to each partition's worker over its control channel, retrying
through worker restarts; a ``__consumer_offsets`` partition is the group coordinator's own),
then CompleteCommit/CompleteAbort (its fsync not awaited: a lost Complete record only means
the markers are written again at the next start), and only then answers.  A request arriving meanwhile gets
CONCURRENT_TRANSACTIONS (51), which clients retry.  A second InitProducerId for an id whose
transaction is open fences the first producer: the epoch is bumped, the transaction aborted
with markers of the new epoch (the old epoch's writes are then refused by every partition,
INVALID_PRODUCER_EPOCH), and the caller told CONCURRENT_TRANSACTIONS until that is done.  A
transaction open past its ``transaction.timeout.ms`` is aborted the same way by a timer
(``transaction.abort.timed.out.transaction.cleanup.interval.ms``), so the partitions' last
stable offsets move on.

Recovery: at start the log is replayed (last record of an id wins); a transaction found in
PrepareCommit/PrepareAbort (the controller died while writing markers) has its markers written
again once the workers are up, then completes.  Markers are idempotent enough for that: a second
marker of an ended transaction ends nothing.  An Ongoing one stays open until its producer ends
it or its timeout aborts it.

``__transaction_state`` records (``TransactionLogKey.json`` v0 / ``TransactionLogValue.json``
v1, the flexible version Kafka writes once ``transaction.version`` is 1 or more; v0 is read)::

    key    int16 version 0 | string transactionalId
    value  int16 version 1 | int64 producerId | int16 producerEpoch | int32 transactionTimeoutMs
           | int8 transactionStatus | compact [compact string topic | compact [int32 partition]
           | tags] (null when Empty) | int64 lastUpdateTimestampMs
           | int64 transactionStartTimestampMs
           | tags: 0 PreviousProducerId int64, 1 NextProducerId int64,
                   2 ClientTransactionVersion int16 (each only when not its default)

Kafka 4.3 writes tag 2; shmq also writes tag 0 after a producer id rotation and tag 1 in the
Prepare record of a transaction whose end rotates the producer id (its epoch ran out), which
Kafka's reader reads, so that recovery finishes such a transaction with the new id.

Transaction version 2 (KIP-890 part 2; ``transaction.version`` finalized at 2 in ApiVersions,
decided per request version as Kafka does): EndTxn v5 bumps the producer epoch at every end
(Prepare carries epoch + 1, the markers too, checked strictly above the producer's epoch in
each partition), and answers the new producer id and epoch, a new producer id at epoch 0 when
the epoch would pass 32766; Produce v12 and TxnOffsetCommit v5 add their partition to the
transaction implicitly (``add_partition_implicitly``, the worker's ``add_txn_partition``).
Requests of the older versions (librdkafka, kafka-python, aiokafka) run as before: no bump at
EndTxn v0-4, partitions added by AddPartitionsToTxn and verified (KIP-890 part 1).  A fence
(InitProducerId over an open transaction, a timeout) bumps the epoch once, whatever the
version (KAFKA-19367).

The coordinator epoch written into markers is the leader epoch of the id's ``__transaction_state``
partition: 0, as node 0 leads it for good.  Not done: AddPartitionsToTxn v4-5 (the batched
broker form; the workers reach the coordinator over their control channel).

EndTxn's end (Prepare, markers, Complete) runs in a task of the coordinator's own, so a client
that closes its connection meanwhile (its request cancelled) does not leave the transaction in
Prepare* with nobody writing its markers.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from shmq.coordinator.offsets_log import OffsetsLog
from shmq.coordinator.records import partition_for
from shmq.protocol.kio_guard import write_uvarint as _uvarint

log = logging.getLogger("shmq.coordinator")

TOPIC = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"
COORDINATOR_EPOCH = 0

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
COORDINATOR_NOT_AVAILABLE = 15
INVALID_REQUEST = 42
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
OPERATION_NOT_ATTEMPTED = 55
TRANSACTIONAL_ID_NOT_FOUND = 105
PRODUCER_FENCED = 90
MAX_EPOCH = 32767
TRANSACTION_VERSION = 2      # the finalized ``transaction.version`` (ApiVersions)


class TxnState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        return "".join(w.title() for w in self.name.split("_"))


@dataclass(frozen=True)
class TxnConfig:
    max_timeout_ms: int = 900_000              # transaction.max.timeout.ms
    abort_check_interval_ms: int = 10_000      # transaction.abort.timed.out.transaction.cleanup.interval.ms
    partitions: int = 50                       # transaction.state.log.num.partitions
    segment_bytes: int = 16 << 20              # transaction.state.log.segment.bytes


@dataclass
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    update_ms: int = -1
    start_ms: int = -1
    prev_producer_id: int = -1   # the id before the last rotation (an EndTxn v5 retry)
    next_producer_id: int = -1   # the id an ending transaction rotates to (epoch ran out)
    client_tv: int = 0           # the transaction version its client ran (markers' checks)
    busy: bool = False           # a state change (markers) under way: CONCURRENT_TRANSACTIONS


# -- records --------------------------------------------------------------------------------

_H, _I, _Q, _B = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q"), struct.Struct(">b")


def _str(s: str) -> bytes:
    b = s.encode()
    return _H.pack(len(b)) + b


def txn_key(transactional_id: str) -> bytes:
    return _H.pack(0) + _str(transactional_id)


def _compact_str(s: str) -> bytes:
    b = s.encode()
    return _uvarint(len(b) + 1) + b


def txn_value(m: TxnMetadata) -> bytes:
    """``TransactionLogValue`` v1 (flexible), as Kafka writes it with transaction.version 2."""
    out = bytearray(_H.pack(1))
    out += struct.pack(">qhib", m.producer_id, m.producer_epoch, m.timeout_ms, int(m.state))
    if m.state == TxnState.EMPTY:
        out += _uvarint(0)  # null
    else:
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(m.partitions):
            by_topic.setdefault(t, []).append(p)
        out += _uvarint(len(by_topic) + 1)
        for t, parts in by_topic.items():
            out += _compact_str(t) + _uvarint(len(parts) + 1)
            out += b"".join(_I.pack(p) for p in parts) + _uvarint(0)
    out += _Q.pack(m.update_ms) + _Q.pack(m.start_ms)
    tags: list[tuple[int, bytes]] = []
    if m.prev_producer_id not in (-1, m.producer_id):
        tags.append((0, _Q.pack(m.prev_producer_id)))
    if m.next_producer_id != -1:
        tags.append((1, _Q.pack(m.next_producer_id)))
    if m.client_tv != 0:
        tags.append((2, _H.pack(m.client_tv)))
    out += _uvarint(len(tags))
    for tag, data in tags:
        out += _uvarint(tag) + _uvarint(len(data)) + data
    return bytes(out)


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def take(self, s: struct.Struct) -> int:
        if self.pos + s.size > len(self.buf):
            raise ValueError("__transaction_state record is truncated")
        v = s.unpack_from(self.buf, self.pos)[0]
        self.pos += s.size
        return int(v)

    def uvarint(self) -> int:
        n = shift = 0
        while True:
            if self.pos >= len(self.buf) or shift > 28:
                raise ValueError("bad varint in a __transaction_state record")
            b = self.buf[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7

    def raw(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError("bad length in a __transaction_state record")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def string(self, compact: bool = False) -> str:
        n = self.uvarint() - 1 if compact else self.take(_H)
        return self.raw(n).decode()


def decode_key(key: bytes) -> str:
    r = _Reader(key)
    version = r.take(_H)
    if version != 0:
        raise ValueError(f"unknown __transaction_state key version {version}")
    return r.string()


def decode_value(transactional_id: str, value: bytes) -> TxnMetadata:
    """A ``TransactionLogValue`` of version 0 or 1 (unknown tagged fields are skipped)."""
    r = _Reader(value)
    version = r.take(_H)
    if version not in (0, 1):
        raise ValueError(f"unknown __transaction_state value version {version}")
    flexible = version == 1
    pid, epoch, timeout, status = r.take(_Q), r.take(_H), r.take(_I), r.take(_B)
    if not 0 <= status < len(TxnState):
        raise ValueError(f"unknown transaction status {status}")
    partitions: set[tuple[str, int]] = set()
    n = r.uvarint() - 1 if flexible else r.take(_I)
    for _ in range(max(n, 0)):
        topic = r.string(flexible)
        count = r.uvarint() - 1 if flexible else r.take(_I)
        for _ in range(max(count, 0)):
            partitions.add((topic, r.take(_I)))
        if flexible:
            for _ in range(r.uvarint()):
                r.uvarint()
                r.raw(r.uvarint())
    update, start = r.take(_Q), r.take(_Q)
    m = TxnMetadata(transactional_id, pid, epoch, timeout, TxnState(status), partitions,
                    update, start)
    if flexible:
        for _ in range(r.uvarint()):
            tag, size = r.uvarint(), r.uvarint()
            data = r.raw(size)
            if tag == 0 and size == 8:
                m.prev_producer_id = _Q.unpack(data)[0]
            elif tag == 1 and size == 8:
                m.next_producer_id = _Q.unpack(data)[0]
            elif tag == 2 and size == 2:
                m.client_tv = _H.unpack(data)[0]
    return m


def _now_ms() -> int:
    return int(time.time() * 1000)


# topic, partition, producer id, epoch, commit, transaction version of the marker's check
Marker = tuple[str, int, int, int, bool, int]


class TransactionCoordinator:
    """``write_markers(markers)`` writes COMMIT/ABORT markers into worker partitions and returns
    once each is written; ``offsets_marker(partition, pid, epoch, commit, tv)`` writes one into the
    group coordinator's ``__consumer_offsets`` partition; ``new_producer_id()`` allocates ids;
    ``topic_partitions(topic)`` says how many partitions a topic has."""

    def __init__(self, directory: Path, config: TxnConfig,
                 new_producer_id: Callable[[], Awaitable[int]],
                 write_markers: Callable[[list[Marker]], Awaitable[None]],
                 offsets_marker: Callable[[int, int, int, bool, int], Awaitable[None]],
                 topic_partitions: Callable[[str], int | None],
                 offsets_partitions: Callable[[], int], *,
                 registered_partitions: int | None = None) -> None:
        """``registered_partitions``: the partition count ``__transaction_state`` has in the
        cluster metadata (fixed once registered), else ``config.partitions``."""
        self.config = config
        self.log = OffsetsLog(directory, registered_partitions or config.partitions,
                              config.segment_bytes, config.segment_bytes, topic=TOPIC)
        self.txns: dict[str, TxnMetadata] = {}
        self.new_producer_id = new_producer_id
        self.write_markers = write_markers
        self.offsets_marker = offsets_marker
        self.topic_partitions = topic_partitions
        self.offsets_partitions = offsets_partitions
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.closed = False

    # -- life cycle -----------------------------------------------------------------------

    def load(self) -> list[TxnMetadata]:
        """Replay ``__transaction_state``; returns the transactions caught mid-marker."""
        for p in self.log.partitions_on_disk():
            for key, value in self.log.replay(p):
                try:
                    tid = decode_key(key)
                    if value is None:
                        self.txns.pop(tid, None)
                    else:
                        self.txns[tid] = decode_value(tid, value)
                except (ValueError, IndexError, UnicodeDecodeError) as exc:
                    log.error("skipping an unreadable __transaction_state record: %s", exc)
        pending = [m for m in self.txns.values()
                   if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)]
        log.info("transaction coordinator loaded %d transactional ids (%d ending)",
                 len(self.txns), len(pending))
        return pending

    def start(self, pending: Sequence[TxnMetadata] = ()) -> None:
        """Finish the transactions recovery found mid-marker, and start the timeout timer."""
        for m in pending:
            m.busy = True
            self._spawn(self._complete(m, m.state == TxnState.PREPARE_COMMIT))
        self._schedule()

    def _spawn(self, coro: Any) -> asyncio.Future:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        self.log.close()

    def _schedule(self) -> None:
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.config.abort_check_interval_ms / 1000,
                                      self._abort_timed_out)

    def _abort_timed_out(self) -> None:
        """Kafka's ``abortTimedOutTransactions``: bump the epoch (fencing the producer) and
        abort."""
        now = _now_ms()
        for m in list(self.txns.values()):
            if (m.state == TxnState.ONGOING and not m.busy
                    and m.start_ms + m.timeout_ms <= now):
                log.info("transaction %s (producer %d epoch %d) timed out after %d ms: aborting",
                         m.transactional_id, m.producer_id, m.producer_epoch, m.timeout_ms)
                self._spawn(self._fence_and_abort(m, timed_out=True))
        self._schedule()

    # -- persistence ----------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.log.partitions)

    async def _persist(self, m: TxnMetadata, wait: bool = True) -> int:
        """Append the id's record; with ``wait``, return once it is fsynced."""
        m.update_ms = _now_ms()
        p = self.partition_for(m.transactional_id)
        try:
            end = self.log.append(p, [(txn_key(m.transactional_id), txn_value(m))])
            if wait:  # the flush goes on if the client leaves meanwhile (this is cancelled)
                await asyncio.shield(self.log.durable(p, end))
            else:
                self._spawn(self._durable_later(p, end))
        except (OSError, ValueError) as exc:
            log.error("cannot write __transaction_state-%d: %s", p, exc)
            return COORDINATOR_NOT_AVAILABLE
        return NONE

    async def _durable_later(self, partition: int, end: int) -> None:
        try:
            await self.log.durable(partition, end)
        except (OSError, ValueError) as exc:
            log.error("cannot flush __transaction_state-%d: %s", partition, exc)

    # -- InitProducerId -------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               producer_id: int = -1, producer_epoch: int = -1
                               ) -> tuple[int, int, int]:
        """(error, producer id, epoch)."""
        if not transactional_id:
            return INVALID_REQUEST, -1, -1
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return INVALID_TRANSACTION_TIMEOUT, -1, -1
        m = self.txns.get(transactional_id)
        if m is None:
            pid = await self.new_producer_id()
            m = self.txns.get(transactional_id)  # another request may have won meanwhile
            if m is None:
                m = TxnMetadata(transactional_id, pid, 0, timeout_ms, start_ms=-1)
                self.txns[transactional_id] = m
                m.busy = True
                try:
                    error = await self._persist(m)
                finally:
                    m.busy = False
                if error:
                    del self.txns[transactional_id]
                    return error, -1, -1
                return NONE, m.producer_id, m.producer_epoch
        if m.busy or m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT,
                                 TxnState.PREPARE_EPOCH_FENCE):
            return CONCURRENT_TRANSACTIONS, -1, -1
        if producer_id >= 0 and (producer_id != m.producer_id
                                 or producer_epoch != m.producer_epoch) \
                and not (producer_id == m.prev_producer_id and producer_epoch >= MAX_EPOCH - 1
                         and m.producer_epoch == 0):
            # KIP-360: the producer says who it was; a stale one is fenced (the id before a
            # rotation at an exhausted epoch is its own retry)
            return PRODUCER_FENCED, -1, -1
        if m.state == TxnState.ONGOING:
            m.busy = True
            self._spawn(self._fence_and_abort(m, already_busy=True))
            return CONCURRENT_TRANSACTIONS, -1, -1
        m.busy = True
        try:
            if m.producer_epoch >= MAX_EPOCH - 1:
                m.prev_producer_id = m.producer_id
                m.producer_id, m.producer_epoch = await self.new_producer_id(), 0
            else:
                m.producer_epoch += 1
            m.timeout_ms = timeout_ms
            m.state = TxnState.EMPTY
            m.partitions.clear()
            m.start_ms = -1
            error = await self._persist(m)
        finally:
            m.busy = False
        if error:
            return error, -1, -1
        return NONE, m.producer_id, m.producer_epoch

    # -- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------

    def _check_producer(self, m: TxnMetadata | None, producer_id: int,
                        producer_epoch: int) -> int:
        if m is None or m.producer_id != producer_id:
            return INVALID_PRODUCER_ID_MAPPING
        if m.producer_epoch != producer_epoch:
            return PRODUCER_FENCED
        if m.busy or m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT,
                                 TxnState.PREPARE_EPOCH_FENCE):
            return CONCURRENT_TRANSACTIONS
        return NONE

    async def add_partitions(self, transactional_id: str, producer_id: int,
                             producer_epoch: int, partitions: Sequence[tuple[str, int]],
                             client_tv: int = 0) -> dict[tuple[str, int], int]:
        """One error per partition (Kafka: OPERATION_NOT_ATTEMPTED for the good ones when
        some are unknown).  ``client_tv``: 2 when a partition leader or the group coordinator
        adds it for a transaction version 2 client (Produce v12, TxnOffsetCommit v5)."""
        m = self.txns.get(transactional_id)
        error = self._check_producer(m, producer_id, producer_epoch)
        if error:
            return {tp: error for tp in partitions}
        assert m is not None
        unknown = {tp for tp in partitions
                   if (n := self.topic_partitions(tp[0])) is None or not 0 <= tp[1] < n}
        if unknown:
            return {tp: UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else OPERATION_NOT_ATTEMPTED
                    for tp in partitions}
        new = set(partitions) - m.partitions
        if m.state == TxnState.ONGOING and not new:
            return {tp: NONE for tp in partitions}
        m.busy = True
        try:
            if m.state != TxnState.ONGOING:
                m.start_ms = _now_ms()
                m.partitions.clear()
            old_tv = m.client_tv
            m.state = TxnState.ONGOING
            m.partitions |= new
            m.client_tv = client_tv
            error = await self._persist(m)
            if error:
                m.client_tv = old_tv
        finally:
            m.busy = False
        return {tp: error for tp in partitions}

    async def add_partition_implicitly(self, transactional_id: str, producer_id: int,
                                       producer_epoch: int, topic: str, partition: int) -> int:
        """Transaction version 2: the first Produce v12 batch of a transaction in a partition
        (or TxnOffsetCommit v5 in a group's ``__consumer_offsets`` partition) adds it, as
        Kafka's partition leader does through ``AddPartitionsToTxnManager`` (not verify-only):
        the coordinator's own answer (PRODUCER_FENCED, CONCURRENT_TRANSACTIONS, ...), which
        the caller maps for its client."""
        if not transactional_id:
            return INVALID_REQUEST
        for _ in range(500):
            m = self.txns.get(transactional_id)
            # another partition's add being made durable (two workers' first batches of one
            # request): wait for it rather than answer CONCURRENT_TRANSACTIONS, which the
            # client would retry after its backoff
            if m is None or not (m.busy and m.state == TxnState.ONGOING
                                 and m.producer_id == producer_id
                                 and m.producer_epoch == producer_epoch):
                break
            await asyncio.sleep(0.002)
        errors = await self.add_partitions(transactional_id, producer_id, producer_epoch,
                                           [(topic, partition)], client_tv=TRANSACTION_VERSION)
        return next(iter(errors.values()))

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          group_id: str) -> int:
        p = partition_for(group_id, self.offsets_partitions())
        errors = await self.add_partitions(transactional_id, producer_id, producer_epoch,
                                           [(OFFSETS_TOPIC, p)])
        return next(iter(errors.values()))

    def check_txn_offset_commit(self, transactional_id: str, producer_id: int,
                                producer_epoch: int) -> int:
        m = self.txns.get(transactional_id)
        if m is None or m.producer_id != producer_id:
            return INVALID_PRODUCER_ID_MAPPING
        if m.producer_epoch != producer_epoch:
            return PRODUCER_FENCED
        if m.state != TxnState.ONGOING or m.busy:
            return INVALID_TXN_STATE if not m.busy else CONCURRENT_TRANSACTIONS
        return NONE

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
               topic: str, partition: int) -> int:
        """KIP-890 part 1: may this producer open a transaction in this partition?  Only when
        its transaction is Ongoing with the partition added, at its current epoch: a write
        arriving late (after its transaction ended, or from a fenced producer) is refused, so
        it can never leave a transaction open that no marker will close (a hanging
        transaction, which would hold the partition's LSO for good)."""
        m = self.txns.get(transactional_id)
        if m is None or m.producer_id != producer_id:
            return INVALID_TXN_STATE
        if producer_epoch < m.producer_epoch:
            return INVALID_PRODUCER_EPOCH
        if (m.state != TxnState.ONGOING or producer_epoch != m.producer_epoch
                or (topic, partition) not in m.partitions):
            return INVALID_TXN_STATE
        return NONE

    # -- EndTxn ---------------------------------------------------------------------------

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                      commit: bool, client_tv: int = 0) -> tuple[int, int, int]:
        """(error, producer id, epoch).  ``client_tv`` is the request's transaction version
        (EndTxn v5: 2): with 2 the epoch is bumped at the end (a new producer id when it runs
        out) and the answer carries the new pair; v0-4 answer -1, -1."""
        if client_tv >= 2:
            return await self._end_txn_v2(transactional_id, producer_id, producer_epoch, commit)
        m = self.txns.get(transactional_id)
        if m is None or m.producer_id != producer_id:
            return INVALID_PRODUCER_ID_MAPPING, -1, -1
        if m.producer_epoch != producer_epoch:
            return PRODUCER_FENCED, -1, -1
        if m.busy:
            return CONCURRENT_TRANSACTIONS, -1, -1
        if m.state == TxnState.ONGOING:
            return (await self._end(m, commit, client_tv, bump=False))[0], -1, -1
        if m.state == TxnState.COMPLETE_COMMIT:  # a retry of an EndTxn that succeeded
            return (NONE if commit else INVALID_TXN_STATE), -1, -1
        if m.state == TxnState.COMPLETE_ABORT:
            return (NONE if not commit else INVALID_TXN_STATE), -1, -1
        if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return CONCURRENT_TRANSACTIONS, -1, -1
        return INVALID_TXN_STATE, -1, -1  # Empty

    async def _end_txn_v2(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          commit: bool) -> tuple[int, int, int]:
        """Kafka's ``endTransaction`` for transaction version 2.  The epoch names the
        transaction: a retry of an end that succeeded carries the epoch before the bump (or
        the last one before a producer id rotation) and gets NONE with the current pair; the
        current epoch on a completed transaction is the next transaction's end (an abort
        with no partitions is allowed: it only bumps the epoch)."""
        m = self.txns.get(transactional_id)
        if not transactional_id:
            return INVALID_REQUEST, -1, -1
        if m is None:
            return INVALID_PRODUCER_ID_MAPPING, -1, -1
        retry_on_overflow = (m.prev_producer_id == producer_id
                             and producer_epoch == MAX_EPOCH - 1 and m.producer_epoch == 0)
        retry_on_bump = m.producer_epoch == producer_epoch + 1
        if m.producer_id != producer_id and not retry_on_overflow:
            return INVALID_PRODUCER_ID_MAPPING, -1, -1
        state = m.state
        if state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            valid = retry_on_bump
        elif state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
            valid = retry_on_bump or retry_on_overflow or producer_epoch == m.producer_epoch
        else:
            valid = producer_epoch == m.producer_epoch
        if not valid:
            return PRODUCER_FENCED, -1, -1
        if state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):  # markers under way
            same = (state == TxnState.PREPARE_COMMIT) == commit
            return (CONCURRENT_TRANSACTIONS if same else INVALID_TXN_STATE), -1, -1
        if m.busy:
            return CONCURRENT_TRANSACTIONS, -1, -1
        retry = retry_on_bump or retry_on_overflow
        ended = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if state == TxnState.ONGOING:
            pass
        elif state == ended and retry:
            return NONE, m.producer_id, m.producer_epoch
        elif commit or retry:
            return INVALID_TXN_STATE, -1, -1
        # Ongoing; or an abort of no transaction (Empty, Complete*): bump the epoch
        m.busy = True
        try:
            next_pid = (await self.new_producer_id() if m.producer_epoch >= MAX_EPOCH - 1
                        else -1)
        except BaseException:
            m.busy = False
            raise
        error, pid, epoch = await self._end(m, commit, TRANSACTION_VERSION, bump=True,
                                            next_pid=next_pid)
        return (error, -1, -1) if error else (NONE, pid, epoch)

    async def _end(self, m: TxnMetadata, commit: bool, client_tv: int, *, bump: bool,
                   next_pid: int = -1) -> tuple[int, int, int]:
        """(error, producer id, epoch once ended).  The end runs in the coordinator's own
        task, not the request's: a client that leaves (its connection closed, the request
        cancelled) must not stop the transaction halfway, in Prepare* with no one left to
        write its markers."""
        m.busy = True
        prepared: asyncio.Future[tuple[int, int, int]] = \
            asyncio.get_running_loop().create_future()
        self._spawn(self._prepare_and_complete(m, commit, prepared, bump=bump,
                                               client_tv=client_tv, next_pid=next_pid))
        return await asyncio.shield(prepared)

    async def _prepare_and_complete(self, m: TxnMetadata, commit: bool,
                                    answer: asyncio.Future[tuple[int, int, int]] | None = None,
                                    *,
                                    bump: bool = False, client_tv: int | None = None,
                                    next_pid: int = -1) -> int:
        """Ongoing -> Prepare* (durable) -> markers -> Complete* (call with ``busy`` set).
        ``answer`` gets the EndTxn's error code and the producer id and epoch it ended with
        once the markers are written and the transaction is Complete*, or once it could not be (a Prepare* record that could not be
        written; the controller stopping).  ``bump`` (transaction version 2): Prepare carries
        epoch + 1 and ``next_pid`` (the id Complete rotates to, -1 for none); an abort from
        Empty or Complete* (no partitions) starts and ends there.

        Kafka answers EndTxn once Prepare* is written and sends the markers behind it; clients
        then retry the next transaction's AddPartitionsToTxn on CONCURRENT_TRANSACTIONS until
        the markers are in.  Measured here with librdkafka (perf/bench_txn.py), that retry's
        backoff made transactions of 100 records slower (0.16-0.7x) than answering after the
        markers (perf/README.md), so EndTxn waits for them."""
        old = (m.state, set(m.partitions), m.producer_epoch, m.next_producer_id, m.client_tv,
               m.start_ms)

        def rollback() -> None:
            (m.state, m.partitions, m.producer_epoch, m.next_producer_id, m.client_tv,
             m.start_ms) = old
            m.busy = False

        if m.state != TxnState.ONGOING:  # version 2: an abort with no partitions
            m.partitions.clear()
            m.start_ms = _now_ms()
        m.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        if client_tv is not None:
            m.client_tv = client_tv
        if bump:
            m.producer_epoch += 1
            m.next_producer_id = next_pid
        try:
            error = await self._persist(m)
        except BaseException:
            rollback()
            if answer is not None and not answer.done():
                answer.set_result((COORDINATOR_NOT_AVAILABLE, -1, -1))
            raise
        if error:
            rollback()
            if answer is not None and not answer.done():
                answer.set_result((error, -1, -1))
            return error
        try:
            error = await self._complete(m, commit)
        except BaseException:  # stopping: the Prepare record has the markers written at start
            if answer is not None and not answer.done():
                answer.set_result((COORDINATOR_NOT_AVAILABLE, -1, -1))
            raise
        if answer is not None and not answer.done():
            answer.set_result((error, m.producer_id, m.producer_epoch))
        return error

    async def _complete(self, m: TxnMetadata, commit: bool) -> int:
        """Markers of the Prepare* epoch (checked as transaction version ``m.client_tv``),
        then Complete* (with transaction version 2, the producer id rotated when Prepare named
        the next one)."""
        try:
            tv = m.client_tv
            offsets = [p for t, p in m.partitions if t == OFFSETS_TOPIC]
            markers = [(t, p, m.producer_id, m.producer_epoch, commit, tv)
                       for t, p in sorted(m.partitions) if t != OFFSETS_TOPIC]
            if markers:
                await self.write_markers(markers)
            for p in offsets:
                await self.offsets_marker(p, m.producer_id, m.producer_epoch, commit, tv)
            m.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            m.partitions.clear()
            if m.next_producer_id >= 0:
                m.prev_producer_id, m.producer_id = m.producer_id, m.next_producer_id
                m.producer_epoch, m.next_producer_id = 0, -1
            # not waited for (Kafka does not either): were it lost, recovery would find the
            # Prepare record and write the same markers again
            return await self._persist(m, wait=False)
        finally:
            m.busy = False

    async def _fence_and_abort(self, m: TxnMetadata, already_busy: bool = False,
                               timed_out: bool = False) -> None:
        """Bump the epoch (the producer is fenced) and abort its open transaction, once
        (KAFKA-19367: a transaction version 2 abort does not bump a second time).  A timeout
        ends it as the coordinator's own transaction version (2); a fence by InitProducerId
        as the version its client ran."""
        if m.busy and not already_busy:
            return
        m.busy = True
        if m.state != TxnState.ONGOING:
            m.busy = False
            return
        tv: int | None = TRANSACTION_VERSION if timed_out else None
        if m.producer_epoch >= MAX_EPOCH - 1:
            log.warning("transaction %s: epoch exhausted; aborting without a bump",
                        m.transactional_id)
            tv = 0  # markers of the same epoch as its data: version 0's check
        else:
            m.producer_epoch += 1
        try:
            await self._prepare_and_complete(m, commit=False, client_tv=tv)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - logged, retried by the next timer round
            log.exception("aborting transaction %s failed", m.transactional_id)
            m.busy = False

    # -- admin ----------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        return self.txns.get(transactional_id)

    def list(self, states: Sequence[str] = (), producer_ids: Sequence[int] = (),
             duration_ms: int = -1) -> list[TxnMetadata]:
        wanted = {s.lower() for s in states}
        now = _now_ms()
        return [m for m in self.txns.values()
                if (not wanted or m.state.kafka_name.lower() in wanted)
                and (not producer_ids or m.producer_id in producer_ids)
                and (duration_ms < 0 or (m.state == TxnState.ONGOING
                                         and now - m.start_ms >= duration_ms))]
