"""Shared helpers for protocol tests: kio value generation, kio encoding, kafka-python lookup.

kafka-python 3.x's ``kafka.protocol`` (generated from the same Kafka JSON schemas, independently
of kio) is the oracle: requests are encoded by it, responses are decoded by it.
"""

from __future__ import annotations

import datetime
import importlib
import io
import pkgutil
import random
import struct
import sys
import uuid
from dataclasses import fields
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.static.primitive import Records

from shmq.protocol import api_versions
from shmq.protocol.records import encode_batch

# (api_key, version) pairs the codec serves, for parametrization.
SERVED = [
    (key, version)
    for key, (_, hi) in sorted(api_versions.SUPPORTED.items())
    for version in range(api_versions.implemented_min(key), hi + 1)
]

_ERROR_CODES = [code for code in ErrorCode]
_INT_RANGES = {
    "int8": (-128, 127), "uint8": (0, 255),
    "int16": (-(2**15), 2**15 - 1), "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1),
}  # fmt: skip


def kio_encode(obj: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(obj))(out, obj)
    return out.getvalue()


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def kio_request_frame_payload(
    req: Any, correlation_id: int = 7, client_id: str | None = "t"
) -> bytes:
    """Header + body encoded by kio (no size prefix)."""
    header = req.__header_schema__(
        request_api_key=req.__api_key__, request_api_version=req.__version__,
        correlation_id=correlation_id, client_id=client_id,
    )  # fmt: skip
    return kio_encode(header) + kio_encode(req)


def batch(n: int = 2, seed: int = 0, **kw: Any) -> bytes:
    rnd = random.Random(seed)
    recs = [
        (b"k%d" % i, rnd.randbytes(rnd.randint(0, 40)), 1_700_000_000_000 + i) for i in range(n)
    ]
    return bytes(encode_batch(recs, **kw))


def _primitive(kafka_type: str, name: str, rnd: random.Random) -> Any:
    if kafka_type in _INT_RANGES:
        lo, hi = _INT_RANGES[kafka_type]
        return rnd.choice([lo, hi, 0, 1, -1 if lo < 0 else 2, rnd.randint(lo, hi)])
    if kafka_type == "float64":
        return rnd.choice([0.0, 1.5, -2.25])
    if kafka_type == "string":
        return rnd.choice(["", "topic-é", "s" * rnd.randint(1, 30)])
    if kafka_type == "bytes":
        return rnd.randbytes(rnd.randint(0, 20))
    if kafka_type == "records":
        return Records(batch(rnd.randint(1, 3), rnd.randint(0, 99)))
    if kafka_type == "uuid":
        return uuid.UUID(int=rnd.getrandbits(128) | 1)
    if kafka_type == "bool":
        return rnd.random() < 0.5
    if kafka_type == "error_code":
        return rnd.choice(_ERROR_CODES)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=rnd.randint(0, 2**31 - 1))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(
            rnd.randint(0, 2**41) / 1000, tz=datetime.timezone.utc
        )
    raise NotImplementedError(kafka_type)


def generate(cls: type, rnd: random.Random, depth: int = 0) -> Any:
    """A kio entity of ``cls`` with varied (non-default where possible) values."""
    kwargs = {}
    for f in fields(cls):
        kind = classify_field(f)
        nullable = is_optional(f) and get_field_tag(f) is None
        if nullable and rnd.random() < 0.2:
            kwargs[f.name] = None
            continue
        if isinstance(kind, EntityTupleField):
            count = rnd.randint(0, 2) if depth < 3 else 0
            kwargs[f.name] = tuple(generate(kind.type_, rnd, depth + 1) for _ in range(count))
        elif isinstance(kind, EntityField):
            kwargs[f.name] = generate(kind.type_, rnd, depth + 1)
        elif isinstance(kind, PrimitiveTupleField):
            kafka_type = get_schema_field_type(f)
            kwargs[f.name] = tuple(
                _primitive(kafka_type, f.name, rnd) for _ in range(rnd.randint(0, 3))
            )
        else:
            kwargs[f.name] = _primitive(get_schema_field_type(f), f.name, rnd)
    return cls(**kwargs)


def module_of(cls: type) -> Any:
    return sys.modules[cls.__module__]


_REGISTRY: dict[tuple[int, str], Any] = {}


# The versions Kafka 4 removed that shmq serves (``shmq.protocol.legacy``): kafka-python's
# Kafka-4 schemas no longer have them, its hand-written ``kafka.protocol.old`` classes do.
_OLD_CLASSES = {
    2: ("list_offsets", "ListOffsets"), 8: ("commit", "OffsetCommit"),
    9: ("commit", "OffsetFetch"), 19: ("admin", "CreateTopics"), 20: ("admin", "DeleteTopics"),
    32: ("admin", "DescribeConfigs"), 23: ("offset_for_leader_epoch", "OffsetForLeaderEpoch"),
}  # fmt: skip


def kafka_python_old_class(api_key: int, kind: str, version: int) -> Any:
    """kafka-python's ``kafka.protocol.old`` class of a version Kafka 4 removed."""
    module, name = _OLD_CLASSES[api_key]
    old = importlib.import_module(f"kafka.protocol.old.{module}")
    return getattr(old, f"{name}{kind.title()}_v{version}")


class _WithOldVersions:
    """``cls[version]`` as kafka-python's ApiMessage classes index, with the removed versions
    taken from ``kafka.protocol.old``."""

    def __init__(self, cls: Any, api_key: int, kind: str) -> None:
        self.cls, self.api_key, self.kind = cls, api_key, kind

    def __getitem__(self, version: int) -> Any:
        from shmq.protocol import legacy

        if (self.api_key, version) in legacy.MODULES:
            return kafka_python_old_class(self.api_key, self.kind, version)
        return self.cls[version]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cls, name)


def kafka_python_class(api_key: int, kind: str) -> Any:
    """kafka-python's primary message class for (api_key, "request" | "response")."""
    if not _REGISTRY:
        from kafka.protocol.api_message import ApiMessage

        for name in ("admin", "consumer", "metadata", "producer"):
            package = importlib.import_module("kafka.protocol." + name)
            for sub in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(sub.name)

        def walk(cls: Any) -> None:
            for sub in cls.__subclasses__():
                if getattr(sub, "_class_version", 1) is None:
                    try:
                        _REGISTRY[(sub.API_KEY, sub.type)] = sub
                    except Exception:
                        pass
                walk(sub)

        walk(ApiMessage)
    return _WithOldVersions(_REGISTRY[(api_key, kind)], api_key, kind)
