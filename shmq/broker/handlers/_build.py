"""Building kio response objects for any version of an API."""

from __future__ import annotations

import datetime
import sys
from dataclasses import fields
from functools import cache
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from shmq.protocol.codec import response_class

ZERO = datetime.timedelta(0)


@cache
def response_module(api_key: int, version: int) -> tuple[type, ModuleType]:
    """The response class of a version and the module of its nested classes (kio's, or
    ``protocol.legacy``'s for a version Kafka 4 removed)."""
    cls = response_class(api_key, version)
    return cls, sys.modules[cls.__module__]


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def build(cls: type, **kw: Any) -> Any:
    """``cls(**kw)`` keeping only the fields this version has; ints become ErrorCodes."""
    names = _field_names(cls)
    args = {k: v for k, v in kw.items() if k in names}
    if "error_code" in args and not isinstance(args["error_code"], ErrorCode):
        args["error_code"] = ErrorCode(int(args["error_code"]))
    if "throttle_time" in names and "throttle_time" not in args:
        args["throttle_time"] = ZERO
    return cls(**args)
