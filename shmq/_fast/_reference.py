"""Pure-Python twin of every compiled ``_fast`` function: same names, same behaviour.

It is the fallback when the extensions are not built and the oracle the parity tests compare the
compiled code against, so it is written for obviousness, not speed.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
from collections.abc import Sequence
from typing import Any

from shmq._fast._client_reference import _zigzag, murmur2_partition  # the one twin of each
from shmq._fast._errors import CorruptRecordError, InvalidRecordError

HEADER_SIZE = 61
NO_LOG_APPEND_TIME = -(2**63)
_U64 = (1 << 64) - 1


def _wrap64(v: int) -> int:
    """Two's-complement int64 arithmetic, as the compiled code and Java do."""
    v &= _U64
    return v - (1 << 64) if v >= 1 << 63 else v
SCAN_END, SCAN_PARTIAL, SCAN_CORRUPT, SCAN_FULL = 0, 1, 2, 3
SCAN_COLUMNS = 12
(
    COL_POSITION,
    COL_BASE_OFFSET,
    COL_LAST_OFFSET,
    COL_MAX_TIMESTAMP,
    COL_SIZE,
    COL_LEADER_EPOCH,
    COL_PRODUCER_ID,
    COL_PRODUCER_EPOCH,
    COL_BASE_SEQUENCE,
    COL_ATTRIBUTES,
    COL_RECORDS_COUNT,
    COL_BASE_TIMESTAMP,
) = range(12)

_HEADER = struct.Struct(">qiibIhiqqqhii")

# --- CRC-32C ---------------------------------------------------------------------------------

_POLY = 0x82F63B78
_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C of ``data`` continuing from ``value`` (a finished CRC, 0 to start)."""
    crc = value ^ 0xFFFFFFFF
    table = _TABLE
    for b in bytes(data):
        crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


crc32c_software = crc32c
crc32c_sse42 = crc32c


def have_hardware() -> bool:
    return False


def have_folding() -> bool:
    return False


# --- batch headers ---------------------------------------------------------------------------

_REASONS = {
    "partial": "batch runs past the end of the buffer",
    "short": "batch length is smaller than the 61-byte header",
    "magic": "magic byte is not 2",
    "crc": "CRC-32C mismatch",
    "count": "record count is invalid",
    "delta": "lastOffsetDelta does not match the record count",
    "control": "clients may not write control batches",
    "sequence": "producer id set but base sequence is negative",
    "overflow": "last offset overflows int64",
}


def _check(buf: bytes, pos: int, end: int, verify_crc: bool, strict: bool) -> tuple[str, int]:
    avail = end - pos
    if avail < 17:
        return "partial", 0
    (length,) = struct.unpack_from(">i", buf, pos + 8)
    if length < HEADER_SIZE - 12:
        return "short", 0
    if buf[pos + 16] != 2:
        return "magic", 0
    size = length + 12
    if size > avail:
        return "partial", 0
    if verify_crc:
        (stored,) = struct.unpack_from(">I", buf, pos + 17)
        if crc32c(buf[pos + 21 : pos + size]) != stored:
            return "crc", size
    (delta,) = struct.unpack_from(">i", buf, pos + 23)
    (count,) = struct.unpack_from(">i", buf, pos + 57)
    if count < 0 or delta < 0:
        return "count", size
    (base,) = struct.unpack_from(">q", buf, pos)
    if base > 0x7FFFFFFFFFFFFFFF - delta:
        return "overflow", size
    if strict:
        if count == 0 or delta != count - 1:
            return "delta", size
        if buf[pos + 22] & 0x20:
            return "control", size
        (pid,) = struct.unpack_from(">q", buf, pos + 43)
        (seq,) = struct.unpack_from(">i", buf, pos + 53)
        if pid >= 0 and seq < 0:
            return "sequence", size
    return "", size


def validate_batch(
    buf: Any, pos: int = 0, end: int = -1, verify_crc: bool = True, strict: bool = True
) -> int:
    data = bytes(buf)
    if end < 0 or end > len(data):
        end = len(data)
    if pos < 0 or pos > end:
        raise CorruptRecordError(f"batch position {pos} outside the buffer")
    reason, size = _check(data, pos, end, verify_crc, strict)
    if reason:
        message = f"invalid record batch at byte {pos}: {_REASONS[reason]}"
        magic = data[pos + 16] if end - pos > 16 else 2
        if reason in ("partial", "count", "delta", "control", "sequence") or (
                reason == "magic" and magic in (0, 1)):
            raise InvalidRecordError(message)
        raise CorruptRecordError(message)
    return size



def write_stamped(fd: int, at: int, buf: Any, pos: int, size: int, base_offset: int,
                  leader_epoch: int) -> int:
    """The batch at ``buf[pos:pos + size]`` written at ``at`` with baseOffset, batchLength and
    partitionLeaderEpoch stamped (see batch.pyx); short writes finished."""
    view = memoryview(buf).cast("B")
    if pos < 0 or size < HEADER_SIZE or size > len(view) - pos:
        raise ValueError(f"no batch of {size} bytes at {pos} in a buffer of {len(view)}")
    data = struct.pack(">qii", base_offset, size - 12, leader_epoch) + bytes(
        view[pos + 16 : pos + size])
    done = 0
    while done < size:
        n = os.pwrite(fd, data[done:], at + done)
        if n == 0:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        done += n
    return size

def batch_header(buf: Any, pos: int = 0) -> tuple[int, ...]:
    data = bytes(buf)
    if pos < 0 or len(data) - pos < HEADER_SIZE:
        raise CorruptRecordError(f"record batch header at byte {pos} is truncated")
    return _HEADER.unpack_from(data, pos)


def stamp_batch(buf: Any, pos: int, base_offset: int, leader_epoch: int) -> None:
    if pos < 0 or len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(f"record batch header at byte {pos} is truncated")
    struct.pack_into(">q", buf, pos, base_offset)
    struct.pack_into(">i", buf, pos + 12, leader_epoch)


def scan_batches(
    buf: Any, start: int, end: int, out: Any, verify_crc: bool = True, strict: bool = False
) -> tuple[int, int, int, str | None]:
    data = bytes(buf)
    if end < 0 or end > len(data):
        end = len(data)
    if start < 0 or start > end:
        raise CorruptRecordError(f"scan start {start} outside the buffer")
    cap = len(out) // SCAN_COLUMNS
    n, pos = 0, start
    while True:
        if pos == end:
            return n, pos, SCAN_END, None
        if n == cap:
            return n, pos, SCAN_FULL, None
        reason, size = _check(data, pos, end, verify_crc, strict)
        if reason:
            status = SCAN_PARTIAL if reason == "partial" else SCAN_CORRUPT
            return n, pos, status, _REASONS[reason]
        h = _HEADER.unpack_from(data, pos)
        row = [pos, h[0], h[0] + h[6], h[8], size, h[2], h[9], h[10], h[11], h[5], h[12], h[7]]
        for j, v in enumerate(row):  # any int64 table: numpy, array.array("q"), memoryview
            out[n * SCAN_COLUMNS + j] = v
        n += 1
        pos += size


# --- varints and records ---------------------------------------------------------------------


def _read_varint(data: bytes, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    raw, shift, i = 0, 0, 0
    while True:
        if pos + i >= end or i >= max_bytes:
            raise CorruptRecordError("truncated or overlong varint")
        b = data[pos + i]
        raw |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            break
        shift += 7
    raw &= _U64  # a 10th byte's high bits fall off, as in Java's readVarlong
    return (raw >> 1) ^ -(raw & 1), pos + i


def _parse_record(data: bytes, pos: int, end: int) -> tuple[int, int, Any, Any, tuple, int]:
    length, pos = _read_varint(data, pos, end, 5)
    if length < 6 or length > end - pos:
        raise CorruptRecordError("record length out of range")
    rend = pos + length
    pos += 1
    ts_delta, pos = _read_varint(data, pos, rend, 10)
    off_delta, pos = _read_varint(data, pos, rend, 5)
    fields = []
    for _ in range(2):
        n, pos = _read_varint(data, pos, rend, 5)
        if n < -1 or n > rend - pos:
            raise CorruptRecordError("key or value length out of range")
        fields.append(None if n < 0 else data[pos : pos + n])
        pos += max(n, 0)
    count, pos = _read_varint(data, pos, rend, 5)
    if count < 0 or count > rend - pos:
        raise CorruptRecordError("header count out of range")
    headers = []
    for _ in range(count):
        n, pos = _read_varint(data, pos, rend, 5)
        if n < 0 or n > rend - pos:
            raise CorruptRecordError("header key length out of range")
        hkey = data[pos : pos + n].decode("utf-8", "replace")
        pos += n
        n, pos = _read_varint(data, pos, rend, 5)
        if n < -1 or n > rend - pos:
            raise CorruptRecordError("header value length out of range")
        headers.append((hkey, None if n < 0 else data[pos : pos + n]))
        pos += max(n, 0)
    if pos != rend:
        raise CorruptRecordError("record length does not match its fields")
    return ts_delta, off_delta, fields[0], fields[1], tuple(headers), rend


def check_timestamps(
    body: Any,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int,
    create_time: bool,
    now: int,
    before_max_ms: int,
    after_max_ms: int,
) -> tuple[int, list[tuple[int, int, int, int, int, int]] | None]:
    """Kafka's ``LogValidator.validateTimestamp`` over one records section (see batch.pyx)."""
    data = bytes(body)
    if count < 0 or count > len(data):
        raise InvalidRecordError(f"record count {count} cannot fit in {len(data)} bytes")
    lo, hi = now - before_max_ms, now + after_max_ms
    max_ts, errors, pos = -1, [], 0
    for i in range(count):
        try:
            ts_delta, off_delta, key, value, _, pos = _parse_record(data, pos, len(data))
        except CorruptRecordError:
            raise InvalidRecordError(f"record {i} of {count} is malformed") from None
        ts = log_append_time if log_append_time != NO_LOG_APPEND_TIME \
            else _wrap64(base_timestamp + ts_delta)
        where = (ts, _wrap64(base_offset + off_delta), len(key or b""), len(value or b""))
        if create_time and ts != -1:
            if not lo <= ts <= hi:
                errors.append((i, 0, *where))
        elif log_append_time != NO_LOG_APPEND_TIME:
            errors.append((i, 1, *where))
        max_ts = max(max_ts, ts)
    if pos != len(data):
        raise InvalidRecordError(f"{len(data) - pos} bytes left after {count} records")
    return max_ts, errors or None



TIMESTAMPS_UNCHECKED = -2


def check_batch(
    buf: Any,
    pos: int,
    limit: int,
    validate: bool,
    create_time: bool,
    now: int,
    before_max_ms: int,
    after_max_ms: int,
) -> tuple[int, int, int, int, int, int, int, int,
           list[tuple[int, int, int, int, int, int]] | None]:
    """Pass 1 of ``PartitionLog.append`` for one batch (see batch.pyx): validate_batch, the
    header's fields, and Kafka's timestamp rules when ``validate`` and the size is in ``limit``."""
    size = validate_batch(buf, pos, -1, True, validate)
    data = bytes(buf)
    (base_offset, _, _, _, _, attributes, delta, base_ts, header_max, pid, pepoch, seq,
     _) = _HEADER.unpack_from(data, pos)
    batch_max, rewrite, errors = header_max, -1, None
    if validate and size <= limit:
        if attributes & 0x07:
            rewrite = TIMESTAMPS_UNCHECKED
        else:
            derived, errors = check_timestamps(
                data[pos + HEADER_SIZE : pos + size], delta + 1, base_offset, base_ts,
                header_max if attributes & 0x08 else NO_LOG_APPEND_TIME, create_time, now,
                before_max_ms, after_max_ms)
            if not create_time:
                batch_max = now
            else:
                batch_max = derived
                if attributes & 0x08 or batch_max != header_max:
                    rewrite = attributes & 0x77
    return size, attributes, delta, batch_max, rewrite, pid, pepoch, seq, errors

def decode_records(
    body: Any,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int = NO_LOG_APPEND_TIME,
    record_type: type | None = None,
) -> list[Any]:
    if record_type is not None and not (
        issubclass(record_type, tuple) and len(getattr(record_type, "_fields", ())) == 5
    ):
        raise TypeError("record_type must be a tuple subclass with 5 fields")
    data = bytes(body)
    if count < 0 or count > len(data):
        raise CorruptRecordError(f"record count {count} cannot fit in {len(data)} bytes")
    out: list[Any] = []
    pos = 0
    for i in range(count):
        try:
            ts_delta, off_delta, key, value, headers, pos = _parse_record(data, pos, len(data))
        except CorruptRecordError:
            raise CorruptRecordError(f"record {i} of {count} is malformed") from None
        ts = log_append_time if log_append_time != NO_LOG_APPEND_TIME else _wrap64(base_timestamp + ts_delta)
        item = (_wrap64(base_offset + off_delta), ts, key, value, headers)
        out.append(item if record_type is None else record_type(*item))  # type: ignore[call-arg, arg-type]
    if pos != len(data):
        raise CorruptRecordError(f"{len(data) - pos} bytes left after {count} records")
    return out


def decode_sections(bodies: list[Any], meta: Any, record_type: type | None = None) -> list[Any]:
    if len(meta) < 4 * len(bodies):
        raise ValueError("meta holds fewer than 4 values per section")
    if record_type is not None and not (
        issubclass(record_type, tuple) and len(getattr(record_type, "_fields", ())) == 5
    ):
        raise TypeError("record_type must be a tuple subclass with 5 fields")
    for b, body in enumerate(bodies):
        count = int(meta[4 * b])
        # a record takes at least 7 bytes: a lying count must not size the list
        if count < 0 or 7 * count > len(body):
            raise CorruptRecordError(f"record count {count} cannot fit in {len(body)} bytes")
    out: list[Any] = []
    for b, body in enumerate(bodies):
        count, base_offset, base_ts, lat = (int(x) for x in meta[4 * b : 4 * b + 4])
        out += decode_records(body, count, base_offset, base_ts, lat, record_type)
    return out


def _as_bytes(obj: Any) -> bytes | None:
    if obj is None:
        return None
    if isinstance(obj, str):
        return obj.encode("utf-8")
    return bytes(obj)


def encode_records(records: Sequence[tuple[Any, Any, int, Any]], base_timestamp: int) -> bytes:
    out = bytearray()
    for i, (key, value, timestamp, headers) in enumerate(records):
        body = bytearray(b"\x00")
        body += _zigzag(timestamp - base_timestamp)
        body += _zigzag(i)
        for field in (_as_bytes(key), _as_bytes(value)):
            if field is None:
                body += _zigzag(-1)
            else:
                body += _zigzag(len(field)) + field
        hlist = list(headers) if headers else []
        body += _zigzag(len(hlist))
        for hkey, hvalue in hlist:
            if hkey is None:
                raise ValueError("header keys may not be None")
            hk = _as_bytes(hkey)
            assert hk is not None
            body += _zigzag(len(hk)) + hk
            hv = _as_bytes(hvalue)
            body += _zigzag(-1) if hv is None else _zigzag(len(hv)) + hv
        out += _zigzag(len(body)) + body
    return bytes(out)


def build_batch(
    records: Any,
    records_count: int,
    last_offset_delta: int,
    attributes: int,
    base_offset: int,
    leader_epoch: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> bytearray:
    body = bytes(records)
    size = HEADER_SIZE + len(body)
    if size - 12 > 0x7FFFFFFF:
        raise ValueError("record batch larger than 2 GiB")
    out = bytearray(size)
    _HEADER.pack_into(
        out, 0, base_offset, size - 12, leader_epoch, 2, 0, attributes, last_offset_delta,
        base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, records_count,
    )
    out[HEADER_SIZE:] = body
    struct.pack_into(">I", out, 17, crc32c(out[21:]))
    return out


def fill_columns(
    bodies: list[Any],
    meta: Any,
    offsets: Any,
    timestamps: Any,
    key_offsets: Any,
    key_data: Any,
    key_valid: Any,
    value_offsets: Any,
    value_data: Any,
    value_valid: Any,
    min_offset: int = -0x7FFFFFFFFFFFFFFF,
    max_offset: int = 0x7FFFFFFFFFFFFFFF,
    timestamp_scale: int = 1,
) -> tuple[int, int, int, int, int]:
    if len(meta) < 4 * len(bodies):
        raise ValueError("meta holds fewer than 4 values per section")
    cap_rows = min(len(offsets), len(timestamps), len(key_offsets) - 1, len(value_offsets) - 1,
                   8 * len(key_valid), 8 * len(value_valid))
    kv, vv = memoryview(key_valid).cast("B"), memoryview(value_valid).cast("B")
    kd, vd = memoryview(key_data).cast("B"), memoryview(value_data).cast("B")
    kv[:] = bytes(len(kv))
    vv[:] = bytes(len(vv))
    key_offsets[0] = value_offsets[0] = 0
    rows = klen = vlen = knulls = vnulls = 0
    for b, body in enumerate(bodies):
        count, base_offset, base_ts, lat = (int(x) for x in meta[4 * b : 4 * b + 4])
        records = decode_records(body, count, base_offset, base_ts, lat)
        for offset, ts, key, value, _headers in records:
            if offset < min_offset or offset >= max_offset:
                continue
            if rows >= cap_rows or klen + len(key or b"") > len(kd) or vlen + len(value or b"") > len(vd):
                raise ValueError("column buffers are too small for these sections")
            offsets[rows] = offset
            timestamps[rows] = _wrap64(ts * timestamp_scale)
            for field, data, valid in ((key, kd, kv), (value, vd, vv)):
                if field is None:
                    if data is kd:
                        knulls += 1
                    else:
                        vnulls += 1
                    continue
                used = klen if data is kd else vlen
                data[used : used + len(field)] = field
                valid[rows >> 3] |= 1 << (rows & 7)
                if data is kd:
                    klen += len(field)
                else:
                    vlen += len(field)
            rows += 1
            if klen > 0x7FFFFFFF or vlen > 0x7FFFFFFF:
                raise OverflowError("more than 2 GiB of keys or values in one column")
            key_offsets[rows] = klen
            value_offsets[rows] = vlen
    return rows, klen, vlen, knulls, vnulls


def _header_fields(data: bytes, pos: int, end: int) -> list[tuple[bytes, bytes | None]]:
    """The raw (key bytes, value bytes | None) headers of the record at ``pos`` (already parsed
    once by ``_parse_record``, so every length is in range)."""
    length, pos = _read_varint(data, pos, end, 5)
    rend = pos + length
    pos += 1
    _, pos = _read_varint(data, pos, rend, 10)
    _, pos = _read_varint(data, pos, rend, 5)
    for _ in range(2):
        n, pos = _read_varint(data, pos, rend, 5)
        pos += max(n, 0)
    count, pos = _read_varint(data, pos, rend, 5)
    out = []
    for _ in range(count):
        n, pos = _read_varint(data, pos, rend, 5)
        key = data[pos : pos + n]
        pos += n
        n, pos = _read_varint(data, pos, rend, 5)
        out.append((key, None if n < 0 else data[pos : pos + n]))
        pos += max(n, 0)
    return out


def fill_headers(
    bodies: list[Any],
    meta: Any,
    list_offsets: Any,
    list_valid: Any,
    key_offsets: Any,
    key_data: Any,
    value_offsets: Any,
    value_data: Any,
    value_valid: Any,
    min_offset: int = -0x7FFFFFFFFFFFFFFF,
    max_offset: int = 0x7FFFFFFFFFFFFFFF,
) -> tuple[int, int, int, int, int, int, int]:
    if len(meta) < 4 * len(bodies):
        raise ValueError("meta holds fewer than 4 values per section")
    cap_rows = min(len(list_offsets) - 1, 8 * len(list_valid))
    cap_headers = min(len(key_offsets) - 1, len(value_offsets) - 1, 8 * len(value_valid))
    if cap_rows < 0 or cap_headers < 0:
        raise ValueError("offset arrays need room for n + 1 entries")
    lv, vv = memoryview(list_valid).cast("B"), memoryview(value_valid).cast("B")
    kd, vd = memoryview(key_data).cast("B"), memoryview(value_data).cast("B")
    lv[:] = bytes(len(lv))
    vv[:] = bytes(len(vv))
    list_offsets[0] = key_offsets[0] = value_offsets[0] = 0
    rows = headers = klen = vlen = list_nulls = value_nulls = bad_keys = 0
    for b, body in enumerate(bodies):
        count, base_offset = int(meta[4 * b]), int(meta[4 * b + 1])
        data = bytes(body)
        if count < 0 or count > len(data):
            raise CorruptRecordError(f"record count {count} cannot fit in {len(data)} bytes")
        pos = 0
        for i in range(count):
            start = pos
            try:
                _, off_delta, _, _, _, pos = _parse_record(data, pos, len(data))
            except CorruptRecordError:
                raise CorruptRecordError(
                    f"record {i} of {count} in section {b} is malformed") from None
            offset = _wrap64(base_offset + off_delta)
            if offset < min_offset or offset >= max_offset:
                continue
            fields = _header_fields(data, start, pos)
            if rows >= cap_rows or len(fields) > cap_headers - headers:
                raise ValueError("column buffers are too small for these sections")
            if fields:
                lv[rows >> 3] |= 1 << (rows & 7)
            else:
                list_nulls += 1
            for key, value in fields:
                if len(key) > len(kd) - klen or (value is not None and len(value) > len(vd) - vlen):
                    raise ValueError("column buffers are too small for these sections")
                kd[klen : klen + len(key)] = key
                klen += len(key)
                try:
                    key.decode("utf-8")
                except UnicodeDecodeError:
                    bad_keys += 1
                if value is None:
                    value_nulls += 1
                else:
                    vv[headers >> 3] |= 1 << (headers & 7)
                    vd[vlen : vlen + len(value)] = value
                    vlen += len(value)
                if klen > 0x7FFFFFFF or vlen > 0x7FFFFFFF:
                    raise OverflowError("more than 2 GiB of header keys or values in one column")
                headers += 1
                key_offsets[headers] = klen
                value_offsets[headers] = vlen
            rows += 1
            list_offsets[rows] = headers
        if pos != len(data):
            raise CorruptRecordError(
                f"{len(data) - pos} bytes left after {count} records in section {b}")
    return rows, headers, klen, vlen, list_nulls, value_nulls, bad_keys


def murmur2_partitions(offsets: Any, data: Any, valid: Any, partitions: int, out: Any) -> None:
    n = len(out)
    if partitions <= 0:
        raise ValueError("partitions must be positive")
    if len(offsets) < n + 1:
        raise ValueError("offsets need n + 1 entries")
    raw = bytes(memoryview(data).cast("B"))
    bits = None if valid is None else bytes(memoryview(valid).cast("B"))
    if bits is not None and len(bits) * 8 < n:
        raise ValueError("the validity bitmap is too short")
    for i in range(n):
        if bits is not None and not (bits[i >> 3] >> (i & 7)) & 1:
            out[i] = -1
            continue
        a, b = int(offsets[i]), int(offsets[i + 1])
        if a < 0 or b < a or b > len(raw):
            raise ValueError(f"key {i}: offsets {a}..{b} outside the data")
        out[i] = murmur2_partition(raw[a:b], partitions)


def encode_arrow_batch_into(out: Any, pos: int, limit: int, rows: Any, key_offsets: Any,
                            key_data: Any, key_valid: Any, value_offsets: Any, value_data: Any,
                            value_valid: Any, timestamp: int, producer_id: int = -1,
                            producer_epoch: int = -1, base_sequence: int = -1) -> int:
    n = len(rows)
    if n == 0:
        raise ValueError("a record batch holds at least one record")
    if pos < 0 or limit < 0 or pos > len(out) - limit:
        raise IndexError("encode window is outside the buffer")
    if key_offsets is not None and key_data is None:
        raise ValueError("key offsets without key data")

    def column(offsets: Any, data: Any, valid: Any, name: str) -> Any:
        if offsets is None:
            return None
        raw = bytes(memoryview(data).cast("B"))
        bits = None if valid is None else bytes(memoryview(valid).cast("B"))
        if bits is not None and len(bits) * 8 < len(offsets) - 1:
            raise ValueError(f"the {name} validity bitmap is too short")

        def get(r: int) -> bytes | None:
            if bits is not None and not (bits[r >> 3] >> (r & 7)) & 1:
                return None
            a, b = int(offsets[r]), int(offsets[r + 1])
            if not 0 <= a <= b <= len(raw):
                raise ValueError(f"row {r}: {name} offsets outside the column data")
            return raw[a:b]

        return get

    keys = column(key_offsets, key_data, key_valid, "key")
    values = column(value_offsets, value_data, value_valid, "value")
    records: list[tuple[Any, Any, int, list]] = []
    for r in (int(x) for x in rows):
        if r < 0 or r >= len(value_offsets) - 1 or (
                key_offsets is not None and r >= len(key_offsets) - 1):
            raise IndexError(f"row {r} is outside the columns")
        records.append((None if keys is None else keys(r), values(r), timestamp, []))
    body = encode_records(records, timestamp)
    batch = build_batch(body, n, n - 1, 0, 0, -1, timestamp, timestamp, producer_id,
                        producer_epoch, base_sequence)
    if len(batch) > limit:
        return -len(batch)
    memoryview(out).cast("B")[pos : pos + len(batch)] = batch
    return len(batch)


# --- index search ----------------------------------------------------------------------------

_WARM_BYTES = 8192


def _check_args(size: int, entries: int, entry_size: int, key_offset: int, key_width: int) -> None:
    if entry_size <= 0 or key_width not in (4, 8) or key_offset < 0 or key_offset + key_width > entry_size:
        raise ValueError("bad index entry layout")
    if entries < 0 or entries * entry_size > size:
        raise ValueError(f"{entries} entries of {entry_size} bytes do not fit in {size} bytes")


def _key(buf: Any, slot: int, entry_size: int, key_offset: int, key_width: int) -> int:
    fmt = ">q" if key_width == 8 else ">i"
    return struct.unpack_from(fmt, buf, slot * entry_size + key_offset)[0]


def largest_lower_bound(
    buf: Any, entries: int, entry_size: int, key_offset: int, key_width: int, target: int
) -> int:
    _check_args(len(buf), entries, entry_size, key_offset, key_width)
    best = -1
    for slot in range(entries):
        if _key(buf, slot, entry_size, key_offset, key_width) <= target:
            best = slot
        else:
            break
    return best


def smallest_upper_bound(
    buf: Any, entries: int, entry_size: int, key_offset: int, key_width: int, target: int
) -> int:
    _check_args(len(buf), entries, entry_size, key_offset, key_width)
    for slot in range(entries):
        if _key(buf, slot, entry_size, key_offset, key_width) >= target:
            return slot
    return -1


# --- mapping ---------------------------------------------------------------------------------


READAHEAD_CHUNK = 512 << 10  # as mapping.pyx's


class MappedFile(mmap.mmap):
    """Twin of the compiled MappedFile: an ``mmap.mmap`` (which keeps a duplicate descriptor)."""

    def __new__(cls, fd: int, length: int, writable: bool = False) -> MappedFile:
        if length <= 0:
            raise ValueError("cannot map 0 bytes")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self = super().__new__(cls, fd, length, access=access)
        self.madvise(mmap.MADV_RANDOM)  # as the compiled one: no read-around of index holes
        self.writable = writable  # type: ignore[attr-defined]
        return self

    @property
    def length(self) -> int:
        return len(self)

    def populate(self, start: int, length: int, file_size: int = -1) -> int:
        """As the compiled one: ``MADV_WILLNEED`` for the aligned chunks of the range, ending at
        ``file_size`` when given, then ``MADV_POPULATE_READ`` over the range (best effort).
        Python has no ``mincore``, so the twin asks for every chunk and populates every range;
        the compiled one skips both where the page cache holds the range (the walker's faults
        map it, 16 pages each).  Returns how many chunks were asked for."""
        if length <= 0:
            return 0
        if start < 0 or start > len(self) - length:
            raise ValueError("range outside the mapping")
        lo = start - start % mmap.PAGESIZE
        hi = start + length
        if file_size < hi or file_size > len(self):
            file_size = len(self)
        asked = 0
        try:
            at = lo - lo % READAHEAD_CHUNK
            while at < hi:
                self.madvise(mmap.MADV_WILLNEED, at, min(READAHEAD_CHUNK, file_size - at))
                asked += 1
                at += READAHEAD_CHUNK
            self.madvise(22, lo, hi - lo)  # MADV_POPULATE_READ (Linux >= 5.14)
        except OSError:
            pass
        return asked


def import_spark_batch(importer: Any, schema: Any, n: int, block: Any, at_koff: int,
                       at_kdata: int, at_kvalid: int, r4: int, data: int, bits: int, r8: int,
                       knulls: int, vnulls: int, topic_ends: Any, topic_data: Any,
                       partitions: Any, types: Any) -> Any:
    """The compiled module's Arrow C data interface import, as pyarrow arrays built in Python
    (``importer`` is not needed): the same columns over the same buffers."""
    import pyarrow as pa

    sl = block.slice

    def binary(off: int, at: int, valid: int, nulls: int) -> Any:
        end = struct.unpack_from("=i", block, off + 4 * n)[0]  # the last row's end
        return pa.Array.from_buffers(pa.binary(), n, [sl(valid, n // 8 + 1) if nulls else None,
                                                      sl(off, 4 * (n + 1)), sl(at, end)],
                                     null_count=nulls)

    fields = [f.type for f in schema]
    arrays = [
        binary(at_koff, at_kdata, at_kvalid, knulls),
        binary(at_koff + r4, at_kdata + data, at_kvalid + bits, vnulls),
        pa.Array.from_buffers(fields[2], n, [None, topic_ends, topic_data]),
        pa.Array.from_buffers(fields[3], n, [None, partitions]),
        pa.Array.from_buffers(fields[4], n, [None, sl(0, 8 * n)]),
        pa.Array.from_buffers(fields[5], n, [None, sl(r8, 8 * n)]),
        pa.Array.from_buffers(fields[6], n, [None, types]),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
