"""Pure-Python twin of ``worker_ring.pyx`` (the worker's half of a session's rings): the same
methods and results, the oracle in ``tests/unit/ipc/test_worker_ring.py``.  Steps as
``shmq.ipc.ring.Ring`` takes them (``peek``, ``advance``, ``release``, ``set_sleeping``;
``free_space``, ``reserve`` + ``commit``), with the worker's PRODUCE checks."""

from __future__ import annotations

import struct
from typing import Any

from shmq._fast import _ring_reference as _r

TAIL, HEAD, CONSUMER_SLEEPING, PRODUCER_WAITING = 0, 64, 128, 132
PAD, PRODUCE, COMPLETION = 0, 1, 2
_ENTRY = struct.Struct("=IHH")
_FIELDS = struct.Struct("=IiHb")  # correlation u32, partition i32, topic_len u16, acks i8
_COMPLETION = struct.Struct("=IHHIhHqqq")
PRODUCE_HEADER_SIZE, COMPLETION_HEADER_SIZE = 24, 40


def _align8(n: int) -> int:
    return (n + 7) & ~7


class WorkerRings:
    def __init__(self, view: Any, submit_control: int, submit_data: int, submit_capacity: int,
                 completion_control: int, completion_data: int, completion_capacity: int,
                 error: type[Exception]) -> None:
        view = memoryview(view)
        if view.readonly:
            raise BufferError("the rings' buffer must be writable")
        for c in (submit_capacity, completion_capacity):
            if c < 8 or c & (c - 1):
                raise ValueError(f"ring capacity {c} is not a power of two")
        for c in (submit_control, completion_control):
            if c < 0 or c % 64 or c + 136 > len(view):
                raise ValueError(f"ring control at {c} is outside the buffer")
        if (submit_data < 0 or submit_data % 8 or submit_data + submit_capacity > len(view)
                or completion_data < 0 or completion_data % 8
                or completion_data + completion_capacity > len(view)):
            raise ValueError("ring data outside the buffer")
        self._view: Any = view
        self.s_ctl, self.s_data, self.s_cap = submit_control, submit_data, submit_capacity
        self.c_ctl, self.c_data, self.c_cap = completion_control, completion_data, completion_capacity
        self.s_head = _r.load_u64(view, submit_control + HEAD)
        self.s_seen = 0
        self.c_tail = _r.load_u64(view, completion_control + TAIL)
        self.c_seen = 0
        self.error = error

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None

    def _live(self) -> Any:
        if self._view is None:
            raise ValueError("the rings are closed")
        return self._view

    # -- submit ring: consumer ------------------------------------------------------------------

    @property
    def head(self) -> int:
        return self.s_head

    def _published(self) -> None:
        tail = _r.load_u64(self._live(), self.s_ctl + TAIL)
        if tail & 7 or not 0 <= tail - self.s_head <= self.s_cap:
            raise self.error(f"ring tail {tail} is not within a ring of {self.s_cap} bytes "
                             f"ahead of head {self.s_head}")
        self.s_seen = tail

    def next_produce(self) -> tuple[int, int, int, int, int, int] | None:
        view = self._live()
        while True:
            if self.s_head == self.s_seen:
                self._published()
                if self.s_seen == self.s_head:
                    return None
            idx = self.s_head & (self.s_cap - 1)
            length, kind, _ = _ENTRY.unpack_from(view, self.s_data + idx)
            if (length < 8 or length > self.s_cap - idx
                    or _align8(length) > self.s_seen - self.s_head):
                raise self.error(f"ring entry of {length} bytes at {idx} does not fit")
            if kind == PAD:
                if length != self.s_cap - idx:
                    raise self.error(f"PAD entry of {length} bytes at {idx}")
                self.s_head += length
                continue
            break
        at = self.s_data + idx
        if kind != PRODUCE or length < PRODUCE_HEADER_SIZE:
            raise self.error(f"entry kind {kind} of {length} bytes")
        corr, partition, tlen, acks = _FIELDS.unpack_from(view, at + 8)
        if tlen > length - PRODUCE_HEADER_SIZE or acks not in (0, 1, -1):
            raise self.error(f"entry topic length {tlen}, acks {acks}")
        return at, length, corr, partition, tlen, acks

    def advance(self, length: int) -> None:
        self.s_head += _align8(length)

    def release(self, upto: int) -> bool:
        view = self._live()
        _r.store_u64(view, self.s_ctl + HEAD, upto)
        _r.full_fence()
        if _r.load_u32(view, self.s_ctl + PRODUCER_WAITING):
            return bool(_r.exchange_u32(view, self.s_ctl + PRODUCER_WAITING, 0))
        return False

    def set_sleeping(self) -> bool:
        view = self._live()
        _r.exchange_u32(view, self.s_ctl + CONSUMER_SLEEPING, 1)
        self._published()
        if self.s_seen != self.s_head:
            _r.exchange_u32(view, self.s_ctl + CONSUMER_SLEEPING, 0)
            return False
        return True

    # -- completion ring: producer --------------------------------------------------------------

    @property
    def completion_tail(self) -> int:
        return self.c_tail

    def free_space(self) -> int:
        self.c_seen = _r.load_u64(self._live(), self.c_ctl + HEAD)
        return self.c_cap - (self.c_tail - self.c_seen)

    def set_waiting(self) -> None:
        _r.exchange_u32(self._live(), self.c_ctl + PRODUCER_WAITING, 1)

    def answer(self, correlation: int, error_code: int, base_offset: int, log_append_time: int,
               log_start_offset: int, message: bytes) -> int:
        view = self._live()
        size = COMPLETION_HEADER_SIZE + len(message)
        n = _align8(size)
        if n > self.c_cap:
            raise ValueError(f"entry of {size} bytes does not fit a ring of {self.c_cap}")
        idx = self.c_tail & (self.c_cap - 1)
        room = self.c_cap - idx
        need = n if n <= room else room + n
        if need > self.c_cap - (self.c_tail - self.c_seen):
            self.c_seen = _r.load_u64(view, self.c_ctl + HEAD)
            if need > self.c_cap - (self.c_tail - self.c_seen):
                return -1
        start = self.c_tail
        if n > room:
            _ENTRY.pack_into(view, self.c_data + idx, room, PAD, 0)
            start += room
            idx = 0
        at = self.c_data + idx
        _COMPLETION.pack_into(view, at, size, COMPLETION, 0, correlation, error_code, 0,
                              base_offset, log_append_time, log_start_offset)
        if message:
            view[at + COMPLETION_HEADER_SIZE : at + size] = message
        self.c_tail = start + n
        _r.store_u64(view, self.c_ctl + TAIL, self.c_tail)
        _r.full_fence()
        if _r.load_u32(view, self.c_ctl + CONSUMER_SLEEPING):
            return 1 if _r.exchange_u32(view, self.c_ctl + CONSUMER_SLEEPING, 0) else 0
        return 0
