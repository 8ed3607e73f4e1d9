"""Transaction version 2 (KIP-890 part 2) in the transaction coordinator and the partition log,
with real ``__transaction_state`` and partition files: the epoch bump at every EndTxn v5, the
producer id rotation when the epoch runs out (and its retry), recovery of a Prepare record that
names the next producer id, ``TransactionLogValue`` v1 (v0 still read), and the strict marker
check in a partition.  Kafka's sources (``TransactionCoordinator.endTransaction``,
``TransactionMetadata.prepareAbortOrCommit`` / ``prepareComplete``,
``ProducerAppendInfo.checkProducerEpoch``) are the reference; the broker-level behaviour is
checked against Kafka 4.3 itself in test_kafka_wire_diff.py::test_transaction_version_2."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pytest

from shmq.coordinator import transactions as tx
from shmq.coordinator.transactions import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_TXN_STATE,
    NONE,
    PRODUCER_FENCED,
    TransactionCoordinator,
    TxnConfig,
    TxnMetadata,
    TxnState,
    decode_value,
    txn_value,
)
from shmq.errors import KafkaApiError
from shmq.protocol.records import encode_batch
from shmq.storage.log import PartitionLog
from shmq.storage.log_config import LogConfig

TID = "t-v2"


class Fake:
    """The controller's side of the coordinator: producer ids, and markers recorded (or
    refused while ``down``, as when the controller stops with markers unwritten)."""

    def __init__(self) -> None:
        self.next_pid = 1000
        self.markers: list[tuple[Any, ...]] = []
        self.down = False

    async def new_producer_id(self) -> int:
        self.next_pid += 1
        return self.next_pid

    async def write_markers(self, markers: list[tuple[Any, ...]]) -> None:
        if self.down:
            raise ConnectionError("stopping with transaction markers unwritten")
        self.markers.extend(markers)

    async def offsets_marker(self, p: int, pid: int, epoch: int, commit: bool, tv: int) -> None:
        self.markers.append(("__consumer_offsets", p, pid, epoch, commit, tv))

    def coordinator(self, directory: Path) -> TransactionCoordinator:
        return TransactionCoordinator(directory, TxnConfig(partitions=3), self.new_producer_id,
                                      self.write_markers, self.offsets_marker,
                                      lambda topic: 2, lambda: 50)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_end_txn_v5_bumps_the_epoch_and_answers_retries(tmp_path: Path) -> None:
    fake = Fake()

    async def scenario() -> None:
        c = fake.coordinator(tmp_path)
        c.start()
        err, pid, epoch = await c.init_producer_id(TID, 60_000)
        assert (err, epoch) == (NONE, 0)
        assert await c.add_partition_implicitly(TID, pid, 0, "t", 1) == NONE
        assert c.txns[TID].state == TxnState.ONGOING and c.txns[TID].client_tv == 2
        assert await c.end_txn(TID, pid, 0, True, 2) == (NONE, pid, 1)
        assert fake.markers == [("t", 1, pid, 1, True, 2)]  # the bumped epoch, checked as TV2
        assert await c.end_txn(TID, pid, 0, True, 2) == (NONE, pid, 1)  # retry
        assert await c.end_txn(TID, pid, 0, False, 2) == (INVALID_TXN_STATE, -1, -1)
        assert await c.end_txn(TID, pid, 1, True, 2) == (INVALID_TXN_STATE, -1, -1)
        assert await c.end_txn(TID, pid, 3, True, 2) == (PRODUCER_FENCED, -1, -1)
        assert await c.end_txn(TID, pid + 1, 1, True, 2) == (INVALID_PRODUCER_ID_MAPPING, -1, -1)
        # an abort of no transaction only bumps the epoch; its retry answers the same pair
        assert await c.end_txn(TID, pid, 1, False, 2) == (NONE, pid, 2)
        assert await c.end_txn(TID, pid, 1, False, 2) == (NONE, pid, 2)
        assert len(fake.markers) == 1
        # the old epoch may not open the next transaction; version 0's EndTxn does not bump
        assert await c.add_partition_implicitly(TID, pid, 1, "t", 0) == PRODUCER_FENCED
        assert await c.add_partition_implicitly(TID, pid, 2, "t", 0) == NONE
        assert await c.end_txn(TID, pid, 2, False, 0) == (NONE, -1, -1)
        assert fake.markers[-1] == ("t", 0, pid, 2, False, 0)
        assert c.txns[TID].producer_epoch == 2
        c.close()

    run(scenario())


def test_exhausted_epoch_rotates_the_producer_id_and_recovery_finishes_it(tmp_path: Path) -> None:
    """At epoch 32766 an EndTxn v5 ends with markers of epoch 32767 and answers a new producer
    id at epoch 0; the retry of that end (the old id at 32766) gets the same answer.  A
    controller that stops between Prepare and its markers finishes the rotation at its next
    start, from the Prepare record's NextProducerId."""
    fake = Fake()

    async def first() -> int:
        c = fake.coordinator(tmp_path)
        c.start()
        _, pid, _ = await c.init_producer_id(TID, 60_000)
        c.txns[TID].producer_epoch = 32765  # white box: 32765 transactions later
        assert await c.add_partition_implicitly(TID, pid, 32765, "t", 0) == NONE
        assert await c.end_txn(TID, pid, 32765, True, 2) == (NONE, pid, 32766)
        assert await c.add_partition_implicitly(TID, pid, 32766, "t", 0) == NONE
        err, new_pid, epoch = await c.end_txn(TID, pid, 32766, True, 2)
        assert (err, epoch) == (NONE, 0) and new_pid != pid
        assert fake.markers[-1] == ("t", 0, pid, 32767, True, 2)
        assert await c.end_txn(TID, pid, 32766, True, 2) == (NONE, new_pid, 0)  # its retry
        assert await c.end_txn(TID, new_pid, 0, True, 2) == (INVALID_TXN_STATE, -1, -1)
        # the next transaction of the new id ends with the controller going down mid-marker
        assert await c.add_partition_implicitly(TID, new_pid, 0, "t", 1) == NONE
        c.txns[TID].producer_epoch = 32766
        c.txns[TID].busy = True
        fake.down = True
        with pytest.raises(ConnectionError):
            await c._prepare_and_complete(c.txns[TID], True, bump=True, client_tv=2,
                                          next_pid=4242)
        c.close()
        return new_pid

    new_pid = run(first())
    fake.down = False
    fake.markers.clear()

    async def second() -> None:
        c = fake.coordinator(tmp_path)
        pending = c.load()
        m = c.txns[TID]
        assert [p.transactional_id for p in pending] == [TID]
        assert (m.state, m.producer_id, m.producer_epoch, m.next_producer_id, m.client_tv) == \
            (TxnState.PREPARE_COMMIT, new_pid, 32767, 4242, 2)
        c.start(pending)
        for _ in range(100):
            if m.state == TxnState.COMPLETE_COMMIT:
                break
            await asyncio.sleep(0.01)
        assert fake.markers == [("t", 1, new_pid, 32767, True, 2)]
        assert (m.state, m.producer_id, m.producer_epoch, m.prev_producer_id) == \
            (TxnState.COMPLETE_COMMIT, 4242, 0, new_pid)
        c.close()

    run(second())


def test_fence_bumps_once_and_busy_is_concurrent(tmp_path: Path) -> None:
    """KAFKA-19367: InitProducerId over an open version 2 transaction bumps the epoch once and
    aborts with markers of that epoch; the retry bumps again."""
    fake = Fake()

    async def scenario() -> None:
        c = fake.coordinator(tmp_path)
        c.start()
        _, pid, _ = await c.init_producer_id(TID, 60_000)
        assert await c.add_partition_implicitly(TID, pid, 0, "t", 0) == NONE
        assert (await c.init_producer_id(TID, 60_000))[0] == CONCURRENT_TRANSACTIONS
        for _ in range(100):
            if not c.txns[TID].busy:
                break
            await asyncio.sleep(0.01)
        assert fake.markers == [("t", 0, pid, 1, False, 2)]
        assert await c.init_producer_id(TID, 60_000) == (NONE, pid, 2)
        c.close()

    run(scenario())


def test_transaction_log_value_v1_and_v0() -> None:
    m = TxnMetadata(TID, 5, 3, 60_000, TxnState.PREPARE_COMMIT, {("a", 1), ("a", 0), ("b", 2)},
                    10, 9, prev_producer_id=4, next_producer_id=9, client_tv=2)
    value = txn_value(m)
    assert value[:2] == b"\x00\x01"  # flexible, as Kafka writes with transaction.version >= 1
    back = decode_value(TID, value)
    assert (back.producer_id, back.producer_epoch, back.state, back.partitions,
            back.prev_producer_id, back.next_producer_id, back.client_tv) == \
        (5, 3, TxnState.PREPARE_COMMIT, m.partitions, 4, 9, 2)
    # the defaults are not written: Empty, no rotation, version 0 client
    empty = TxnMetadata(TID, 5, 0, 60_000)
    assert txn_value(empty) == struct.pack(">hqhib", 1, 5, 0, 60_000, 0) + b"\x00" + \
        struct.pack(">qq", -1, -1) + b"\x00"
    # v0 (what shmq wrote before) still reads
    v0 = struct.pack(">hqhibi", 0, 7, 2, 1000, 1, 1) + struct.pack(">h", 1) + b"t" + \
        struct.pack(">ii", 1, 3) + struct.pack(">qq", 5, 4)
    old = decode_value(TID, v0)
    assert (old.producer_id, old.state, old.partitions, old.client_tv) == \
        (7, TxnState.ONGOING, {("t", 3)}, 0)
    # an unknown tag (9) is skipped; truncation and nonsense are errors, not crashes
    tagged = txn_value(empty)[:-1] + b"\x01\x09\x02\xab\xcd"
    assert decode_value(TID, tagged).client_tv == 0
    for bad in (value[:20], value[:-3], struct.pack(">h", 7) + value[2:],
                value[:2] + b"\x00" * 15 + b"\x09"):
        with pytest.raises(ValueError):
            decode_value(TID, bad)


def test_version_2_marker_must_be_above_the_producer_epoch(tmp_path: Path) -> None:
    """ProducerAppendInfo.checkProducerEpoch: a version 2 marker at the epoch of the open
    transaction is INVALID_PRODUCER_EPOCH and writes nothing; one epoch above ends it; a repeat
    of that marker with no transaction open is accepted and writes nothing (KAFKA-19999); a
    version 0 marker at the same epoch still ends a transaction."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    try:
        pid = 77

        def data(epoch: int, seq: int) -> None:
            log.append(bytes(encode_batch([(b"k", b"v")], producer_id=pid, producer_epoch=epoch,
                                          base_sequence=seq, transactional=True)))

        data(4, 0)
        with pytest.raises(KafkaApiError) as info:
            log.append_control(pid, 4, 0, True, transaction_version=2)
        assert info.value.code == 47 and log.log_end_offset == 1
        assert log.append_control(pid, 5, 0, True, transaction_version=2) is not None
        log.update_high_watermark(log.log_end_offset)
        assert log.log_end_offset == 2 and log.last_stable_offset == 2
        assert log.append_control(pid, 5, 0, True, transaction_version=2) is None
        assert log.log_end_offset == 2
        with pytest.raises(KafkaApiError):
            log.append_control(pid, 4, 0, False, transaction_version=2)
        data(5, 0)  # the next transaction, at the epoch the marker brought
        assert log.append_control(pid, 5, 0, False) is not None  # version 0: same epoch ends it
        log.update_high_watermark(log.log_end_offset)
        assert log.last_stable_offset == log.log_end_offset == 4
    finally:
        log.close()


def test_module_constants() -> None:
    assert tx.TRANSACTION_VERSION == 2 and tx.MAX_EPOCH == 32767
