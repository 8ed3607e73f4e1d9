"""The append path's shortcuts against the slow, obvious answers.

* The indexes cache their last entry in memory; after every kind of mutation (append, truncate,
  reset, rebuild, grow past the preallocation) it must equal the entry read back from the file.
* ``PartitionLog.append`` writes a freshly packed 16-byte prefix plus the client's bytes; the log
  file must equal the client's batches with only baseOffset and partitionLeaderEpoch changed.
"""

from __future__ import annotations

import random
import struct

from _storage_util import kbatch

from shmq.storage.log import PartitionLog
from shmq.storage.log_config import LogConfig
from shmq.storage.offset_index import OffsetIndex
from shmq.storage.time_index import TimeIndex

BASE = 500


def _read_back(idx) -> tuple[int, int]:
    empty = (idx.base_offset, 0) if isinstance(idx, OffsetIndex) else (-1, idx.base_offset)
    return idx.entry(idx.entries - 1) if idx.entries else empty


def test_last_entry_cache_follows_every_mutation(tmp_path) -> None:
    rng = random.Random(7)
    oi = OffsetIndex(tmp_path / "a.index", BASE, 8 * 40, writable=True)
    ti = TimeIndex(tmp_path / "a.timeindex", BASE, 12 * 40, writable=True)
    offset, ts = BASE, 1000
    try:
        for step in range(600):
            op = rng.random()
            if op < 0.6 and not oi.is_full:
                offset += rng.randint(1, 5)
                ts += rng.randint(0, 3)
                oi.append(offset, offset * 10)
                ti.maybe_append(ts, offset, skip_full_check=rng.random() < 0.1)
            elif op < 0.8:
                cut = rng.randint(BASE, offset + 1)
                oi.truncate_to(cut)
                ti.truncate_to(cut)
                offset = max(cut - 1, oi.last_entry[0], ti.last_entry[1])
                ts = max(ts, ti.last_entry[0])
            elif op < 0.9:
                oi.reset()
                ti.reset()
                offset = BASE
            else:
                oi.last_entry, ti.last_entry  # noqa: B018  (fill the cache, then mutate)
                oi.truncate_entries(max(0, oi.entries - 1))
                ti.truncate_entries(max(0, ti.entries - 1))
                offset = max(offset, oi.last_entry[0])
            assert oi.last_entry == _read_back(oi), step
            assert ti.last_entry == _read_back(ti), step
        oi.begin_rebuild()
        ti.begin_rebuild()
        assert oi.last_entry == (BASE, 0) and ti.last_entry == (-1, BASE)
        oi.append(BASE + 3, 30)
        ti.maybe_append(5, BASE + 3)
        assert oi.last_entry == _read_back(oi) == (BASE + 3, 30)
        assert ti.last_entry == _read_back(ti) == (5, BASE + 3)
    finally:
        oi.close()
        ti.close()


def test_appended_bytes_are_the_clients_with_offset_and_epoch_stamped(tmp_path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(index_interval_bytes=100))
    sent = []
    try:
        for i in range(30):
            batch = kbatch([b"v%03d" % j * (i + 1) for j in range(1 + i % 4)],
                           [1_000 + i * 10 + j for j in range(1 + i % 4)])
            info = log.append(batch, leader_epoch=3 + i // 10)
            sent.append((batch, info.first_offset, 3 + i // 10))
        data = log.active_segment.read_bytes(0, log.active_segment.size)
    finally:
        log.close()
    pos = 0
    for batch, first, epoch in sent:
        expected = bytearray(batch)
        struct.pack_into(">q", expected, 0, first)
        struct.pack_into(">i", expected, 12, epoch)
        assert data[pos : pos + len(batch)] == bytes(expected)
        pos += len(batch)
    assert pos == len(data)
