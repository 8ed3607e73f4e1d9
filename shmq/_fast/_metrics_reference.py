"""Pure-Python twin of ``shmq._fast.metrics``: the same counters at the same words.

It holds the metrics layout's constants (the compiled module repeats them and a parity test
checks they agree) and is the oracle for which word each call touches, and the fallback when the
extension is not built.  The full layout is drawn in ``shmq/ipc/metrics_table.py``, its owner.

Every value is a native-order u64 word with exactly one writer (a process's region: that
process; a partition's slot: its leader worker).  A word is read and written whole through a
``Q`` memoryview (an aligned 8-byte copy), so a reader in another process never sees half of
one; counters only grow, and a reader takes differences.
"""

from __future__ import annotations

from typing import Any

# -- histogram ---------------------------------------------------------------------------------
# Upper bounds in nanoseconds (Prometheus' "le"), a 1-2.5-5 series from 10 us to 10 s; the last
# bucket is +Inf.  Words of one histogram: the bucket counts (not cumulative), then the sum in ns.
BUCKET_BOUNDS_NS = (
    10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 25_000_000, 50_000_000,
    100_000_000, 250_000_000, 500_000_000, 1_000_000_000, 2_500_000_000, 5_000_000_000,
    10_000_000_000,
)
BUCKETS = len(BUCKET_BOUNDS_NS) + 1        # 20, the last one +Inf
HIST_SUM = BUCKETS                         # word of the sum (ns)
HIST_WORDS = 24                            # buckets, sum, 3 spare

# -- a process's region (word offsets) ----------------------------------------------------------
# scalars
CONNECTIONS_OPENED = 0
CONNECTIONS_CLOSED = 1       # at boot a process sets it to CONNECTIONS_OPENED: its old ones died
FSYNCS = 2
PRODUCE_WAITS_STARTED = 3    # acks=all requests that waited for the group commit (purgatory)
PRODUCE_WAITS_DONE = 4
FETCH_WAITS_STARTED = 5      # fetches that long-polled
FETCH_WAITS_DONE = 6
PROTOCOL_ERRORS = 7          # connections closed for a malformed or unsupported request
FAILED_PRODUCE_OTHER = 8     # failed partitions without a slot (unknown topic or partition)
FAILED_FETCH_OTHER = 9
PID = 10                     # written at boot by the process itself
BOOT_TIME_MS = 11            # wall clock ms of that boot
SCALARS = 64
# histograms
FSYNC_HIST = SCALARS                          # fsync (or group commit) time
PRODUCE_WAIT_HIST = FSYNC_HIST + HIST_WORDS   # time a produce request waited in purgatory
FETCH_WAIT_HIST = PRODUCE_WAIT_HIST + HIST_WORDS
# per API key and version: requests
API_SLOTS = 128
VERSION_SLOTS = 32
REQUESTS = 256
# per API key and error code (code + 1: UNKNOWN_SERVER_ERROR -1 is column 0)
ERROR_SLOTS = 192
ERRORS = REQUESTS + API_SLOTS * VERSION_SLOTS
# per API key and phase: latency histograms (Kafka's RequestMetrics times)
PHASES = ("total", "queue", "local", "remote", "send")
TOTAL, QUEUE, LOCAL, REMOTE, SEND = range(5)
LATENCY = ERRORS + API_SLOTS * ERROR_SLOTS
REGION_WORDS_USED = LATENCY + API_SLOTS * len(PHASES) * HIST_WORDS
REGION_WORDS = -(-REGION_WORDS_USED // 512) * 512   # whole 4 KiB pages

# -- a partition's slot ---------------------------------------------------------------------------
P_MESSAGES_IN = 0
P_BYTES_IN = 1
P_MESSAGES_OUT = 2
P_BYTES_OUT = 3
P_PRODUCE_REQUESTS = 4       # Kafka counts these per partition (ReplicaManager.appendToLocalLog)
P_FETCH_REQUESTS = 5
P_FAILED_PRODUCE = 6
P_FAILED_FETCH = 7
P_SIZE_BYTES = 8             # gauge, written about once a second
P_SEGMENTS = 9               # gauge
PARTITION_WORDS = 16


def bucket_of(ns: int) -> int:
    """The histogram bucket of a duration: the first bound it does not exceed."""
    for i, bound in enumerate(BUCKET_BOUNDS_NS):
        if ns <= bound:
            return i
    return BUCKETS - 1


class MetricsWriter:
    """One writer's view of a metrics table: its own region and the partitions' slots.

    ``buf`` is the whole table (a writable buffer), ``region_word`` the first word of this
    process's region and ``partitions_word`` the first word of the partition slots."""

    def __init__(self, buf: Any, region_word: int, partitions_word: int,
                 partition_slots: int) -> None:
        self._owner = buf
        self.words = memoryview(buf).cast("Q")
        self.region = region_word
        self.partitions = partitions_word
        self.partition_slots = partition_slots

    def _add(self, word: int, value: int) -> None:
        w = self.words
        w[word] = (w[word] + value) & 0xFFFFFFFFFFFFFFFF

    def _observe(self, word: int, ns: int) -> None:
        if ns < 0:
            ns = 0
        self._add(word + bucket_of(ns), 1)
        self._add(word + HIST_SUM, ns)

    def add(self, index: int, value: int = 1) -> None:
        """A region scalar grows by ``value``."""
        if not 0 <= index < SCALARS:
            raise IndexError(index)
        self._add(self.region + index, value)

    def set(self, index: int, value: int) -> None:
        if not 0 <= index < SCALARS:
            raise IndexError(index)
        self.words[self.region + index] = value & 0xFFFFFFFFFFFFFFFF

    def get(self, index: int) -> int:
        if not 0 <= index < SCALARS:
            raise IndexError(index)
        return int(self.words[self.region + index])

    def observe(self, hist: int, ns: int) -> None:
        """One duration into the region histogram starting at word ``hist`` (FSYNC_HIST, ...)."""
        if hist not in (FSYNC_HIST, PRODUCE_WAIT_HIST, FETCH_WAIT_HIST):
            raise IndexError(hist)
        self._observe(self.region + hist, ns)

    def request(self, api: int, version: int, t_arrived: int, t_started: int, t_handled: int,
                t_sent: int, remote_ns: int) -> None:
        """One request: its count by API and version and its five times (ns timestamps)."""
        if not 0 <= api < API_SLOTS:
            return
        if 0 <= version < VERSION_SLOTS:
            self._add(self.region + REQUESTS + api * VERSION_SLOTS + version, 1)
        local = t_handled - t_started - remote_ns
        base = self.region + LATENCY + api * len(PHASES) * HIST_WORDS
        self._observe(base + TOTAL * HIST_WORDS, t_sent - t_arrived)
        self._observe(base + QUEUE * HIST_WORDS, t_started - t_arrived)
        self._observe(base + LOCAL * HIST_WORDS, local)
        self._observe(base + REMOTE * HIST_WORDS, remote_ns)
        self._observe(base + SEND * HIST_WORDS, t_sent - t_handled)

    def error(self, api: int, code: int) -> None:
        if 0 <= api < API_SLOTS and 0 <= code + 1 < ERROR_SLOTS:
            self._add(self.region + ERRORS + api * ERROR_SLOTS + code + 1, 1)

    def _slot(self, slot: int) -> int:
        if 0 <= slot < self.partition_slots:
            return self.partitions + slot * PARTITION_WORDS
        return -1

    def produced(self, slot: int, messages: int, nbytes: int) -> None:
        base = self._slot(slot)
        if base >= 0:
            self._add(base + P_MESSAGES_IN, messages)
            self._add(base + P_BYTES_IN, nbytes)
            self._add(base + P_PRODUCE_REQUESTS, 1)

    def fetched(self, slot: int, messages: int, nbytes: int) -> None:
        base = self._slot(slot)
        if base >= 0:
            self._add(base + P_MESSAGES_OUT, messages)
            self._add(base + P_BYTES_OUT, nbytes)
            self._add(base + P_FETCH_REQUESTS, 1)

    def produce_failed(self, slot: int) -> None:
        base = self._slot(slot)
        if base >= 0:
            self._add(base + P_PRODUCE_REQUESTS, 1)
            self._add(base + P_FAILED_PRODUCE, 1)
        else:
            self._add(self.region + FAILED_PRODUCE_OTHER, 1)

    def fetch_failed(self, slot: int) -> None:
        base = self._slot(slot)
        if base >= 0:
            self._add(base + P_FETCH_REQUESTS, 1)
            self._add(base + P_FAILED_FETCH, 1)
        else:
            self._add(self.region + FAILED_FETCH_OTHER, 1)

    def partition_gauges(self, slot: int, size_bytes: int, segments: int) -> None:
        base = self._slot(slot)
        if base >= 0:
            self.words[base + P_SIZE_BYTES] = size_bytes
            self.words[base + P_SEGMENTS] = segments

    def partition_value(self, slot: int, field: int) -> int:
        base = self._slot(slot)
        return int(self.words[base + field]) if base >= 0 else 0

    def release(self) -> None:
        self.words.release()
