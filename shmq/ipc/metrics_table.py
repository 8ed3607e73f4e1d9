"""The broker's metrics table: counters and histograms in one POSIX shared-memory object.

Every broker process counts into it directly: no lock, no system call, one Cython call per event
(``shmq._fast.MetricsWriter``).  The controller owns it and is its only reader that matters: the
collector (``shmq.monitor.collector``) turns it into Prometheus metrics and JSON.

Layout, native byte order, every value a u64 word (``W`` = 8 bytes)::

    header  64 B at 0
       0  magic            8 B  b"SHMQMX01"
       8  version          u32  1
      12  region_count     u32  processes: region 0 the controller, region n worker n
      16  region_words     u32  words per region (a whole number of 4 KiB pages)
      20  partition_slots  u32  as many as the state table has slots (same index)
      24  partition_words  u32  16
      28  reserved         4 B
      32  boot_id          16 B the state table's: both belong to one broker run
      48  reserved         16 B
    region r at 64 + r * region_words * W     (written by process r only)
       word 0..63        scalars: 0 connections opened, 1 connections closed, 2 fsyncs,
                         3/4 produce waits started/done, 5/6 fetch waits started/done,
                         7 protocol errors, 8/9 failed produce/fetch without a partition slot,
                         10 pid, 11 boot time (ms since the epoch)
       word 64           histogram: fsync time                      (24 words each:
       word 88           histogram: produce purgatory wait            20 buckets of the
       word 112          histogram: fetch long-poll wait              bounds below, not
       word 256          requests[api 0..127][version 0..31]          cumulative, then the
       word 4352         errors[api 0..127][error code + 1, 0..191]   sum in ns, 3 spare)
       word 28928        latency[api 0..127][phase 0..4] histograms: total, queue, local,
                         remote, send (Kafka's TotalTimeMs, RequestQueueTimeMs, LocalTimeMs,
                         RemoteTimeMs, ResponseSendTimeMs)
    partition slot i at 64 + region_count * region_words * W + i * 16 * W
                         (written by the partition's leader worker; slot i = state table slot i)
       0 messages in | 1 bytes in | 2 messages out | 3 bytes out | 4 produce requests
       | 5 fetch requests | 6 failed produce | 7 failed fetch | 8 size in bytes (gauge)
       | 9 segments (gauge) | 10..15 reserved

    histogram bucket bounds (ns, "le"): 10 us, 25, 50, 100, 250, 500 us, 1 ms, 2.5, 5, 10, 25,
    50, 100, 250, 500 ms, 1 s, 2.5, 5, 10 s, +Inf

Theory of operation:

* **One owner.**  The controller ``create``-s it beside the state table: exclusive create, mode
  0600 (``fchmod``), an unguessable ``/shmq-mx-<128 random bits>`` name recorded by the same
  ``ShmTracker`` (so a crashed broker's table is removed by the next start), zeroed by the
  kernel.  It alone unlinks; ``close`` (unmap) and ``unlink`` are separate.
* **One writer per word.**  A worker attaches read-write and writes its own region and the
  slots of the partitions it leads.  Counters only grow and survive a worker's restart (the
  table outlives the process); gauges that a dead process cannot have kept right (open
  connections, waiting requests) are differences of two counters, and a booting process sets
  the "closed"/"done" counter to the "opened"/"started" one.  A slot that the metadata hands to
  a new partition is zeroed by the controller before any worker leads it.
* **Readers** take a copy of the words (numpy) and never block a writer: a counter read while it
  grows is the old or the new value; a histogram's buckets and sum may be one event apart.
"""

from __future__ import annotations

import os
import secrets
import struct
import time
from types import TracebackType
from typing import Any

import numpy as np
import posix_ipc

from shmq._fast import MappedFile, MetricsWriter
from shmq._fast import _metrics_reference as L
from shmq.ipc.state_table import (  # the state table's shm helpers: same rules for both
    MODE,
    ShmTracker,
    StateTableError,
    _check_name,
    _check_owner,
    _open,
    _unlink,
)

MAGIC = b"SHMQMX01"
VERSION = 1
HEADER_SIZE = 64
HEADER = struct.Struct("=8sIIIII4x16s")   # magic, version, regions, region words, slots, words
METRICS_PREFIX = "/shmq-mx-"
WORD = 8

assert HEADER.size <= HEADER_SIZE


class MetricsTableError(StateTableError):
    """The metrics table cannot be used as asked (a bad header, size or broker run)."""


class MetricsTable:
    """A mapped metrics table; build one with ``create`` (owner) or ``attach``."""

    def __init__(self, name: str, mapping: MappedFile, region_count: int, partition_slots: int,
                 boot_id: bytes, *, owner: bool, readonly: bool,
                 region_words: int = L.REGION_WORDS) -> None:
        self.name = name
        self.region_count = region_count
        self.partition_slots = partition_slots
        self.region_words = region_words
        self.boot_id = boot_id
        self.owner = owner
        self.readonly = readonly
        self._map: MappedFile | None = mapping
        self._tracker: ShmTracker | None = None
        self._unlinked = False
        self._writers: list[Any] = []

    @staticmethod
    def size_for(region_count: int, partition_slots: int) -> int:
        return HEADER_SIZE + WORD * (region_count * L.REGION_WORDS
                                     + partition_slots * L.PARTITION_WORDS)

    @property
    def partitions_word(self) -> int:
        return HEADER_SIZE // WORD + self.region_count * self.region_words

    def region_word(self, region: int) -> int:
        if not 0 <= region < self.region_count:
            raise IndexError(f"region {region} is not in [0, {self.region_count})")
        return HEADER_SIZE // WORD + region * self.region_words

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def create(cls, region_count: int, partition_slots: int, *, boot_id: bytes | None = None,
               tracker: ShmTracker | None = None) -> MetricsTable:
        """A new zeroed table (we own it) with an unguessable name."""
        if not 1 <= region_count <= 4096 or not 0 <= partition_slots < 2**31:
            raise ValueError("region or slot count out of range")
        name = METRICS_PREFIX + secrets.token_hex(16)
        _check_name(name)
        size = cls.size_for(region_count, partition_slots)
        boot_id = secrets.token_bytes(16) if boot_id is None else boot_id
        shm = _open(name, posix_ipc.O_CREX, size=size)
        mapping = None
        try:
            try:
                os.fchmod(shm.fd, MODE)
                st = os.fstat(shm.fd)
                _check_owner(st, name)
                if st.st_size != size:
                    raise MetricsTableError(f"{name}: size {st.st_size} after create, not {size}")
                mapping = MappedFile(shm.fd, size, True)
            finally:
                shm.close_fd()
            with memoryview(mapping) as view:   # ftruncate zeroed the rest; magic last
                HEADER.pack_into(view, 0, b"\0" * 8, VERSION, region_count, L.REGION_WORDS,
                                 partition_slots, L.PARTITION_WORDS, boot_id)
                view[0:8] = MAGIC
        except BaseException:
            if mapping is not None:
                mapping.close()
            _unlink(name)
            raise
        table = cls(name, mapping, region_count, partition_slots, boot_id, owner=True,
                    readonly=False)
        if tracker is not None:
            tracker.add(name)
            table._tracker = tracker
        return table

    @classmethod
    def attach(cls, name: str, *, readonly: bool = True,
               boot_id: bytes | None = None) -> MetricsTable:
        """Map an existing table after checking owner, mode, header and size."""
        _check_name(name)
        shm = _open(name, 0, read_only=readonly)
        try:
            st = os.fstat(shm.fd)
            _check_owner(st, name)
            size = st.st_size
            if size < HEADER_SIZE:
                raise MetricsTableError(f"{name}: {size} bytes is too small for a metrics table")
            mapping = MappedFile(shm.fd, size, not readonly)
        finally:
            shm.close_fd()
        try:
            magic, version, regions, rwords, slots, pwords, run = HEADER.unpack_from(mapping, 0)
            if magic != MAGIC:
                raise MetricsTableError(f"{name}: bad magic {magic!r}")
            if version != VERSION:
                raise MetricsTableError(f"{name}: version {version}, expected {VERSION}")
            if rwords != L.REGION_WORDS or pwords != L.PARTITION_WORDS:
                raise MetricsTableError(f"{name}: a layout this shmq does not know")
            if size != cls.size_for(regions, slots):
                raise MetricsTableError(f"{name}: {size} bytes do not hold the table")
            if boot_id is not None and run != boot_id:
                raise MetricsTableError(f"{name}: belongs to another broker run")
        except BaseException:
            mapping.close()
            raise
        return cls(name, mapping, regions, slots, run, owner=False, readonly=readonly)

    # -- writing ------------------------------------------------------------------------------

    def writer(self, region: int) -> Any:
        """The ``MetricsWriter`` of process ``region`` (it writes that region and the slots of
        the partitions it leads).  Marks the process's boot: pid and boot time written, its dead
        predecessor's connections and waits closed."""
        if self._map is None:
            raise ValueError("metrics table is closed")
        if self.readonly:
            raise MetricsTableError(f"{self.name} is attached read-only")
        w = MetricsWriter(self._map, self.region_word(region), self.partitions_word,
                          self.partition_slots)
        w.set(L.CONNECTIONS_CLOSED, w.get(L.CONNECTIONS_OPENED))
        w.set(L.PRODUCE_WAITS_DONE, w.get(L.PRODUCE_WAITS_STARTED))
        w.set(L.FETCH_WAITS_DONE, w.get(L.FETCH_WAITS_STARTED))
        w.set(L.PID, os.getpid())
        w.set(L.BOOT_TIME_MS, int(time.time() * 1000))
        self._writers.append(w)
        return w

    def reset_partition(self, slot: int) -> None:
        """Zero a slot that the metadata gives to a new partition (no worker writes it yet)."""
        if self._map is None or not 0 <= slot < self.partition_slots:
            return
        start = (self.partitions_word + slot * L.PARTITION_WORDS) * WORD
        with memoryview(self._map) as view:
            view[start:start + L.PARTITION_WORDS * WORD] = bytes(L.PARTITION_WORDS * WORD)

    # -- reading ------------------------------------------------------------------------------

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the regions (region_count x region_words) and of the partition slots
        (partition_slots x 16), as u64 arrays."""
        if self._map is None:
            raise ValueError("metrics table is closed")
        words = np.frombuffer(self._map, dtype=np.uint64)  # type: ignore[call-overload]
        first = HEADER_SIZE // WORD
        regions = words[first:self.partitions_word].reshape(self.region_count, self.region_words)
        parts = words[self.partitions_word:].reshape(self.partition_slots, L.PARTITION_WORDS)
        out = regions.copy(), parts.copy()
        del words, regions, parts
        return out

    # -- lifetime -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._map is None

    def close(self) -> None:
        """Unmap (idempotent); writers made by ``writer`` are released first."""
        for w in self._writers:
            w.release()
        self._writers.clear()
        if self._map is not None:
            self._map.close()
            self._map = None

    def unlink(self) -> None:
        if not self.owner:
            raise MetricsTableError(f"{self.name}: only the process that created it unlinks it")
        if not self._unlinked:
            _unlink(self.name)
            self._unlinked = True
            if self._tracker is not None:
                self._tracker.discard(self.name)

    def __enter__(self) -> MetricsTable:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self.owner:
                self.unlink()
        finally:
            self.close()

    def __repr__(self) -> str:
        role = "owner" if self.owner else "read-only" if self.readonly else "writer"
        return f"<MetricsTable {self.name} {role} {self.region_count} regions>"
