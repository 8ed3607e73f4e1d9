"""The metrics table: layout, ownership, the compiled writer against its twin, quantiles, and
the exposition read back by prometheus_client's parser."""

from __future__ import annotations

import bisect
import os
import random
import stat

import numpy as np
import pytest

from shmq._fast import HAVE_FAST
from shmq._fast import _metrics_reference as L
from shmq.ipc.metrics_table import METRICS_PREFIX, MetricsTable, MetricsTableError
from shmq.ipc.state_table import ShmTracker, StateTableError
from shmq.monitor.collector import Collector, quantile
from shmq.monitor.exposition import render


@pytest.fixture
def table():
    t = MetricsTable.create(3, 64)
    try:
        yield t
    finally:
        t.unlink()
        t.close()


def test_layout_constants_agree_with_the_compiled_module() -> None:
    if not HAVE_FAST:
        pytest.skip("extension not built")
    from shmq._fast import metrics

    for name in ("BUCKETS", "HIST_SUM", "HIST_WORDS", "SCALARS", "FSYNC_HIST",
                 "PRODUCE_WAIT_HIST", "FETCH_WAIT_HIST", "API_SLOTS", "VERSION_SLOTS",
                 "ERROR_SLOTS", "REQUESTS", "ERRORS", "LATENCY", "PARTITION_WORDS",
                 "FAILED_PRODUCE_OTHER", "FAILED_FETCH_OTHER"):
        assert getattr(metrics, name) == getattr(L, name), name
    assert metrics.BUCKET_BOUNDS_NS == L.BUCKET_BOUNDS_NS
    assert metrics.N_PHASES == len(L.PHASES)
    assert L.REGION_WORDS % 512 == 0 and L.REGION_WORDS >= L.REGION_WORDS_USED
    assert L.PRODUCE_WAIT_HIST + L.HIST_WORDS == L.FETCH_WAIT_HIST
    assert L.FETCH_WAIT_HIST + L.HIST_WORDS <= L.REQUESTS


def test_bucket_of_is_bisect() -> None:
    from shmq._fast import MetricsWriter  # noqa: F401  (the compiled one when built)

    fast = __import__("shmq._fast.metrics", fromlist=["bucket_of"]).bucket_of if HAVE_FAST \
        else L.bucket_of
    rng = random.Random(7)
    values = [0, 1, *L.BUCKET_BOUNDS_NS, *(b + 1 for b in L.BUCKET_BOUNDS_NS), 10**12]
    values += [rng.randrange(0, 20_000_000_000) for _ in range(2000)]
    for ns in values:
        expected = bisect.bisect_left(L.BUCKET_BOUNDS_NS, ns)
        assert L.bucket_of(ns) == expected == fast(ns), ns


def test_create_attach_and_owner_rules(table: MetricsTable) -> None:
    assert table.name.startswith(METRICS_PREFIX) and len(table.name) == len(METRICS_PREFIX) + 32
    st = os.stat("/dev/shm" + table.name)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_size == MetricsTable.size_for(3, 64)
    other = MetricsTable.attach(table.name, readonly=False, boot_id=table.boot_id)
    try:
        assert (other.region_count, other.partition_slots) == (3, 64)
        with pytest.raises(MetricsTableError):
            other.unlink()
    finally:
        other.close()
    with pytest.raises(MetricsTableError, match="another broker run"):
        MetricsTable.attach(table.name, boot_id=b"x" * 16)
    ro = MetricsTable.attach(table.name)
    try:
        with pytest.raises(StateTableError):
            ro.writer(1)
    finally:
        ro.close()


def test_attach_refuses_a_bad_header_or_size(table: MetricsTable) -> None:
    path = "/dev/shm" + table.name
    with open(path, "r+b") as f:
        f.write(b"NOTMX!!!")
    with pytest.raises(MetricsTableError, match="bad magic"):
        MetricsTable.attach(table.name)
    with open(path, "r+b") as f:
        f.write(b"SHMQMX01")
        f.truncate(MetricsTable.size_for(3, 64) - 8)
    with pytest.raises(MetricsTableError, match="do not hold"):
        MetricsTable.attach(table.name)


def test_tracker_and_unlink() -> None:
    tracker = ShmTracker()
    t = MetricsTable.create(2, 8, tracker=tracker)
    assert t.name in tracker
    with t:
        pass
    assert t.name not in tracker and t.closed
    assert not os.path.exists("/dev/shm" + t.name)


def _drive(writer, rng: random.Random) -> None:
    """The same random events through any writer."""
    for _ in range(3000):
        kind = rng.randrange(9)
        if kind == 0:
            writer.add(rng.randrange(L.SCALARS), rng.randrange(1, 1000))
        elif kind == 1:
            writer.observe(rng.choice([L.FSYNC_HIST, L.PRODUCE_WAIT_HIST, L.FETCH_WAIT_HIST]),
                           rng.randrange(-5, 20_000_000_000))
        elif kind == 2:
            t0 = rng.randrange(10**9)
            t1 = t0 + rng.randrange(10**6)
            t2 = t1 + rng.randrange(10**8)
            writer.request(rng.randrange(-2, 140), rng.randrange(-1, 40), t0, t1, t2,
                           t2 + rng.randrange(10**6), rng.randrange(0, max(1, t2 - t1)))
        elif kind == 3:
            writer.error(rng.randrange(-2, 140), rng.randrange(-3, 200))
        elif kind == 4:
            writer.produced(rng.randrange(-3, 70), rng.randrange(1000), rng.randrange(10**6))
        elif kind == 5:
            writer.fetched(rng.randrange(-3, 70), rng.randrange(1000), rng.randrange(10**6))
        elif kind == 6:
            writer.produce_failed(rng.randrange(-3, 70))
        elif kind == 7:
            writer.fetch_failed(rng.randrange(-3, 70))
        else:
            writer.partition_gauges(rng.randrange(-3, 70), rng.randrange(10**9),
                                    rng.randrange(100))


@pytest.mark.skipif(not HAVE_FAST, reason="extension not built")
def test_compiled_writer_writes_the_twins_words() -> None:
    """Same events, same words: the twin is the oracle of which word each call touches."""
    from shmq._fast.metrics import MetricsWriter as Fast

    size = MetricsTable.size_for(3, 64)
    a, b = bytearray(size), bytearray(size)
    region, parts = 8 + L.REGION_WORDS, 8 + 3 * L.REGION_WORDS
    fast, twin = Fast(a, region, parts, 64), L.MetricsWriter(b, region, parts, 64)
    _drive(fast, random.Random(1))
    _drive(twin, random.Random(1))
    fast.release()
    twin.release()
    assert a == b
    assert any(a)


def test_writer_marks_its_boot(table: MetricsTable) -> None:
    w = table.writer(1)
    w.add(L.CONNECTIONS_OPENED, 5)
    w.add(L.CONNECTIONS_CLOSED, 2)
    w.add(L.PRODUCE_WAITS_STARTED, 3)
    w2 = table.writer(1)   # the process restarted: its 3 open connections died with it
    assert w2.get(L.CONNECTIONS_CLOSED) == 5 and w2.get(L.PRODUCE_WAITS_DONE) == 3
    assert w2.get(L.PID) == os.getpid()


def test_reset_partition_zeroes_one_slot(table: MetricsTable) -> None:
    w = table.writer(2)
    w.produced(5, 10, 1000)
    w.produced(6, 1, 1)
    table.reset_partition(5)
    _, parts = table.snapshot()
    assert parts[5].sum() == 0 and parts[6][L.P_MESSAGES_IN] == 1


def test_quantile_matches_numpy_within_a_bucket() -> None:
    """histogram_quantile's interpolation: the answer lies in the bucket that holds the true
    quantile of the observations."""
    rng = np.random.default_rng(3)
    obs = rng.lognormal(mean=13, sigma=1.5, size=20000).astype(np.int64)   # ns, ~0.4 ms
    buckets = np.zeros(L.BUCKETS, dtype=np.uint64)
    for ns in obs:
        buckets[L.bucket_of(int(ns))] += 1
    for q in (0.5, 0.9, 0.99, 0.999):
        true = float(np.quantile(obs, q))
        b = L.bucket_of(int(true))
        low = L.BUCKET_BOUNDS_NS[b - 1] if b else 0
        high = L.BUCKET_BOUNDS_NS[b] if b < len(L.BUCKET_BOUNDS_NS) else 10**13
        assert low / 1e9 <= quantile(buckets, q) <= high / 1e9, q
    assert quantile(np.zeros(L.BUCKETS, dtype=np.uint64), 0.5) == 0.0


def test_exposition_is_valid_text_format(table: MetricsTable) -> None:
    """/metrics for a table with traffic, read back by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    w = table.writer(1)
    w.produced(0, 100, 10_000)
    w.fetched(0, 40, 4_000)
    w.request(0, 9, 0, 10_000, 200_000, 250_000, 50_000)
    w.error(0, 6)
    collector = Collector(table, None)
    view = {"processes": [{"name": "worker-1", "node_id": 1, "pid": os.getpid(), "alive": True,
                           "restarts": 2}],
            "topics": [{"name": 'we"ird\\topic', "internal": False, "partitions": [
                {"partition": 0, "slot": 0, "leader": 1, "leader_epoch": 0, "replicas": [1],
                 "isr": [1]}]}],
            "groups": [], "brokers": [0, 1], "cluster_id": "c", "bootstrap": "b",
            "metrics": True}
    collector.sample(view)
    text = render(collector, view).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("kafka_server_brokertopicmetrics_messagesin_total",
                    (("topic", 'we"ird\\topic'),))] == 100
    assert samples[("kafka_server_brokertopicmetrics_messagesin_total", ())] == 100
    assert samples[("kafka_server_brokertopicmetrics_bytesout_total", ())] == 4000
    assert samples[("kafka_network_requestmetrics_requests_total",
                    (("request", "Produce"), ("version", "9")))] == 1
    assert samples[("kafka_network_requestmetrics_errors_total",
                    (("error", "NOT_LEADER_OR_FOLLOWER"), ("request", "Produce")))] == 1
    assert samples[("kafka_network_requestmetrics_totaltimems_count",
                    (("request", "Produce"),))] == 1
    assert samples[("shmq_request_time_seconds_bucket",
                    (("le", "0.00025"), ("phase", "total"), ("request", "Produce")))] == 1
    assert samples[("shmq_process_restarts_total", (("process", "worker-1"),))] == 2


def test_snapshot_partition_counters_are_the_tables_words(table: MetricsTable) -> None:
    """Each partition row of a snapshot, and its topic's sums, hold the slot's words of the
    table (read element by element here: the collector takes them in one numpy step); a slot
    outside the table has no counters."""
    from shmq.monitor.collector import PARTITION_COUNTERS

    w = table.writer(1)
    rng = random.Random(7)
    slots = [0, 3, 1, 2]
    for slot in slots:
        for _ in range(rng.randrange(1, 5)):
            w.produced(slot, rng.randrange(1, 1000), rng.randrange(1, 10**6))
            w.fetched(slot, rng.randrange(1, 1000), rng.randrange(1, 10**6))
    parts = [{"partition": i, "slot": slot, "leader": 1, "leader_epoch": 0, "replicas": [1],
              "isr": [1]} for i, slot in enumerate(slots + [10**9])]
    view = {"processes": [], "groups": [], "topics": [
        {"name": "t", "internal": False, "partitions": parts}]}
    snap = Collector(table, None).build(view)
    _, words = table.snapshot()
    (topic,) = snap["topics"]
    for row, slot in zip(topic["partition_list"], slots, strict=False):
        assert {k: row[k] for k in PARTITION_COUNTERS} == \
            {k: int(words[slot][word]) for k, word in PARTITION_COUNTERS.items()}
    assert not set(PARTITION_COUNTERS) & set(topic["partition_list"][-1])
    for k, word in PARTITION_COUNTERS.items():
        assert topic[k] == sum(int(words[slot][word]) for slot in slots)
    assert topic["messages_in"] > 0 and topic["bytes_out"] > 0
