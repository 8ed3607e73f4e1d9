"""Idempotent and transactional producer state of one partition (Kafka ``ProducerStateManager``).

Theory of operation
-------------------
For every producer id that wrote to the partition the manager keeps its current epoch, the
metadata of its last ``NUM_BATCHES_TO_RETAIN`` (5) batches, the epoch of the transaction
coordinator that wrote its last marker, the timestamp of its last write, and the first offset of
its open transaction, if any: one row of a ``_fast.ProducerTable`` (C memory, see
``shmq/_fast/producers.pyx``), handed out as ``ProducerStateEntry`` copies.  Five batches
suffice because an idempotent client keeps at most five requests in flight per partition.

A client Produce goes through two calls, both per batch (``ProducerAppendInfo`` +
``UnifiedLog.analyzeAndValidateProducerState``)::

    dup = state.check_append(pid, epoch, base_seq, last_seq, transactional)   # may raise
    if dup is not None: answer with dup.first_offset .. dup.last_offset, append nothing
    else: append the batch at [first_offset, last_offset], then
          state.update(pid, epoch, base_seq, last_seq, first_offset, last_offset, max_ts, transactional)

A request holding several batches of one producer is checked and recorded batch by batch, in
order (Kafka validates them all before appending any; rejecting the request as a whole is the
caller's business).  ``check_append`` applies Kafka's rules in Kafka's order:

1. duplicate: same epoch and the exact (first_seq, last_seq) of one of the cached batches
   -> that ``BatchMetadata`` (the caller returns its original offsets, no error);
2. epoch < current epoch -> ``INVALID_PRODUCER_EPOCH`` (47);
3. epoch > current epoch -> the base sequence must be 0, else ``OUT_OF_ORDER_SEQUENCE_NUMBER``
   (45); with no known epoch (a producer we have no state for) any sequence is accepted;
4. same epoch -> base sequence == last sequence + 1, wrapping from 2^31-1 to 0, else 45;
   a producer without state accepts any sequence (Kafka >= 2.5, KIP-360: the broker no longer
   answers ``UNKNOWN_PRODUCER_ID`` (59); this is what ``checkSequence`` does on trunk);
5. a non-transactional batch while the producer has a transaction open here ->
   ``INVALID_TXN_STATE`` (48).  A transactional batch with no open transaction opens one (the
   coordinator verification of KIP-890 is not done here).

``update`` then records the batch: a new epoch first clears the cached batches, the oldest of
five falls out, and a transactional batch with no open transaction sets
``current_txn_first_offset``.  ``complete_txn`` (a COMMIT/ABORT marker) clears it.
``first_unstable_offset`` is the smallest open transaction start: the LSO is min(that, HW).
(Kafka also holds completed transactions whose marker is above the HW; with a single replica the
HW reaches the marker as soon as it is appended, so shmq has no such window.)

State survives restarts in two ways.  ``take_snapshot(offset)`` writes ``<offset>.snapshot``
(the state after every batch below ``offset``) at segment roll and clean shutdown;
``load_snapshot(upto)`` reads the newest usable one at or below ``upto`` and returns its offset,
from which the caller replays batch headers with ``load_from_batches``.  Replay uses Kafka's
REPLICATION origin: no check raises, the log is taken as the truth.

What a restart loses:

* a snapshot stores only each producer's **last** batch (as Kafka's does), so after loading one
  duplicate detection covers that batch only; a retry of an older in-flight batch gets
  ``OUT_OF_ORDER_SEQUENCE_NUMBER``, as it would from Kafka;
* (shmq only) a header scan (``load_from_batches``) cannot see a control record's coordinator epoch or
  commit/abort type (they are in the record body), so replayed markers keep the coordinator
  epoch already known.

Producers idle for ``producer_id_expiration_ms`` (``producer.id.expiration.ms``, 1 day) with no
open transaction are forgotten (Kafka ``removeExpiredProducers``): by ``remove_expired``, which
the worker calls every ``producer.id.expiration.check.interval.ms`` (10 minutes), and when a
snapshot is loaded (``load_snapshot(now_ms=...)``).  Idle means: the timestamp of the producer's
last batch (its max timestamp as stored) is that old.  A forgotten producer is "unknown" again,
so a retry of one of its batches is appended again rather than answered as a duplicate, and any
sequence is accepted, as Kafka has done since KIP-360 (2.5; before it answered
``UNKNOWN_PRODUCER_ID`` to a non-zero sequence).  The next snapshot (roll, clean shutdown) no
longer holds it.

Snapshot file (``ProducerStateManager.writeSnapshot``: its ``PID_SNAPSHOT_MAP_SCHEMA`` is
``ProducerSnapshot.json`` v1 with the int16 version in front; all big-endian; shmq writes the
entries in producer id order, Kafka in hash-map order, readers do not care)::

    offset  size    field
    0       2       version                 int16   always 1
    2       4       crc                     uint32  CRC-32C (Castagnoli) of bytes [6, end)
    6       4       count                   int32   number of entries
    10      46*n    entries:
                    +0   producerId            int64
                    +8   epoch                 int16
                    +10  lastSequence          int32   -1: no batch retained
                    +14  lastOffset            int64   -1: no batch retained
                    +22  offsetDelta           int32   lastOffset - firstOffset of that batch
                    +26  timestamp             int64   the producer's last timestamp
                    +34  coordinatorEpoch      int32   -1: no marker seen
                    +38  currentTxnFirstOffset int64   -1: no open transaction

A file is replaced atomically (``.tmp`` + fsync + rename + directory fsync).  A file with the
wrong version, a bad CRC or a length that does not match its count is corrupt: ``load_snapshot``
deletes it and tries the next older one.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from shmq import _fast
from shmq.errors import KafkaApiError, ShmqError
from shmq.protocol.records import CONTROL_FLAG, TRANSACTIONAL_FLAG
from shmq.storage import layout

log = logging.getLogger(__name__)

NUM_BATCHES_TO_RETAIN = 5
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000   # producer.id.expiration.ms

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
INT32_MAX = 2**31 - 1

# Kafka error codes raised by check_append / complete_txn
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
TRANSACTION_COORDINATOR_FENCED = 52

SNAPSHOT_VERSION = 1
SNAPSHOT_HEADER = struct.Struct(">hIi")            # version, crc, count
SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")        # 46 bytes, field order of ProducerSnapshot.json
SNAPSHOT_CRC_START = 6                             # PRODUCER_ENTRIES_OFFSET: the CRC covers [6, end)
_SNAPSHOT_NAME = re.compile(r"^(\d{20})" + re.escape(layout.SNAPSHOT_SUFFIX) + "$")


class CorruptSnapshotError(ShmqError, ValueError):
    """A producer snapshot file failed its version, length or CRC check."""


def increment_sequence(sequence: int, increment: int) -> int:
    """``DefaultRecordBatch.incrementSequence``: sequences wrap from 2^31-1 to 0."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    """``DefaultRecordBatch.decrementSequence``."""
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


class BatchMetadata(NamedTuple):
    """One appended batch of a producer (Kafka keeps lastSeq + offsetDelta; firstSeq is derived)."""

    first_seq: int
    last_seq: int
    last_offset: int
    offset_delta: int       # last_offset - first_offset
    timestamp: int          # the batch's max timestamp

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(slots=True)
class ProducerStateEntry:
    """One producer's state as a value: what ``last_entry`` and ``producers`` hand out (a copy;
    the manager keeps its producers in a ``ProducerTable``) and what a snapshot holds."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: list[BatchMetadata] = field(default_factory=list)  # the last 5, oldest first
    coordinator_epoch: int = -1
    last_timestamp: int = NO_TIMESTAMP
    current_txn_first_offset: int | None = None

    def __post_init__(self) -> None:
        if len(self.batches) > NUM_BATCHES_TO_RETAIN:
            self.batches = list(self.batches)[-NUM_BATCHES_TO_RETAIN:]

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> ProducerStateEntry:
        """From a ``ProducerTable`` row: (pid, epoch, coordinator epoch, last timestamp,
        txn first offset or -1, batches)."""
        pid, epoch, coordinator_epoch, last_ts, txn, batches = row
        return cls(pid, epoch, [BatchMetadata(*b) for b in batches], coordinator_epoch, last_ts,
                   txn if txn >= 0 else None)

    @property
    def is_empty(self) -> bool:
        return not self.batches

    @property
    def first_seq(self) -> int:
        return self.batches[0].first_seq if self.batches else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batches[-1].offset_delta if self.batches else 0


def encode_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    """The bytes of a v1 snapshot holding ``entries`` (each with its last batch only)."""
    rows = []
    for e in entries:
        txn = -1 if e.current_txn_first_offset is None else e.current_txn_first_offset
        rows.append((e.producer_id, e.producer_epoch, e.coordinator_epoch, e.last_timestamp, txn,
                     e.batches[-1:]))
    return _encode_rows(sorted(rows))


def _encode_rows(rows: list[tuple[Any, ...]]) -> bytes:
    """A snapshot of ``ProducerTable`` rows, in the order given (producer id order)."""
    buf = bytearray(SNAPSHOT_HEADER.size + SNAPSHOT_ENTRY.size * len(rows))
    SNAPSHOT_HEADER.pack_into(buf, 0, SNAPSHOT_VERSION, 0, len(rows))
    pos = SNAPSHOT_HEADER.size
    pack = SNAPSHOT_ENTRY.pack_into
    for pid, epoch, coordinator_epoch, last_ts, txn, batches in rows:
        if batches:
            _, last_seq, last_offset, delta, _ = batches[-1]
        else:
            last_seq, last_offset, delta = NO_SEQUENCE, -1, 0
        pack(buf, pos, pid, epoch, last_seq, last_offset, delta, last_ts, coordinator_epoch, txn)
        pos += SNAPSHOT_ENTRY.size
    struct.pack_into(">I", buf, 2, _fast.crc32c(memoryview(buf)[SNAPSHOT_CRC_START:]))
    return bytes(buf)


def decode_snapshot(data: bytes) -> list[ProducerStateEntry]:
    """Entries of a v1 snapshot (``ProducerStateManager.readSnapshot``); raises CorruptSnapshotError."""
    if len(data) < SNAPSHOT_HEADER.size:
        raise CorruptSnapshotError(f"snapshot of {len(data)} bytes is shorter than its header")
    version, crc, count = SNAPSHOT_HEADER.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"snapshot contained an unknown file version {version}")
    computed = _fast.crc32c(memoryview(data)[SNAPSHOT_CRC_START:])
    if crc != computed:
        raise CorruptSnapshotError(f"snapshot is corrupt: stored crc {crc}, computed crc {computed}")
    if count < 0 or len(data) != SNAPSHOT_HEADER.size + count * SNAPSHOT_ENTRY.size:
        raise CorruptSnapshotError(f"snapshot of {len(data)} bytes cannot hold {count} entries")
    entries = []
    for pid, epoch, seq, offset, delta, ts, coord, txn in SNAPSHOT_ENTRY.iter_unpack(
            memoryview(data)[SNAPSHOT_HEADER.size:]):
        entry = ProducerStateEntry(pid, epoch, coordinator_epoch=coord, last_timestamp=ts,
                                   current_txn_first_offset=txn if txn >= 0 else None)
        if offset >= 0:
            first_seq = seq if seq == NO_SEQUENCE else decrement_sequence(seq, delta)
            entry.batches.append(BatchMetadata(first_seq, seq, offset, delta, ts))
        entries.append(entry)
    return entries


def read_snapshot(path: Path) -> list[ProducerStateEntry]:
    return decode_snapshot(path.read_bytes())


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / (layout.filename_prefix(offset) + layout.SNAPSHOT_SUFFIX)


def _write_atomically(path: Path, data: bytes) -> None:
    """tmp + rename, without fsync: a snapshot is a cache of what the log holds.  After a power
    cut a missing or torn one (its CRC fails) is skipped and the state replayed from the log,
    which recovery has validated; an fsync per roll cost more than the roll itself."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:  # a full disk: the older snapshots stay, the partial one goes
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    os.rename(tmp, path)


class ProducerStateManager:
    """Producer ids, their epochs, last batches and open transactions for one partition.

    The state lives in a ``_fast.ProducerTable`` (one 192-byte row a producer in C memory, see
    ``shmq/_fast/producers.pyx`` for why); entries handed out are copies."""

    def __init__(self, directory: Path,
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        self.directory = Path(directory)
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._table = _fast.ProducerTable()

    # -- queries ------------------------------------------------------------------------------

    @property
    def producers(self) -> Mapping[int, ProducerStateEntry]:
        """The active producers, by id (a read-only snapshot)."""
        return MappingProxyType({row[0]: ProducerStateEntry.from_row(row)
                                 for row in self._table.items()})

    def __len__(self) -> int:
        return len(self._table)

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        row = self._table.get(producer_id)
        return None if row is None else ProducerStateEntry.from_row(row)

    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest open transaction (the LSO is min of this and the HW)."""
        first = self._table.first_unstable_offset()
        return None if first < 0 else first

    # -- the append path ----------------------------------------------------------------------

    def check_append(self, producer_id: int, producer_epoch: int, base_sequence: int,
                     last_sequence: int, is_transactional: bool,
                     origin_client: bool = True) -> BatchMetadata | None:
        """Validate a data batch before it is appended; a duplicate returns the original batch.

        ``origin_client=False`` is Kafka's COORDINATOR origin (batches written by the broker's own
        coordinators): no duplicate or sequence checks, only the epoch and transaction checks.
        Raises ``KafkaApiError`` 47, 45 or 48 as described in the module docstring (the rules
        themselves run in ``ProducerTable.check``).
        """
        if producer_id < 0:
            return None
        result = self._table.check(producer_id, producer_epoch, base_sequence, last_sequence,
                                   is_transactional, origin_client)
        code = result[0]
        if code == 0:
            return None
        if code == 1:  # a retried batch we already have
            return BatchMetadata(*result[1:])
        _, epoch, last_seq, txn = result
        if code == INVALID_PRODUCER_EPOCH:
            message = (f"epoch {producer_epoch} of producer {producer_id} is smaller than the "
                       f"last seen epoch {epoch}")
        elif code == OUT_OF_ORDER_SEQUENCE_NUMBER and producer_epoch != epoch:
            message = (f"invalid sequence number {base_sequence} for new epoch {producer_epoch} "
                       f"of producer {producer_id} (current epoch {epoch})")
        elif code == OUT_OF_ORDER_SEQUENCE_NUMBER:
            message = (f"out of order sequence number for producer {producer_id}: "
                       f"{base_sequence} (incoming), {last_seq} (current end sequence number)")
        else:
            message = (f"expected a transactional write from producer {producer_id}: its "
                       f"transaction opened at offset {txn} is not complete")
        raise KafkaApiError(code, message)

    def update(self, producer_id: int, producer_epoch: int, first_seq: int, last_seq: int,
               first_offset: int, last_offset: int, timestamp: int,
               is_transactional: bool) -> None:
        """Record a data batch appended at [first_offset, last_offset] (no checks).

        ``timestamp`` is the batch's max timestamp as stored (the log append time on
        LogAppendTime topics); it is what a duplicate answers and what expiration measures.
        """
        if producer_id < 0:
            raise ValueError(f"invalid producer id {producer_id}")
        self._table.append_batch(producer_id, producer_epoch, first_seq, last_seq, first_offset,
                                 last_offset, timestamp, is_transactional)

    def complete_txn(self, producer_id: int, producer_epoch: int, marker_offset: int,
                     timestamp: int, coordinator_epoch: int | None = None,
                     check: bool = True) -> int | None:
        """Apply a COMMIT/ABORT marker at ``marker_offset``; the first offset of the ended txn.

        ``None`` means no transaction was open (an empty transaction: nothing for the
        ``.txnindex`` or the LSO).  With ``check`` (markers written by the coordinator) an older
        producer epoch raises 47 and an older coordinator epoch 52 (``appendEndTxnMarker``, TV0/1
        rules); a ``coordinator_epoch`` of None keeps the known one.
        """
        code, first, epoch, coord = self._table.end_txn(
            producer_id, producer_epoch, timestamp,
            -1 if coordinator_epoch is None else coordinator_epoch,
            coordinator_epoch is not None, check)
        if code == INVALID_PRODUCER_EPOCH:
            raise KafkaApiError(code, f"marker epoch {producer_epoch} of producer {producer_id} "
                                      f"is smaller than the last seen epoch {epoch}")
        if code == TRANSACTION_COORDINATOR_FENCED:
            raise KafkaApiError(code, f"marker coordinator epoch {coordinator_epoch} of producer "
                                      f"{producer_id} is older than {coord}")
        log.debug("producer %d: transaction from %s ended by marker at %d",
                  producer_id, first, marker_offset)
        return None if first < 0 else first

    # -- rebuilding ---------------------------------------------------------------------------

    def load_from_batches(self, table: Any) -> None:
        """Replay batch headers (a ``scan_headers`` table, rows in offset order) into the state.

        Kafka's REPLICATION origin: nothing raises.  Rows without a producer id are skipped;
        control batches (attributes & 0x20) end the producer's transaction; empty control
        batches (cleaned transactions) are ignored.
        """
        rows = table.tolist() if hasattr(table, "tolist") else table
        producers = self._table
        for row in rows:
            pid = row[_fast.COL_PRODUCER_ID]
            if pid < 0:
                continue
            epoch = row[_fast.COL_PRODUCER_EPOCH]
            attributes = row[_fast.COL_ATTRIBUTES]
            base_offset = row[_fast.COL_BASE_OFFSET]
            last_offset = row[_fast.COL_LAST_OFFSET]
            timestamp = row[_fast.COL_MAX_TIMESTAMP]
            if attributes & CONTROL_FLAG:
                if row[_fast.COL_RECORDS_COUNT] > 0:
                    self.complete_txn(pid, epoch, base_offset, timestamp, check=False)
                continue
            base_seq = row[_fast.COL_BASE_SEQUENCE]
            last_seq = (NO_SEQUENCE if base_seq == NO_SEQUENCE
                        else increment_sequence(base_seq, last_offset - base_offset))
            transactional = bool(attributes & TRANSACTIONAL_FLAG)
            if not transactional and pid in producers:
                txn = producers.get(pid)[4]  # type: ignore[index]
                if txn >= 0:
                    log.warning("producer %d: non-transactional batch at %d inside its "
                                "transaction opened at %d", pid, base_offset, txn)
            producers.append_batch(pid, epoch, base_seq, last_seq, base_offset, last_offset,
                                   timestamp, transactional)

    def remove_expired(self, now_ms: int) -> list[int]:
        """Forget producers idle for the expiration time with no open transaction; their ids.
        The table compacts its rows and gives back the memory they took."""
        return self._table.remove_expired(now_ms, self.producer_id_expiration_ms)  # type: ignore[no-any-return]

    def count_expired(self, now_ms: int) -> int:
        """``remove_expired`` returning how many went (no int object per producer)."""
        return self._table.remove_expired(now_ms, self.producer_id_expiration_ms, False)  # type: ignore[no-any-return]

    def _is_expired(self, entry: ProducerStateEntry, now_ms: int) -> bool:
        return (entry.current_txn_first_offset is None
                and now_ms - entry.last_timestamp >= self.producer_id_expiration_ms)

    def clear(self) -> None:
        self._table.clear()

    def _put(self, entry: ProducerStateEntry) -> None:
        self._table.put(entry.producer_id, entry.producer_epoch, entry.coordinator_epoch,
                        entry.last_timestamp,
                        -1 if entry.current_txn_first_offset is None
                        else entry.current_txn_first_offset, entry.batches)

    # -- snapshots ----------------------------------------------------------------------------

    def take_snapshot(self, offset: int) -> Path:
        """Write the current state as ``<offset>.snapshot`` (the state below ``offset``)."""
        path = snapshot_path(self.directory, offset)
        _write_atomically(path, _encode_rows(self._table.items()))
        return path

    def list_snapshot_offsets(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_SNAPSHOT_NAME.match, names) if m)

    def load_snapshot(self, upto_offset: int, now_ms: int | None = None) -> int | None:
        """Replace the state with the newest valid snapshot at or below ``upto_offset``.

        Corrupt snapshots are deleted on the way down.  Returns the snapshot's offset (replay
        batches from there) or None (state left empty: replay from the log start).  With
        ``now_ms`` producers already expired are not loaded (``loadFromSnapshot``).
        """
        self._table.clear()
        for offset in reversed(self.list_snapshot_offsets()):
            if offset > upto_offset:
                continue
            path = snapshot_path(self.directory, offset)
            try:
                entries = read_snapshot(path)
            except FileNotFoundError:
                continue
            except CorruptSnapshotError as exc:
                log.warning("deleting producer snapshot %s: %s", path, exc)
                self._delete(offset)
                continue
            for entry in entries:
                if now_ms is None or not self._is_expired(entry, now_ms):
                    self._put(entry)
            return offset
        return None

    def delete_snapshots_below(self, offset: int) -> list[int]:
        """Delete snapshots with an offset < ``offset`` (retention); the deleted offsets."""
        doomed = [o for o in self.list_snapshot_offsets() if o < offset]
        for o in doomed:
            self._delete(o)
        return doomed

    def delete_snapshots_above(self, offset: int) -> list[int]:
        """Delete snapshots with an offset > ``offset`` (truncation); the deleted offsets."""
        doomed = [o for o in self.list_snapshot_offsets() if o > offset]
        for o in doomed:
            self._delete(o)
        return doomed

    def truncate_and_reload(self, log_start: int, log_end: int,
                            now_ms: int | None = None) -> int:
        """Drop snapshots outside (log_start, log_end] and reload the newest one left.

        Returns the offset to replay batch headers from: the snapshot's, or ``log_start``.
        Like Kafka's ``truncateAndReload``, a snapshot exactly at the log start is dropped too.
        """
        for o in self.list_snapshot_offsets():
            if o > log_end or o <= log_start:
                self._delete(o)
        loaded = self.load_snapshot(log_end, now_ms)
        return log_start if loaded is None else loaded

    def truncate_fully(self) -> None:
        """Forget every producer and delete every snapshot (``truncateFullyAndStartAt``)."""
        self._table.clear()
        for o in self.list_snapshot_offsets():
            self._delete(o)

    def _delete(self, offset: int) -> None:
        try:
            os.unlink(snapshot_path(self.directory, offset))
        except FileNotFoundError:
            pass
