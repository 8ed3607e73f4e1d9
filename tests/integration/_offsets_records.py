"""An independent reader of ``__consumer_offsets`` records for the tests: Kafka's key and value
schemas (``group-coordinator/src/main/resources/common/message/OffsetCommitKey.json``,
``OffsetCommitValue.json``, ``GroupMetadataKey.json``) declared with kafka-python's protocol
types, so nothing of shmq's own record code (``shmq.coordinator.records``) is involved."""

from __future__ import annotations

import io
from typing import Any

from kafka.protocol.old.types import (
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    String,
    TaggedFields,
)

KEY_VERSION = Schema(("version", Int16))
OFFSET_COMMIT_KEY = Schema(("group", String("utf-8")), ("topic", String("utf-8")),
                           ("partition", Int32))                       # key versions 0 and 1
GROUP_METADATA_KEY = Schema(("group", String("utf-8")))                # key version 2
OFFSET_COMMIT_VALUE = {                                                # by value version
    0: Schema(("offset", Int64), ("metadata", String("utf-8")), ("commit_timestamp", Int64)),
    1: Schema(("offset", Int64), ("metadata", String("utf-8")), ("commit_timestamp", Int64),
              ("expire_timestamp", Int64)),
    3: Schema(("offset", Int64), ("leader_epoch", Int32), ("metadata", String("utf-8")),
              ("commit_timestamp", Int64)),
    4: Schema(("offset", Int64), ("leader_epoch", Int32), ("metadata", CompactString("utf-8")),
              ("commit_timestamp", Int64), ("tags", TaggedFields)),     # tag 0: the topic id
}


def decode(key: bytes, value: bytes | None) -> tuple[str, tuple, dict[str, Any] | None]:
    """``("offset", (group, topic, partition), {"offset": ..., ...} or None)`` for an offset
    commit (None: a tombstone), ``("group", (group,), None)`` for group metadata."""
    data = io.BytesIO(key)
    (version,) = KEY_VERSION.decode(data)
    if version in (0, 1):
        k = OFFSET_COMMIT_KEY.decode(data)
        if value is None:
            return "offset", k, None
        v = io.BytesIO(value)
        (value_version,) = KEY_VERSION.decode(v)
        schema = OFFSET_COMMIT_VALUE[value_version]
        return "offset", k, dict(zip(schema.names, schema.decode(v), strict=True))
    if version == 2:
        return "group", GROUP_METADATA_KEY.decode(data), None
    raise ValueError(f"unexpected __consumer_offsets key version {version}")


def committed(records: list[tuple[bytes, bytes | None]]) -> dict[tuple, int]:
    """The committed offset of every (group, topic, partition), last record winning."""
    out: dict[tuple, int] = {}
    for key, value in records:
        kind, k, v = decode(key, value)
        if kind != "offset":
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v["offset"]
    return out
