"""All partition logs of one log directory, and the files that belong to the directory.

Theory of operation (Kafka ``LogManager``)
------------------------------------------
``startup`` reads ``.kafka_cleanshutdown`` (present only if the last run stopped cleanly), the
``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint``, and opens every
``<topic>-<partition>`` directory through the loader, which recovers whatever the checkpoints do
not vouch for.  Then the marker is removed: from now on a crash must look like a crash.
``checkpoint`` rewrites both checkpoint files (atomically); ``shutdown`` flushes and closes every
log, checkpoints, and writes the marker last.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

from shmq.errors import ConfigError
from shmq.storage import checkpoint, layout
from shmq.storage.log import PartitionLog
from shmq.storage.log_config import LogConfig


class LogManager:
    def __init__(self, log_dir: Path | str, default_config: LogConfig | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.default_config = default_config or LogConfig()
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self.had_clean_shutdown = False
        self._started = False

    # -- start and stop -------------------------------------------------------------------------

    def startup(self, topic_configs: dict[str, LogConfig] | None = None) -> None:
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        marker = self.log_dir / layout.CLEAN_SHUTDOWN_FILE
        self.had_clean_shutdown = marker.exists()
        recovery = checkpoint.read_offsets(self.log_dir / layout.RECOVERY_POINT_CHECKPOINT)
        starts = checkpoint.read_offsets(self.log_dir / layout.LOG_START_OFFSET_CHECKPOINT)
        topic_configs = topic_configs or {}
        for entry in sorted(os.scandir(self.log_dir), key=lambda e: e.name):
            if entry.is_dir() and entry.name.endswith("-delete"):
                shutil.rmtree(entry.path, ignore_errors=True)  # a deletion that did not finish
                continue
            tp = layout.parse_partition_dir(entry.name) if entry.is_dir() else None
            if tp is None:
                continue
            config = topic_configs.get(tp[0], self.default_config)
            self.logs[tp] = PartitionLog.open(
                Path(entry.path), config, recovery_point=recovery.get(tp, 0),
                log_start_offset=starts.get(tp, 0), clean_shutdown=self.had_clean_shutdown)
        if self.had_clean_shutdown:
            marker.unlink()
        self._started = True
        self.checkpoint()

    def shutdown(self) -> None:
        """Flush and close every log, checkpoint, then mark the shutdown clean."""
        for log in self.logs.values():
            log.close()
        self.checkpoint()
        checkpoint.write_atomically(
            self.log_dir / layout.CLEAN_SHUTDOWN_FILE,
            json.dumps({"version": 0, "brokerEpoch": -1}) + "\n")
        self.logs.clear()
        self._started = False

    # -- logs -------------------------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int,
                          config: LogConfig | None = None) -> PartitionLog:
        tp = (topic, partition)
        log = self.logs.get(tp)
        if log is None:
            if layout.parse_partition_dir(layout.partition_dir_name(topic, partition)) != tp:
                raise ConfigError(f"illegal topic name {topic!r}")
            directory = self.log_dir / layout.partition_dir_name(topic, partition)
            log = PartitionLog.open(directory, config or self.default_config, clean_shutdown=True)
            self.logs[tp] = log
        return log

    def delete_log(self, topic: str, partition: int) -> None:
        """Close the log and remove its directory (renamed to ``*-delete`` first, like Kafka)."""
        log = self.logs.pop((topic, partition), None)
        if log is None:
            return
        log.close()
        doomed = log.directory.with_name(f"{log.directory.name}.{uuid.uuid4().hex}-delete")
        os.rename(log.directory, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def truncate_to(self, topic: str, partition: int, offset: int) -> None:
        """Truncate a log and checkpoint at once (Kafka's ``LogManager.truncateTo``): the old,
        higher recovery point must not survive in the checkpoint file, or a crash after new
        appends would skip validating bytes that were never fsynced."""
        log = self.logs[(topic, partition)]
        log.truncate_to(offset)
        self.checkpoint()

    # -- periodic work ----------------------------------------------------------------------------

    def checkpoint(self) -> None:
        checkpoint.write_offsets(self.log_dir / layout.RECOVERY_POINT_CHECKPOINT,
                                 {tp: log.recovery_point for tp, log in self.logs.items()})
        checkpoint.write_offsets(self.log_dir / layout.LOG_START_OFFSET_CHECKPOINT,
                                 {tp: log.log_start_offset for tp, log in self.logs.items()})

    def run_retention(self, now_ms: int | None = None) -> int:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        deleted = sum(log.delete_old_segments(now) for log in self.logs.values())
        if deleted:
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
        for log in self.logs.values():
            log.maybe_flush(now_ms)
