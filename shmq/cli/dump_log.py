"""``shmq dump-log``: Kafka's ``kafka-dump-log.sh`` (``DumpLogSegments``), same flags, same text.

Every line written to stdout is the line Kafka's tool prints for the same file, so scripts and
eyes used to Kafka's output read ours unchanged.  The rules below are Kafka's (DumpLogSegments.scala,
FileLogInputStream, OffsetIndex, TimeIndex, TransactionIndex); where Kafka would die with an
exception, we print one ``Error:`` line on stderr instead, carry on, and exit 1.

``.log`` files are walked the way ``FileLogInputStream`` frames batches::

    fewer than 17 bytes left        end of the data
    length < 14                     corrupt (Kafka throws CorruptRecordException; we stop)
    batch runs past the end         end of the data (a torn tail)
    otherwise                       one batch of length + 12 bytes; the CRC only sets "isvalid"

then ``Found N invalid bytes at the end of <name>`` when bytes are left over (not with
``--max-bytes``).  shmq stores RecordBatch v2 only, so a batch with another magic byte, or too
short for the 61-byte v2 header, also stops the walk (Kafka would print legacy messages).

Index files, all big-endian, named after the segment's base offset like the log::

    .index      8-byte entries   relative offset int32 | log position int32
    .timeindex  12-byte entries  timestamp int64 | relative offset int32
    .txnindex   34-byte entries  version int16 | producerId int64 | firstOffset int64
                                 | lastOffset int64 | lastStableOffset int64

An index is listed until the first entry after the first whose offset is the base offset
(a preallocated, zero-filled tail).  Each entry is also checked against the segment's ``.log``;
disagreements are summed up on stderr at the end, as Kafka does.  A ``.snapshot`` (producer
state, ``ProducerSnapshot`` v1: version int16 | crc32c uint32 | count int32 | 46-byte entries)
prints one line per producer; other files are ``Ignoring unknown file``.
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import stat
import struct
import sys
from typing import IO, Any

from shmq.cli import CommandError

INT_MAX = 0x7FFFFFFF
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024

# Framing constants (Kafka Records.java, LegacyRecord.java, DefaultRecordBatch.java)
LOG_OVERHEAD = 12  # baseOffset int64 + length int32
HEADER_SIZE_UP_TO_MAGIC = 17
RECORD_OVERHEAD_V0 = 14  # the smallest message of any format
BATCH_HEADER_SIZE = 61  # RecordBatch v2
CRC_START = 21  # the CRC covers attributes .. end of batch

# baseOffset, length, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_ABORTED_TXN = struct.Struct(">hqqqq")
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_END_TXN_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch

CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
CONTROL_TYPES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}

_BASE_OFFSET = re.compile(r"[+-]?[0-9]+")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "dump-log",
        help="print the batches, records and index entries of segment files (kafka-dump-log.sh)",
        description="Parse log segment and index files and dump their contents, in the format "
        "of Kafka's kafka-dump-log.sh; useful for debugging a seemingly corrupt log segment.",
    )
    p.add_argument("--files", required=True, metavar="FILE1,FILE2,...",
                   help="REQUIRED: the comma separated list of data and index log files to dump")
    p.add_argument("--print-data-log", action="store_true",
                   help="print the messages' keys and payloads (implies --deep-iteration)")
    p.add_argument("--deep-iteration", action="store_true",
                   help="print every record, not only the batch headers")
    p.add_argument("--skip-record-metadata", action="store_true",
                   help="do not print the metadata (offset, timestamp, sizes ...) of each record")
    p.add_argument("--verify-index-only", action="store_true",
                   help="check index files against their log without printing their entries")
    p.add_argument("--index-sanity-check", action="store_true",
                   help="only run the sanity check a broker runs on startup to decide whether an "
                   "index must be rebuilt")
    p.add_argument("--max-message-size", type=_size, default=DEFAULT_MAX_MESSAGE_SIZE,
                   metavar="SIZE", help="size of the largest message (default %(default)s)")
    p.add_argument("--max-bytes", type=_size, default=INT_MAX, metavar="SIZE",
                   help="read at most SIZE bytes of each .log file")
    return p


def _size(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= INT_MAX:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and {INT_MAX}")
    return value


def run(args: argparse.Namespace) -> int:
    # Java's String.split drops trailing empty strings; an empty name in the middle would make
    # Kafka crash, so we skip those too.
    files = [name for name in args.files.split(",") if name]
    if not files:
        raise CommandError("--files names no file")
    for name in files:
        if not os.path.exists(name):
            raise CommandError(f"file {name} does not exist")
        if not stat.S_ISREG(os.stat(name).st_mode):
            raise CommandError(f"{name} is not a regular file")
    dumper = Dumper(args, sys.stdout, sys.stderr)
    try:
        for name in files:
            dumper.dump(name)
        dumper.report()
    finally:
        dumper.close()
    return 1 if dumper.failed else 0


# --- Kafka arithmetic ------------------------------------------------------------------------


def _int32(v: int) -> int:
    return (v + 0x80000000) % 0x100000000 - 0x80000000


def increment_sequence(sequence: int, increment: int) -> int:
    """``DefaultRecordBatch.incrementSequence``: sequences wrap from Int.MAX to 0."""
    if sequence > _int32(INT_MAX - increment):
        return _int32(increment - _int32(INT_MAX - sequence) - 1)
    return _int32(sequence + increment)


def _bool(flag: Any) -> str:
    return "true" if flag else "false"


def _text(data: bytes) -> str:
    """Kafka's StringDecoder: ``new String(bytes, UTF_8)``, malformed input replaced."""
    return bytes(data).decode("utf-8", "replace")


def _base_offset(path: str) -> int | None:
    """``file.getName.split("\\.")(0).toLong``."""
    stem = os.path.basename(path).split(".")[0]
    if _BASE_OFFSET.fullmatch(stem) and -(2**63) <= int(stem) < 2**63:
        return int(stem)
    return None


class SegmentFile:
    """Reads of one file through a window of ``pread`` chunks.

    Not mmap: a segment truncated while we read it (broker recovery) would kill the process
    with SIGBUS; Kafka's tool reads through a FileChannel the same way.  The size is taken
    once, when the file is opened, as Kafka's ``FileRecords.open`` does; a read past a file
    that shrank since just comes back short.
    """

    CHUNK = 1 << 20

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size
        self._start = 0
        self._data = b""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SegmentFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, pos: int, n: int) -> memoryview:
        """The ``n`` bytes at ``pos`` (fewer at the end of the file)."""
        n = max(0, min(n, self.size - pos))
        if not (self._start <= pos and pos + n <= self._start + len(self._data)):
            self._data = os.pread(self._fd, max(n, self.CHUNK), pos)
            self._start = pos
        at = pos - self._start
        return memoryview(self._data)[at : at + n]

    def frame_at(self, pos: int, end: int) -> tuple[int, str | None]:
        """Size of the batch framed at ``pos`` in the first ``end`` bytes (Kafka's
        ``FileLogInputStream.nextBatch``).

        ``(size, None)`` for a whole batch, ``(0, None)`` when the data ends first (nothing
        left, or a torn tail), ``(0, reason)`` where Kafka throws CorruptRecordException.
        """
        if pos >= end - HEADER_SIZE_UP_TO_MAGIC:
            return 0, None
        head = self.read(pos, HEADER_SIZE_UP_TO_MAGIC)
        if len(head) < HEADER_SIZE_UP_TO_MAGIC:
            return 0, None
        (length,) = _I32.unpack_from(head, 8)
        if length < RECORD_OVERHEAD_V0:
            return 0, (f"batch length {length} is smaller than the minimum record overhead "
                       f"({RECORD_OVERHEAD_V0})")
        if pos > end - LOG_OVERHEAD - length:
            return 0, None
        return length + LOG_OVERHEAD, None

    def batch_at(self, pos: int, end: int) -> tuple[memoryview | None, str | None]:
        """The bytes of the batch framed at ``pos`` (None at the end of the data), and why the
        data is corrupt there if it is."""
        size, problem = self.frame_at(pos, end)
        if not size:
            return None, problem
        batch = self.read(pos, size)
        return (batch if len(batch) == size else None), None

    def last_offset_at(self, position: int, max_size: int) -> int:
        """lastOffset of the batch at ``position`` (read within ``max_size`` bytes), or -1."""
        if not 0 <= position <= self.size:
            return -1
        batch, _ = self.batch_at(position, min(self.size, position + max_size))
        return -1 if batch is None else _last_offset(batch)


def _last_offset(batch: memoryview) -> int:
    """lastOffset of a batch: base + lastOffsetDelta (of a legacy message set: its offset)."""
    (base,) = _I64.unpack_from(batch, 0)
    if len(batch) >= BATCH_HEADER_SIZE and struct.unpack_from(">b", batch, 16)[0] >= 2:
        return base + _I32.unpack_from(batch, 23)[0]
    return base


class LogFile(SegmentFile):
    """The ``.log`` an index is checked against, with its batches found by offset."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._frames: tuple[list[int], list[int], list[int], list[int]] | None = None

    def first_batch_reaching(self, offset: int) -> tuple[int, int, int] | None:
        """(position, size, lastOffset) of the first batch whose lastOffset >= ``offset``."""
        positions, sizes, last_offsets, running_max = self._scan()
        i = bisect.bisect_left(running_max, offset)
        if i == len(positions):
            return None
        return positions[i], sizes[i], last_offsets[i]

    def _scan(self) -> tuple[list[int], list[int], list[int], list[int]]:
        if self._frames is None:
            positions: list[int] = []
            sizes: list[int] = []
            last_offsets: list[int] = []
            running_max: list[int] = []  # non-decreasing, so the first batch reaching x bisects
            pos = 0
            while True:
                batch, _ = self.batch_at(pos, self.size)
                if batch is None:
                    break
                last = _last_offset(batch)
                positions.append(pos)
                sizes.append(len(batch))
                last_offsets.append(last)
                running_max.append(max(last, running_max[-1]) if running_max else last)
                pos += len(batch)
            self._frames = positions, sizes, last_offsets, running_max
        return self._frames


class Dumper:
    """Dumps files one by one, gathering the index and offset checks ``report()`` prints."""

    def __init__(self, args: argparse.Namespace, out: IO[str], err: IO[str]) -> None:
        from shmq import _fast

        self._crc32c = _fast.crc32c
        self.out = out
        self.err = err
        self.print_data = bool(args.print_data_log)
        self.deep = bool(args.deep_iteration) or self.print_data
        self.skip_metadata = bool(args.skip_record_metadata)
        self.verify_only = bool(args.verify_index_only)
        self.sanity_only = bool(args.index_sanity_check)
        self.max_message_size = int(args.max_message_size)
        self.max_bytes = int(args.max_bytes)
        self.failed = False
        # Kafka's reports, keyed by absolute path.  Kafka prepends to the index and offset lists
        # (Scala `::=`) and appends to the time index ones; we keep its printing order.
        self.index_mismatches: dict[str, list[tuple[int, int]]] = {}
        self.time_mismatches: dict[str, list[tuple[int, int]]] = {}
        self.time_out_of_order: dict[str, list[tuple[int, int]]] = {}
        self.time_not_found: dict[str, list[tuple[int, int]]] = {}
        self.non_consecutive: dict[str, list[tuple[int, int]]] = {}
        self._logs: dict[str, LogFile | None] = {}

    # --- output --------------------------------------------------------------------------------

    def emit(self, *lines: str) -> None:
        if not lines:
            return
        text = "\n".join(lines) + "\n"
        try:
            self.out.write(text)
        except UnicodeEncodeError:  # a terminal that cannot show every character
            enc = getattr(self.out, "encoding", None) or "ascii"
            self.out.write(text.encode(enc, "replace").decode(enc))

    def _stderr(self, line: str) -> None:
        self.out.flush()
        self.err.write(line + "\n")

    def error(self, message: str) -> None:
        self._stderr(f"Error: {message}")
        self.failed = True

    def close(self) -> None:
        for log in self._logs.values():
            if log is not None:
                log.close()
        self._logs.clear()

    # --- files ---------------------------------------------------------------------------------

    def dump(self, path: str) -> None:
        self.emit(f"Dumping {path}")
        name = os.path.basename(path)
        suffix = name[name.rfind("."):] if "." in name else ""
        handler = {
            ".log": self.dump_log,
            ".index": self.dump_offset_index,
            ".timeindex": self.dump_time_index,
            ".txnindex": self.dump_txn_index,
            ".snapshot": self.dump_producer_snapshot,
        }.get(suffix)
        if handler is None:
            self._stderr(f"Ignoring unknown file {path}")
            return
        try:
            handler(path)
        except BrokenPipeError:  # our reader went away: main() ends quietly
            raise
        except OSError as e:
            self.error(f"cannot read {path}: {e.strerror or e}")

    def _segment_base(self, path: str) -> int | None:
        base = _base_offset(path)
        if base is None:
            self.error(f"cannot read a base offset from the name of {path} "
                       "(segment files are named like 00000000000000000000.log)")
        return base

    # --- .log ----------------------------------------------------------------------------------

    def dump_log(self, path: str) -> None:
        base = self._segment_base(path)
        if base is None:
            return
        self.emit(f"Log starting offset: {base}")
        with SegmentFile(path) as segment:
            self._dump_batches(segment)

    def _dump_batches(self, segment: SegmentFile) -> None:
        end = min(segment.size, self.max_bytes)
        pos = 0
        problem = None
        last_offset = [-1]  # across the whole file, for the non-consecutive offsets report
        while True:
            batch, problem = segment.batch_at(pos, end)
            if batch is None:
                break
            magic = struct.unpack_from(">b", batch, 16)[0]
            if magic != 2:
                problem = f"magic byte {magic} is not 2 (shmq reads RecordBatch v2 only)"
                break
            if len(batch) < BATCH_HEADER_SIZE:
                problem = (f"batch size {len(batch)} is smaller than the {BATCH_HEADER_SIZE}-byte "
                           "RecordBatch v2 header")
                break
            self._dump_batch(segment.path, batch, pos, last_offset)
            pos += len(batch)
        trailing = end - pos
        if trailing > 0 and self.max_bytes == INT_MAX:
            self.emit(f"Found {trailing} invalid bytes at the end of "
                      f"{os.path.basename(segment.path)}")
        if problem:
            self.error(f"corrupt record batch at position {pos} of {segment.path}: {problem}")

    def _dump_batch(self, path: str, batch: memoryview, pos: int, last_offset: list[int]) -> None:
        (base_offset, _, leader_epoch, magic, crc, attributes, last_delta, base_ts, max_ts,
         producer_id, producer_epoch, base_sequence, count) = _BATCH_HEADER.unpack_from(batch)
        size = len(batch)
        valid = self._crc32c(batch[CRC_START:]) == crc
        codec = attributes & 0x07
        ts_type = "LogAppendTime" if attributes & 0x08 else "CreateTime"
        control = bool(attributes & 0x20)
        horizon = f"OptionalLong[{base_ts}]" if attributes & 0x40 else "OptionalLong.empty"
        last_sequence = (-1 if base_sequence == -1
                         else increment_sequence(base_sequence, last_delta))
        lines = [
            f"baseOffset: {base_offset} lastOffset: {base_offset + last_delta} count: {count} "
            f"baseSequence: {base_sequence} lastSequence: {last_sequence} "
            f"producerId: {producer_id} producerEpoch: {producer_epoch} "
            f"partitionLeaderEpoch: {leader_epoch} isTransactional: {_bool(attributes & 0x10)} "
            f"isControl: {_bool(control)} deleteHorizonMs: {horizon} "
            f"position: {pos} {ts_type}: {max_ts} size: {size} magic: {magic} "
            f"compresscodec: {CODEC_NAMES.get(codec, f'unknown({codec})')} crc: {crc} "
            f"isvalid: {_bool(valid)}"
        ]
        if self.deep:
            self._dump_records(path, batch, pos, ts_type, last_offset, lines)
        self.emit(*lines)

    def _dump_records(self, path: str, batch: memoryview, pos: int, ts_type: str,
                      last_offset: list[int], lines: list[str]) -> None:
        from shmq.errors import CorruptRecordError
        from shmq.protocol.records import LOG_APPEND_TIME, RecordBatchView

        try:
            view = RecordBatchView(batch)
            records = view.records()
        except CorruptRecordError as e:
            self.emit(*lines)
            lines.clear()
            self.error(f"cannot read the records of the batch at position {pos} of {path}: {e}")
            return
        base_offset, base_sequence = view.base_offset, view.base_sequence
        max_ts = view.max_timestamp
        log_append_time = view.timestamp_type == LOG_APPEND_TIME
        control = view.is_control
        invalid: list[str] = []
        for offset, timestamp, key, value, headers in records:
            if last_offset[0] != -1 and offset != last_offset[0] + 1:
                self.non_consecutive.setdefault(os.path.abspath(path), []).insert(
                    0, (last_offset[0], offset))
            last_offset[0] = offset
            if log_append_time:  # Kafka: every record of a LogAppendTime batch has maxTimestamp
                timestamp = max_ts
            line = []
            prefix = "| "
            invalid_control = None
            if not self.skip_metadata:
                sequence = (increment_sequence(base_sequence, offset - base_offset)
                            if base_sequence >= 0 else -1)
                line.append(
                    f"{prefix}offset: {offset} {ts_type}: {timestamp} "
                    f"keySize: {-1 if key is None else len(key)} "
                    f"valueSize: {-1 if value is None else len(value)} "
                    f"sequence: {sequence} headerKeys: [{','.join(k for k, _ in headers)}]"
                )
                prefix = " "
                if control:
                    marker, invalid_control = control_marker(key, value)
                    line.append(marker)
            if self.print_data and not control:
                if key is not None:
                    line.append(f"{prefix}key: {_text(key)}")
                    prefix = " "
                if value is not None:
                    line.append(f" payload: {_text(value)}")
            lines.append("".join(line))
            if invalid_control:
                invalid.append(f"invalid control record at offset {offset} of {path}: "
                               f"{invalid_control}")
        if invalid:
            self.emit(*lines)
            lines.clear()
            for message in invalid:
                self.error(message)

    # --- .index --------------------------------------------------------------------------------

    def dump_offset_index(self, path: str) -> None:
        base = self._segment_base(path)
        if base is None:
            return
        with open(path, "rb") as f:
            data = f.read()
        entries = len(data) // _OFFSET_ENTRY.size
        if entries == 0:
            self.emit(f"{path} is empty.")
            return
        if self.sanity_only:  # OffsetIndex.sanityCheck
            last = base + _OFFSET_ENTRY.unpack_from(data, (entries - 1) * _OFFSET_ENTRY.size)[0]
            where = os.path.abspath(path)
            if last < base:
                self.error(f"Corrupt index found, index file {where} has non-zero size but the "
                           f"last offset is {last} which is less than the base offset {base}")
            elif len(data) % _OFFSET_ENTRY.size:
                self.error(f"Index file {where} is corrupt, found {len(data)} bytes which is "
                           f"neither positive nor a multiple of {_OFFSET_ENTRY.size}")
            else:
                self.emit(f"{path} passed sanity check.")
            return
        log = self._log_for(path)
        mismatches: list[tuple[int, int]] = []
        for i in range(entries):
            relative, position = _OFFSET_ENTRY.unpack_from(data, i * _OFFSET_ENTRY.size)
            offset = base + relative
            if offset == base and i > 0:  # the zero-filled tail of a preallocated index
                break
            if log is not None:
                found = log.last_offset_at(position, self.max_message_size)
                if found != offset:
                    mismatches.insert(0, (offset, found))
            if not self.verify_only:
                self.emit(f"offset: {offset} position: {position}")
        if mismatches:
            self.index_mismatches.setdefault(os.path.abspath(path), [])[:0] = mismatches

    # --- .timeindex ----------------------------------------------------------------------------

    def dump_time_index(self, path: str) -> None:
        base = self._segment_base(path)
        if base is None:
            return
        with open(path, "rb") as f:
            data = f.read()
        entry = _TIME_ENTRY
        entries = len(data) // entry.size
        if self.sanity_only:  # TimeIndex.sanityCheck
            where = os.path.abspath(path)
            if entries:
                first_ts = entry.unpack_from(data, 0)[0]
                last_ts, last_rel = entry.unpack_from(data, (entries - 1) * entry.size)
                if last_ts < first_ts:
                    self.error(f"Corrupt time index found, time index file ({where}) has non-zero "
                               f"size but the last timestamp is {last_ts} which is less than the "
                               f"first timestamp {first_ts}")
                    return
                if base + last_rel < base:
                    self.error(f"Corrupt time index found, time index file ({where}) has non-zero "
                               f"size but the last offset is {base + last_rel} which is less than "
                               f"the first offset {base}")
                    return
            if len(data) % entry.size:
                self.error(f"Time index file {where} is corrupt, found {len(data)} bytes which "
                           f"is neither positive nor a multiple of {entry.size}")
                return
            self.emit(f"{path} passed sanity check.")
            return
        log = self._log_for(path)
        prev_ts = -1
        for i in range(entries):
            timestamp, relative = entry.unpack_from(data, i * entry.size)
            offset = base + relative
            if offset == base and i > 0:  # the zero-filled tail of a preallocated index
                break
            if log is not None:
                self._check_time_entry(path, log, timestamp, offset, prev_ts)
            if not self.verify_only:
                self.emit(f"timestamp: {timestamp} offset: {offset}")
            prev_ts = timestamp

    def _check_time_entry(self, path: str, log: LogFile, timestamp: int, offset: int,
                          prev_ts: int) -> None:
        # Kafka looks the batch up from the offset index's position for `offset`; scanning from
        # the start of the log finds the same batch whenever that index is right.
        where = os.path.abspath(path)
        found = log.first_batch_reaching(offset)
        if found is None:
            self.time_not_found.setdefault(where, []).append((offset, -1))
            return
        pos, size, last = found
        if last != offset:
            self.time_not_found.setdefault(where, []).append((offset, last))
            return
        max_ts = self._max_record_timestamp(log, pos, size)
        if max_ts is None:
            return
        if max_ts != timestamp:
            self.time_mismatches.setdefault(where, []).append((timestamp, max_ts))
        if prev_ts >= timestamp:
            self.time_out_of_order.setdefault(where, []).append((timestamp, prev_ts))

    def _max_record_timestamp(self, log: LogFile, pos: int, size: int) -> int | None:
        from shmq.errors import CorruptRecordError
        from shmq.protocol.records import LOG_APPEND_TIME, RecordBatchView

        data = log.read(pos, size)
        if len(data) < BATCH_HEADER_SIZE or data[16] != 2:
            self.error(f"the batch at position {pos} of {log.path} is not a RecordBatch v2")
            return None
        batch = RecordBatchView(data)
        try:
            records = batch.records()
        except CorruptRecordError as e:
            self.error(f"cannot read the records of the batch at position {pos} of {log.path}: {e}")
            return None
        if batch.timestamp_type == LOG_APPEND_TIME:
            return max(-1, batch.max_timestamp) if records else -1
        return max([-1, *(r.timestamp for r in records)])

    # --- .snapshot (producer state) ----------------------------------------------------------

    def dump_producer_snapshot(self, path: str) -> None:
        """Kafka's ``dumpProducerIdSnapshot``: each producer's entry and its last batch; a
        corrupt snapshot is one line on stderr (``CorruptSnapshotException``'s message)."""
        from shmq._fast import crc32c
        from shmq.storage.producer_state import (
            SNAPSHOT_CRC_START,
            SNAPSHOT_ENTRY,
            SNAPSHOT_HEADER,
            decrement_sequence,
        )

        with open(path, "rb") as f:
            data = f.read()
        # Kafka wraps what reading the schema throws; a short buffer's exception has no
        # message ("null")
        invalid = "Snapshot failed schema validation: "
        if len(data) < 2:
            self._stderr(invalid + "null")
            return
        version = struct.unpack_from(">h", data)[0]
        if version != 1:
            self._stderr(f"{invalid}Snapshot contained an unknown file version {version}")
            return
        if len(data) < SNAPSHOT_HEADER.size:
            self._stderr(invalid + "null")
            return
        _, crc, count = SNAPSHOT_HEADER.unpack_from(data)
        if count < 0 or len(data) < SNAPSHOT_HEADER.size + count * SNAPSHOT_ENTRY.size:
            self._stderr(invalid + "null")
            return
        computed = crc32c(memoryview(data)[SNAPSHOT_CRC_START:])
        if crc != computed:
            self._stderr(f"Snapshot is corrupt (CRC is no longer valid). Stored crc: {crc}. "
                         f"Computed crc: {computed}")
            return
        for i in range(count):
            pid, epoch, last_seq, last_offset, delta, ts, coordinator, txn = \
                SNAPSHOT_ENTRY.unpack_from(data, SNAPSHOT_HEADER.size + i * SNAPSHOT_ENTRY.size)
            line = (f"producerId: {pid} producerEpoch: {epoch} coordinatorEpoch: {coordinator} "
                    f"currentTxnFirstOffset: "
                    f"{f'OptionalLong[{txn}]' if txn >= 0 else 'OptionalLong.empty'} "
                    f"lastTimestamp: {ts}")
            if last_offset >= 0:
                first = decrement_sequence(last_seq, delta)
                line += (f" firstSequence: {first} lastSequence: {last_seq} lastOffset: "
                         f"{last_offset} offsetDelta: {delta} timestamp: {ts}")
            self.emit(line)

    # --- .txnindex -----------------------------------------------------------------------------

    def dump_txn_index(self, path: str) -> None:
        with open(path, "rb") as f:
            data = f.read()
        txns = [_ABORTED_TXN.unpack_from(data, i)
                for i in range(0, len(data) - _ABORTED_TXN.size + 1, _ABORTED_TXN.size)]
        for version, *_ in txns:
            if version > 0:
                self.error(f"Unexpected aborted transaction version {version} in transaction "
                           f"index {os.path.abspath(path)}, current version is 0")
                return
        for version, producer_id, first, last, last_stable in txns:
            self.emit(f"version: {version} producerId: {producer_id} firstOffset: {first} "
                      f"lastOffset: {last} lastStableOffset: {last_stable}")

    # --- index checks --------------------------------------------------------------------------

    def _log_for(self, index_path: str) -> LogFile | None:
        """The segment's .log next to ``index_path``, or None (and a note) if there is none."""
        directory = os.path.dirname(os.path.abspath(index_path))
        log_path = os.path.join(directory, os.path.basename(index_path).split(".")[0] + ".log")
        if log_path not in self._logs:
            log = None
            if os.path.isfile(log_path):
                log = LogFile(log_path)
            elif self.verify_only:
                self.error(f"cannot verify {index_path}: {log_path} does not exist")
            else:
                self._stderr(f"Warning: {log_path} does not exist; the entries of {index_path} "
                             "are not checked against it")
            self._logs[log_path] = log
        return self._logs[log_path]

    def report(self) -> None:
        """Kafka's end-of-run summary of what the index and offset checks found (stderr)."""
        for where, pairs in self.index_mismatches.items():
            self._stderr(f"Mismatches in :{where}")
            for index_offset, log_offset in pairs:
                self._stderr(f"  Index offset: {index_offset}, log offset: {log_offset}")
        for where, pairs in self.time_mismatches.items():
            self._stderr(f"Found timestamp mismatch in :{where}")
            for index_ts, log_ts in pairs:
                self._stderr(f"  Index timestamp: {index_ts}, log timestamp: {log_ts}")
        for where, pairs in self.time_out_of_order.items():
            self._stderr(f"Found out of order timestamp in :{where}")
            for index_ts, prev_ts in pairs:
                self._stderr(f"  Index timestamp: {index_ts}, "
                             f"Previously indexed timestamp: {prev_ts}")
        for where, pairs in self.time_not_found.items():
            self._stderr(f"The following indexed offsets are not found in :{where}")
            for index_offset, log_offset in pairs:
                self._stderr(f"Indexed offset: {index_offset}, found log offset: {log_offset}")
        for where, pairs in self.non_consecutive.items():
            self._stderr(f"Non-consecutive offsets in {where}")
            for first, second in pairs:
                self._stderr(f"  {first} is followed by {second}")


def control_marker(key: bytes | None, value: bytes | None) -> tuple[str, str | None]:
    """The text DumpLogSegments adds to a control record, and why it is invalid (or None)."""
    if key is None or len(key) < _CONTROL_KEY.size:
        size = "null" if key is None else len(key)
        return "", f"the control record key must have at least 4 bytes, found {size}"
    version, type_id = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        return "", f"invalid control record key version {version}"
    name = CONTROL_TYPES.get(type_id, "UNKNOWN")
    if name not in ("ABORT", "COMMIT"):
        # Kafka prints KRaft snapshot and voter records as JSON; shmq logs never hold them.
        return f" controlType: {name}({type_id})", None
    if value is None or len(value) < _END_TXN_VALUE.size:
        size = "null" if value is None else len(value)
        return "", f"the end transaction marker must have at least 6 bytes, found {size}"
    marker_version, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
    if marker_version < 0:
        return "", f"invalid end transaction marker version {marker_version}"
    return f" endTxnMarker: {name} coordinatorEpoch: {coordinator_epoch}", None
