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
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from shmq.errors import ConfigError
from shmq.storage import checkpoint, layout, partition_metadata
from shmq.storage.log import PartitionLog
from shmq.storage.log_config import LogConfig

log = logging.getLogger(__name__)

RECOVERY_THREADS = 8  # logs opened (and recovered) at once by startup


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

    def describe(self) -> str:
        how = "a clean shutdown" if self.clean else "an unclean shutdown"
        parts = [f"{self.opened} logs opened after {how}"]
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
        self.had_clean_shutdown = False
        self._started = False

    # -- start and stop -------------------------------------------------------------------------

    def startup(self, topic_configs: dict[str, LogConfig] | None = None, *,
                hosted: Mapping[tuple[str, int], HostedLog] | None = None) -> StartupReport:
        started = time.monotonic()
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        marker = self.log_dir / layout.CLEAN_SHUTDOWN_FILE
        self.had_clean_shutdown = marker.exists()
        recovery = checkpoint.read_offsets(self.log_dir / layout.RECOVERY_POINT_CHECKPOINT)
        starts = checkpoint.read_offsets(self.log_dir / layout.LOG_START_OFFSET_CHECKPOINT)
        topic_configs = topic_configs or {}
        deleted: list[str] = []
        todo: list[tuple[tuple[str, int], Path, HostedLog | None]] = []
        for entry in sorted(os.scandir(self.log_dir), key=lambda e: e.name):
            if entry.is_dir() and entry.name.endswith("-delete"):
                shutil.rmtree(entry.path, ignore_errors=True)  # a deletion that did not finish
                continue
            tp = layout.parse_partition_dir(entry.name) if entry.is_dir() else None
            if tp is not None:
                todo.append((tp, Path(entry.path), hosted.get(tp) if hosted is not None else None))

        def open_one(tp: tuple[str, int], directory: Path,
                     want: HostedLog | None) -> PartitionLog | str:
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
        if self.had_clean_shutdown:
            marker.unlink()
        self._started = True
        self.checkpoint()
        summaries = [plog.load_summary for plog in self.logs.values()]
        return StartupReport(
            clean=self.had_clean_shutdown, opened=len(self.logs),
            recovered=0 if self.had_clean_shutdown else len(self.logs),
            validated_bytes=sum(s.validated_bytes for s in summaries),
            truncated_bytes=sum(s.truncated_bytes for s in summaries),
            rebuilt_segments=sum(s.rebuilt_segments for s in summaries),
            deleted=tuple(deleted), seconds=time.monotonic() - started)

    def shutdown(self) -> None:
        """Flush and close every log, checkpoint, then mark the shutdown clean.  A write the disk
        refuses (a full disk) is logged once and leaves the shutdown unmarked, as Kafka's
        LogManager does, so the next start recovers instead of trusting a missing snapshot or
        index entry; every file is still closed."""
        failed: list[str] = []
        for key, log_ in self.logs.items():
            try:
                log_.close()
            except OSError as exc:
                failed.append(f"{key[0]}-{key[1]}: {exc.strerror or exc}")
        try:
            self.checkpoint()
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
        self._started = False

    # -- logs -------------------------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig | None = None,
                          topic_id: str | None = None) -> PartitionLog:
        tp = (topic, partition)
        plog = self.logs.get(tp)
        if plog is None:
            if layout.parse_partition_dir(layout.partition_dir_name(topic, partition)) != tp:
                raise ConfigError(f"illegal topic name {topic!r}")
            directory = self.log_dir / layout.partition_dir_name(topic, partition)
            if topic_id is not None and directory.exists():
                why = _stray(directory, HostedLog(topic_id, config or self.default_config))
                if why is not None:  # an earlier topic's directory: never serve it
                    log.warning("deleting stray log %s: %s", directory, why)
                    self._delete_directory(directory)
            plog = PartitionLog.open(directory, config or self.default_config, clean_shutdown=True)
            if topic_id is not None:
                plog.assign_topic_id(topic_id)
            self.logs[tp] = plog
        return plog

    def delete_log(self, topic: str, partition: int) -> None:
        """Close the log and remove its directory (renamed to ``*-delete`` first, like Kafka)."""
        plog = self.logs.pop((topic, partition), None)
        if plog is None:
            return
        plog.close()
        self._delete_directory(plog.directory)

    def remove_strays(self, hosted: Mapping[tuple[str, int], HostedLog]) -> list[str]:
        """Delete every open log that ``hosted`` no longer lists, or lists under another topic
        id (a metadata update: topics deleted, or deleted and created again)."""
        doomed = []
        for tp, plog in list(self.logs.items()):
            want = hosted.get(tp)
            if want is None or (plog.topic_id is not None
                                and plog.topic_id != uuid.UUID(want.topic_id)):
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
        plog = self.logs[(topic, partition)]
        plog.truncate_to(offset)
        self.checkpoint()

    # -- periodic work ----------------------------------------------------------------------------

    def checkpoint(self) -> None:
        self.write_checkpoint(self.checkpoint_offsets())

    def checkpoint_offsets(self) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """What ``checkpoint`` writes, taken now (in the owner's thread; the writing, with its
        fsyncs, may then run in another: ``write_checkpoint``)."""
        return ({tp: plog.recovery_point for tp, plog in self.logs.items()},
                {tp: plog.log_start_offset for tp, plog in self.logs.items()})

    def write_checkpoint(self, offsets: tuple[dict[tuple[str, int], int],
                                              dict[tuple[str, int], int]]) -> None:
        recovery, start = offsets
        checkpoint.write_offsets(self.log_dir / layout.RECOVERY_POINT_CHECKPOINT, recovery)
        checkpoint.write_offsets(self.log_dir / layout.LOG_START_OFFSET_CHECKPOINT, start)

    def run_retention(self, now_ms: int | None = None, *, checkpoint: bool = True) -> int:
        """Kafka's retention over every log; segments deleted.  ``checkpoint=False``: the caller
        writes the checkpoint (a worker, in a thread)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
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


def _stray(directory: Path, want: HostedLog | None) -> str | None:
    """Why the log in ``directory`` must not be served here (None if it may)."""
    if want is None:
        return "no partition of that name is hosted here (its topic was deleted)"
    found = partition_metadata.read(directory)
    if found is not None and found != uuid.UUID(want.topic_id):
        return (f"it holds topic id {partition_metadata.kafka_uuid(found)}, the topic now has "
                f"{partition_metadata.kafka_uuid(want.topic_id)} (deleted and created again)")
    return None
