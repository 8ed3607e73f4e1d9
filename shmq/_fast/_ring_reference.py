"""Pure-Python twin of ``shmq._fast.ring``: same names, same bytes.

The counters are loaded and stored whole through one-item ``Q`` / ``I`` memoryviews (one aligned
``mov`` each, see ``_seqlock_reference``); on x86-64 (total store order) that gives the acquire
and release order the rings need.  Python has no fence: the twin's store-load order rests on
the interpreter's hundreds of instructions between the two, which is why every wait on a ring
has a timeout and re-checks the ring (wake-ups are hints).  The batch is built with
``encode_records`` + ``build_batch`` and copied: the oracle for ``encode_batch_into``'s bytes.
"""

from __future__ import annotations

from typing import Any

from shmq._fast import _reference

HEADER = 61


def _word(buf: Any, off: int, width: int) -> memoryview:
    view = memoryview(buf).cast("B")
    if off < 0 or off > view.nbytes - width or off % width:
        raise IndexError(f"{width}-byte word at {off} is outside or misaligned in {view.nbytes} bytes")
    return view[off : off + width].cast("Q" if width == 8 else "I")


def load_u64(buf: Any, off: int) -> int:
    return int(_word(buf, off, 8)[0])


def store_u64(buf: Any, off: int, value: int) -> None:
    word = _word(buf, off, 8)
    if word.readonly:
        raise BufferError("underlying buffer is not writable")
    word[0] = value


def load_u32(buf: Any, off: int) -> int:
    return int(_word(buf, off, 4)[0])


def exchange_u32(buf: Any, off: int, value: int) -> int:
    word = _word(buf, off, 4)
    if word.readonly:
        raise BufferError("underlying buffer is not writable")
    old = int(word[0])
    word[0] = value
    return old


def full_fence() -> None:
    """No fence in Python (see the module docstring)."""


def publish_u64(buf: Any, off: int, value: int, flag: int) -> bool:
    """``store_u64`` of ``value`` at ``off``, then the wake-up flag at ``flag`` taken if set."""
    _word(buf, flag, 4)  # both checked before anything is stored
    store_u64(buf, off, value)
    full_fence()
    if load_u32(buf, flag):
        return exchange_u32(buf, flag, 0) != 0
    return False


def _as_bytes(obj: Any) -> bytes | None:
    if obj is None or isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    return bytes(obj)


def encode_batch_into(out: Any, pos: int, limit: int, records: list, timestamp: int,
                      producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                      attributes: int = 0) -> int:
    if not isinstance(records, list):
        raise TypeError("records must be a list")
    if not records:
        raise ValueError("a record batch holds at least one record")
    view = memoryview(out).cast("B")
    if pos < 0 or limit < 0 or pos > view.nbytes - limit:
        raise IndexError("encode window is outside the buffer")
    items: list[tuple[Any, Any, int, Any]] = []
    for rec in records:
        if isinstance(rec, bytes):
            items.append((None, rec, timestamp, ()))
            continue
        t = tuple(rec)
        if not 2 <= len(t) <= 4:
            raise ValueError("a record is bytes or (key, value[, timestamp[, headers]])")
        ts = timestamp if len(t) < 3 or t[2] is None else int(t[2])
        headers = []
        for h in (t[3] if len(t) > 3 and t[3] else ()):
            hk = _as_bytes(h[0])
            if hk is None:
                raise ValueError("header keys may not be None")
            headers.append((hk, _as_bytes(h[1])))
        items.append((_as_bytes(t[0]), _as_bytes(t[1]), ts, headers))
    base_ts = items[0][2]
    max_ts = max(r[2] for r in items)
    body = _reference.encode_records(items, base_ts)
    batch = _reference.build_batch(body, len(items), len(items) - 1, attributes, 0, -1, base_ts,
                                   max_ts, producer_id, producer_epoch, base_sequence)
    size = len(batch)
    if size - 12 > 0x7FFFFFFF:
        raise ValueError("record batch larger than 2 GiB")
    if size > limit:
        return -size
    if view.readonly:
        raise BufferError("underlying buffer is not writable")
    view[pos : pos + size] = batch
    return size


def encode_values_into(out: Any, pos: int, size: int, records: list, timestamp: int,
                       producer_id: int = -1, producer_epoch: int = -1,
                       base_sequence: int = -1) -> int:
    if not isinstance(records, list):
        raise TypeError("records must be a list")
    if not records:
        raise ValueError("a record batch holds at least one record")
    view = memoryview(out).cast("B")
    if size < 61 or pos < 0 or pos > view.nbytes - size:
        raise IndexError("encode window is outside the buffer")
    got = encode_batch_into(out, pos, size, records, timestamp, producer_id, producer_epoch,
                            base_sequence)
    if got != size:
        raise ValueError(f"the records make a batch of {abs(got)} bytes, not {size}")
    return size


def encode_columns_into(out: Any, pos: int, limit: int, keys: list, values: list, stamps: list,
                        producer_id: int = -1, producer_epoch: int = -1,
                        base_sequence: int = -1) -> int:
    """Twin of ``ring.encode_columns_into``: record ``i`` is ``(keys[i], values[i], stamps[i])``
    (bytes or None, bytes or None, int), no headers; ``encode_batch_into``'s general form."""
    if not (isinstance(keys, list) and isinstance(values, list) and isinstance(stamps, list)):
        raise TypeError("keys, values and stamps must be lists")
    if not values:
        raise ValueError("a record batch holds at least one record")
    if len(keys) != len(values) or len(stamps) != len(values):
        raise ValueError("keys, values and stamps differ in length")
    for k, v in zip(keys, values, strict=True):
        if (k is not None and type(k) is not bytes) or (v is not None and type(v) is not bytes):
            raise TypeError("keys and values must be bytes or None")
    if not all(isinstance(t, int) for t in stamps):
        raise TypeError("stamps must be ints")
    return encode_batch_into(out, pos, limit, list(zip(keys, values, stamps, strict=True)),
                             stamps[0], producer_id, producer_epoch, base_sequence)
