"""What makes a dataclass a kio entity: the class attributes kio's reader and writer read."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.static.constants import EntityType
from kio.static.primitive import i16

T = TypeVar("T", bound=type)


def _entity(kind: EntityType, header: type, api_key: int, version: int) -> Callable[[T], T]:
    def mark(cls: T) -> T:
        cls.__type__ = kind  # type: ignore[attr-defined]
        cls.__version__ = i16(version)  # type: ignore[attr-defined]
        cls.__flexible__ = False  # type: ignore[attr-defined]  # every legacy version is
        cls.__api_key__ = i16(api_key)  # type: ignore[attr-defined]
        cls.__header_schema__ = header  # type: ignore[attr-defined]
        return cls

    return mark


def request(api_key: int, version: int) -> Callable[[T], T]:
    """A request body (request header v1)."""
    return _entity(EntityType.request, RequestHeader, api_key, version)


def response(api_key: int, version: int) -> Callable[[T], T]:
    """A response body (response header v0)."""
    return _entity(EntityType.response, ResponseHeader, api_key, version)


def request_nested(api_key: int, version: int) -> Callable[[T], T]:
    return _entity(EntityType.nested, RequestHeader, api_key, version)


def response_nested(api_key: int, version: int) -> Callable[[T], T]:
    return _entity(EntityType.nested, ResponseHeader, api_key, version)
