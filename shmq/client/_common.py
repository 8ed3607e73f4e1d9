"""What the producer, the consumer and the admin client share: errors, messages, serializers."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

from shmq._fast._client_reference import Message
from shmq.client.config import JAVA_SERDES, ClientConfig, instances, resolve_callable

__all__ = ["Message", "kafka_exception", "Serdes", "Interceptors"]


def kafka_exception(code: int, reason: str | None = None) -> KafkaException:
    """confluent-kafka's exception for ``code`` (a Kafka or librdkafka error code)."""
    return KafkaException(KafkaError(code) if reason is None else KafkaError(code, reason))




class Serdes:
    """Key/value serializers or deserializers as confluent-kafka's serializing clients call them:
    ``f(obj, SerializationContext(topic, field, headers))``; a failure raises confluent-kafka's
    ``KeySerializationError`` / ``ValueSerializationError`` (or the deserialization ones)."""

    def __init__(self, config: ClientConfig, direction: str) -> None:
        self.key = resolve_callable(config.py.get(f"key.{direction}"), f"key.{direction}",
                                    JAVA_SERDES)
        self.value = resolve_callable(config.py.get(f"value.{direction}"),
                                      f"value.{direction}", JAVA_SERDES)
        from confluent_kafka import error as ck_error

        self.key_error: type[Exception]
        self.value_error: type[Exception]
        if direction == "serializer":
            self.key_error, self.value_error = (ck_error.KeySerializationError,
                                                ck_error.ValueSerializationError)
        else:
            self.key_error, self.value_error = (ck_error.KeyDeserializationError,
                                                ck_error.ValueDeserializationError)

    @property
    def active(self) -> bool:
        return self.key is not None or self.value is not None

    def apply(self, topic: str, key: Any, value: Any, headers: Any) -> tuple[Any, Any]:
        if self.key is not None:
            try:
                key = self.key(key, SerializationContext(topic, MessageField.KEY, headers))
            except Exception as exc:  # noqa: BLE001  (confluent-kafka wraps any failure)
                raise self.key_error(exception=exc) from exc  # type: ignore[call-arg]
        if self.value is not None:
            try:
                value = self.value(value, SerializationContext(topic, MessageField.VALUE,
                                                               headers))
            except Exception as exc:  # noqa: BLE001
                raise self.value_error(exception=exc) from exc  # type: ignore[call-arg]
        return key, value


class Interceptors:
    """Kafka's interceptor hooks (``ProducerInterceptor`` / ``ConsumerInterceptor``): objects
    with any of ``on_send(msg) -> msg``, ``on_acknowledgement(err, msg)``,
    ``on_consume(msgs) -> msgs``, ``on_commit(offsets)``, ``close()``.  As in Kafka, an
    exception in a hook is logged and ignored (the chain goes on with the previous result)."""

    def __init__(self, config: ClientConfig) -> None:
        self.items = instances(config.py.get("interceptor.classes"), "interceptor.classes")

    def __bool__(self) -> bool:
        return bool(self.items)

    def hook(self, name: str) -> list[Any]:
        return [getattr(i, name) for i in self.items if callable(getattr(i, name, None))]

    def chain(self, name: str, value: Any) -> Any:
        for f in self.hook(name):
            try:
                got = f(value)
            except Exception:  # noqa: BLE001  (Kafka logs and goes on)
                import logging

                logging.getLogger("shmq.client").exception("interceptor %s failed", name)
                continue
            if got is not None:
                value = got
        return value

    def notify(self, name: str, *args: Any) -> None:
        for f in self.hook(name):
            try:
                f(*args)
            except Exception:  # noqa: BLE001
                import logging

                logging.getLogger("shmq.client").exception("interceptor %s failed", name)

    def close(self) -> None:
        self.notify("close")


__all__ += ["SerializationError"]
