"""``partition.metadata``: the id of the topic a partition directory belongs to (Kafka's
``PartitionMetadataFile``).

    version: 0
    topic_id: 3q7ABiUfQfOHj2vG1nXU2A

The id is Kafka's ``Uuid.toString()``: the 16 bytes in URL-safe base64 without padding.  A topic
deleted and created again under the same name gets a new id, so a directory whose file names
another id holds the old topic's data: it is removed, never served (``LogManager.startup``).
"""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

from shmq.storage import checkpoint, layout

VERSION = 0


def kafka_uuid(topic_id: str | uuid.UUID) -> str:
    """Kafka's text form of a topic id (``Uuid.toString``)."""
    value = topic_id if isinstance(topic_id, uuid.UUID) else uuid.UUID(topic_id)
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


def parse_kafka_uuid(text: str) -> uuid.UUID:
    """The inverse of ``kafka_uuid``; ValueError for anything that is not one."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(raw) != 16:
        raise ValueError(f"not a topic id: {text!r}")
    return uuid.UUID(bytes=raw)


def encode(topic_id: str | uuid.UUID) -> str:
    return f"version: {VERSION}\ntopic_id: {kafka_uuid(topic_id)}"


def read(directory: Path | str) -> uuid.UUID | None:
    """The topic id recorded in ``directory``; None if the file is missing or unreadable.
    (Plain descriptors, no file object: an unclean start reads it for 10,000 partitions.)"""
    try:
        fd = os.open(os.path.join(directory, layout.PARTITION_METADATA), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        text = os.read(fd, 4096).decode()
    except UnicodeDecodeError:
        return None
    finally:
        os.close(fd)
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    try:
        if int(fields["version"]) != VERSION:
            return None
        return parse_kafka_uuid(fields["topic_id"].strip())
    except (KeyError, ValueError):
        return None


def write(directory: Path, topic_id: str | uuid.UUID, *, sync: bool) -> None:
    """Replace the file atomically; without ``sync`` the caller fsyncs it before the log's
    first flush (Kafka flushes it before the first append lands on disk)."""
    checkpoint.write_atomically(directory / layout.PARTITION_METADATA, encode(topic_id), sync=sync)


def create(directory: Path, topic_id: str | uuid.UUID) -> None:
    """Write the file of a directory just created, in place (no ``.tmp`` and rename: there is no
    old file to keep whole, and a crash that tears the new one leaves a file that reads as
    missing, after which the start adopts the directory and writes it again).  Not fsynced:
    as ``write(sync=False)``."""
    fd = os.open(os.path.join(directory, layout.PARTITION_METADATA),
                 os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(encode(topic_id).encode())
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.close(fd)
        os.unlink(os.path.join(directory, layout.PARTITION_METADATA))
        raise
    os.close(fd)
