"""ProducerStateManager: Kafka's idempotence rules, transactions, snapshots and replay.

Snapshot bytes are checked against a layout written out here with ``struct`` and the ``crc32c``
PyPI package (not shmq's CRC), following Kafka's ``ProducerSnapshot.json`` v1.
"""

from __future__ import annotations

import os
import struct

import crc32c
import pytest

from shmq import _fast
from shmq.errors import KafkaApiError
from shmq.protocol.records import encode_batch, scan_headers
from shmq.storage.producer_state import (
    NUM_BATCHES_TO_RETAIN,
    BatchMetadata,
    CorruptSnapshotError,
    ProducerStateManager,
    decode_snapshot,
    increment_sequence,
)

INT32_MAX = 2**31 - 1
PID = 1000
T0 = 1_700_000_000_000

# Kafka ProducerSnapshot v1, as read from ProducerStateManager.java: header then 46-byte entries
ORACLE_HEADER = struct.Struct(">hIi")
ORACLE_ENTRY = struct.Struct(">qhiqiqiq")


def code_of(excinfo: pytest.ExceptionInfo[KafkaApiError]) -> int:
    return excinfo.value.code


class Producer:
    """A well-behaved idempotent producer writing ``count``-record batches through the manager."""

    def __init__(self, state: ProducerStateManager, pid: int = PID, epoch: int = 0,
                 seq: int = 0) -> None:
        self.state, self.pid, self.epoch, self.seq = state, pid, epoch, seq

    def send(self, offset: int, count: int = 1, *, transactional: bool = False,
             ts: int = T0) -> BatchMetadata:
        last_seq = increment_sequence(self.seq, count - 1)
        dup = self.state.check_append(self.pid, self.epoch, self.seq, last_seq, transactional)
        assert dup is None
        self.state.update(self.pid, self.epoch, self.seq, last_seq, offset, offset + count - 1,
                          ts, transactional)
        sent = BatchMetadata(self.seq, last_seq, offset + count - 1, count - 1, ts)
        self.seq = increment_sequence(last_seq, 1)
        return sent


@pytest.fixture
def state(tmp_path) -> ProducerStateManager:
    return ProducerStateManager(tmp_path)


# -- sequence rules ---------------------------------------------------------------------------


def test_unknown_producer_accepts_any_sequence(state):
    # Kafka >= 2.5 (KIP-360): no UNKNOWN_PRODUCER_ID, an unknown producer may start anywhere
    assert state.check_append(PID, 3, 42, 44, False) is None
    state.update(PID, 3, 42, 44, 0, 2, T0, False)
    assert state.check_append(PID, 3, 45, 45, False) is None
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(PID, 3, 46, 46, False)
    assert code_of(exc) == 45


def test_same_epoch_needs_next_sequence(state):
    p = Producer(state)
    p.send(0, 3)                                            # seqs 0..2
    for bad in (4, 1, 2, 1000):
        with pytest.raises(KafkaApiError) as exc:
            state.check_append(PID, 0, bad, bad, False)
        assert code_of(exc) == 45, bad
    assert state.check_append(PID, 0, 3, 5, False) is None


def test_sequence_wraps_at_int32_max(state):
    p = Producer(state, seq=INT32_MAX - 2)
    sent = p.send(0, 5)                                     # MAX-2, MAX-1, MAX, 0, 1
    assert sent.last_seq == 1
    assert state.last_entry(PID).last_seq == 1
    assert state.check_append(PID, 0, INT32_MAX - 2, 1, False) == sent   # retry detected
    assert state.check_append(PID, 0, 2, 2, False) is None

    q = Producer(state, pid=PID + 1, seq=INT32_MAX)
    q.send(10)
    assert state.check_append(PID + 1, 0, 0, 0, False) is None           # MAX -> 0
    for bad in (1, INT32_MAX - 1):
        with pytest.raises(KafkaApiError) as exc:
            state.check_append(PID + 1, 0, bad, bad, False)
        assert code_of(exc) == 45


def test_duplicates_detected_over_the_last_five_batches_only(state):
    p = Producer(state)
    sent = [p.send(offset=10 * i, count=2, ts=T0 + i) for i in range(6)]
    entry = state.last_entry(PID)
    assert len(entry.batches) == NUM_BATCHES_TO_RETAIN == 5
    assert list(entry.batches) == sent[1:]
    for batch in sent[1:]:
        dup = state.check_append(PID, 0, batch.first_seq, batch.last_seq, False)
        assert dup == batch
        assert (dup.first_offset, dup.last_offset, dup.timestamp) == (
            batch.last_offset - 1, batch.last_offset, batch.timestamp)
    oldest = sent[0]
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(PID, 0, oldest.first_seq, oldest.last_seq, False)
    assert code_of(exc) == 45


def test_duplicate_needs_the_exact_sequence_range(state):
    p = Producer(state)
    p.send(0, 3)                                            # seqs 0..2
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(PID, 0, 0, 1, False)
    assert code_of(exc) == 45


def test_duplicate_is_checked_before_transaction_state(state):
    p = Producer(state)
    sent = p.send(0, transactional=True)
    # a retried batch is answered from the cache even if it would now fail another rule
    assert state.check_append(PID, 0, 0, 0, True) == sent


# -- epochs -----------------------------------------------------------------------------------


def test_epoch_bump_starts_at_sequence_zero_and_clears_the_cache(state):
    p = Producer(state, epoch=4)
    p.send(0, 2)
    p.send(2, 2)
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(PID, 5, 4, 4, False)             # new epoch must restart at 0
    assert code_of(exc) == 45
    assert state.check_append(PID, 5, 0, 0, False) is None
    state.update(PID, 5, 0, 0, 4, 4, T0, False)
    entry = state.last_entry(PID)
    assert entry.producer_epoch == 5
    assert list(entry.batches) == [BatchMetadata(0, 0, 4, 0, T0)]
    assert state.check_append(PID, 5, 1, 1, False) is None


def test_lower_epoch_is_fenced(state):
    p = Producer(state, epoch=4)
    old = p.send(0)
    p.epoch, p.seq = 5, 0
    p.send(1)
    # even a retry of a batch the old epoch wrote: the cache holds epoch 5 only
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(PID, 4, old.first_seq, old.last_seq, False)
    assert code_of(exc) == 47
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(PID, 4, 1, 1, False)
    assert code_of(exc) == 47


def test_duplicate_of_another_epoch_is_not_a_duplicate(state):
    p = Producer(state, epoch=1)
    p.send(0)                                               # epoch 1, seq 0
    # epoch 2 with seq 0 is a new batch of the new epoch, not a retry
    assert state.check_append(PID, 2, 0, 0, False) is None


def test_coordinator_origin_checks_only_the_epoch(state):
    p = Producer(state, epoch=3)
    p.send(0)
    assert state.check_append(PID, 3, -1, -1, False, origin_client=False) is None
    assert state.check_append(PID, 3, 77, 77, False, origin_client=False) is None
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(PID, 2, -1, -1, False, origin_client=False)
    assert code_of(exc) == 47


def test_known_epoch_without_batches_restarts_at_zero(state):
    # a marker with a bumped epoch leaves the epoch known and no batch (snapshot lastOffset -1):
    # Kafka then compares against NO_SEQUENCE, so only 0 follows on
    Producer(state, epoch=1).send(0, transactional=True)
    state.complete_txn(PID, 2, 1, T0)
    assert state.last_entry(PID).is_empty
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(PID, 2, 5, 5, False)
    assert code_of(exc) == 45
    assert state.check_append(PID, 2, 0, 0, False) is None


# -- transactions -----------------------------------------------------------------------------


def test_transaction_tracking_and_first_unstable_offset(state):
    a = Producer(state, pid=1)
    b = Producer(state, pid=2)
    assert state.first_unstable_offset() is None
    a.send(10, 2, transactional=True)
    b.send(12, transactional=True)
    a.send(13, transactional=True)
    assert state.last_entry(1).current_txn_first_offset == 10
    assert state.last_entry(2).current_txn_first_offset == 12
    assert state.first_unstable_offset() == 10
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(1, 0, a.seq, a.seq, False)       # plain write inside a txn
    assert code_of(exc) == 48
    assert state.complete_txn(1, 0, 14, T0 + 5, coordinator_epoch=7) == 10
    assert state.first_unstable_offset() == 12
    entry = state.last_entry(1)
    assert entry.current_txn_first_offset is None
    assert entry.coordinator_epoch == 7
    assert entry.last_timestamp == T0 + 5
    assert len(entry.batches) == 2                          # same epoch: batches kept
    assert state.check_append(1, 0, a.seq, a.seq, False) is None
    assert state.complete_txn(2, 0, 15, T0) == 12
    assert state.first_unstable_offset() is None
    assert state.complete_txn(2, 0, 16, T0) is None         # nothing open: empty transaction


def test_transactional_batch_without_open_transaction_is_allowed(state):
    assert state.check_append(PID, 0, 0, 0, True) is None   # coordinator verification: later


def test_marker_fencing(state):
    p = Producer(state, epoch=3)
    p.send(0, transactional=True)
    state.complete_txn(PID, 3, 1, T0, coordinator_epoch=5)
    p.send(2, transactional=True)
    with pytest.raises(KafkaApiError) as exc:
        state.complete_txn(PID, 2, 3, T0, coordinator_epoch=5)
    assert code_of(exc) == 47
    with pytest.raises(KafkaApiError) as exc:
        state.complete_txn(PID, 3, 3, T0, coordinator_epoch=4)
    assert code_of(exc) == 52
    assert state.first_unstable_offset() == 2               # failed markers change nothing
    assert state.complete_txn(PID, 4, 3, T0, coordinator_epoch=5) == 2
    assert state.last_entry(PID).producer_epoch == 4
    assert state.last_entry(PID).is_empty                   # a bumped epoch clears the cache


# -- snapshots --------------------------------------------------------------------------------


def oracle_snapshot(entries: list[tuple]) -> bytes:
    body = struct.pack(">i", len(entries)) + b"".join(ORACLE_ENTRY.pack(*e) for e in entries)
    return struct.pack(">hI", 1, crc32c.crc32c(body)) + body


def oracle_parse(data: bytes) -> list[tuple]:
    version, crc, count = ORACLE_HEADER.unpack_from(data, 0)
    assert version == 1
    assert crc == crc32c.crc32c(data[6:])                   # CRC covers everything after itself
    assert len(data) == 10 + 46 * count
    return [ORACLE_ENTRY.unpack_from(data, 10 + 46 * i) for i in range(count)]


def build_mixed_state(state: ProducerStateManager) -> None:
    p = Producer(state, pid=7, epoch=2)
    for i in range(4):
        p.send(10 * i, 3, ts=T0 + i)                        # last batch: seqs 9..11 at 30..32
    t = Producer(state, pid=3, epoch=0)
    t.send(40, 2, transactional=True, ts=T0 + 9)            # open txn at 40
    m = Producer(state, pid=5, epoch=1)
    m.send(42, transactional=True, ts=T0 + 10)
    state.complete_txn(5, 1, 43, T0 + 11, coordinator_epoch=9)


def test_snapshot_byte_layout(state, tmp_path):
    build_mixed_state(state)
    path = state.take_snapshot(1234)
    assert path == tmp_path / "00000000000000001234.snapshot"
    assert sorted(os.listdir(tmp_path)) == ["00000000000000001234.snapshot"]  # no .tmp left
    data = path.read_bytes()
    assert oracle_parse(data) == [
        # pid, epoch, lastSeq, lastOffset, offsetDelta, timestamp, coordEpoch, txnFirstOffset
        (3, 0, 1, 41, 1, T0 + 9, -1, 40),
        (5, 1, 0, 42, 0, T0 + 11, 9, -1),
        (7, 2, 11, 32, 2, T0 + 3, -1, -1),
    ]
    assert data == oracle_snapshot(oracle_parse(data))


def test_snapshot_round_trip_keeps_only_the_last_batch(state, tmp_path):
    build_mixed_state(state)
    state.take_snapshot(44)
    fresh = ProducerStateManager(tmp_path)
    assert fresh.load_snapshot(44) == 44
    assert sorted(fresh.producers) == [3, 5, 7]
    e7 = fresh.last_entry(7)
    assert (e7.producer_epoch, e7.coordinator_epoch, e7.last_timestamp) == (2, -1, T0 + 3)
    assert list(e7.batches) == [BatchMetadata(9, 11, 32, 2, T0 + 3)]
    assert fresh.last_entry(3).current_txn_first_offset == 40
    assert fresh.first_unstable_offset() == 40
    assert fresh.last_entry(5).coordinator_epoch == 9
    # duplicate detection after a reload covers the last batch only
    assert fresh.check_append(7, 2, 9, 11, False) == BatchMetadata(9, 11, 32, 2, T0 + 3)
    assert state.check_append(7, 2, 6, 8, False) is not None        # in memory: still cached
    with pytest.raises(KafkaApiError) as exc:
        fresh.check_append(7, 2, 6, 8, False)
    assert code_of(exc) == 45
    assert fresh.check_append(7, 2, 12, 12, False) is None
    # and writing it again gives the same bytes
    fresh.take_snapshot(45)
    assert (tmp_path / "00000000000000000045.snapshot").read_bytes() == (
        tmp_path / "00000000000000000044.snapshot").read_bytes()


def test_snapshot_written_by_the_oracle_loads(state, tmp_path):
    # an entry with a wrapped sequence, one with no batch (lastOffset -1), one with a txn
    data = oracle_snapshot([
        (11, 0, 1, 99, 4, T0, -1, -1),
        (12, 3, -1, -1, 0, T0 + 1, 2, -1),
        (13, 1, 6, 120, 0, T0 + 2, 0, 118),
    ])
    (tmp_path / "00000000000000000200.snapshot").write_bytes(data)
    assert state.load_snapshot(500) == 200
    assert list(state.last_entry(11).batches) == [BatchMetadata(INT32_MAX - 2, 1, 99, 4, T0)]
    assert state.last_entry(11).batches[0].first_offset == 95
    assert state.last_entry(12).is_empty
    assert state.last_entry(12).producer_epoch == 3
    assert state.last_entry(13).current_txn_first_offset == 118
    assert state.check_append(11, 0, INT32_MAX - 2, 1, False) is not None
    assert state.check_append(11, 0, 2, 2, False) is None


def test_empty_snapshot(state, tmp_path):
    state.take_snapshot(0)
    data = (tmp_path / "00000000000000000000.snapshot").read_bytes()
    assert data == oracle_snapshot([])
    assert len(data) == 10
    assert state.load_snapshot(0) == 0
    assert not state.producers


@pytest.mark.parametrize("damage", ["flip_entry", "flip_count", "flip_crc", "version", "truncate",
                                    "trailing", "short"])
def test_corrupt_snapshot_is_deleted_and_older_one_used(state, tmp_path, damage):
    Producer(state, pid=1).send(0)
    state.take_snapshot(10)
    Producer(state, pid=2).send(10)
    bad = state.take_snapshot(20)
    data = bytearray(bad.read_bytes())
    if damage == "flip_entry":
        data[30] ^= 0x01
    elif damage == "flip_count":
        data[9] ^= 0x01
    elif damage == "flip_crc":
        data[3] ^= 0x80
    elif damage == "version":
        data[0:2] = struct.pack(">h", 2)
    elif damage == "truncate":
        data = data[:-5]
    elif damage == "trailing":
        data += b"\x00" * 46
    else:
        data = data[:4]
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(bytes(data))
    fresh = ProducerStateManager(tmp_path)
    assert fresh.load_snapshot(100) == 10
    assert sorted(fresh.producers) == [1]
    assert not bad.exists()
    assert fresh.list_snapshot_offsets() == [10]


@pytest.mark.parametrize("count", [2, 0, -1])
def test_snapshot_with_a_valid_crc_but_wrong_count_is_corrupt(state, tmp_path, count):
    body = struct.pack(">i", count) + ORACLE_ENTRY.pack(1, 0, 0, 0, 0, T0, -1, -1)
    data = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(data)
    (tmp_path / "00000000000000000009.snapshot").write_bytes(data)
    assert state.load_snapshot(9) is None
    assert state.list_snapshot_offsets() == []


def test_load_snapshot_respects_the_upper_bound(state, tmp_path):
    for off in (5, 10, 20):
        Producer(state, pid=off).send(off)
        state.take_snapshot(off)
    fresh = ProducerStateManager(tmp_path)
    assert fresh.load_snapshot(19) == 10
    assert sorted(fresh.producers) == [5, 10]
    assert fresh.list_snapshot_offsets() == [5, 10, 20]     # nothing deleted
    assert fresh.load_snapshot(4) is None
    assert not fresh.producers                              # loading replaces the state


def test_snapshot_listing_and_deletion(state, tmp_path):
    for off in (0, 100, 250, 999):
        state.take_snapshot(off)
    for name in ("00000000000000000100.log", "00000000000000000300.snapshot.tmp",
                 "00000000000000000400.snapshot.deleted", "12.snapshot", "leader-epoch-checkpoint"):
        (tmp_path / name).write_bytes(b"x")
    assert state.list_snapshot_offsets() == [0, 100, 250, 999]
    assert state.delete_snapshots_below(250) == [0, 100]
    assert state.delete_snapshots_above(250) == [999]
    assert state.list_snapshot_offsets() == [250]
    assert (tmp_path / "00000000000000000100.log").exists()
    assert (tmp_path / "12.snapshot").exists()


def test_take_snapshot_replaces_an_existing_file(state, tmp_path):
    state.take_snapshot(7)
    Producer(state).send(0)
    state.take_snapshot(7)
    assert [e[0] for e in oracle_parse((tmp_path / "00000000000000000007.snapshot").read_bytes())] == [PID]


def test_truncate_and_reload(state, tmp_path):
    for off in (10, 20, 30):
        Producer(state, pid=off).send(off - 1)
        state.take_snapshot(off)
    assert state.truncate_and_reload(10, 25) == 20
    assert state.list_snapshot_offsets() == [20]            # 10 <= log start and 30 > LEO gone
    assert sorted(state.producers) == [10, 20]
    assert state.truncate_and_reload(20, 25) == 20          # nothing left: replay from the start
    assert not state.producers
    state.take_snapshot(22)
    state.truncate_fully()
    assert state.list_snapshot_offsets() == []


# -- replay from batch headers ----------------------------------------------------------------


def log_bytes(batches: list[dict]) -> bytes:
    out = bytearray()
    offset = 0
    for spec in batches:
        n = spec.pop("n", 1)
        ts = spec.pop("ts", T0)
        recs = [(None, b"v%d" % i, ts + i) for i in range(n)]
        out += encode_batch(recs, base_offset=offset, partition_leader_epoch=0, **spec)
        offset += n
    return bytes(out)


def test_load_from_batches_matches_live_updates(state, tmp_path):
    data = log_bytes([
        dict(n=3),                                                      # no producer id
        dict(n=2, producer_id=1, producer_epoch=0, base_sequence=0),
        dict(n=3, producer_id=2, producer_epoch=4, base_sequence=INT32_MAX - 1),
        dict(n=3, producer_id=1, producer_epoch=0, base_sequence=2, ts=T0 + 50),
        dict(n=1, producer_id=2, producer_epoch=4, base_sequence=1),
    ])
    table = scan_headers(data)
    assert len(table) == 5
    state.load_from_batches(table)
    assert sorted(state.producers) == [1, 2]
    e1 = state.last_entry(1)
    assert list(e1.batches) == [BatchMetadata(0, 1, 4, 1, T0 + 1),
                                BatchMetadata(2, 4, 10, 2, T0 + 52)]
    assert e1.last_timestamp == T0 + 52
    e2 = state.last_entry(2)
    assert e2.producer_epoch == 4
    assert [(b.first_seq, b.last_seq) for b in e2.batches] == [(INT32_MAX - 1, 0), (1, 1)]
    # the same history pushed through the live path gives the same state
    live = ProducerStateManager(tmp_path)
    Producer(live, pid=1).send(3, 2, ts=T0 + 1)
    p2 = Producer(live, pid=2, epoch=4, seq=INT32_MAX - 1)
    p2.send(5, 3, ts=T0 + 2)
    Producer(live, pid=1, seq=2).send(8, 3, ts=T0 + 52)
    p2.send(11, ts=T0)
    assert dict(live.producers) == dict(state.producers)
    # retries are recognised after a replay; the next batch must follow on
    assert state.check_append(1, 0, 2, 4, False).first_offset == 8
    assert state.check_append(2, 4, 2, 2, False) is None


def test_load_from_batches_transactions_and_markers(state):
    data = log_bytes([
        dict(n=2, producer_id=1, producer_epoch=0, base_sequence=0, transactional=True),
        dict(n=1, producer_id=2, producer_epoch=0, base_sequence=0, transactional=True),
        dict(n=1, producer_id=1, producer_epoch=0, base_sequence=2, transactional=True),
        dict(n=1, producer_id=1, producer_epoch=0, transactional=True, control=True, ts=T0 + 9),
        dict(n=1, producer_id=3, producer_epoch=0, base_sequence=0),
    ])
    state.load_from_batches(scan_headers(data))
    assert state.last_entry(1).current_txn_first_offset is None     # committed/aborted at 4
    assert state.last_entry(1).last_timestamp == T0 + 9
    assert [(b.first_seq, b.last_seq) for b in state.last_entry(1).batches] == [(0, 1), (2, 2)]
    assert state.last_entry(2).current_txn_first_offset == 2
    assert state.last_entry(3).current_txn_first_offset is None
    assert state.first_unstable_offset() == 2


def test_load_from_batches_on_top_of_a_snapshot(state, tmp_path):
    Producer(state, pid=1).send(0, 2)
    state.take_snapshot(2)
    data = log_bytes([dict(n=2, producer_id=1, producer_epoch=0, base_sequence=0),
                      dict(n=1, producer_id=1, producer_epoch=0, base_sequence=2)])
    fresh = ProducerStateManager(tmp_path)
    start = fresh.load_snapshot(3)
    table = scan_headers(data)
    fresh.load_from_batches(table[table[:, _fast.COL_BASE_OFFSET] >= start])
    assert [(b.first_seq, b.last_seq) for b in fresh.last_entry(1).batches] == [(0, 1), (2, 2)]
    assert fresh.check_append(1, 0, 3, 3, False) is None


def test_load_from_batches_epoch_bump(state):
    data = log_bytes([
        dict(n=1, producer_id=1, producer_epoch=0, base_sequence=0),
        dict(n=1, producer_id=1, producer_epoch=0, base_sequence=1),
        dict(n=1, producer_id=1, producer_epoch=1, base_sequence=0),
    ])
    state.load_from_batches(scan_headers(data))
    entry = state.last_entry(1)
    assert entry.producer_epoch == 1
    assert list(entry.batches) == [BatchMetadata(0, 0, 2, 0, T0)]
    with pytest.raises(KafkaApiError) as exc:
        state.check_append(1, 0, 2, 2, False)
    assert code_of(exc) == 47


# -- expiration -------------------------------------------------------------------------------


def test_remove_expired(tmp_path):
    state = ProducerStateManager(tmp_path, producer_id_expiration_ms=1000)
    Producer(state, pid=1).send(0, ts=T0)
    Producer(state, pid=2).send(1, ts=T0 + 500)
    Producer(state, pid=3).send(2, ts=T0, transactional=True)        # open txn: never expires
    assert state.remove_expired(T0 + 999) == []
    assert state.remove_expired(T0 + 1000) == [1]                    # idle >= expiration
    assert sorted(state.producers) == [2, 3]
    assert state.remove_expired(T0 + 10_000) == [2]
    assert sorted(state.producers) == [3]
    # a forgotten producer is unknown again: any sequence goes
    assert state.check_append(1, 0, 17, 17, False) is None


def test_default_expiration_is_one_day(tmp_path):
    state = ProducerStateManager(tmp_path)
    assert state.producer_id_expiration_ms == 86_400_000
    Producer(state).send(0, ts=T0)
    assert state.remove_expired(T0 + 86_399_999) == []
    assert state.remove_expired(T0 + 86_400_000) == [PID]


def test_load_snapshot_skips_expired_producers(tmp_path):
    state = ProducerStateManager(tmp_path, producer_id_expiration_ms=1000)
    Producer(state, pid=1).send(0, ts=T0)
    Producer(state, pid=2).send(1, ts=T0 + 900)
    state.take_snapshot(2)
    fresh = ProducerStateManager(tmp_path, producer_id_expiration_ms=1000)
    assert fresh.load_snapshot(2, now_ms=T0 + 1500) == 2
    assert sorted(fresh.producers) == [2]
    assert fresh.load_snapshot(2) == 2
    assert sorted(fresh.producers) == [1, 2]
