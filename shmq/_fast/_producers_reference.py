"""Pure-Python twin of ``shmq._fast.producers``: the same ``ProducerTable``, on a dict.

It is the oracle in the parity tests (``tests/unit/test_producer_table_parity.py``) and what runs
with ``SHMQ_PURE=1``.  The rules are Kafka's ``ProducerAppendInfo`` / ``ProducerStateEntry``; see
``shmq/storage/producer_state.py`` for the theory and ``producers.pyx`` for the layout.

A row is ``[epoch, coordinator_epoch, last_timestamp, txn_first_offset, batches]`` with
``txn_first_offset`` -1 for "no open transaction" and ``batches`` the last five
``(first_seq, last_seq, last_offset, offset_delta, timestamp)``, oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

RETAIN = 5
NO_EPOCH = -1
OK, DUPLICATE = 0, 1
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
TRANSACTION_COORDINATOR_FENCED = 52
INT32_MAX = 2**31 - 1
_OK = (OK,)
_I16 = (-(2**15), 2**15 - 1)
_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def _checked(value: int, bounds: tuple[int, int]) -> int:
    value = int(value)
    if not bounds[0] <= value <= bounds[1]:
        raise OverflowError(f"{value} is out of range")
    return value


class ProducerTable:
    """Producer id -> epoch, coordinator epoch, last timestamp, open transaction, last 5 batches."""

    def __init__(self) -> None:
        self._rows: dict[int, list[Any]] = {}
        self._open_txns = 0

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, producer_id: object) -> bool:
        return producer_id in self._rows

    def _row(self, producer_id: int) -> list[Any]:
        row = self._rows.get(producer_id)
        if row is None:
            row = self._rows[producer_id] = [NO_EPOCH, -1, -1, -1, []]
        return row

    @staticmethod
    def _set_epoch(row: list[Any], epoch: int) -> None:
        if row[0] != epoch:  # a new epoch starts a new sequence space
            row[4] = []
            row[0] = epoch

    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
              transactional: bool, origin_client: bool) -> tuple[int, ...]:
        """``(OK,)``, ``(DUPLICATE, first_seq, last_seq, last_offset, offset_delta, timestamp)``
        of the retained batch, or ``(error, current_epoch, current_last_seq, txn_first_offset)``
        with error 47, 45 or 48, in Kafka's order (see producer_state.py)."""
        _checked(producer_id, _I64), _checked(epoch, _I16)
        _checked(first_seq, _I32), _checked(last_seq, _I32)
        row = self._rows.get(producer_id)
        cur_epoch, txn, batches = (NO_EPOCH, -1, []) if row is None else (row[0], row[3], row[4])
        cur_last = batches[-1][1] if batches else -1
        if origin_client and epoch == cur_epoch:
            for b in batches:
                if b[0] == first_seq and b[1] == last_seq:
                    return (DUPLICATE, *b)
        if epoch < cur_epoch:
            return INVALID_PRODUCER_EPOCH, cur_epoch, cur_last, txn
        if origin_client:
            if epoch != cur_epoch:
                if first_seq != 0 and cur_epoch != NO_EPOCH:
                    return OUT_OF_ORDER_SEQUENCE_NUMBER, cur_epoch, cur_last, txn
            elif cur_epoch != NO_EPOCH and not _in_sequence(cur_last, first_seq):
                return OUT_OF_ORDER_SEQUENCE_NUMBER, cur_epoch, cur_last, txn
        if txn >= 0 and not transactional:
            return INVALID_TXN_STATE, cur_epoch, cur_last, txn
        return _OK

    def append_batch(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
                     first_offset: int, last_offset: int, timestamp: int,
                     transactional: bool) -> None:
        """Record a data batch appended at [first_offset, last_offset] (no checks)."""
        _checked(producer_id, _I64), _checked(epoch, _I16)
        _checked(first_seq, _I32), _checked(last_seq, _I32), _checked(timestamp, _I64)
        _checked(first_offset, _I64), _checked(last_offset, _I64)
        _checked(last_offset - first_offset, _I32)
        row = self._row(producer_id)
        self._set_epoch(row, epoch)
        batches = row[4]
        batches.append((first_seq, last_seq, last_offset, last_offset - first_offset, timestamp))
        if len(batches) > RETAIN:
            del batches[0]
        row[2] = timestamp
        if transactional and row[3] < 0:
            row[3] = first_offset
            self._open_txns += 1

    def end_txn(self, producer_id: int, epoch: int, timestamp: int, coordinator_epoch: int,
                has_coordinator_epoch: bool, check: bool) -> tuple[int, int, int, int]:
        """A COMMIT/ABORT marker: ``(0, first offset of the ended transaction or -1, epoch,
        coordinator epoch)``, or ``(47 | 52, -1, current epoch, current coordinator epoch)``
        when ``check`` finds an older producer or coordinator epoch (nothing changes then)."""
        _checked(producer_id, _I64), _checked(epoch, _I16), _checked(timestamp, _I64)
        _checked(coordinator_epoch, _I32)
        row = self._rows.get(producer_id)
        cur_epoch, cur_coord = (NO_EPOCH, -1) if row is None else (row[0], row[1])
        if check:
            if epoch < cur_epoch:
                return INVALID_PRODUCER_EPOCH, -1, cur_epoch, cur_coord
            if has_coordinator_epoch and coordinator_epoch < cur_coord:
                return TRANSACTION_COORDINATOR_FENCED, -1, cur_epoch, cur_coord
        row = self._row(producer_id)
        first = row[3]
        self._set_epoch(row, epoch)
        if has_coordinator_epoch:
            row[1] = coordinator_epoch
        if row[3] >= 0:
            self._open_txns -= 1
        row[3] = -1
        row[2] = timestamp
        return OK, first, row[0], row[1]

    def get(self, producer_id: int) -> tuple[Any, ...] | None:
        """``(producer_id, epoch, coordinator_epoch, last_timestamp, txn_first_offset,
        batches)`` with ``batches`` a tuple of 5-tuples, oldest first; None if unknown."""
        row = self._rows.get(producer_id)
        if row is None:
            return None
        return producer_id, row[0], row[1], row[2], row[3], tuple(row[4])

    def items(self) -> list[tuple[Any, ...]]:
        """``get`` of every producer, in producer id order."""
        return [self.get(pid) for pid in sorted(self._rows)]  # type: ignore[misc]

    def put(self, producer_id: int, epoch: int, coordinator_epoch: int, last_timestamp: int,
            txn_first_offset: int, batches: Iterable[tuple[int, int, int, int, int]]) -> None:
        """Insert or replace a producer whole (a snapshot entry); the last 5 batches are kept."""
        _checked(producer_id, _I64), _checked(epoch, _I16), _checked(coordinator_epoch, _I32)
        _checked(last_timestamp, _I64), _checked(txn_first_offset, _I64)
        kept = []
        for b in batches:
            first_seq, last_seq, last_offset, delta, ts = b
            kept.append((_checked(first_seq, _I32), _checked(last_seq, _I32),
                         _checked(last_offset, _I64), _checked(delta, _I32), _checked(ts, _I64)))
        old = self._rows.get(producer_id)
        if old is not None and old[3] >= 0:
            self._open_txns -= 1
        txn = txn_first_offset if txn_first_offset >= 0 else -1
        self._rows[producer_id] = [epoch, coordinator_epoch, last_timestamp, txn, kept[-RETAIN:]]
        if txn >= 0:
            self._open_txns += 1

    def remove_expired(self, now_ms: int, expiration_ms: int, ids: bool = True) -> Any:
        """Forget producers with no open transaction whose last timestamp is at least
        ``expiration_ms`` before ``now_ms``; their ids in row order (``ids`` False: how many)."""
        gone = [pid for pid, row in self._rows.items()
                if row[3] < 0 and now_ms - row[2] >= expiration_ms]
        if gone:
            self._rows = {pid: row for pid, row in self._rows.items()
                          if not (row[3] < 0 and now_ms - row[2] >= expiration_ms)}
        return gone if ids else len(gone)

    def first_unstable_offset(self) -> int:
        """The smallest first offset of an open transaction, -1 if none."""
        if not self._open_txns:
            return -1
        return min(row[3] for row in self._rows.values() if row[3] >= 0)

    def clear(self) -> None:
        self._rows = {}
        self._open_txns = 0

    def memory(self) -> int:
        """Bytes held outside Python objects (the compiled table's arrays; 0 here)."""
        return 0
