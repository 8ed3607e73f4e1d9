"""Storage operation fuzzer: random append / roll / retention / truncation / close sequences with
simulated crashes, checked against a deterministic model after every step.

What it does
------------
``Fuzz`` drives one partition log (``PartitionLog`` directly, or through a ``LogManager`` and its
checkpoint files) with a seeded random sequence of operations on a random small ``LogConfig``
(4-16 KiB segments, index files of 12-1000 bytes so index-full rolls happen, record-time
``segment.ms`` rolls, CreateTime or LogAppendTime, size and time retention):

* append 1-3 model batches (one call with the batches concatenated, or one call each), with
  the log's default leader epoch or explicit, growing ones; an append whose last batch is
  corrupt (bad CRC, truncated, wrong magic, wrong length) must be refused and write nothing,
* roll, flush, checkpoint (manager), update the high watermark,
* retention (``delete_old_segments`` / ``run_retention``, ``retention.bytes`` and
  ``retention.ms``; the kept segments are predicted independently with Kafka's
  ``deletableSegments`` rules), ``delete_records_before`` (DeleteRecords), ``truncate_to``
  (follower truncation; through a manager it is followed by a checkpoint, as Kafka's
  ``LogManager.truncateTo`` does),
* clean close + reopen (optionally with an index file deleted, garbled or cut first),
* crash: ``crash_close`` (what SIGKILL leaves: untrimmed indexes, nothing else lost), then
  optional damage - a recoverable segment truncated at a random byte, bits flipped near the end
  of one (never in partitionLeaderEpoch, the one field nothing covers, and never before the
  recovery point's byte: recovery validates from the partition's recovery record, the last
  flush's byte position, when there is one), zero bytes appended to one (a
  preallocated-looking tail), an index deleted, garbled or cut - and a reopen with
  ``clean_shutdown=False`` from a recovery point a checkpoint could hold.

``test_sigkill_writer`` runs ``_writer.py`` in a real process that appends in a loop (up to
megabytes per ``pwritev``), SIGKILLs it at a random moment (after the N-th acknowledgement,
inside a big append to tear it, or at a random time), and reopens the log in the test process.
``test_garbled_index_after_clean_shutdown`` and ``test_flushed_segment_files_survive_power_loss``
are focused runs of one fault each (see their docstrings).

Invariants (checked after every operation; the expensive ones after every reopen)
---------------------------------------------------------------------------------
1. prefix: every ``.log`` file, decoded from disk with ``iter_batches(verify_crc=True)``, holds
   valid batches with contiguous offsets across segments, each byte-identical to the model's
   batch (header fields other than baseOffset / leader epoch, and the whole records section),
   stamped with the leader epoch it was appended with, and decoding to the model's records;
   the batches are model batches ``j..k-1``.  After a clean close or an undamaged crash nothing
   is lost (``k`` unchanged); after damage exactly the batches that sit wholly before the first
   damaged byte of a recovered segment survive (bit flips: at least those); after the SIGKILL
   every acknowledged batch survives.  The log's own view (segments, sizes, LEO, log start,
   recovery point, HW) agrees with the disk.
2. reads: ``read(offset, max_bytes, upper_bound=, min_one_batch=)`` for random offsets in
   [log start, HW) returns exactly the disk's whole, CRC-valid batches from the one holding
   ``offset``, in its segment, below the bound, as many as fit in ``max_bytes`` (the first one
   regardless, with ``min_one_batch``); kafka-python's ``DefaultRecordBatch`` is the
   independent oracle (``validate_crc`` and record decoding) for the same bytes.  Out-of-range
   reads raise.
3. indexes: after every reopen, each segment's ``.log`` is copied alone into a fresh directory
   and recovered from scratch (recovery point 0, unclean) - a clean rebuild.  The live
   ``.index`` must equal the rebuilt one byte for byte, for every segment (the indexing rule is
   deterministic, and a clean close does not touch the offset index).  The live ``.timeindex``
   must equal the rebuilt one for every segment the loader reported as rebuilt
   (``LoadedLog.rebuilt_segments``, captured by wrapping ``shmq.storage.loader.load_log``);
   segments whose index was deleted, and every segment at or after the recovery point of an
   unclean start, must be among them.  Other segments may carry extra entries from earlier
   clean closes (Kafka appends a final ``(max timestamp, offset)`` entry on roll and close), so
   their time index is checked semantically: timestamps strictly increase, every entry
   ``(T, O)`` names the last offset of the batch where the segment's running max timestamp
   first became ``T``, and the last entry is the segment's max.  Index files of inactive
   segments are trimmed; the active one's tail past its entries is zeros.
4. lookups: ``offset_for_timestamp(ts)`` equals a brute-force scan over the model's records
   (first offset >= log start with timestamp >= ts); -1 / -2 / -3 too.
5. durability: every byte below the recovery point was fsynced (``SyncTracker`` wraps
   ``os.fsync`` / ``os.fdatasync``), so a checkpoint of it never vouches for page-cache-only
   data; after every flush the recovery record names the LEO at a byte position that was
   fsynced.  A reopen after a crash resumes validation at the record's byte whenever the
   damage left the record's segment and indexes consistent with it, and the recovery point it
   reports is then the record's (or the checkpoint's, if higher).

Reproducing: failures print the seed, the config and the last operations;
``SHMQ_FUZZ_SEED=<n>`` pins the seed (every parametrized case then runs that seed),
``SHMQ_FUZZ_OPS=<n>`` sets the op count, ``SHMQ_FUZZ_DAMAGE=truncate,flip,zeros,delete_index,
garble_index,cut_index`` restricts the damage kinds (default: all), ``SHMQ_FUZZ_TRACE=<n>`` the number of
operations printed.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shmq.errors import CorruptRecordError, OffsetOutOfRangeError
from shmq.protocol.records import iter_batches
from shmq.storage import checkpoint as ckpt_mod
from shmq.storage import layout, recovery_point
from shmq.storage import loader as loader_mod
from shmq.storage.log import PartitionLog
from shmq.storage.log_config import LogConfig
from shmq.storage.log_manager import LogManager

HERE = Path(__file__).resolve().parent
WRITER = HERE / "_writer.py"


def _load_writer_module() -> Any:
    spec = importlib.util.spec_from_file_location("shmq_opfuzz_writer", WRITER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


W = _load_writer_module()
BatchModel = W.BatchModel
append_time = W.append_time

_ORIGINAL_LOAD_LOG = loader_mod.load_log
ALL_DAMAGE = ("truncate", "flip", "zeros", "delete_index", "garble_index", "cut_index")
TOPIC, PARTITION = "fuzz", 0


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    return int(raw) if raw else None


def _damage_kinds() -> tuple[str, ...]:
    raw = os.environ.get("SHMQ_FUZZ_DAMAGE")
    if not raw:
        return ALL_DAMAGE
    kinds = tuple(k.strip() for k in raw.split(",") if k.strip())
    unknown = set(kinds) - set(ALL_DAMAGE)
    assert not unknown, f"unknown SHMQ_FUZZ_DAMAGE kinds {unknown}"
    return kinds


# --- kafka-python, the independent record-batch oracle -------------------------------------------

def _kafka_batch_class() -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.record.default_records import DefaultRecordBatch
    return DefaultRecordBatch


DefaultRecordBatch = _kafka_batch_class()


# --- what is on disk -------------------------------------------------------------------------------

@dataclass
class DiskBatch:
    position: int
    base: int
    last: int
    size: int
    max_ts: int
    raw: bytes


@dataclass
class DiskSegment:
    base: int
    size: int
    batches: list[DiskBatch]

    @property
    def next_offset(self) -> int:
        return self.batches[-1].last + 1 if self.batches else self.base


class InvariantError(AssertionError):
    pass


def scan_disk(directory: Path) -> list[DiskSegment]:
    """Decode every ``.log`` file with CRC checks; any bad or partial batch is a failure."""
    segments = []
    for path in sorted(directory.glob("*" + layout.LOG_SUFFIX)):
        base = layout.offset_from_filename(path.name)
        data = path.read_bytes()
        batches = []
        pos = 0
        try:
            for view in iter_batches(data, verify_crc=True):
                batches.append(DiskBatch(pos, view.base_offset, view.last_offset, view.size,
                                         view.max_timestamp, data[pos : pos + view.size]))
                pos += view.size
        except CorruptRecordError as exc:
            raise InvariantError(f"{path.name}: invalid batch on disk at byte {pos}: {exc}") from exc
        segments.append(DiskSegment(base, len(data), batches))
    return segments


def disk_bases(directory: Path) -> list[int]:
    return sorted(layout.offset_from_filename(p.name)
                  for p in directory.glob("*" + layout.LOG_SUFFIX))


# --- configurations -------------------------------------------------------------------------------

def random_config(rng: random.Random) -> LogConfig:
    segment_bytes = rng.choice([4096, 6000, 8192, 12000, 16384])
    retention_bytes = -1 if rng.random() < 0.4 else rng.randint(2, 6) * segment_bytes
    return LogConfig(
        segment_bytes=segment_bytes,
        segment_index_bytes=rng.choice([12, 24, 120, 200, 256, 400, 1000]),
        index_interval_bytes=rng.choice([0, 200, 400, 700, 1000]),
        retention_bytes=retention_bytes,
        retention_ms=rng.choice([-1, -1, 5_000, 60_000]),
        segment_ms=rng.choice([7 * 24 * 3600 * 1000] * 3 + [3_000, 20_000]),
        flush_messages=rng.choice([2**63 - 1, 2**63 - 1, 50, 200]),
        max_message_bytes=4 << 20,
        message_timestamp_type="LogAppendTime" if rng.random() < 0.2 else "CreateTime",
    )


def config_args(config: LogConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in (
        "segment_bytes", "segment_ms", "segment_index_bytes", "index_interval_bytes", "retention_bytes",
        "retention_ms", "flush_messages", "max_message_bytes", "message_timestamp_type")}


# --- what reached the disk ------------------------------------------------------------------------

class SyncTracker:
    """Records what shmq made durable, by wrapping ``os.fsync`` / ``os.fdatasync``,
    ``IndexFile.flush`` (the msync of an index: its entries) and
    ``disk.syncfs`` (a clean shutdown's: everything under ``root``) (and
    ``os.ftruncate`` / ``os.unlink`` / ``os.open`` to keep the record true) while active.

    ``synced[path]`` is the file size at its last fsync (a data prefix that survives a power
    cut); ``unsynced_entries`` the files created under ``root`` whose directory has not been
    fsynced since (POSIX: the name of a new file is durable only after an fsync of its
    directory; Kafka's ``LocalLog.flush`` does ``Utils.flushDir`` for that reason).
    """

    def __init__(self) -> None:
        self.synced: dict[str, int] = {}
        self.unsynced_entries: set[str] = set()
        self.root = ""

    @staticmethod
    def _path(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    @contextmanager
    def active(self, root: Path) -> Iterator[None]:
        self.root = str(root)
        originals = {name: getattr(os, name)
                     for name in ("fsync", "fdatasync", "ftruncate", "unlink", "open")}

        def synced(name: str) -> Any:
            def wrapper(fd: int) -> None:
                originals[name](fd)
                path = self._path(fd)
                if os.path.isdir(path):
                    self.unsynced_entries = {p for p in self.unsynced_entries
                                             if os.path.dirname(p) != path}
                else:
                    self.synced[path] = os.fstat(fd).st_size
            return wrapper

        def ftruncate(fd: int, length: int) -> None:
            originals["ftruncate"](fd, length)
            path = self._path(fd)
            if path in self.synced:
                self.synced[path] = min(self.synced[path], length)

        def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
            originals["unlink"](path, *args, **kwargs)
            self.forget(os.fspath(path))

        def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            name = os.fspath(path)
            new = bool(flags & os.O_CREAT) and not os.path.exists(name)
            fd = originals["open"](path, flags, *args, **kwargs)
            if new and isinstance(name, str) and name.startswith(self.root):
                self.unsynced_entries.add(os.path.abspath(name))
            return fd

        from shmq.storage import disk
        from shmq.storage.index_file import IndexFile

        original_syncfs = disk.syncfs
        original_index_flush = IndexFile.flush

        def index_flush(index: IndexFile) -> None:
            """An msync: the index's entries so far are durable (as bytes of its file)."""
            entries = index.entries
            original_index_flush(index)
            self.synced[os.path.abspath(index.path)] = entries * index.ENTRY_SIZE

        def syncfs(fd: int, *, slowed: bool = False) -> None:
            """A clean shutdown's syncfs: every file and name of the filesystem is durable."""
            original_syncfs(fd, slowed=slowed)
            for directory, _, names in os.walk(self.root):
                for name in names:
                    path = os.path.abspath(os.path.join(directory, name))
                    self.synced[path] = os.path.getsize(path)
            self.unsynced_entries.clear()

        os.fsync, os.fdatasync = synced("fsync"), synced("fdatasync")
        os.ftruncate, os.unlink, os.open = ftruncate, unlink, open_
        disk.syncfs = syncfs
        IndexFile.flush = index_flush  # type: ignore[method-assign]
        try:
            yield
        finally:
            for name, fn in originals.items():
                setattr(os, name, fn)
            disk.syncfs = original_syncfs
            IndexFile.flush = original_index_flush  # type: ignore[method-assign]

    def forget(self, path: str) -> None:
        path = os.path.abspath(path)
        self.synced.pop(path, None)
        self.unsynced_entries.discard(path)

    def truncated(self, path: Path, length: int) -> None:
        key = os.path.abspath(path)
        if key in self.synced:
            self.synced[key] = min(self.synced[key], length)


# --- the fuzzer -----------------------------------------------------------------------------------

@dataclass
class Expectation:
    """What a reopen must produce."""

    clean: bool
    rp_checkpoint: int
    start_checkpoint: int
    min_k: int
    max_k: int
    must_rebuild: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    record: Any = None          # the recovery record recovery should resume from (unclean)
    record_broken: bool = False     # damage made it unusable: recovery must not resume from it
    record_doubtful: bool = False   # damage to its segment's indexes: it may not resume
    fallback_rebuild: set[int] = field(default_factory=set)  # rebuilt if it does not resume


class Fuzz:
    def __init__(self, seed: int, root: Path, *, use_manager: bool | None = None,
                 big_rate: float = 0.0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.root = root
        self.config = random_config(self.rng)
        self.use_manager = self.rng.random() < 0.35 if use_manager is None else use_manager
        self.log_dir = root / "logs"
        self.dir = self.log_dir / layout.partition_dir_name(TOPIC, PARTITION)
        self.model = BatchModel(seed, big_rate)
        self.lat = self.config.log_append_time
        self.lat_of: dict[int, int] = {}     # batch -> append time (LogAppendTime topics)
        # leader epochs: None appends with the log's default epoch, else explicit and growing
        self.epoch: int | None = None if self.rng.random() < 0.5 else self.rng.randint(0, 3)
        self.epoch_of: dict[int, int] = {}   # batch -> leader epoch stamped into it
        self.sync = SyncTracker()
        self.check_dir_entries = False
        self.check_sync = True               # off when another process wrote (SIGKILL test)
        # an unrebuilt .index must equal a rebuild byte for byte; when False (the large-segment
        # sanity path, which keeps any valid sparse index) it must only be correct
        self.strict_offset_index = True
        self.damaged_indexes: set[int] = set()   # segments whose index files were garbled or cut
        self.k = 0                           # batches 0..k-1 were appended (some may be retained away)
        self.start = 0                       # expected log start offset
        self.hw = 0
        self.trace: list[str] = []
        self.damage_kinds = _damage_kinds()
        self.loads: list[Any] = []           # LoadedLog of every load_log call
        self.manager: LogManager | None = None
        self.log: PartitionLog | None = None
        self.ref_counter = 0
        self.stats: dict[str, int] = {}

    # -- helpers ------------------------------------------------------------------------------

    def fail(self, message: str) -> None:
        tail = "\n  ".join(self.trace[-int(os.environ.get("SHMQ_FUZZ_TRACE", "25")):])
        raise InvariantError(
            f"[seed={self.seed} manager={self.use_manager} config={config_args(self.config)}]\n"
            f"{message}\nlast operations:\n  {tail}")

    def check(self, cond: bool, message: str) -> None:
        if not cond:
            self.fail(message)

    def note(self, text: str) -> None:
        self.trace.append(text)

    def count(self, name: str) -> None:
        self.stats[name] = self.stats.get(name, 0) + 1

    def lat_for(self, i: int) -> int | None:
        return self.lat_of[i] if self.lat else None

    @property
    def leo(self) -> int:
        return self.model.base_offset(self.k)

    @contextmanager
    def capture_loads(self) -> Iterator[None]:
        def recording_load_log(*args: Any, **kwargs: Any) -> Any:
            loaded = _ORIGINAL_LOAD_LOG(*args, **kwargs)
            self.loads.append(loaded)
            return loaded

        loader_mod.load_log = recording_load_log
        try:
            yield
        finally:
            loader_mod.load_log = _ORIGINAL_LOAD_LOG

    # -- open / close ---------------------------------------------------------------------------

    def open_fresh(self) -> None:
        if self.use_manager:
            self.manager = LogManager(self.log_dir, self.config)
            self.manager.startup()
            self.log = self.manager.get_or_create_log(TOPIC, PARTITION, self.config)
        else:
            self.log = PartitionLog.open(self.dir, self.config, clean_shutdown=True)
        self.hw = self.log.high_watermark

    def reopen(self, clean: bool, rp: int, start: int) -> Any:
        """Open the log again; returns the LoadedLog the loader produced."""
        before = len(self.loads)
        if self.use_manager:
            self.manager = LogManager(self.log_dir, self.config)
            self.manager.startup()
            self.check(self.manager.had_clean_shutdown == clean,
                       f"manager saw clean shutdown {self.manager.had_clean_shutdown}, expected {clean}")
            log = self.manager.get_log(TOPIC, PARTITION)
            self.check(log is not None, "manager did not open the partition")
            assert log is not None
            self.log = log
        else:
            self.log = PartitionLog.open(self.dir, self.config, recovery_point=rp,
                                         log_start_offset=start, clean_shutdown=clean)
        self.check(len(self.loads) == before + 1, "reopen did not go through load_log once")
        return self.loads[-1]

    def close_clean(self) -> None:
        assert self.log is not None
        if self.manager is not None:
            self.manager.shutdown()
            self.manager = None
        else:
            self.log.close()
        self.log = None

    def crash(self) -> None:
        assert self.log is not None
        self.log.crash_close()
        self.log = None
        self.manager = None   # no shutdown, no marker, no checkpoint

    def read_checkpoints(self) -> tuple[int, int]:
        """(recovery point, log start) a LogManager would read at startup."""
        rp = ckpt_mod.read_offsets(self.log_dir / layout.RECOVERY_POINT_CHECKPOINT)
        st = ckpt_mod.read_offsets(self.log_dir / layout.LOG_START_OFFSET_CHECKPOINT)
        return rp.get((TOPIC, PARTITION), 0), st.get((TOPIC, PARTITION), 0)

    # -- the model against the disk ----------------------------------------------------------------

    def scan(self) -> list[DiskSegment]:
        try:
            return scan_disk(self.dir)
        except InvariantError as exc:
            self.fail(str(exc))
            raise

    def verify_disk(self, *, min_k: int, max_k: int) -> list[DiskSegment]:
        """Invariant 1; sets ``self.k`` to the number of model batches the log holds."""
        segs = self.scan()
        self.check(len(segs) > 0, "no segment on disk")
        expected_next = segs[0].base
        first_index: int | None = None
        j: int | None = None
        for seg in segs:
            self.check(seg.base == expected_next,
                       f"segment {seg.base} does not start where the previous ended ({expected_next})")
            for b in seg.batches:
                if j is None:
                    self.check(b.position == 0 and b.base == seg.base,
                               f"segment {seg.base} starts with batch {b.base} at {b.position}")
                    try:
                        j = self.model.index_at(b.base)
                    except ValueError:
                        self.fail(f"first batch at offset {b.base} is not a model batch boundary")
                    first_index = j
                assert j is not None
                self.check(b.base == self.model.base_offset(j),
                           f"batch at {seg.base}:{b.position} has base offset {b.base}, "
                           f"model batch {j} starts at {self.model.base_offset(j)}")
                if self.lat:
                    self.check(j in self.lat_of, f"batch {j} was never appended")
                self.compare_batch(b.raw, j, f"segment {seg.base} byte {b.position}")
                j += 1
            expected_next = seg.next_offset
            if j is None:
                # no batch yet: the segment's base must still be a model boundary
                try:
                    self.model.index_at(seg.base)
                except ValueError:
                    self.fail(f"empty segment {seg.base} is not at a model batch boundary")
        k_disk = j if j is not None else self.model.index_at(segs[-1].base)
        if first_index is None:
            first_index = k_disk
        self.check(min_k <= k_disk <= max_k,
                   f"log holds batches {first_index}..{k_disk - 1}, expected the end in "
                   f"[{min_k}, {max_k}] (model appended {self.k})")
        self.k = k_disk
        return segs

    def compare_batch(self, raw: bytes, j: int, where: str) -> None:
        want = self.model.encoded(j)
        self.check(len(raw) == len(want), f"{where}: batch {j} is {len(raw)} bytes, model {len(want)}")
        self.check(raw[61:] == want[61:], f"{where}: records section of batch {j} differs")
        if not self.lat:
            self.check(raw[8:12] == want[8:12] and raw[16:61] == want[16:61],
                       f"{where}: header of batch {j} differs from what was appended")
        else:   # LogAppendTime: the broker sets the timestamp-type bit and maxTimestamp
            attrs, want_attrs = struct.unpack_from(">h", raw, 21)[0], struct.unpack_from(">h", want, 21)[0]
            self.check(raw[8:12] == want[8:12] and raw[16] == want[16] and raw[23:35] == want[23:35]
                       and raw[43:61] == want[43:61] and attrs == want_attrs | 0x08
                       and struct.unpack_from(">q", raw, 35)[0] == self.lat_of.get(j),
                       f"{where}: header of batch {j} differs from what was appended "
                       f"at LogAppendTime {self.lat_of.get(j)}")
        stamped = struct.unpack_from(">i", raw, 12)[0]
        self.check(stamped == self.epoch_of.get(j),
                   f"{where}: batch {j} carries leader epoch {stamped}, it was appended with "
                   f"{self.epoch_of.get(j)}")
        got = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
               for r in next(iter_batches(raw)).records()]
        self.check(got == self.model.expected_records(j, self.lat_for(j)),
                   f"{where}: records of batch {j} differ from the model")

    def check_live_vs_disk(self, segs: list[DiskSegment]) -> None:
        log = self.log
        assert log is not None
        live = [(s.base_offset, s.size, s.next_offset) for s in log.segments]
        disk = [(s.base, s.size, s.next_offset) for s in segs]
        self.check(live == disk, f"log segments (base, size, next) {live} != disk {disk}")
        self.check(log.log_end_offset == self.leo, f"LEO {log.log_end_offset} != model {self.leo}")
        self.check(log.log_start_offset == self.start,
                   f"log start {log.log_start_offset} != expected {self.start}")
        self.check(log.high_watermark == self.hw, f"HW {log.high_watermark} != expected {self.hw}")
        self.check(log.recovery_point <= log.log_end_offset,
                   f"recovery point {log.recovery_point} above the LEO {log.log_end_offset}")
        names = {p.name for p in self.dir.iterdir()}
        loaded = {s.base_offset for s in log.segments if s.loaded}
        # a new log's first indexes live in memory until a flush, trim or close (index_file.py)
        deferred = {(s.base_offset, suffix) for s in log.segments
                    for name, suffix in (("offset_index", layout.INDEX_SUFFIX),
                                         ("time_index", layout.TIME_INDEX_SUFFIX))
                    if getattr(s.__dict__.get(name), "deferred", False)}
        # and a segment never written gets its index files at its first write (a new log's,
        # or an empty last segment found without them: LogSegment.unwritten)
        unwritten = {s.base_offset for s in log.segments if s.unwritten}
        for s in segs:
            if s.base not in loaded or s.base in unwritten:
                continue  # a lazily opened segment: its indexes are checked at first use
            for suffix in (layout.INDEX_SUFFIX, layout.TIME_INDEX_SUFFIX):
                if (s.base, suffix) in deferred:
                    continue
                self.check(layout.filename_prefix(s.base) + suffix in names,
                           f"segment {s.base} has no {suffix} file")
        stray = {n for n in names if n.endswith(layout.TEMP_SUFFIXES)}
        self.check(not stray, f"temporary files left behind: {stray}")

    def present_records(self, segs: list[DiskSegment]) -> list[tuple[int, int]]:
        """(offset, timestamp) of every record on disk, from the model."""
        out = []
        for seg in segs:
            for b in seg.batches:
                j = self.model.index_at(b.base)
                out.extend((r[0], r[1]) for r in self.model.expected_records(j, self.lat_for(j)))
        return out

    # -- invariant 2: reads -------------------------------------------------------------------------

    def check_reads(self, segs: list[DiskSegment], n: int) -> None:
        log = self.log
        assert log is not None
        start, hw, leo = log.log_start_offset, log.high_watermark, log.log_end_offset
        batches = [(seg.base, b) for seg in segs for b in seg.batches]
        for _ in range(n if hw > start else 0):
            offset = self.rng.randrange(start, hw)
            max_bytes = self.rng.choice([1, self.rng.randint(1, 300), self.rng.randint(300, 9000),
                                         self.rng.randint(9000, 60000), 1 << 22])
            upper = None if self.rng.random() < 0.7 else self.rng.randint(offset, leo)
            min_one = self.rng.random() < 0.8
            res = log.read(offset, max_bytes, upper_bound=upper, min_one_batch=min_one)
            bound = hw if upper is None else min(upper, leo)
            what = (f"read({offset}, {max_bytes}, upper_bound={upper}, min_one_batch={min_one}) "
                    f"with start={start} hw={hw} leo={leo}")
            self.check((res.log_start_offset, res.high_watermark, res.log_end_offset)
                       == (start, hw, leo), f"{what}: result offsets {res[1:]}")
            # expected: the disk's batches from the one holding the offset, in its segment, each
            # wholly below the bound, as many as fit in max_bytes (the first one always, with
            # min_one_batch)
            idx = next(i for i, (_, b) in enumerate(batches) if b.base <= offset <= b.last)
            seg_base = batches[idx][0]
            want: list[tuple[int, int, int]] = []
            size = 0
            for sb, b in batches[idx:]:
                if sb != seg_base or b.last >= bound:
                    break
                if size + b.size > max_bytes and (want or not min_one):
                    break
                want.append((b.base, b.last, b.size))
                size += b.size
            self.check(len(res.slices) == (1 if want else 0),
                       f"{what}: {len(res.slices)} slices, expected batches {want}")
            if not want:
                continue
            data = res.slices[0].read()
            pos, got = 0, []
            try:
                for view in iter_batches(data, verify_crc=True):
                    got.append((view.base_offset, view.last_offset, view.size))
                    pos += view.size
            except CorruptRecordError as exc:
                self.fail(f"{what}: returned a bad batch at byte {pos} of the slice: {exc}")
            self.check(got == want, f"{what}: batches {got} != expected {want}")
            # independent oracle: kafka-python on the same bytes
            pos = 0
            for base, _last, bsize in got:
                kb = DefaultRecordBatch(data[pos : pos + bsize])
                self.check(kb.validate_crc(), f"{what}: kafka-python rejects the CRC of {base}")
                j = self.model.index_at(base)
                recs = [(r.offset, r.timestamp, r.key, r.value,
                         tuple((hk, hv) for hk, hv in r.headers)) for r in kb]
                self.check(recs == self.model.expected_records(j, self.lat_for(j)),
                           f"{what}: kafka-python decodes batch {j} differently from the model")
                pos += bsize
        # the edges
        self.check(log.read(hw, 1 << 20).slices == [], f"read at the HW {hw} returned data")
        for bad in (leo + 1, start - 1):
            if bad < 0:
                continue
            try:
                log.read(bad, 1000)
            except OffsetOutOfRangeError:
                pass
            else:
                self.fail(f"read({bad}) outside [{start}, {leo}] did not raise")

    # -- invariant 4: timestamp lookups -------------------------------------------------------------

    def check_lookups(self, segs: list[DiskSegment], n: int) -> None:
        log = self.log
        assert log is not None
        recs = self.present_records(segs)
        start = log.log_start_offset
        visible = [(o, t) for o, t in recs if o >= start]
        self.check(log.offset_for_timestamp(-1) == (log.log_end_offset, -1), "ListOffsets latest")
        self.check(log.offset_for_timestamp(-2) == (start, -1), "ListOffsets earliest")
        if recs:
            top = max(t for _, t in recs)
            want_max = (min(o for o, t in recs if t == top), top)
        else:
            want_max = None
        got_max = log.offset_for_timestamp(-3)
        self.check(got_max == want_max, f"ListOffsets max timestamp: {got_max} != {want_max}")
        if not recs:
            return
        lo, hi = min(t for _, t in recs), max(t for _, t in recs)
        targets = [lo - 1, lo, hi, hi + 1]
        for _ in range(n):
            if self.rng.random() < 0.6:
                targets.append(self.rng.choice(recs)[1] + self.rng.choice([-1, 0, 0, 1]))
            else:
                targets.append(self.rng.randint(lo - 5, hi + 5))
        for ts in targets:
            want = next(((o, t) for o, t in visible if t >= ts), None)   # offsets ascend
            got = log.offset_for_timestamp(ts)
            self.check(got == want, f"offset_for_timestamp({ts}) = {got}, brute force {want} "
                                    f"(log start {start})")

    # -- invariant 3: indexes ------------------------------------------------------------------------

    def reference_indexes(self, log_path: Path) -> tuple[bytes, bytes]:
        """A clean rebuild: the .log alone in a fresh directory, recovered from offset 0."""
        self.ref_counter += 1
        ref_dir = self.root / "ref" / str(self.ref_counter)
        ref_dir.mkdir(parents=True)
        shutil.copyfile(log_path, ref_dir / log_path.name)
        loaded = _ORIGINAL_LOAD_LOG(ref_dir, self.config, recovery_point=0, clean_shutdown=False)
        self.check(loaded.truncated_bytes == 0,
                   f"a clean rebuild of {log_path.name} truncated {loaded.truncated_bytes} bytes")
        for seg in loaded.segments:
            seg.close()
        _, idx, tidx = layout.segment_paths(ref_dir, layout.offset_from_filename(log_path.name))
        out = idx.read_bytes(), tidx.read_bytes()
        shutil.rmtree(ref_dir)
        return out

    def live_index_bytes(self, index: Any, entries: int, entry_size: int, active: bool,
                         damaged: bool) -> bytes:
        path = index.path
        # a deferred index (a new or unwritten segment's) holds its entries in memory
        data = bytes(index.buffer) if index.deferred else path.read_bytes()
        valid = data[: entries * entry_size]
        self.check(len(valid) == entries * entry_size,
                   f"{path.name} is {len(data)} bytes, shorter than its {entries} entries")
        if damaged:
            pass    # a damaged index the loader kept: only its entries matter
        elif active:
            self.check(data[len(valid):].count(0) == len(data) - len(valid),
                       f"{path.name}: non-zero bytes after the {entries} valid entries")
        else:
            self.check(len(data) == len(valid),
                       f"{path.name} of an inactive segment is not trimmed "
                       f"({len(data)} bytes for {entries} entries)")
        return valid

    def check_indexes(self, segs: list[DiskSegment], rebuilt: set[int]) -> None:
        log = self.log
        assert log is not None
        live_bases = {s.base_offset for s in log.segments}
        self.damaged_indexes = (self.damaged_indexes - rebuilt) & live_bases
        for n, (seg, dseg) in enumerate(zip(log.segments, segs, strict=True)):
            active = n == len(segs) - 1
            damaged = seg.base_offset in self.damaged_indexes
            ref_idx, ref_tidx = self.reference_indexes(seg.log_path)
            oi, ti = seg.offset_index, seg.time_index
            idx = self.live_index_bytes(oi, oi.entries, 8, active, damaged)
            tidx = self.live_index_bytes(ti, ti.entries, 12, active, damaged)
            if not self.strict_offset_index and seg.base_offset not in rebuilt:
                self.check_offset_index_semantics(seg.base_offset, dseg, _entries(idx, ">ii"))
                ref_idx = idx
            self.check(idx == ref_idx,
                       f"segment {seg.base_offset}: .index ({len(idx) // 8} entries, rebuilt="
                       f"{seg.base_offset in rebuilt}) differs from a clean rebuild "
                       f"({len(ref_idx) // 8} entries): live {_entries(idx, '>ii')} vs rebuilt "
                       f"{_entries(ref_idx, '>ii')}")
            if seg.base_offset in rebuilt:
                self.check(tidx == ref_tidx,
                           f"rebuilt segment {seg.base_offset}: .timeindex differs from a clean "
                           f"rebuild: live {_entries(tidx, '>qi')} vs {_entries(ref_tidx, '>qi')}")
            # a kept damaged time index may have lost entries (a cut keeps a valid prefix): it
            # must still be right, not complete
            self.check_time_index_semantics(seg.base_offset, dseg, _entries(tidx, ">qi"),
                                            complete=not damaged)

    def check_offset_index_semantics(self, base: int, dseg: DiskSegment,
                                     entries: list[tuple[int, int]]) -> None:
        """Every entry (relative offset, position) names a batch: its start and last offset."""
        batches = {b.position: b.last - base for b in dseg.batches}
        prev: tuple[int, int] | None = None
        for rel, pos in entries:
            self.check(batches.get(pos) == rel,
                       f"segment {base} .index entry ({base + rel}, {pos}) names no batch")
            self.check(prev is None or (rel > prev[0] and pos > prev[1]),
                       f"segment {base} .index entries out of order: {entries}")
            prev = (rel, pos)

    def check_time_index_semantics(self, base: int, dseg: DiskSegment,
                                   entries: list[tuple[int, int]], complete: bool = True) -> None:
        first_reach: dict[int, int] = {}    # running max timestamp -> last offset where first reached
        running = -1
        for b in dseg.batches:
            if b.max_ts > running:
                running = b.max_ts
                first_reach[running] = b.last
        where = f"segment {base} .timeindex {entries}"
        prev_ts, prev_off = None, None
        for ts, rel in entries:
            off = base + rel
            self.check(first_reach.get(ts) == off,
                       f"{where}: entry ({ts}, {off}) is not a (running max, first offset) pair "
                       f"of the segment {sorted(first_reach.items())}")
            if prev_ts is not None:
                assert prev_off is not None
                self.check(ts > prev_ts and off >= prev_off, f"{where}: entries out of order")
            prev_ts, prev_off = ts, off
        if dseg.batches and complete:
            self.check(bool(entries) and entries[-1] == (running, first_reach[running] - base),
                       f"{where}: last entry is not the segment's max ({running}, "
                       f"{first_reach[running]})")

    # -- checks bundles -------------------------------------------------------------------------

    def check_recovery_point_durable(self, segs: list[DiskSegment]) -> None:
        """Everything below the recovery point was fsynced (what a checkpoint vouches for)."""
        log = self.log
        assert log is not None
        rp = log.recovery_point
        if not self.check_sync:
            return
        for seg in segs:
            below = [b for b in seg.batches if b.last < rp]
            if not below:
                continue
            path = os.path.abspath(layout.segment_paths(self.dir, seg.base)[0])
            need = below[-1].position + below[-1].size
            have = self.sync.synced.get(path, 0)
            self.check(have >= need,
                       f"recovery point {rp} covers {need} bytes of {os.path.basename(path)} "
                       f"but only {have} were fsynced")
            if self.check_dir_entries:
                self.check(path not in self.sync.unsynced_entries,
                           f"recovery point {rp} covers {os.path.basename(path)}, whose directory "
                           f"entry was never fsynced: a power cut can lose the whole file")

    def light_check(self) -> None:
        segs = self.verify_disk(min_k=self.k, max_k=self.k)
        self.check_live_vs_disk(segs)
        self.check_recovery_point_durable(segs)
        self.check_reads(segs, 3)
        self.check_lookups(segs, 3)

    def after_reopen(self, exp: Expectation, loaded: Any) -> None:
        log = self.log
        assert log is not None
        segs = self.verify_disk(min_k=exp.min_k, max_k=exp.max_k)
        first_base = segs[0].base
        leo = self.leo
        self.start = min(max(exp.start_checkpoint, first_base), leo)
        rp_ckpt = exp.rp_checkpoint
        if not exp.clean and exp.record is not None:
            rec = exp.record
            if exp.record_broken:
                self.check(loaded.resumed_at is None,
                           f"recovery resumed at {loaded.resumed_at} from a record the damage "
                           f"broke ({exp.notes})")
            elif loaded.resumed_at is not None:
                self.check(loaded.resumed_at == (rec.segment_base, rec.position),
                           f"recovery resumed at {loaded.resumed_at}, the record names "
                           f"{(rec.segment_base, rec.position)}")
                rp_ckpt = max(rp_ckpt, rec.offset)
            else:
                self.check(exp.record_doubtful,
                           f"recovery did not resume from the intact record {rec} ({exp.notes})")
            if loaded.resumed_at is None:
                exp.must_rebuild |= exp.fallback_rebuild
        want_rp = leo if exp.clean and not loaded.truncated_bytes else min(rp_ckpt, leo)
        self.check(log.recovery_point == want_rp,
                   f"recovery point {log.recovery_point} != {want_rp} (clean={exp.clean}, "
                   f"checkpoint {exp.rp_checkpoint}, record {exp.record}, LEO {leo})")
        self.hw = leo
        self.check_live_vs_disk(segs)
        # reads first: they load lazily opened segments (and check their indexes) on the way
        self.check_reads(segs, 8)
        self.check_lookups(segs, 8)
        for seg in log.segments:
            seg.ensure_loaded()
        rebuilt = set(loaded.rebuilt_segments) | {s.base_offset for s in log.segments if s.rebuilt}
        live_bases = {s.base_offset for s in log.segments}
        missing = (exp.must_rebuild & live_bases) - rebuilt
        self.check(not missing, f"segments {sorted(missing)} were not rebuilt "
                                f"(rebuilt: {sorted(rebuilt)}; {exp.notes})")
        self.check_indexes(segs, rebuilt)
        self.check_recovery_point_durable(segs)

    def read_record(self) -> Any:
        return recovery_point.read(self.dir)

    def plan_recovery(self, exp: Expectation, rp: int) -> tuple[int, int, int]:
        """Where an unclean reopen validates from: (segment index, byte), the recovery record's
        when its segment is still there, else the start of the checkpoint's segment; and the
        checkpoint's segment index (where it falls back to if damage breaks the record).  Every
        segment after the start must be rebuilt, and the start one too unless recovery resumes
        in it."""
        bases = disk_bases(self.dir)
        ckpt_first = max([i for i, b in enumerate(bases) if b <= rp], default=0)
        rec = self.read_record()
        if rec is not None and rec.segment_base in bases:
            exp.record = rec
            _, idx, tidx = layout.segment_paths(self.dir, rec.segment_base)
            if not (idx.exists() and tidx.exists()):
                # an empty last segment a clean start adopted without index files (they come
                # with its first flush or close): the loader cannot check the record against
                # them and falls back to Kafka's rule, as on main (seed 7014 of the soak)
                exp.record_doubtful = True
            first = bases.index(rec.segment_base)
            exp.must_rebuild |= set(bases[first + 1:])
            exp.fallback_rebuild = set(bases[ckpt_first:])
            return first, rec.position, ckpt_first
        exp.must_rebuild |= set(bases[ckpt_first:])
        return ckpt_first, 0, ckpt_first

    # -- operations -------------------------------------------------------------------------------

    def op_append(self) -> None:
        log = self.log
        assert log is not None
        n = self.rng.choice([1, 1, 2, 3])
        together = n > 1 and self.rng.random() < 0.5
        calls = [list(range(self.k, self.k + n))] if together else [[i] for i in
                                                                    range(self.k, self.k + n)]
        for call in calls:
            now = append_time(call[0])
            data = b"".join(self.model.encoded(i) for i in call)
            self.note(f"append batches {call[0]}..{call[-1]} ({len(data)} bytes) at LEO "
                      f"{log.log_end_offset}, active segment {log.active_segment!r} "
                      f"index entries {log.active_segment.offset_index.entries}/"
                      f"{log.active_segment.offset_index.max_entries} time "
                      f"{log.active_segment.time_index.entries}/"
                      f"{log.active_segment.time_index.max_entries}")
            epoch = self.epoch if self.epoch is not None else log.leader_epoch
            try:
                info = log.append(data, now_ms=now, leader_epoch=self.epoch)
            except Exception as exc:  # noqa: BLE001 - any failure of a valid append is a finding
                self.fail(f"append of batches {call} raised {type(exc).__name__}: {exc}")
            first, last = self.model.base_offset(call[0]), self.model.base_offset(call[-1] + 1) - 1
            self.check((info.first_offset, info.last_offset, info.batch_count, info.size)
                       == (first, last, len(call), len(data)), f"append returned {info}")
            for i in call:
                self.lat_of[i] = now
                self.epoch_of[i] = epoch
            self.k = call[-1] + 1

    def op_epoch(self) -> None:
        if self.epoch is not None:
            self.epoch += self.rng.randint(1, 3)
            self.note(f"leader epoch -> {self.epoch}")

    def op_bad_append(self) -> None:
        """A produce whose last batch is corrupt: rejected, and nothing may be written."""
        log = self.log
        assert log is not None
        n = self.rng.randint(1, 3)
        parts = [bytearray(self.model.encoded(i)) for i in range(self.k, self.k + n)]
        victim = parts[-1]
        how = self.rng.choice(["crc", "truncated", "magic", "length"])
        if how == "crc":
            victim[self.rng.randrange(61, len(victim)) if len(victim) > 61 else 30] ^= 0x40
        elif how == "truncated":
            del victim[self.rng.randrange(1, len(victim)):]
        elif how == "magic":
            victim[16] = 1
        else:
            struct.pack_into(">i", victim, 8, self.rng.choice([0, 13, len(victim) + 5]))
        before = (log.log_end_offset, [s.size for s in log.segments])
        self.note(f"bad append of batches {self.k}..{self.k + n - 1} ({how} in the last)")
        try:
            log.append(b"".join(parts), now_ms=append_time(self.k), leader_epoch=self.epoch)
        except CorruptRecordError:
            pass
        else:
            self.fail(f"an append with a {how} batch was accepted")
        after = (log.log_end_offset, [s.size for s in log.segments])
        self.check(after == before, f"a rejected append changed the log: {before} -> {after}")

    def op_roll(self) -> None:
        log = self.log
        assert log is not None
        before = len(log.segments)
        empty = log.active_segment.size == 0
        self.note(f"roll at LEO {log.log_end_offset} (active empty={empty})")
        log.roll()
        self.check(len(log.segments) == before + (0 if empty else 1), "roll count")
        self.check(log.active_segment.base_offset == log.log_end_offset, "roll base")

    def op_flush(self) -> None:
        log = self.log
        assert log is not None
        self.note(f"flush (LEO {log.log_end_offset})")
        flushed = log.flush()
        self.check(log.recovery_point == log.log_end_offset, "flush did not move the recovery point")
        rec = self.read_record()
        if flushed and log.active_segment.loaded:
            # the record names the LEO at the end of the active segment, and only fsynced bytes
            active = log.active_segment
            self.check(rec is not None and (rec.offset, rec.segment_base, rec.position)
                       == (log.log_end_offset, active.base_offset, active.size),
                       f"after a flush the recovery record is {rec}, not the LEO "
                       f"{log.log_end_offset} at byte {active.size} of segment {active.base_offset}")
        if rec is not None and flushed:
            self.check_record_synced(rec)

    def check_record_synced(self, rec: Any) -> None:
        """The record a flush just wrote vouches for no byte of its ``.log`` past the last
        fdatasync and no index entry past the last msync of its index."""
        if not self.check_sync:
            return
        sizes = (("bytes", 1, rec.position), ("offset index entries", 8, rec.offset_index_entries),
                 ("time index entries", 12, rec.time_index_entries))
        for path, (what, width, count) in zip(layout.segment_paths(self.dir, rec.segment_base),
                                              sizes, strict=True):
            path = os.path.abspath(path)
            have = self.sync.synced.get(path, 0) // width
            self.check(have >= count or not os.path.exists(path),
                       f"the recovery record vouches for {count} {what} of "
                       f"{os.path.basename(path)}, only {have} were made durable")

    def op_ack_flush(self) -> None:
        """An acknowledgement's flush (``checkpoint=False``): the durable offset reaches the
        offset asked for (fdatasynced); the recovery point and its record move only when a
        checkpoint was due, and then to the LEO."""
        log = self.log
        assert log is not None
        leo, rp, before = log.log_end_offset, log.recovery_point, self.read_record()
        up_to = self.rng.randint(min(log.durable_offset + 1, leo), leo)
        self.note(f"acknowledgement flush to {up_to} (durable {log.durable_offset}, LEO {leo})")
        flushed = log.flush(up_to, checkpoint=False)
        self.check(log.durable_offset >= up_to, f"durable offset {log.durable_offset} < {up_to}")
        rec = self.read_record()
        if log.recovery_point == rp:
            self.check(rec == before, f"an acknowledgement flush moved the record: {rec}")
        else:
            self.check(log.recovery_point == leo, f"a checkpoint stopped at {log.recovery_point}")
            if rec is not None and flushed:
                self.check_record_synced(rec)
        if self.check_sync:
            for seg in self.verify_disk(min_k=self.k, max_k=self.k):
                below = [b for b in seg.batches if b.last < log.durable_offset]
                if below:
                    path = os.path.abspath(layout.segment_paths(self.dir, seg.base)[0])
                    need = below[-1].position + below[-1].size
                    have = self.sync.synced.get(path, 0)
                    self.check(have >= need, f"durable offset {log.durable_offset} covers {need} "
                                             f"bytes of {os.path.basename(path)}, {have} synced")

    def op_hw(self) -> None:
        log = self.log
        assert log is not None
        if self.rng.random() < 0.6 or self.hw >= self.leo:
            target = self.leo
        else:
            lo = self.model.index_containing(self.hw)
            target = max(self.hw, self.model.base_offset(self.rng.randint(lo, self.k)))
        self.note(f"high watermark {self.hw} -> {target}")
        self.hw = log.update_high_watermark(target)
        self.check(self.hw == target, f"update_high_watermark({target}) gave {self.hw}")

    def expected_retention(self, segs: list[DiskSegment], now: int | None,
                           only_start: bool) -> tuple[list[int], int]:
        """Kafka's deletableSegments, computed from the disk and the model: (bases kept, start)."""
        start = self.start
        leo = self.leo
        remaining = [(s.base, s.size, s.next_offset, self.segment_max_ts(s)) for s in segs]

        def run(pred: Any) -> None:
            nonlocal start
            doomed = 0
            for i, seg in enumerate(remaining):
                nxt = remaining[i + 1] if i + 1 < len(remaining) else None
                upper = nxt[0] if nxt else leo
                if nxt is None and seg[1] == 0:
                    break
                if self.hw >= upper and pred(seg, nxt):
                    doomed += 1
                else:
                    break
            if doomed:
                if doomed == len(remaining):
                    remaining.append((leo, 0, leo, -1))
                del remaining[:doomed]
                start = max(start, remaining[0][0])

        run(lambda seg, nxt: nxt is not None and nxt[0] <= start)
        if not only_start:
            if self.config.retention_bytes >= 0:
                excess = [sum(s[1] for s in remaining) - self.config.retention_bytes]

                def over(seg: Any, nxt: Any) -> bool:
                    if excess[0] - seg[1] >= 0:
                        excess[0] -= seg[1]
                        return True
                    return False

                run(over)
            if self.config.retention_ms >= 0:
                assert now is not None
                run(lambda seg, nxt: now - seg[3] > self.config.retention_ms)
        return [s[0] for s in remaining], start

    def segment_max_ts(self, seg: DiskSegment) -> int:
        best = -1
        for b in seg.batches:
            j = self.model.index_at(b.base)
            best = max(best, self.model.max_timestamp(j, self.lat_for(j)))
        return best

    def op_retention(self) -> None:
        log = self.log
        assert log is not None
        segs = self.scan()
        maxes = [self.segment_max_ts(s) for s in segs if s.batches]
        if maxes and self.config.retention_ms >= 0 and self.rng.random() < 0.7:
            now = self.rng.choice(maxes) + self.config.retention_ms + self.rng.choice([0, 1, 500])
        else:
            now = (max(maxes) if maxes else W.T0) + self.rng.randint(0, 1000)
        kept, start = self.expected_retention(segs, now, only_start=False)
        self.note(f"retention now={now} hw={self.hw} start={self.start} segments "
                  f"{[(s.base, s.size) for s in segs]} -> expect kept {kept} start {start}")
        if self.manager is not None:
            self.manager.run_retention(now)
        else:
            log.delete_old_segments(now)
        self.start = start
        got = [s.base_offset for s in log.segments]
        self.check(got == kept, f"retention kept segments {got}, expected {kept}")

    def op_delete_records(self) -> None:
        log = self.log
        assert log is not None
        if self.hw <= self.start:
            return
        offset = self.rng.randint(self.start, self.hw)
        segs = self.scan()
        self.note(f"delete_records_before({offset}) start={self.start} hw={self.hw}")
        got = log.delete_records_before(offset)
        self.start = max(self.start, offset)
        kept, start = self.expected_retention(segs, None, only_start=True)
        self.start = start
        self.check(got == start, f"delete_records_before returned {got}, expected {start}")
        bases = [s.base_offset for s in log.segments]
        self.check(bases == kept, f"delete_records_before kept {bases}, expected {kept}")

    def op_truncate(self) -> None:
        log = self.log
        assert log is not None
        first = self.model.index_containing(self.start) if self.start < self.leo else self.k
        if self.model.base_offset(first) < self.start:
            first += 1
        if first > self.k:
            return
        j = self.rng.randint(max(first, self.k - 6), self.k)
        offset = self.model.base_offset(j)
        self.note(f"truncate_to({offset}) (batch {j}, LEO {self.leo}, start {self.start})")
        log.truncate_to(offset)
        if self.manager is not None:
            # Kafka's LogManager.truncateTo checkpoints recovery points right after truncating:
            # the old checkpoint may vouch for offsets that now hold new, unflushed batches
            self.manager.checkpoint()
        self.k = j
        self.hw = min(self.hw, offset)
        self.check(log.recovery_point <= offset, "truncate_to left the recovery point above it")

    def op_checkpoint(self) -> None:
        if self.manager is not None:
            self.note("checkpoint")
            self.manager.checkpoint()

    def op_clean_reopen(self) -> None:
        log = self.log
        assert log is not None
        k = self.k
        self.note(f"clean close + reopen (LEO {self.leo}, start {self.start})")
        self.close_clean()
        exp = Expectation(True, self.leo, self.start, k, k)
        if self.rng.random() < 0.25:
            self.damage_indexes(exp)
        if self.use_manager:
            exp.rp_checkpoint, exp.start_checkpoint = self.read_checkpoints()
        if exp.notes:
            self.note(f"  damage before the clean reopen: {exp.notes}")
        loaded = self.reopen(True, self.leo, self.start)
        self.after_reopen(exp, loaded)
        self.count("clean_reopen")

    def op_crash(self) -> None:
        log = self.log
        assert log is not None
        k = self.k
        if self.use_manager:
            rp = None
        else:
            rp = log.recovery_point if self.rng.random() < 0.7 else self.rng.randint(0, log.recovery_point)
        start_ckpt = self.start if not self.use_manager else None
        self.note(f"crash (LEO {self.leo}, recovery point {log.recovery_point}, start {self.start})")
        self.crash()
        if self.use_manager:
            rp, start_ckpt = self.read_checkpoints()
        assert rp is not None and start_ckpt is not None
        exp = Expectation(False, rp, start_ckpt, k, k)
        segs = self.scan()
        first_recovered, from_byte, ckpt_first = self.plan_recovery(exp, rp)
        if self.rng.random() < 0.6:
            self.damage_logs(exp, segs, first_recovered, from_byte, ckpt_first)
        if self.rng.random() < 0.3:
            self.damage_indexes(exp)
        self.note(f"  reopen unclean with recovery point {rp}, start {start_ckpt}; {exp.notes}")
        loaded = self.reopen(False, rp, start_ckpt)
        self.after_reopen(exp, loaded)
        self.count("crash")

    # -- damage ---------------------------------------------------------------------------------

    def intact_before(self, segs: list[DiskSegment], s: int, byte: int) -> int:
        """Number of model batches wholly before ``byte`` of segment ``s`` (from the log start)."""
        seg = segs[s]
        kept = [b for b in seg.batches if b.position + b.size <= byte]
        if kept:
            return self.model.index_at(kept[-1].base) + 1
        return self.model.index_at(seg.base)

    def damage_logs(self, exp: Expectation, segs: list[DiskSegment], first: int,
                    from_byte: int = 0, fallback: int = 0) -> None:
        """Damage a segment recovery will validate: ``first`` and later ones, in ``first`` only
        from byte ``from_byte`` on (what a recovery record vouches for is not validated again).
        A truncation below that byte breaks the record and recovery falls back to the
        checkpoint's segment ``fallback``: allowed only if that one is not later."""
        kinds = [k for k in ("truncate", "flip", "zeros") if k in self.damage_kinds]
        if not kinds:
            return
        kind = self.rng.choice(kinds)
        candidates = list(range(first, len(segs)))
        s = candidates[-1] if self.rng.random() < 0.6 else self.rng.choice(candidates)
        seg = segs[s]
        path = layout.segment_paths(self.dir, seg.base)[0]
        if kind == "truncate" and seg.size > 0:
            if self.rng.random() < 0.6:
                cut = seg.size - self.rng.randint(1, min(seg.size, 200))
            else:
                cut = self.rng.randrange(seg.size)
            if s == first and cut < from_byte:
                if fallback > first:
                    cut = from_byte + (cut % max(1, seg.size - from_byte))
                    if cut >= seg.size:
                        return
                elif exp.record is not None:
                    exp.record_broken = True
            os.truncate(path, cut)
            self.sync.truncated(path, cut)
            intact = self.intact_before(segs, s, cut)
            exp.min_k = exp.max_k = min(exp.max_k, intact)
            exp.notes.append(f"truncated {path.name} at byte {cut} of {seg.size}")
            self.count("damage_truncate")
        elif kind == "flip" and seg.size > 0:
            window = self.rng.choice([8, 61, 200, 1000])
            lo = max(from_byte if s == first else 0, seg.size - window)
            # partitionLeaderEpoch (header bytes 12-15) is the one field neither the CRC nor
            # recovery's offset checks cover (as in Kafka): a flip there is undetectable
            epoch_bytes = {b.position + x for b in seg.batches for x in range(12, 16)}
            spots = [p for p in range(lo, seg.size) if p not in epoch_bytes]
            if not spots:
                return
            flips = sorted(self.rng.choice(spots) for _ in range(self.rng.randint(1, 3)))
            with open(path, "r+b") as f:
                for p in flips:
                    f.seek(p)
                    byte = f.read(1)[0]
                    f.seek(p)
                    f.write(bytes([byte ^ (1 << self.rng.randrange(8))]))
            intact = self.intact_before(segs, s, flips[0])
            exp.min_k = min(exp.min_k, intact)
            exp.notes.append(f"flipped bits at {flips} of {path.name} ({seg.size} bytes)")
            self.count("damage_flip")
        elif kind == "zeros":
            n = self.rng.choice([1, 12, 61, 4096, self.rng.randint(1, 20000)])
            with open(path, "ab") as f:
                f.write(bytes(n))
            if s < len(segs) - 1:    # recovery truncates it and drops every later segment
                intact = self.intact_before(segs, s, seg.size)
                exp.min_k = exp.max_k = min(exp.max_k, intact)
            exp.notes.append(f"appended {n} zero bytes to {path.name}")
            self.count("damage_zeros")

    def damage_indexes(self, exp: Expectation, kinds: tuple[str, ...] | None = None) -> None:
        """Delete, garble (random bytes over a random region) or cut (truncate at a random byte,
        or grow with zeros, as an untrimmed index looks) an index file of a random segment."""
        allowed = [k for k in (kinds if kinds is not None else self.damage_kinds)
                   if k in ("delete_index", "garble_index", "cut_index")]
        if not allowed:
            return
        kind = self.rng.choice(allowed)
        base = self.rng.choice(disk_bases(self.dir))
        _, idx, tidx = layout.segment_paths(self.dir, base)
        if exp.record is not None and exp.record.segment_base == base:
            exp.record_doubtful = True
        if kind == "delete_index":
            which = self.rng.choice([[idx], [tidx], [idx, tidx]])
            for p in which:
                p.unlink(missing_ok=True)
            empty_last = (base == disk_bases(self.dir)[-1]
                          and layout.segment_paths(self.dir, base)[0].stat().st_size == 0)
            if not (exp.clean and empty_last and not idx.exists() and not tidx.exists()):
                # (a clean start takes an empty last segment without index files for a new,
                # unwritten one: nothing to rebuild, its files come with its first write)
                exp.must_rebuild.add(base)
            exp.notes.append(f"deleted {[p.name for p in which]}")
        elif kind == "garble_index":
            path = self.rng.choice([idx, tidx])
            size = path.stat().st_size if path.exists() else 0
            if size == 0:
                return
            at = self.rng.randrange(size)
            n = min(size - at, self.rng.randint(1, 24))
            junk = self.rng.randbytes(n)
            with open(path, "r+b") as f:
                f.seek(at)
                old = f.read(n)
                f.seek(at)
                f.write(junk)
            exp.notes.append(f"garbled {path.name} bytes {at}..{at + n} of {size}: "
                             f"{old.hex()} -> {junk.hex()}")
            self.damaged_indexes.add(base)
        else:
            path = self.rng.choice([idx, tidx])
            size = path.stat().st_size if path.exists() else 0
            if size and self.rng.random() < 0.5:
                cut = self.rng.randrange(size)
                os.truncate(path, cut)
                exp.notes.append(f"cut {path.name} to {cut} of {size} bytes")
            else:
                grow = self.rng.choice([8, 12, 24, 96, self.rng.randint(1, 400)])
                with open(path, "ab") as f:
                    f.write(bytes(grow))
                exp.notes.append(f"appended {grow} zero bytes to {path.name} ({size} bytes)")
            self.damaged_indexes.add(base)
        self.count("damage_" + kind)

    # -- driver -----------------------------------------------------------------------------------

    OPS = (
        ("append", 40), ("roll", 5), ("flush", 6), ("ack_flush", 8), ("hw", 10), ("retention", 6),
        ("delete_records", 4), ("truncate", 3), ("checkpoint", 3), ("clean_reopen", 6),
        ("crash", 14), ("epoch", 2), ("bad_append", 2),
    )

    def run(self, n_ops: int) -> dict[str, int]:
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        with self.capture_loads(), self.sync.active(self.root):
            self.open_fresh()
            try:
                for step in range(n_ops):
                    op = self.rng.choices(names, weights)[0] if step > 2 else "append"
                    self.count(op)
                    self.note(f"#{step} {op}")
                    try:
                        getattr(self, "op_" + op)()
                    except InvariantError:
                        raise
                    except Exception as exc:  # noqa: BLE001
                        self.fail(f"operation {op} raised {type(exc).__name__}: {exc}")
                    self.light_check()
                self.note("final clean close + reopen")
                self.op_clean_reopen()
            finally:
                if self.log is not None:
                    try:
                        self.close_clean()
                    except Exception:  # noqa: BLE001 - already failing
                        pass
        return self.stats


def _entries(data: bytes, fmt: str) -> list[tuple[int, int]]:
    st = struct.Struct(fmt)
    return [st.unpack_from(data, i) for i in range(0, len(data) - st.size + 1, st.size)]


# --- the tests ---------------------------------------------------------------------------------------

def _seeds(count: int, salt: int) -> list[int]:
    pinned = _env_int("SHMQ_FUZZ_SEED")
    if pinned is not None:
        return [pinned]
    return [salt * 1000 + i for i in range(count)]


@pytest.mark.parametrize("seed", _seeds(20, 1))
def test_storage_op_fuzz(seed: int, tmp_path: Path) -> None:
    stats = Fuzz(seed, tmp_path).run(_env_int("SHMQ_FUZZ_OPS") or 100)
    assert stats.get("append", 0) > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds(40, 7))
def test_storage_op_fuzz_soak(seed: int, tmp_path: Path) -> None:
    Fuzz(seed, tmp_path).run(_env_int("SHMQ_FUZZ_OPS") or 300)


# --- focused runs of single damage kinds ------------------------------------------------------------

def _garble_after_clean_shutdown(seed: int, root: Path, *, strict_offset_index: bool = True) -> None:
    """Build a log, close it cleanly, garble one index file, reopen: the loader must either
    notice (and rebuild) or be unaffected; every invariant must hold, and appends must work."""
    fz = Fuzz(seed, root, use_manager=False)
    fz.strict_offset_index = strict_offset_index
    rng = fz.rng
    with fz.capture_loads(), fz.sync.active(fz.root):
        fz.open_fresh()
        try:
            for _ in range(rng.randint(6, 30)):
                fz.op_append()
                if rng.random() < 0.15:
                    fz.op_roll()
            fz.op_hw()
            fz.note("clean close, garble an index, reopen")
            fz.close_clean()
            exp = Expectation(True, fz.leo, fz.start, fz.k, fz.k)
            fz.damage_indexes(exp, ("garble_index", "cut_index"))
            fz.note(f"  {exp.notes}")
            loaded = fz.reopen(True, fz.leo, fz.start)
            fz.after_reopen(exp, loaded)
            for _ in range(3):
                fz.op_append()
                fz.light_check()
        finally:
            if fz.log is not None:
                try:
                    fz.close_clean()
                except Exception:  # noqa: BLE001 - already failing
                    pass


@pytest.mark.parametrize("seed", _seeds(3, 5))
def test_garbled_index_after_clean_shutdown(seed: int, tmp_path: Path) -> None:
    """Index files garbled at rest (the segments are not re-validated after a clean shutdown:
    only ``sanity_check`` stands between a garbled index and the read path)."""
    for trial in range(12):
        _garble_after_clean_shutdown(seed * 100 + trial, tmp_path / str(trial))


@pytest.mark.parametrize("seed", _seeds(2, 6))
def test_flushed_segment_files_survive_power_loss(seed: int, tmp_path: Path) -> None:
    """A flush vouches for everything below the recovery point: the data of every segment below
    it must be fsynced (checked in every run) and, for a segment created since the partition
    directory was last fsynced, so must the directory entry (POSIX; Kafka's LocalLog.flush
    calls Utils.flushDir when it flushes a new segment)."""
    fz = Fuzz(seed, tmp_path)
    fz.check_dir_entries = True
    fz.run(30)


@contextmanager
def _large_segment_sanity_path() -> Iterator[None]:
    """Send every segment down ``LogSegment.sanity_check``'s path for segments larger than its
    full-verification limit (16 MiB by default, so most production segments): only the last
    entry of each index is checked against the log."""
    from shmq.storage.segment import LogSegment

    original = LogSegment.sanity_check

    def sanity_check(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, verify_bytes=0)

    LogSegment.sanity_check = sanity_check  # type: ignore[method-assign]
    try:
        yield
    finally:
        LogSegment.sanity_check = original  # type: ignore[method-assign]


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds(30, 8))
def test_storage_op_fuzz_large_segment_sanity_path(seed: int, tmp_path: Path) -> None:
    """The whole fuzzer with every segment checked as a large one.  A kept offset index then
    only has to be correct (every entry names a batch), not equal to a rebuild: a cut index is
    a valid sparse one."""
    fz = Fuzz(seed, tmp_path)
    fz.strict_offset_index = False
    with _large_segment_sanity_path():
        fz.run(_env_int("SHMQ_FUZZ_OPS") or 150)


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds(4, 4))
def test_garbled_index_large_segment_sanity_path(seed: int, tmp_path: Path) -> None:
    """``test_garbled_index_after_clean_shutdown`` with every segment checked as a large one."""
    with _large_segment_sanity_path():
        for trial in range(50):
            fz_root = tmp_path / str(trial)
            _garble_after_clean_shutdown(seed * 100 + trial, fz_root, strict_offset_index=False)


# --- SIGKILL of a real writer process -----------------------------------------------------------------

def _run_writer_round(fz: Fuzz, round_no: int, rng: random.Random) -> tuple[int, int, int]:
    """Spawn the writer, SIGKILL it, reopen; returns (acked, attempted, k after recovery)."""
    assert fz.log is not None
    start_batch = fz.k
    fz.note(f"round {round_no}: clean close, writer appends from batch {start_batch}")
    fz.close_clean()
    args = {"dir": str(fz.dir), "seed": fz.seed, "big_rate": fz.model.big_rate,
            "config": config_args(fz.config), "writer_seed": rng.randrange(1 << 30),
            "start_batch": start_batch, "log_start": fz.start, "epoch": fz.epoch}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH", "")]))
    err_path = fz.root / f"writer-{round_no}.stderr"
    lines: list[str] = []
    with open(err_path, "wb") as err_file:
        proc = subprocess.Popen([sys.executable, str(WRITER), json.dumps(args)],
                                stdout=subprocess.PIPE, stderr=err_file, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        lines.append(first.strip())
        if not first.startswith("R "):
            proc.kill()
            proc.wait(timeout=30)
            fz.fail(f"writer did not start: {first!r} {err_path.read_text()[-3000:]}")
        mode = rng.random()
        if mode < 0.4:      # after the N-th acknowledgement, plus a little
            want = rng.randint(1, 60)
            acks = 0
            while acks < want:
                line = proc.stdout.readline().decode()
                if not line:
                    break
                lines.append(line.strip())
                acks += line.startswith("A ")
            time.sleep(rng.choice([0, 0, rng.uniform(0, 0.002), rng.uniform(0, 0.02)]))
        elif mode < 0.75:   # inside a multi-megabyte append, to tear its pwritev
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                line = proc.stdout.readline().decode()
                if not line:
                    break
                lines.append(line.strip())
                parts = line.split()
                if parts[0] == "W" and int(parts[3]) > 1_000_000:
                    break
            time.sleep(rng.uniform(0, 0.03))
        else:               # at a random moment
            time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # the rest of what it printed: lines already in readline's buffer, then the pipe to EOF
        # (communicate() would read the descriptor directly and miss the buffered lines)
        rest = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    lines.extend(x.strip() for x in rest.decode().splitlines())
    fz.check(proc.returncode == -signal.SIGKILL,
             f"writer exited with {proc.returncode} before the kill: "
             f"{err_path.read_text()[-3000:]}")
    acked, attempted, rp, durable = start_batch, start_batch, 0, 0
    writer_epoch = fz.epoch if fz.epoch is not None else -1
    for line in lines:
        parts = line.split()
        if parts[0] == "W":
            first_i, last_i = int(parts[1]), int(parts[2])
            for i in range(first_i, last_i + 1):
                fz.lat_of[i] = append_time(first_i)
                fz.epoch_of[i] = writer_epoch
            attempted = last_i + 1
        elif parts[0] == "A":
            acked = int(parts[1]) + 1
        elif parts[0] == "F":
            rp = int(parts[1])
        elif parts[0] == "K":  # the durable offset moved; the recovery point maybe too
            durable, rp = max(durable, int(parts[1])), int(parts[2])
        elif parts[0] == "R":
            rp = int(parts[2])
            if fz.epoch is None:
                writer_epoch = int(parts[3])
    fz.k = attempted   # the model's upper bound; verify_disk sets the real k
    rp_ckpt = rp if rng.random() < 0.8 else rng.randint(0, rp)
    exp = Expectation(False, rp_ckpt, fz.start, acked, attempted)
    fz.plan_recovery(exp, rp_ckpt)
    if rng.random() < 0.3:
        fz.damage_indexes(exp, ("delete_index", "cut_index"))
    fz.note(f"round {round_no}: killed after {len(lines)} lines, acked<{acked}, attempted<"
            f"{attempted}, reopen unclean from {rp_ckpt}; {exp.notes}")
    with fz.capture_loads():
        loaded = fz.reopen(False, rp_ckpt, fz.start)
        fz.after_reopen(exp, loaded)
    assert fz.log is not None
    fz.check(fz.log.log_end_offset >= durable,
             f"the durable offset {durable} did not survive (LEO {fz.log.log_end_offset})")
    if durable > rp:  # acknowledged bytes whose index entries no checkpoint covered
        fz.count("killed_past_the_record")
    return acked, attempted, fz.k


def _sigkill_rounds(seed: int, tmp_path: Path, rounds: int) -> None:
    fz = Fuzz(seed, tmp_path, use_manager=False, big_rate=0.04)
    fz.check_sync = False   # the writer process's fsyncs are not tracked
    rng = random.Random(seed ^ 0x5EED)
    with fz.capture_loads():
        fz.open_fresh()
    try:
        for r in range(rounds):
            _run_writer_round(fz, r, rng)
            # keep working with the recovered log in-process for a few steps
            with fz.capture_loads():
                for _ in range(rng.randint(0, 4)):
                    op = rng.choice(["append", "append", "roll", "flush", "hw", "retention"])
                    fz.note(f"after round {r}: {op}")
                    getattr(fz, "op_" + op)()
                    fz.light_check()
    finally:
        if fz.log is not None:
            fz.close_clean()


@pytest.mark.parametrize("seed", _seeds(3, 3))
def test_sigkill_writer(seed: int, tmp_path: Path) -> None:
    _sigkill_rounds(seed, tmp_path, rounds=3)


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds(6, 9))
def test_sigkill_writer_soak(seed: int, tmp_path: Path) -> None:
    _sigkill_rounds(seed, tmp_path, rounds=8)
