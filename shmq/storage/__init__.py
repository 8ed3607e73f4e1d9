"""Partition logs on disk in Apache Kafka's format: segments, indexes, recovery, retention."""

from shmq.storage.log import AppendInfo, LogReadResult, PartitionLog, RecordTooLargeError
from shmq.storage.log_config import LogConfig
from shmq.storage.log_manager import HostedLog, LogManager
from shmq.storage.slices import FileHandle, FileSlice

__all__ = [
    "AppendInfo",
    "FileHandle",
    "FileSlice",
    "HostedLog",
    "LogConfig",
    "LogManager",
    "LogReadResult",
    "PartitionLog",
    "RecordTooLargeError",
]
