"""Independent oracles for the storage tests.

Batches are built with kafka-python's ``DefaultRecordBatchBuilder`` (an independent producer of
RecordBatch v2 bytes), CRCs are checked with the ``crc32c`` PyPI package, records are decoded with
kafka-python's ``DefaultRecordBatch`` and the index files are parsed here with ``struct``: nothing
below uses shmq's own codecs, so a bug there cannot hide a bug in the storage layer.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Sequence
from pathlib import Path

import crc32c

with warnings.catch_warnings():
    # kafka-python 3.0.12 calls the deprecated importlib.resources.read_text on import.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

HEADER = 61


def kbatch(values: Sequence[bytes | None], timestamps: Sequence[int] | None = None, *,
           key: bytes | None = None, compression: int = 0, producer_id: int = -1,
           producer_epoch: int = -1, base_sequence: int = -1) -> bytes:
    """One RecordBatch v2 built by kafka-python (baseOffset 0, leader epoch 0)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=False, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, batch_size=1 << 30)
    for i, value in enumerate(values):
        ts = timestamps[i] if timestamps is not None else 1_700_000_000_000 + i
        builder.append(i, timestamp=ts, key=key, value=value, headers=[])
    return bytes(builder.build())


def split_batches(data: bytes) -> list[tuple[int, bytes]]:
    """(position, bytes) of every whole batch in ``data`` (by batchLength only)."""
    out = []
    pos = 0
    while pos + 12 <= len(data):
        size = struct.unpack_from(">i", data, pos + 8)[0] + 12
        if size < 12 or pos + size > len(data):
            break
        out.append((pos, data[pos : pos + size]))
        pos += size
    return out


def log_batches(path: Path) -> list[tuple[int, bytes]]:
    return split_batches(path.read_bytes())


def crc_ok(batch: bytes) -> bool:
    """CRC-32C over bytes 21..end equals the stored CRC at 17..21 (DefaultRecordBatch)."""
    return crc32c.crc32c(batch[21:]) == struct.unpack_from(">I", batch, 17)[0]


def base_offset(batch: bytes) -> int:
    return struct.unpack_from(">q", batch, 0)[0]


def last_offset(batch: bytes) -> int:
    return base_offset(batch) + struct.unpack_from(">i", batch, 23)[0]


def leader_epoch(batch: bytes) -> int:
    return struct.unpack_from(">i", batch, 12)[0]


def attributes(batch: bytes) -> int:
    return struct.unpack_from(">h", batch, 21)[0]


def max_timestamp(batch: bytes) -> int:
    return struct.unpack_from(">q", batch, 35)[0]


def decode(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(offset, timestamp, key, value) of every record, decoded by kafka-python."""
    b = DefaultRecordBatch(batch)
    assert b.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value) for r in b]


def all_records(directory: Path) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of every segment in ``directory``, in offset order."""
    out = []
    for path in sorted(directory.glob("*.log")):
        for _, batch in log_batches(path):
            out.extend(decode(batch))
    return out


def offset_index_entries(path: Path, base: int) -> list[tuple[int, int]]:
    data = path.read_bytes()
    return [(base + rel, pos) for rel, pos in struct.iter_unpack(">ii", data[: len(data) // 8 * 8])]


def time_index_entries(path: Path, base: int) -> list[tuple[int, int]]:
    data = path.read_bytes()
    return [(ts, base + rel)
            for ts, rel in struct.iter_unpack(">qi", data[: len(data) // 12 * 12])]


def expected_indexes(batches: Sequence[tuple[int, int, int, int]], interval: int
                     ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Kafka ``LogSegment.append`` run over (position, last offset, max timestamp, size) rows.

    For each batch: track the max timestamp; if the bytes written since the last index entry
    (before this batch) exceed ``index.interval.bytes``, append (lastOffset, position) to the
    offset index and (max timestamp so far, its offset) to the time index when that timestamp
    grew; reset the counter; then add the batch size.
    """
    offsets: list[tuple[int, int]] = []
    times: list[tuple[int, int]] = []
    since = 0
    max_ts, off_of_max = -1, None
    for position, last, ts, size in batches:
        if ts > max_ts:
            max_ts, off_of_max = ts, last
        if since > interval:
            offsets.append((last, position))
            if not times or max_ts > times[-1][0]:
                times.append((max_ts, off_of_max))
            since = 0
        since += size
    return offsets, times


def batch_rows(path: Path) -> list[tuple[int, int, int, int]]:
    """(position, last offset, max timestamp, size) of every batch in a .log file."""
    return [(pos, last_offset(b), max_timestamp(b), len(b)) for pos, b in log_batches(path)]
