"""Serializers and deserializers: confluent-kafka's String/Integer/Double ones, and JSON.

Each is a callable ``f(obj, ctx)`` as confluent-kafka's ``SerializingProducer`` calls them; pass
them as ``key.serializer`` / ``value.serializer`` / ``key.deserializer`` /
``value.deserializer`` (objects, classes, ``module.name`` paths or the Java class names of
Kafka's built-in ones, e.g. ``org.apache.kafka.common.serialization.StringSerializer``).
"""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka.serialization import (
    Deserializer,
    DoubleDeserializer,
    DoubleSerializer,
    IntegerDeserializer,
    IntegerSerializer,
    SerializationError,
    Serializer,
    StringDeserializer,
    StringSerializer,
)

__all__ = ["DoubleDeserializer", "DoubleSerializer", "IntegerDeserializer", "IntegerSerializer",
           "JSONDeserializer", "JSONSerializer", "StringDeserializer", "StringSerializer"]


class JSONSerializer(Serializer):
    """Any JSON-serializable object as UTF-8 JSON (no schema registry; ``None`` stays null)."""

    def __init__(self, **dumps_kwargs: Any) -> None:
        self.kwargs = {"separators": (",", ":"), **dumps_kwargs}

    def __call__(self, obj: Any, ctx: Any = None) -> bytes | None:
        if obj is None:
            return None
        try:
            return json.dumps(obj, **self.kwargs).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise SerializationError(str(exc)) from exc


class JSONDeserializer(Deserializer):
    """UTF-8 JSON back into Python objects (``None`` stays ``None``)."""

    def __call__(self, data: bytes | None, ctx: Any = None) -> Any:
        if data is None:
            return None
        try:
            return json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise SerializationError(str(exc)) from exc
