"""Configuration: Kafka's dotted keys, checked by librdkafka itself, plus shmq's own.

A configuration is split in three:

* **shmq's keys** (``shmq.transport``, ``shmq.data.dir``) choose the transport;
* **Python-side keys** librdkafka does not know, which confluent-kafka's serializing clients
  or Kafka's Java client take: ``key.serializer`` / ``value.serializer`` /
  ``key.deserializer`` / ``value.deserializer``, ``interceptor.classes``, a ``partitioner``
  that is a callable (or ``partitioner.class``), ``max.poll.records``, and Java's
  ``buffer.memory`` (translated to ``queue.buffering.max.kbytes``);
* **everything else goes to librdkafka** unchanged, which checks every key and value when the
  client is created, so a wrong key or value raises exactly confluent-kafka's
  ``KafkaException(_INVALID_ARG, 'No such configuration property: "foo"')``.

Values shmq uses itself are read back here with librdkafka's aliases (``linger.ms`` is
``queue.buffering.max.ms``, ``acks`` is ``request.required.acks`` ...) and defaults, except
where the issue asks for Kafka's Java client behaviour: ``enable.idempotence`` is on by default
(Kafka >= 3.0; turned off, as Java does, when the user asked for ``acks`` other than all or
more than 5 in flight without asking for idempotence) and the partitioner is
``murmur2_random`` (Java's ``BuiltInPartitioner``; librdkafka's default is
``consistent_random``).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

TRANSPORTS = ("auto", "shm", "kafka")

# librdkafka's aliases of the properties shmq reads (alias -> canonical name)
ALIASES = {
    "linger.ms": "queue.buffering.max.ms",
    "acks": "request.required.acks",
    "compression.type": "compression.codec",
    "delivery.timeout.ms": "message.timeout.ms",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "retry.backoff.ms": "retry.backoff.ms",
}

PRODUCER_DEFAULTS: dict[str, Any] = {
    "queue.buffering.max.ms": 5.0,
    "batch.size": 1_000_000,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "message.max.bytes": 1_000_000,
    "request.required.acks": -1,
    "compression.codec": "none",
    "compression.level": -1,
    "message.timeout.ms": 300_000,
    "max.in.flight.requests.per.connection": 1_000_000,
    "retry.backoff.ms": 100,
    "partitioner": "murmur2_random",
    "sticky.partitioning.linger.ms": 10,
    "topic.metadata.propagation.max.ms": 30_000,
    "delivery.report.only.error": False,
}

CONSUMER_DEFAULTS: dict[str, Any] = {
    "auto.offset.reset": "largest",
    "enable.auto.commit": True,
    "auto.commit.interval.ms": 5_000,
    "enable.auto.offset.store": True,
    "enable.partition.eof": False,
    "isolation.level": "read_committed",
    "max.partition.fetch.bytes": 1_048_576,
    "fetch.max.bytes": 52_428_800,
    "max.poll.records": 500,
    "check.crcs": False,
}

COMPRESSION = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
RESET = {"smallest": "earliest", "earliest": "earliest", "beginning": "earliest",
         "largest": "latest", "latest": "latest", "end": "latest", "error": "error"}

# Java serializer / deserializer class names users paste from Java configs
JAVA_SERDES = {
    "org.apache.kafka.common.serialization.StringSerializer": "StringSerializer",
    "org.apache.kafka.common.serialization.StringDeserializer": "StringDeserializer",
    "org.apache.kafka.common.serialization.IntegerSerializer": "IntegerSerializer",
    "org.apache.kafka.common.serialization.IntegerDeserializer": "IntegerDeserializer",
    "org.apache.kafka.common.serialization.DoubleSerializer": "DoubleSerializer",
    "org.apache.kafka.common.serialization.DoubleDeserializer": "DoubleDeserializer",
    "org.apache.kafka.common.serialization.ByteArraySerializer": None,
    "org.apache.kafka.common.serialization.ByteArrayDeserializer": None,
    "org.apache.kafka.common.serialization.BytesSerializer": None,
    "org.apache.kafka.common.serialization.BytesDeserializer": None,
}


def invalid(key: str, value: Any = None, why: str = "") -> KafkaException:
    """librdkafka's error for a bad value of ``key``."""
    shown = "" if value is None else f' "{value}"'
    tail = f": {why}" if why else ""
    return KafkaException(KafkaError(KafkaError._INVALID_ARG,
                                     f'Invalid value{shown} for configuration property "{key}"'
                                     f"{tail}"))


def not_supported(key: str, why: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._NOT_IMPLEMENTED,
                                     f'Configuration property "{key}" is not supported: {why}'))


class ClientConfig:
    """One client's configuration, split as the module docstring says."""

    def __init__(self, conf: Any, role: str, kwargs: Mapping[str, Any] | None = None) -> None:
        if not isinstance(conf, Mapping):
            raise TypeError("expected configuration dict")
        merged = dict(conf)
        if kwargs:  # confluent-kafka accepts configuration as keyword arguments too
            merged.update(kwargs)
        for k in merged:
            if not isinstance(k, str):
                raise TypeError(f"expected configuration property name as type unicode "
                                f"string, not {type(k).__name__}")
        self.role = role
        self.transport = str(merged.pop("shmq.transport", "auto"))
        if self.transport not in TRANSPORTS:
            raise invalid("shmq.transport", self.transport,
                          "expected one of " + ", ".join(TRANSPORTS))
        self.data_dir = merged.pop("shmq.data.dir", None)
        self.py: dict[str, Any] = {}
        for key in ("key.serializer", "value.serializer", "key.deserializer",
                    "value.deserializer", "interceptor.classes", "partitioner.class",
                    "max.poll.records"):
            if key in merged:
                self.py[key] = merged.pop(key)
        part = merged.get("partitioner")
        if part is not None and not isinstance(part, str) or (
                isinstance(part, str) and ("." in part or ":" in part)):
            self.py["partitioner"] = merged.pop("partitioner")
        if "buffer.memory" in merged:  # Java's producer buffer, in bytes
            raw = merged.pop("buffer.memory")
            try:
                kbytes = max(1, math.ceil(int(raw) / 1024))
            except (TypeError, ValueError):
                raise invalid("buffer.memory", raw) from None
            merged["queue.buffering.max.kbytes"] = kbytes
        if "transactional.id" in merged and role == "producer":
            if self.transport == "shm":  # auto: librdkafka's transactions, over TCP
                raise not_supported("transactional.id", "the shared-memory producer has no "
                                    "transactions: use shmq.transport=kafka (or auto)")
            self.transport = "kafka"
        self.rd = merged  # what librdkafka gets (and validates)

    # -- reading values back --------------------------------------------------------------------

    def raw(self, name: str, default: Any = None) -> Any:
        """The value of ``name`` or any of its aliases (the last one given wins, as when
        librdkafka applies the dict in order)."""
        found = default
        for key, value in self.rd.items():
            if key == name or ALIASES.get(key) == name:
                found = value
        return found

    def defaults(self) -> dict[str, Any]:
        return PRODUCER_DEFAULTS if self.role == "producer" else CONSUMER_DEFAULTS

    def get_int(self, name: str) -> int:
        value = self.raw(name, self.defaults().get(name))
        try:
            return int(float(value)) if not isinstance(value, bool) else int(value)
        except (TypeError, ValueError):
            raise invalid(name, value) from None

    def get_float(self, name: str) -> float:
        value = self.raw(name, self.defaults().get(name))
        try:
            return float(value)
        except (TypeError, ValueError):
            raise invalid(name, value) from None

    def get_bool(self, name: str, default: bool | None = None) -> bool:
        value = self.raw(name, self.defaults().get(name) if default is None else default)
        return parse_bool(name, value)

    def get_str(self, name: str) -> str:
        value = self.raw(name, self.defaults().get(name))
        return str(value).strip()

    def given(self, name: str) -> bool:
        return any(k == name or ALIASES.get(k) == name for k in self.rd)

    def acks(self) -> int:
        value = str(self.raw("request.required.acks", -1)).strip().lower()
        if value in ("all", "-1"):
            return -1
        try:
            return int(value)
        except ValueError:
            raise invalid("request.required.acks", value) from None

    def idempotence(self) -> bool:
        """Java's rule (KIP-679): on by default, off when the user asked for something it
        cannot do without asking for idempotence itself."""
        if "enable.idempotence" in self.rd:
            return parse_bool("enable.idempotence", self.rd["enable.idempotence"])
        if self.acks() != -1:
            return False
        if self.given("max.in.flight.requests.per.connection") and self.get_int(
                "max.in.flight.requests.per.connection") > 5:
            return False
        if "retries" in self.rd and str(self.rd["retries"]).strip() == "0":
            return False
        return True


def parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "t", "yes", "y", "on"):
        return True
    if text in ("false", "0", "f", "no", "n", "off"):
        return False
    raise invalid(name, value)


def load_object(path: str) -> Any:
    """A class or function named ``module.name`` or ``module:name``."""
    if ":" in path:
        module, _, name = path.partition(":")
    else:
        module, _, name = path.rpartition(".")
    if not module or not name:
        raise ValueError(f"{path!r} is not a module.name path")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def instances(spec: Any, key: str) -> list[Any]:
    """``interceptor.classes`` as Kafka takes it (a comma-separated list of class paths) or as
    objects: instances are used as they are, classes are instantiated without arguments."""
    if spec is None or spec == "":
        return []
    items = [s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else (
        list(spec) if isinstance(spec, list | tuple) else [spec])
    out = []
    for item in items:
        try:
            obj = load_object(item) if isinstance(item, str) else item
        except (ImportError, AttributeError, ValueError) as exc:
            raise invalid(key, item, f"cannot load it: {exc}") from None
        out.append(obj() if isinstance(obj, type) else obj)
    return out


def resolve_callable(spec: Any, key: str, java: Mapping[str, str | None] | None = None
                     ) -> Callable[..., Any] | None:
    """A serializer / deserializer / partitioner given as a callable, a class (instantiated),
    a ``module.name`` path, or a Java class name of the built-in ones."""
    if spec is None:
        return None
    if isinstance(spec, str):
        if java is not None and spec in java:
            name = java[spec]
            if name is None:
                return None  # bytes in, bytes out
            from shmq.client import serialization

            return getattr(serialization, name)()
        try:
            spec = load_object(spec)
        except (ImportError, AttributeError, ValueError) as exc:
            raise invalid(key, spec, f"cannot load it: {exc}") from None
    if isinstance(spec, type):
        spec = spec()
    if not callable(spec):
        raise invalid(key, type(spec).__name__, "expected a callable")
    return spec
