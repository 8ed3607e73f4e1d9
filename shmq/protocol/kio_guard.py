"""Walk a message's structure before kio decodes it: bounds, hostile counts, unknown tagged fields.

Theory of operation
-------------------
kio 0.6.5 decodes in native code, which is fast but has two flaws that matter on a server:

* it sizes a compact array's storage from the wire count before reading any element, so a
  five-byte count such as ``ff ff ff ff 0f`` makes Rust try to allocate tens of GiB and *abort
  the process* (measured: "memory allocation of 34359738352 bytes failed", SIGABRT, for a
  Metadata v12 request).  Catching exceptions cannot help: the process is gone;
* it raises ``KeyError('Unknown tagged field tag: N')`` on an unknown tag, although KIP-482 says
  unknown tags must be skipped; it also ignores a known tag's size field and reads on from wherever
  the value ended.

So nothing from the network reaches kio before ``read_entity`` has walked it with a plan compiled
from the same kio dataclasses (field order, types, nullability, tags).  The walk builds no
objects; it checks that every length and count fits in the bytes that are actually there (an
array element takes at least one byte, so a count above the remaining bytes is rejected before
any loop) and that each known tagged field's value fills exactly its declared size.  kio then
decodes a buffer whose every count is backed by real bytes, so its allocations are bounded by
the frame, which the framing layer caps.

Unknown tagged fields are recorded as edits: each tag section that holds one (directly, or inside
a known tagged field's value) is rebuilt without it, and kio decodes the rebuilt copy.  This path
is rare (today's clients only send tags kio knows) and costs one copy of the message.

Anything malformed raises ``RemoteProtocolError``; so does any exception kio raises on bytes the
walk accepted (invalid UTF-8, bad booleans, unknown enum values...).

Wire types (protocol.md §2.2)::

    fixed       bool/int8 1, int16/error_code 2, int32/timedelta_i32 4,
                int64/float64/datetime_i64/timedelta_i64 8, uuid 16
    string      legacy: int16 len, -1 = null      compact: uvarint(len+1), 0 = null
    bytes       legacy: int32 len, -1 = null      compact: uvarint(len+1), 0 = null
    array       legacy: int32 count, -1 = null    compact: uvarint(count+1), 0 = null
    struct      fields inline (nullable struct: int8 -1 null / 1 present, then fields)
    tags        flexible structs end with uvarint count, then (uvarint tag, uvarint size, value)
"""

from __future__ import annotations

import functools
import struct
from dataclasses import fields
from typing import Any

from kio.serial import entity_reader
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from shmq.errors import RemoteProtocolError

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

_FIXED_SIZES = {
    "bool": 1, "int8": 1, "uint8": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}  # fmt: skip

# Plan operations: tuples whose first item is one of these codes.
_FIXED = 0  # (_FIXED, n)                      skip n bytes
_STRING16 = 1  # (_STRING16, nullable)         int16 length
_BYTES32 = 2  # (_BYTES32, nullable)           int32 length
_COMPACT = 3  # (_COMPACT, nullable)           uvarint(len+1): compact string or bytes
_ARRAY = 4  # (_ARRAY, compact, nullable, item_size, item_plan)  item_size 0 = walk item_plan
_NULLABLE_STRUCT = 5  # (_NULLABLE_STRUCT, plan)
_TAGS = 6  # (_TAGS, {tag: plan})


def _short(pos: int) -> RemoteProtocolError:
    return RemoteProtocolError(f"message is truncated at byte {pos}")


def read_uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """An unsigned LEB128 varint of at most 5 bytes at ``pos``: ``(value, new_pos)``."""
    if pos < end and buf[pos] < 0x80:  # one byte: every count and length below 128
        return buf[pos], pos + 1
    value = 0
    for shift in (0, 7, 14, 21, 28):
        if pos >= end:
            raise _short(pos)
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    raise RemoteProtocolError(f"unsigned varint longer than 5 bytes ending at byte {pos}")


_ONE_BYTE_UVARINTS = [bytes((i,)) for i in range(128)]


def write_uvarint(value: int) -> bytes:
    """The unsigned LEB128 encoding of ``value`` (>= 0)."""
    if value < 0:
        raise ValueError(f"unsigned varint of negative value {value}")
    if value < 0x80:
        return _ONE_BYTE_UVARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# --- plan compilation -------------------------------------------------------------------------


def _primitive_op(kafka_type: str, flexible: bool, nullable: bool) -> tuple:
    size = _FIXED_SIZES.get(kafka_type)
    if size is not None:
        return (_FIXED, size)
    if flexible and kafka_type in ("string", "bytes", "records"):
        return (_COMPACT, nullable)
    if kafka_type == "string":
        return (_STRING16, nullable)
    if kafka_type in ("bytes", "records"):
        return (_BYTES32, nullable)
    raise NotImplementedError(f"no wire layout for kio type {kafka_type!r}")


def _merge_fixed(ops: list[tuple]) -> tuple:
    merged: list[tuple] = []
    for op in ops:
        if op[0] == _FIXED and merged and merged[-1][0] == _FIXED:
            merged[-1] = (_FIXED, merged[-1][1] + op[1])
        else:
            merged.append(op)
    return tuple(merged)


def _item_size(plan: tuple) -> int:
    """The fixed wire size of one array item, or 0 when items must be walked."""
    if len(plan) == 1 and plan[0][0] == _FIXED:
        return int(plan[0][1])
    return 0


def _field_ops(field: Any, flexible: bool, nullable: bool) -> list[tuple]:
    kind = classify_field(field)
    if isinstance(kind, PrimitiveField):
        return [_primitive_op(get_schema_field_type(field), flexible, nullable)]
    if isinstance(kind, PrimitiveTupleField):
        item = (_primitive_op(get_schema_field_type(field), flexible, False),)
        return [(_ARRAY, flexible, nullable, _item_size(item), item)]
    if isinstance(kind, EntityField):
        if nullable:
            return [(_NULLABLE_STRUCT, plan_for(kind.type_))]
        return list(plan_for(kind.type_))  # a struct's fields are inline
    if isinstance(kind, EntityTupleField):
        item = plan_for(kind.type_)
        return [(_ARRAY, flexible, nullable, _item_size(item), item)]
    raise NotImplementedError(f"unknown kio field kind {kind!r}")  # pragma: no cover


@functools.cache
def plan_for(cls: Any) -> tuple:
    """The walk plan of a kio entity class (cached per class)."""
    flexible = bool(cls.__flexible__)
    ops: list[tuple] = []
    tags: dict[int, tuple] = {}
    for field in fields(cls):
        tag = get_field_tag(field)
        if tag is None:
            ops.extend(_field_ops(field, flexible, is_optional(field)))
        else:
            # kio reads (and writes) tagged values as non-nullable.
            tags[int(tag)] = _merge_fixed(_field_ops(field, flexible, False))
    if flexible:
        ops.append((_TAGS, tags))
    return _merge_fixed(ops)


# --- the walk ---------------------------------------------------------------------------------


def walk(plan: tuple, buf: memoryview, pos: int, end: int, edits: list) -> int:
    """Check ``buf[pos:end]`` against ``plan``; return the end of the message.

    ``edits`` receives ``(start, stop, replacement)`` for every tag section that must be rebuilt
    without unknown tags, in buffer order and non-overlapping.
    """
    for op in plan:
        code = op[0]
        if code == _FIXED:
            pos += op[1]
            if pos > end:
                raise _short(end)
        elif code == _COMPACT:
            length, pos = read_uvarint(buf, pos, end)
            if length == 0:
                if not op[1]:
                    raise RemoteProtocolError(f"null in a non-nullable field at byte {pos}")
                continue
            pos += length - 1
            if pos > end:
                raise _short(end)
        elif code == _STRING16 or code == _BYTES32:
            width, reader = (2, _INT16) if code == _STRING16 else (4, _INT32)
            if pos + width > end:
                raise _short(end)
            length = reader.unpack_from(buf, pos)[0]
            pos += width
            if length < 0:
                if length == -1 and op[1]:
                    continue
                raise RemoteProtocolError(f"invalid length {length} at byte {pos - width}")
            pos += length
            if pos > end:
                raise _short(end)
        elif code == _ARRAY:
            pos = _walk_array(op, buf, pos, end, edits)
        elif code == _NULLABLE_STRUCT:
            if pos >= end:
                raise _short(end)
            marker = _INT8.unpack_from(buf, pos)[0]
            pos += 1
            if marker == 1:
                pos = walk(op[1], buf, pos, end, edits)
            elif marker != -1:
                raise RemoteProtocolError(f"invalid struct presence marker {marker}")
        elif pos < end and buf[pos] == 0:  # _TAGS, and none sent: the common case
            pos += 1
        else:
            pos = _walk_tags(op[1], buf, pos, end, edits)
    return pos


def _walk_array(op: tuple, buf: memoryview, pos: int, end: int, edits: list) -> int:
    _, compact, nullable, item_size, item_plan = op
    if compact:
        count, pos = read_uvarint(buf, pos, end)
        count -= 1
    else:
        if pos + 4 > end:
            raise _short(end)
        count = _INT32.unpack_from(buf, pos)[0]
        pos += 4
    if count < 0:
        if count == -1 and nullable:
            return pos
        raise RemoteProtocolError(f"invalid array count {count} at byte {pos}")
    # Every item takes at least one byte: a larger count is hostile, reject it before looping.
    if count > end - pos:
        raise RemoteProtocolError(f"array count {count} exceeds the {end - pos} bytes left")
    if item_size:
        pos += count * item_size
        if pos > end:
            raise _short(end)
        return pos
    for _ in range(count):
        pos = walk(item_plan, buf, pos, end, edits)
    return pos


def _walk_tags(known: dict, buf: memoryview, pos: int, end: int, edits: list) -> int:
    start = pos
    count, pos = read_uvarint(buf, pos, end)
    if count > end - pos:
        raise RemoteProtocolError(f"tagged field count {count} exceeds the bytes left")
    kept: list[tuple[int, int, int, list]] = []
    dropped = False
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos, end)
        size, pos = read_uvarint(buf, pos, end)
        stop = pos + size
        if stop > end:
            raise _short(end)
        plan = known.get(tag)
        if plan is None:
            dropped = True  # KIP-482: unknown tags are skipped
        else:
            inner: list = []
            if walk(plan, buf, pos, stop, inner) != stop:
                raise RemoteProtocolError(f"tagged field {tag} does not fill its {size} bytes")
            kept.append((tag, pos, stop, inner))
        pos = stop
    if dropped or any(inner for *_, inner in kept):
        section = bytearray(write_uvarint(len(kept)))
        for tag, value_start, value_stop, inner in kept:
            value = apply_edits(buf, value_start, value_stop, inner)
            section += write_uvarint(tag) + write_uvarint(len(value)) + value
        edits.append((start, pos, bytes(section)))
    return pos


def skip_tagged_fields(buf: memoryview, pos: int, end: int) -> int:
    """Skip a tagged-field section none of whose tags we read (e.g. request header v2)."""
    if pos < end and buf[pos] == 0:
        return pos + 1
    return _walk_tags({}, buf, pos, end, [])


def apply_edits(buf: memoryview, start: int, stop: int, edits: list) -> bytes:
    """``buf[start:stop]`` with each ``(s, e, replacement)`` edit applied."""
    pieces = []
    cursor = start
    for edit_start, edit_stop, replacement in edits:
        pieces.append(buf[cursor:edit_start])
        pieces.append(replacement)
        cursor = edit_stop
    pieces.append(buf[cursor:stop])
    return b"".join(pieces)


# --- entry point ------------------------------------------------------------------------------


@functools.cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


def read_entity(cls: type, buf: Any, offset: int = 0) -> tuple[Any, int]:
    """Decode one kio entity at ``offset``: ``(value, bytes_consumed)``, safely.

    Raises ``RemoteProtocolError`` for anything malformed, never another exception type.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if not mv.readonly:
        mv = mv.toreadonly()  # kio's native reader refuses writable buffers (reassembled frames)
    end = len(mv)
    edits: list = []
    stop = walk(plan_for(cls), mv, offset, end, edits)
    try:
        if edits:
            value, consumed = _reader(cls)(apply_edits(mv, offset, stop, edits), 0)
            expected = stop - offset - sum(e - s - len(r) for s, e, r in edits)
        else:
            value, consumed = _reader(cls)(mv, offset)
            expected = stop - offset
    except Exception as exc:  # kio: DecodeError, ValueError, KeyError, UnicodeDecodeError...
        raise RemoteProtocolError(f"cannot decode {cls.__name__}: {exc!r}") from exc
    if consumed != expected:  # pragma: no cover - the walk and kio disagree: refuse the bytes
        raise RemoteProtocolError(f"{cls.__name__}: kio read {consumed} bytes, walk {expected}")
    return value, stop - offset
