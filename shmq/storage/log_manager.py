"""All partition logs of one log directory, and the files that belong to the directory.

Theory of operation (Kafka ``LogManager``)
------------------------------------------
``startup`` is given the logs this directory must host: (topic, partition) -> the topic's id and
its effective ``LogConfig``, from the cluster metadata (Kafka's broker loads its logs with the
topic configs it knows, and removes stray logs once it holds the metadata image).  It reads
``.kafka_cleanshutdown`` (present only if the last run stopped cleanly), the
``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint``, then for every
``<topic>-<partition>`` directory:

* not hosted (its topic was deleted, or it is not a replica here), or holding another topic id
  in ``partition.metadata`` (the topic was deleted and created again under the same name): a
  stray.  It is deleted without being opened, crash-safely as Kafka deletes a log: renamed to
  ``<topic>-<partition>.<uuid>-delete`` (the rename made durable), then removed.  A crash before
  the rename leaves a stray that the next start removes again; after it, a ``-delete`` directory,
  which no partition name matches and which the next start removes first.
* otherwise opened through the loader with its topic's config, recovering whatever the
  checkpoints and its recovery record do not vouch for; a directory without ``partition.metadata``
  (written by an older shmq) is adopted and gets one.

Directories are opened ``RECOVERY_THREADS`` at a time (Kafka's
``num.recovery.threads.per.data.dir``): with a cold page cache a start is mostly waits for small
reads.  Then the marker is removed: from now on a crash must look like a crash.  ``checkpoint``
rewrites both checkpoint files (atomically); ``shutdown`` flushes and closes every log,
checkpoints, and writes the marker last.  Without ``hosted`` (storage tests, tools) every
directory is opened, with ``topic_configs`` or the default config.

Opening at first use (``lazy``, the worker's mode)
--------------------------------------------------
A worker may host 10,000 partitions, and opening a log costs ~0.6 ms (three directory
listings, five small files, the producer state): a start used to open them all.  After a clean
shutdown nothing in a log needs checking, so ``startup`` opens none of the logs a clean
shutdown described: each becomes a ``DeferredLog`` holding what the worker must publish before
it serves (log start, end, last stable offset, size) and what retention needs, read from one
file, ``shmq-log-summary``, that ``shutdown`` writes (atomically, before the marker) and every
``startup`` removes after reading it (so only the summary of the last clean shutdown is used).
``get_log`` opens a deferred log at its first use (produce, fetch, ListOffsets, DeleteRecords,
truncation), exactly as ``startup`` would have; retention opens one only when its oldest
segment is due (the rule evaluated on the summary's figures); a deleted topic's deferred logs
are removed without being opened; checkpoints carry their offsets unchanged.  A log the summary
does not describe (an unclean shutdown, a summary that is missing, malformed, or names another
topic id) is opened at start as before: recovery never waits for a first request.  The summary is
shmq's own file (Kafka ignores files in a log directory); the logs keep Kafka's format.

After an unclean shutdown
-------------------------
Kafka's rule is that recovery after an unclean shutdown validates only what follows each log's
recovery point; everything before it is trusted (``LogLoader.recoverLog``).  A log whose recovery
record (``recovery_point.py``) names the exact end of its last segment has nothing after its
recovery point (a log idle for ``CHECKPOINT_INTERVAL_MS`` after its last acks=all append, whose
periodic checkpoint wrote the record at its end, or one not written since a clean close), so an
unclean start does not open it either (``unclean_deferral``: a listing,
a stat per segment, the record and ``partition.metadata``: no segment is opened or read, however
large the log): its offsets come from the record, which carries the LSO (the first unstable
offset at the recovery point), and it is opened at first use the way an unclean start opens it
(index files adopted at the recorded entry counts, checked at first read).  Only logs whose
recovery point is behind their end (written in the last ``CHECKPOINT_INTERVAL_MS``: acknowledged
bytes whose indexes no checkpoint made durable yet, or acks=0/1 bytes never fsynced), or whose
record is missing, of version 1 or does not match the files, are opened and recovered at start,
each validating at most what followed its last checkpoint.  A clean shutdown before such a log was ever
opened carries that in its summary entry (a 12th field, ``true``), so the next start still
opens it as after a crash: its index files were never trimmed, and a clean start's index check
would find them running past the log and rebuild them (reading the segment).

Clean shutdown: one syncfs, not an fsync per file
-------------------------------------------------
Kafka's ``LogManager.shutdown`` flushes every log (its segments, and its directory when a
segment is new), closes it (producer snapshot, trimmed indexes), then writes the recovery-point
and log-start checkpoints and last the clean-shutdown marker.  Per new log that was a
``.log`` fdatasync, the leader-epoch checkpoint's fsync, ``partition.metadata``'s and the
directory's: a stop of 10,000 just-written logs took 9.5-26 s on the shared box, half of it
in fsync.  ``shutdown`` gives the same guarantee with one ``syncfs(2)`` of the log directory's
filesystem, in this order:

1. Every log is closed without an fsync (``PartitionLog.close(sync=False)``): batches, index
   entries (trimmed), producer snapshot, leader-epoch checkpoint, txn indexes and new names
   reach the page cache only.  No recovery point moves and no recovery record is written: on
   disk each log's record still vouches only for what an earlier fsync made durable.
2. ``syncfs`` of the filesystem: it returns once every dirty page (those stored through the
   index mappings too) and inode of it is written and its journal committed, and fails if a
   writeback error happened on it since ``startup`` opened the directory it is called on
   (Linux >= 5.8, ``disk.py``; elsewhere every log is fsynced file by file, as before).
   A log whose directory is on another filesystem is closed with its own fsyncs instead.
3. Only after it succeeded does each log's recovery point move to its LEO and its recovery
   record say so (``PartitionLog.finish_close``; unsynced, as every record: an older one on
   disk vouches for less).  If it failed, nothing moves and the shutdown stays unmarked.
4. Then the checkpoints (each fsynced and renamed into place), the summary, and last the marker.

A crash before step 4 completes leaves no marker: the next start is an unclean one, which
trusts only the recovery points and records on disk, none of which moved before step 2 made
everything below them durable.  Files a killed shutdown wrote but never synced may be read
back by that start from the page cache: a log opened after an unclean shutdown fsyncs its
leader-epoch checkpoint, ``partition.metadata`` and txn indexes at its first flush, an
acknowledgement's too (``PartitionLog(synced=False)``), before its durable offset or recovery
point counts on them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from shmq.errors import ConfigError
from shmq.storage import checkpoint, disk, layout, partition_metadata
from shmq.storage import recovery_point as recovery_point_file
from shmq.storage.log import PartitionLog
from shmq.storage.log_config import LogConfig

log = logging.getLogger(__name__)

RECOVERY_THREADS = 8  # logs opened (and recovered) at once by startup
SUMMARY_FILE = "shmq-log-summary"
SUMMARY_VERSION = 1


class DeferredLog:
    """A log a clean shutdown described, not opened yet: what the worker publishes for it (the
    attributes ``BrokerContext.publish_state`` reads) and what retention checks."""

    __slots__ = ("directory", "config", "topic_id", "recovery_point", "log_start_offset",
                 "log_end_offset", "last_stable_offset", "size_in_bytes", "segment_count",
                 "first_size", "first_largest_timestamp", "second_base", "generation", "clean")

    storage_errno = None

    def __init__(self, directory: Path | str, config: LogConfig, entry: list,
                 recovery_point: int, log_start_offset: int, *, clean: bool = True) -> None:
        """``directory``: a path (a ``Path`` made at first use: 5,000 of them cost 0.07 s of a
        start); ``clean``: False for a log an unclean shutdown left (opened as after a crash)."""
        (_, _, self.topic_id, leo, first_unstable, _, self.size_in_bytes, self.segment_count,
         self.first_size, self.first_largest_timestamp, self.second_base) = entry[:11]
        self.clean = clean
        self.directory = directory
        self.config = config
        self.recovery_point = recovery_point
        self.log_start_offset = log_start_offset
        self.log_end_offset = leo
        self.last_stable_offset = first_unstable if 0 <= first_unstable < leo else leo
        self.generation = int.from_bytes(os.urandom(4), "big")

    @property
    def high_watermark(self) -> int:
        return self.log_end_offset  # one replica: the HW is the LEO once loaded

    def retention_due(self, now_ms: int) -> bool:
        """Whether ``PartitionLog.delete_old_segments`` would delete its oldest segment now:
        its rule, on the summary's figures (True when the oldest segment's newest timestamp is
        not known: open the log and see)."""
        if self.second_base is not None and 0 <= self.second_base <= self.log_start_offset:
            return True
        config = self.config
        if not config.delete_enabled or (self.segment_count == 1 and self.first_size == 0):
            return False
        if config.retention_bytes >= 0 and \
                self.size_in_bytes - config.retention_bytes - self.first_size >= 0:
            return True
        if config.retention_ms >= 0:
            largest = self.first_largest_timestamp
            return largest is None or now_ms - largest > config.retention_ms
        return False

    def summary(self, tp: tuple[str, int]) -> list:
        entry = [tp[0], tp[1], self.topic_id, self.log_end_offset,
                 self.last_stable_offset if self.last_stable_offset < self.log_end_offset
                 else -1, self.log_start_offset, self.size_in_bytes, self.segment_count,
                 self.first_size, self.first_largest_timestamp, self.second_base]
        return entry if self.clean else [*entry, True]  # still to open as after a crash


def unclean_deferral(directory: str, want: HostedLog, recovery_point: int,
                     log_start_offset: int, topic_id: uuid.UUID | None = None
                     ) -> DeferredLog | None:
    """The log in ``directory`` after an unclean shutdown, described without opening it, when
    nothing in it follows its recovery point (see "After an unclean shutdown"); None when it
    must be opened and recovered now.  Reads the listing, one stat per segment, the recovery
    record and ``partition.metadata`` (``topic_id``: ``want``'s, parsed)."""
    bases: list[int] = []
    snapshots = False
    for name in os.listdir(directory):
        if name.endswith(layout.LOG_SUFFIX):
            try:
                bases.append(layout.offset_from_filename(name))
            except ValueError:
                return None  # a stray file: the loader warns about it
        elif name.endswith(layout.TEMP_SUFFIXES):
            return None  # leftovers of an interrupted operation: the loader removes them
        elif name.endswith(layout.SNAPSHOT_SUFFIX):
            snapshots = True
    if not bases or partition_metadata.read(directory) != (topic_id or uuid.UUID(want.topic_id)):
        return None
    bases.sort()
    sizes = [os.stat(os.path.join(directory, layout.filename_prefix(b) + layout.LOG_SUFFIX))
             .st_size for b in bases]
    record = recovery_point_file.read(directory)
    largest = None
    if record is not None and record.first_unstable != recovery_point_file.UNKNOWN \
            and record.segment_base == bases[-1] and record.position == sizes[-1]:
        leo, unstable = record.offset, record.first_unstable  # the end is the recovery point
        durable = max(recovery_point, leo)
        if len(bases) == 1 and record.max_timestamp >= 0:
            largest = record.max_timestamp  # the only segment's: what retention checks
    elif record is None and len(bases) == 1 and sizes[0] == 0 and not snapshots:
        leo, unstable, durable = bases[0], -1, recovery_point  # never written: nothing to check
    else:
        return None
    entry = [None, None, want.topic_id, leo, unstable, None, sum(sizes), len(bases), sizes[0],
             largest, bases[1] if len(bases) > 1 else None]
    return DeferredLog(directory, want.config, entry, min(durable, leo),
                       min(max(log_start_offset, bases[0]), leo), clean=False)


def _summary_entry(tp: tuple[str, int], plog: PartitionLog) -> list:
    """What ``shmq-log-summary`` holds of an open log (taken before it is closed)."""
    first = plog.segments[0]
    # the oldest segment's largest timestamp, if known without loading its indexes now
    largest = first.largest_timestamp if first.loaded else None
    unstable = plog.producer_state.first_unstable_offset()
    return [tp[0], tp[1], str(plog.topic_id) if plog.topic_id is not None else None,
            plog.log_end_offset, -1 if unstable is None else unstable, plog.log_start_offset,
            plog.size_in_bytes, len(plog.segments), first.size, largest,
            plog.segments[1].base_offset if len(plog.segments) > 1 else None]


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


def _read_summary(path: Path) -> dict[tuple[str, int], list]:
    """The logs ``path`` describes; {} when it is missing or not a summary we wrote."""
    try:
        data = json.loads(path.read_bytes())
        if data.get("version") != SUMMARY_VERSION:
            return {}
        out = {}
        for entry in data["logs"]:
            (topic, partition, topic_id, leo, unstable, start, size, count, first_size,
             largest, second, *after_crash) = entry
            if after_crash and (len(after_crash) > 1 or after_crash[0] is not True):
                return {}  # the 12th field, true: a log an unclean start did not open
            ints = (partition, leo, unstable, start, size, count, first_size)
            if (not isinstance(topic, str) or not all(type(v) is int for v in ints)
                    or not (topic_id is None or isinstance(topic_id, str))
                    or not (largest is None or type(largest) is int)
                    or not (second is None or type(second) is int)
                    or min(leo, start, size, first_size) < 0 or count < 1 or start > leo):
                return {}
            if topic_id is not None and not _CANONICAL_UUID.match(topic_id):
                uuid.UUID(topic_id)  # ValueError unless another spelling of one
            out[(topic, partition)] = list(entry)
        return out
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("ignoring %s (every log is opened at start): %s", path, exc)
        return {}


class HostedLog(NamedTuple):
    """A log this directory must hold: its topic's id (uuid text) and effective config."""

    topic_id: str
    config: LogConfig


class StartupReport(NamedTuple):
    """What ``startup`` did (the worker logs it in one line)."""

    clean: bool                 # the last run stopped cleanly
    opened: int                 # logs opened
    recovered: int              # logs validated past their recovery point (unclean start)
    validated_bytes: int
    truncated_bytes: int
    rebuilt_segments: int       # segments whose indexes were rebuilt at start
    deleted: tuple[str, ...]    # stray directories removed
    seconds: float
    deferred: int = 0           # logs left to open at first use

    def describe(self) -> str:
        how = "a clean shutdown" if self.clean else "an unclean shutdown"
        parts = [f"{self.opened} logs opened after {how}"]
        if self.deferred:
            parts[0] += f", {self.deferred} left to open at first use"
        if not self.clean:
            parts.append(f"{self.recovered} recovered from their recovery points, "
                         f"{_size(self.validated_bytes)} validated")
        if self.truncated_bytes:
            parts.append(f"{_size(self.truncated_bytes)} of invalid tails truncated")
        if self.rebuilt_segments:
            parts.append(f"indexes of {self.rebuilt_segments} segments rebuilt")
        if self.deleted:
            parts.append(f"{len(self.deleted)} stray logs deleted")
        return "; ".join(parts) + f" in {self.seconds:.2f} s"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


class LogManager:
    def __init__(self, log_dir: Path | str, default_config: LogConfig | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.default_config = default_config or LogConfig()
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        # logs a clean shutdown described, opened at their first use (see "Opening at first use")
        self.deferred: dict[tuple[str, int], DeferredLog] = {}
        self.lazy = False
        self.had_clean_shutdown = False
        self._started = False
        # called with (topic, partition) and the log when a log an unclean start deferred opens
        # (the worker publishes its offsets again)
        self.on_open: Callable[[tuple[str, int], PartitionLog], None] | None = None
        # the log directory, open from startup to shutdown for its syncfs: a writeback error
        # anywhere on the filesystem after it was opened makes that syncfs fail ("Clean shutdown")
        self._sync_fd: _Descriptor | None = None

    # -- start and stop -------------------------------------------------------------------------

    def startup(self, topic_configs: dict[str, LogConfig] | None = None, *,
                hosted: Mapping[tuple[str, int], HostedLog] | None = None,
                lazy: bool | None = None) -> StartupReport:
        """``lazy`` (default: with ``hosted``): leave the logs a clean shutdown described to
        be opened at first use."""
        started = time.monotonic()
        self.lazy = hosted is not None if lazy is None else lazy
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if disk.HAVE_SYNCFS and self._sync_fd is None:
            self._open_sync_fd()
        marker = self.log_dir / layout.CLEAN_SHUTDOWN_FILE
        self.had_clean_shutdown = marker.exists()
        recovery = checkpoint.read_offsets(self.log_dir / layout.RECOVERY_POINT_CHECKPOINT)
        starts = checkpoint.read_offsets(self.log_dir / layout.LOG_START_OFFSET_CHECKPOINT)
        summary_path = self.log_dir / SUMMARY_FILE
        summary = _read_summary(summary_path) if self.lazy and self.had_clean_shutdown else {}
        topic_configs = topic_configs or {}
        deleted: list[str] = []
        todo: list[tuple[tuple[str, int], str, HostedLog | None]] = []
        for entry in os.scandir(self.log_dir):
            if entry.is_dir() and entry.name.endswith("-delete"):
                shutil.rmtree(entry.path, ignore_errors=True)  # a deletion that did not finish
                continue
            tp = layout.parse_partition_dir(entry.name) if entry.is_dir() else None
            if tp is None:
                continue
            want = hosted.get(tp) if hosted is not None else None
            described = summary.get(tp)
            if (described is not None and want is not None and described[2] is not None
                    and _same_id(described[2], want.topic_id)):
                self.deferred[tp] = DeferredLog(entry.path, want.config, described,
                                                recovery.get(tp, 0), starts.get(tp, 0),
                                                clean=len(described) == 11)
            else:
                todo.append((tp, entry.path, want))
        if self.lazy and not self.had_clean_shutdown:
            todo = self._defer_unclean(todo, recovery, starts)
        todo.sort(key=lambda item: item[1])

        def open_one(tp: tuple[str, int], path: str,
                     want: HostedLog | None) -> PartitionLog | str:
            directory = Path(path)
            if hosted is not None:
                why = _stray(directory, want)
                if why is not None:
                    log.warning("deleting stray log %s: %s", directory, why)
                    self._delete_directory(directory)
                    return directory.name
            config = want.config if want is not None else topic_configs.get(tp[0],
                                                                             self.default_config)
            plog = PartitionLog.open(
                directory, config, recovery_point=recovery.get(tp, 0),
                log_start_offset=starts.get(tp, 0), clean_shutdown=self.had_clean_shutdown)
            if want is not None:
                plog.assign_topic_id(want.topic_id)  # adopts a directory from before the ids
            return plog

        # Kafka's num.recovery.threads.per.data.dir: a start is mostly small reads of many
        # files (a cold cache waits for each), and recovery's CRC loop runs without the GIL
        with ThreadPoolExecutor(max(1, min(RECOVERY_THREADS, len(todo)))) as pool:
            opened = [pool.submit(open_one, *item) for item in todo]
            for (tp, _, _), future in zip(todo, opened, strict=True):
                result = future.result()
                if isinstance(result, str):
                    deleted.append(result)
                else:
                    self.logs[tp] = result
        # the summary describes the state the last shutdown left, for this start only: an
        # unclean stop, or a run of a version that writes none, must not leave it to a later one
        _unlink(summary_path)
        if self.had_clean_shutdown:
            marker.unlink()
        self._started = True
        offsets = self.checkpoint_offsets()
        if offsets != (recovery, starts) or not all(
                (self.log_dir / name).exists() for name in (layout.RECOVERY_POINT_CHECKPOINT,
                                                            layout.LOG_START_OFFSET_CHECKPOINT)):
            self.write_checkpoint(offsets)  # else the files hold it already (every log deferred)
        summaries = [plog.load_summary for plog in self.logs.values()]
        return StartupReport(
            clean=self.had_clean_shutdown, opened=len(self.logs),
            recovered=0 if self.had_clean_shutdown else len(self.logs),
            validated_bytes=sum(s.validated_bytes for s in summaries),
            truncated_bytes=sum(s.truncated_bytes for s in summaries),
            rebuilt_segments=sum(s.rebuilt_segments for s in summaries),
            deleted=tuple(deleted), seconds=time.monotonic() - started,
            deferred=len(self.deferred))

    def _defer_unclean(self, todo: list[tuple[tuple[str, int], str, HostedLog | None]],
                       recovery: dict[tuple[str, int], int], starts: dict[tuple[str, int], int]
                       ) -> list[tuple[tuple[str, int], str, HostedLog | None]]:
        """After an unclean shutdown: leave the logs with nothing after their recovery point
        unopened (``unclean_deferral``); the others, to open now.  In ``RECOVERY_THREADS``
        chunks (a cold cache waits for each small read; a future per log cost more than the
        check)."""
        if not todo:
            return todo
        ids = {want.topic_id: uuid.UUID(want.topic_id) for _, _, want in todo if want is not None}

        def check(chunk: list[tuple[tuple[str, int], str, HostedLog | None]]
                  ) -> list[DeferredLog | None]:
            out: list[DeferredLog | None] = []
            for tp, path, want in chunk:
                deferred = None
                if want is not None:
                    try:
                        deferred = unclean_deferral(path, want, recovery.get(tp, 0),
                                                    starts.get(tp, 0), ids[want.topic_id])
                    except OSError:
                        pass  # opening it reports what is wrong
                out.append(deferred)
            return out

        chunks = [todo[i::RECOVERY_THREADS] for i in range(RECOVERY_THREADS)]
        left = []
        with ThreadPoolExecutor(RECOVERY_THREADS) as pool:
            for chunk, results in zip(chunks, pool.map(check, chunks), strict=True):
                for item, deferred in zip(chunk, results, strict=True):
                    if deferred is None:
                        left.append(item)
                    else:
                        self.deferred[item[0]] = deferred
        return left

    def shutdown(self) -> None:
        """Close every log durably, checkpoint, then mark the shutdown clean (see "Clean
        shutdown" above).  A write the disk refuses (a full disk) is logged once and leaves the
        shutdown unmarked, as Kafka's LogManager does, so the next start recovers instead of
        trusting a missing snapshot or index entry; every file is still closed."""
        failed: list[str] = []
        described: list[list] = []
        if self.lazy:
            described = [_summary_entry(key, log_) for key, log_ in self.logs.items()]
        if disk.HAVE_SYNCFS and self._sync_fd is None:
            self._open_sync_fd()  # never started (a tool's manager)
        sync_fd = self._sync_fd.fd if self._sync_fd is not None else -1
        device = os.fstat(sync_fd).st_dev if sync_fd >= 0 else -1

        def close(plog: PartitionLog) -> tuple[bool, OSError | None]:
            """Close ``plog``: (whether it waits for the syncfs, the error it met)."""
            try:
                batched = device >= 0 and os.stat(plog.directory).st_dev == device
            except OSError:
                batched = False
            try:
                plog.close(sync=not batched)  # a log on another filesystem: fsynced as before
            except OSError as exc:
                return batched, exc
            return batched, None

        # RECOVERY_THREADS closes at once, as Kafka's shutdown closes a directory's logs in
        # num.recovery.threads.per.data.dir threads (one after another, a worker with 5,000
        # written logs took longer than the 15 s a supervisor waits before SIGKILL)
        waiting: list[tuple[PartitionLog, bool]] = []  # (log, closed without an error)
        with ThreadPoolExecutor(max(1, min(RECOVERY_THREADS, len(self.logs)))) as pool:
            for (topic, partition), log_, (batched, error) in zip(
                    self.logs, self.logs.values(), pool.map(close, self.logs.values()),
                    strict=True):
                if error is not None:
                    failed.append(f"{topic}-{partition}: {error.strerror or error}")
                if batched:
                    waiting.append((log_, error is None))
        if waiting:
            # the order that makes one syncfs as safe as Kafka's fsync of each log (see "Clean
            # shutdown"): every byte the logs' closes wrote is durable before any recovery
            # record, checkpoint or the marker vouches for it
            try:
                disk.syncfs(sync_fd, slowed=True)
                synced = True
            except OSError as exc:
                failed.append(f"syncfs of {self.log_dir}: {exc.strerror or exc}")
                synced = False
            for log_, closed in waiting:
                try:
                    log_.finish_close(synced and closed)
                except OSError as exc:  # its record's file (a full disk): it stays behind
                    failed.append(f"{log_.directory.name}: {exc.strerror or exc}")
        if self._sync_fd is not None:
            self._sync_fd.close()
            self._sync_fd = None
        described.extend(d.summary(key) for key, d in self.deferred.items())
        try:
            self.checkpoint()
            if self.lazy and not failed:  # before the marker, which makes it count
                checkpoint.write_atomically(self.log_dir / SUMMARY_FILE, json.dumps(
                    {"version": SUMMARY_VERSION, "logs": described}, separators=(",", ":")))
        except OSError as exc:
            failed.append(f"checkpoints: {exc.strerror or exc}")
        if failed:
            log.error("shutdown could not write %d file(s) (%s%s); the next start recovers the "
                      "logs", len(failed), "; ".join(failed[:3]), " ..." if len(failed) > 3 else "")
        else:
            checkpoint.write_atomically(
                self.log_dir / layout.CLEAN_SHUTDOWN_FILE,
                json.dumps({"version": 0, "brokerEpoch": -1}) + "\n")
        self.logs.clear()
        self.deferred.clear()
        self._started = False

    def _open_sync_fd(self) -> None:
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._sync_fd = _Descriptor(os.open(self.log_dir,
                                            os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))

    # -- logs -------------------------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        """The log of ``topic``-``partition`` if this directory holds one, opened now if it was
        deferred (see "Opening at first use")."""
        plog = self.logs.get((topic, partition))
        if plog is None and self.deferred:
            return self._open_deferred((topic, partition))
        return plog

    def holds(self, topic: str, partition: int) -> bool:
        """Whether this directory has the log, open or deferred (without opening it)."""
        tp = (topic, partition)
        return tp in self.logs or tp in self.deferred

    def _open_deferred(self, tp: tuple[str, int]) -> PartitionLog | None:
        d = self.deferred.pop(tp, None)
        if d is None:
            return None
        plog = PartitionLog.open(Path(d.directory), d.config, recovery_point=d.recovery_point,
                                 log_start_offset=d.log_start_offset, clean_shutdown=d.clean)
        self.logs[tp] = plog
        if self.on_open is not None and not d.clean:
            self.on_open(tp, plog)  # recovery may have found what the record did not say
        return plog

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig | None = None,
                          topic_id: str | None = None) -> PartitionLog:
        tp = (topic, partition)
        plog = self.get_log(topic, partition)
        if plog is None:
            if layout.parse_partition_dir(layout.partition_dir_name(topic, partition)) != tp:
                raise ConfigError(f"illegal topic name {topic!r}")
            directory = self.log_dir / layout.partition_dir_name(topic, partition)
            exists = directory.exists()
            if topic_id is not None and exists:
                why = _stray(directory, HostedLog(topic_id, config or self.default_config))
                if why is not None:  # an earlier topic's directory: never serve it
                    log.warning("deleting stray log %s: %s", directory, why)
                    self._delete_directory(directory)
                    exists = False
            if exists:
                plog = PartitionLog.open(directory, config or self.default_config,
                                         clean_shutdown=True)
                if topic_id is not None:
                    plog.assign_topic_id(topic_id)
            else:
                plog = PartitionLog.create(directory, config or self.default_config,
                                           topic_id=topic_id)
            self.logs[tp] = plog
        return plog

    def create_logs(self, wanted: list[tuple[str, int, LogConfig, str]]
                    ) -> dict[tuple[str, int], PartitionLog | Exception]:
        """The logs of many new partitions, (topic, partition, config, topic id) each: a worker
        leading the new partitions of a CreateTopics.  ``RECOVERY_THREADS`` directories are
        created at once: each is a few small creations (the directory, ``.log``,
        ``partition.metadata``), and on a busy filesystem each of those waits for its journal
        (a 10,000-partition topic took 3.7-19 s on the shared box, one creation after another).
        A partition held already is returned as it is; one whose directory exists (an earlier
        topic's) goes through ``get_or_create_log``; a failure is returned in its place."""
        out: dict[tuple[str, int], PartitionLog | Exception] = {}
        todo: list[tuple[tuple[str, int], Path, LogConfig, str]] = []
        for topic, partition, config, topic_id in wanted:
            tp = (topic, partition)
            if self.holds(topic, partition):
                out[tp] = self.get_log(topic, partition)  # type: ignore[assignment]
                continue
            name = layout.partition_dir_name(topic, partition)
            if layout.parse_partition_dir(name) != tp:
                out[tp] = ConfigError(f"illegal topic name {topic!r}")
                continue
            todo.append((tp, self.log_dir / name, config, topic_id))

        def create(item: tuple[tuple[str, int], Path, LogConfig, str]) -> PartitionLog | Exception:
            _, directory, config, topic_id = item
            try:
                return PartitionLog.create(directory, config, topic_id=topic_id)
            except (OSError, ValueError) as exc:
                return exc

        if len(todo) > 1:
            self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            with ThreadPoolExecutor(min(RECOVERY_THREADS, len(todo))) as pool:
                made = list(pool.map(create, todo))
        else:
            made = [create(item) for item in todo]
        for (tp, _, config, topic_id), result in zip(todo, made, strict=True):
            if isinstance(result, FileExistsError):  # an earlier topic's directory, say
                try:
                    result = self.get_or_create_log(tp[0], tp[1], config, topic_id=topic_id)
                except (OSError, ValueError) as exc:
                    result = exc
            elif isinstance(result, PartitionLog):
                self.logs[tp] = result
            out[tp] = result
        return out

    def delete_log(self, topic: str, partition: int) -> None:
        """Close the log and remove its directory (renamed to ``*-delete`` first, like Kafka);
        a deferred one is removed without being opened."""
        deferred = self.deferred.pop((topic, partition), None)
        if deferred is not None:
            self._delete_directory(Path(deferred.directory))
        plog = self.logs.pop((topic, partition), None)
        if plog is None:
            return
        plog.discard()
        self._delete_directory(plog.directory)

    def remove_strays(self, hosted: Mapping[tuple[str, int], HostedLog]) -> list[str]:
        """Delete every log that ``hosted`` no longer lists, or lists under another topic id
        (a metadata update: topics deleted, or deleted and created again)."""
        doomed = []
        for tp, plog in list(self.logs.items()):
            want = hosted.get(tp)
            if want is None or (plog.topic_id is not None
                                and plog.topic_id != uuid.UUID(want.topic_id)):
                doomed.append(tp)
        for tp, d in list(self.deferred.items()):
            want = hosted.get(tp)
            if want is None or not _same_id(d.topic_id, want.topic_id):
                doomed.append(tp)
        for topic, partition in doomed:
            self.delete_log(topic, partition)
        if doomed:
            self.checkpoint()
        return [layout.partition_dir_name(t, p) for t, p in doomed]

    def _delete_directory(self, directory: Path) -> None:
        """Kafka's ``asyncDelete`` made synchronous: rename to a ``-delete`` name (durable before
        anything is removed), then remove it.  An interrupted removal is finished at start."""
        doomed = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}-delete")
        os.rename(directory, doomed)
        checkpoint.fsync_directory(self.log_dir)
        shutil.rmtree(doomed, ignore_errors=True)

    def truncate_to(self, topic: str, partition: int, offset: int) -> None:
        """Truncate a log and checkpoint at once (Kafka's ``LogManager.truncateTo``): the old,
        higher recovery point must not survive in the checkpoint file, or a crash after new
        appends would skip validating bytes that were never fsynced."""
        plog = self.get_log(topic, partition)
        if plog is None:
            raise KeyError((topic, partition))
        plog.truncate_to(offset)
        self.checkpoint()

    # -- periodic work ----------------------------------------------------------------------------

    def checkpoint(self) -> None:
        self.write_checkpoint(self.checkpoint_offsets())

    def checkpoint_offsets(self) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """What ``checkpoint`` writes, taken now (in the owner's thread; the writing, with its
        fsyncs, may then run in another: ``write_checkpoint``)."""
        recovery = {tp: plog.recovery_point for tp, plog in self.logs.items()}
        start = {tp: plog.log_start_offset for tp, plog in self.logs.items()}
        for tp, d in self.deferred.items():  # unchanged since the start: as read then
            recovery[tp] = d.recovery_point
            start[tp] = d.log_start_offset
        return recovery, start

    def write_checkpoint(self, offsets: tuple[dict[tuple[str, int], int],
                                              dict[tuple[str, int], int]]) -> None:
        recovery, start = offsets
        checkpoint.write_offsets(self.log_dir / layout.RECOVERY_POINT_CHECKPOINT, recovery)
        checkpoint.write_offsets(self.log_dir / layout.LOG_START_OFFSET_CHECKPOINT, start)

    def run_retention(self, now_ms: int | None = None, *, checkpoint: bool = True) -> int:
        """Kafka's retention over every log; segments deleted.  ``checkpoint=False``: the caller
        writes the checkpoint (a worker, in a thread)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        for tp in [tp for tp, d in self.deferred.items() if d.retention_due(now)]:
            self._open_deferred(tp)  # its oldest segment is due: open it and apply the rule
        deleted = sum(plog.delete_old_segments(now) for plog in self.logs.values())
        if deleted and checkpoint:
            self.checkpoint()
        return deleted

    def remove_expired_producers(self, expiration_ms: int, now_ms: int | None = None) -> int:
        """Kafka's ``PeriodicProducerExpirationCheck`` over every log; producers removed."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return sum(log.remove_expired_producers(now, expiration_ms) for log in self.logs.values())

    def producer_count(self) -> int:
        """Producer ids known across the logs (counted at each expiration check)."""
        return sum(len(log.producer_state) for log in self.logs.values())

    def flush_due(self, now_ms: int | None = None) -> None:
        for plog in self.logs.values():
            plog.maybe_flush(now_ms)


class _Descriptor:
    """A descriptor closed by ``close`` or, for a manager dropped without a shutdown (a test's
    simulated crash), when it is collected."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.close = weakref.finalize(self, os.close, fd)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _same_id(a: str, b: str) -> bool:
    """Whether two spellings of topic ids name the same one (equal text first: no parsing)."""
    return a == b or uuid.UUID(a) == uuid.UUID(b)


def _stray(directory: Path, want: HostedLog | None) -> str | None:
    """Why the log in ``directory`` must not be served here (None if it may)."""
    if want is None:
        return "no partition of that name is hosted here (its topic was deleted)"
    found = partition_metadata.read(directory)
    if found is not None and found != uuid.UUID(want.topic_id):
        return (f"it holds topic id {partition_metadata.kafka_uuid(found)}, the topic now has "
                f"{partition_metadata.kafka_uuid(want.topic_id)} (deleted and created again)")
    return None
