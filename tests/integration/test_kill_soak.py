"""Random worker kill -9 under an idempotent acks=all stream (reliability.md C1, on one host).

A soak, run on demand (``make test-slow`` or ``pytest -m slow``); the default run keeps the
two-kill version in ``test_worker_crash.py``.  Replication factor 1: there is no failover to
another replica, the controller restarts the killed worker and it recovers its logs.

* A confluent-kafka idempotent producer (acks=all, 5 in flight) sends numbered messages to 6
  partitions at ``SHMQ_SOAK_RATE`` msg/s (default 2,000) for ``SHMQ_SOAK_SECONDS`` (default 120).
* A killer thread SIGKILLs a random worker after an exponentially distributed pause (mean 6 s,
  clipped to 2..12 s), waits for its restart, and goes on.  ``SHMQ_SOAK_SEED`` fixes the choices.
* A consumer (``assign`` from offset 0, ``check.crcs``) reads through every kill.

Pass: every acknowledged message is stored exactly once, at the offset it was acknowledged
with, in send order per partition, offsets contiguous; nothing failed; no record the live
consumer saw changed afterwards (no offset reused with other content); every batch on disk has a
good CRC; the killed workers, and only they, were restarted; the producer's first acknowledgement
from a killed worker's partitions came back within ``RESTORE_WITHIN`` of the kill.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, KafkaError, TopicPartition
from test_worker_crash import (
    _alive,
    _ConfluentStream,
    _consume_all,
    _create_topic,
    _flush,
    _scan_segments,
    _stop,
    _wait_until,
)

SECONDS = float(os.environ.get("SHMQ_SOAK_SECONDS", "120"))
RATE = float(os.environ.get("SHMQ_SOAK_RATE", "2000"))
SEED = int(os.environ.get("SHMQ_SOAK_SEED", str(random.randrange(1 << 30))))
PARTITIONS = 6
MEAN_PAUSE, MIN_PAUSE, MAX_PAUSE = 6.0, 2.0, 12.0  # seconds between kills
RESTORE_WITHIN = 15.0  # kill -> first acknowledgement from that worker's partitions (loose: 2 cores)


class _Killer(threading.Thread):
    """SIGKILL a random worker, wait for the controller to restart it, pause, repeat."""

    def __init__(self, b: RunningBroker, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.b, self.rng = b, rng
        self.stop = threading.Event()
        self.kills: list[tuple[float, int, int]] = []  # (monotonic time, node, pid)
        self.problems: list[str] = []

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - e.g. broker.json gone: the broker halted
            self.problems.append(f"killer stopped: {exc!r}")

    def _run(self) -> None:
        while not self.stop.wait(min(MAX_PAUSE, max(MIN_PAUSE,
                                                    self.rng.expovariate(1 / MEAN_PAUSE)))):
            pids = self.b.worker_pids()
            node = self.rng.choice(sorted(pids))
            pid = pids[node]
            if not _alive(pid):
                self.problems.append(f"worker {node} (pid {pid}) was not running before a kill")
                return
            os.kill(pid, signal.SIGKILL)
            self.kills.append((time.monotonic(), node, pid))
            if not _wait_until(lambda node=node, pid=pid: self._restarted(node, pid), 30):
                self.problems.append(f"worker {node} not restarted within 30 s of a kill")
                return


    def _restarted(self, node: int, old_pid: int) -> bool:
        pid = self.b.worker_pids().get(node)
        return pid not in (None, old_pid) and _alive(pid)


class _LiveConsumer(threading.Thread):
    """Read every partition from offset 0 while the workers are being killed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.seen: dict[tuple[int, int], bytes] = {}
        self.changed: list[str] = []
        self.errors: Counter[str] = Counter()
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": "soak-live", "enable.auto.commit": False,
            "check.crcs": True, "enable.partition.eof": False,
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
        })
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for msg in self.consumer.consume(1000, 0.2):
                    err = msg.error()
                    if err is not None:
                        self.errors[KafkaError(err.code()).name()] += 1
                        continue
                    key = (msg.partition(), msg.offset())
                    old = self.seen.setdefault(key, msg.value())
                    if old != msg.value():
                        self.changed.append(f"{key}: {old!r} then {msg.value()!r}")
        finally:
            self.consumer.close()


@pytest.mark.slow
@pytest.mark.timeout(int(SECONDS) + 400)  # the stream, its flush (<= 120 s) and the checks
def test_random_worker_kills_under_idempotent_acks_all(tmp_path: Path) -> None:
    print(f"soak: {SECONDS:.0f} s at {RATE:.0f} msg/s, seed {SEED} (SHMQ_SOAK_SEED)")
    b = start_broker(tmp_path / "data", workers=2)
    try:
        _soak(b, random.Random(SEED))
    finally:
        code = _stop(b)
    assert code == 0, b.log_path.read_text()[-4000:]
    for p in range(PARTITIONS):  # after a clean stop: good CRCs, contiguous offsets on disk
        (pdir,) = b.data_dir.glob(f"worker-*/soak-{p}")
        expected = 0
        for base, last in _scan_segments(pdir):
            assert base == expected, f"{pdir}: batch at offset {base}, expected {expected}"
            expected = last + 1


def _soak(b: RunningBroker, rng: random.Random) -> None:
    topic = "soak"
    leaders = _create_topic(b.bootstrap, topic, PARTITIONS)
    pids_before = b.worker_pids()
    sent_at: list[float] = []
    acked: dict[int, tuple[int, int, float]] = {}  # n -> (partition, offset, ack time)
    failed: dict[int, str] = {}
    lock = threading.Lock()

    def on_ack(n: int, partition: int, offset: int) -> None:
        with lock:
            acked[n] = (partition, offset, time.monotonic())

    def on_fail(n: int, err: str) -> None:
        with lock:
            failed[n] = err

    stream = _ConfluentStream(b.bootstrap, on_ack, on_fail)
    live = _LiveConsumer(b.bootstrap, topic)
    killer = _Killer(b, rng)
    live.start()
    killer.start()
    fatal: list[str] = []
    try:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < SECONDS and n < int(SECONDS * RATE) + 1:
            sent_at.append(time.monotonic())
            stream.send(topic, n, n % PARTITIONS)
            n += 1
            delay = start + n / RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        killer.stop.set()
        killer.join(60)
        remaining = _flush(stream, 120, fatal)
    finally:
        killer.stop.set()
        stream.close()
    total = n
    kills = killer.kills
    print(f"soak: {total} sent, {len(acked)} acknowledged, {len(kills)} kills "
          f"({Counter(node for _, node, _ in kills)} by node)")
    assert not killer.problems, killer.problems
    assert len(kills) >= max(2, int(SECONDS / (MAX_PAUSE + 5))), f"only {len(kills)} kills"
    assert not fatal, f"producer hit a fatal error: {fatal}"
    assert remaining == 0, f"{remaining} messages neither acknowledged nor failed after 120 s"
    assert not failed, f"{len(failed)} sends failed, e.g. {sorted(failed.items())[:5]}"
    assert len(acked) == total

    # only the killed workers were restarted, each once per kill
    final_pids = b.worker_pids()
    assert b.proc.poll() is None, "the controller exited"
    assert all(_alive(p) for p in final_pids.values())
    for node, pid in final_pids.items():
        if node in {k for _, k, _ in kills}:
            assert pid not in [p for _, _, p in kills]
        else:
            assert pid == pids_before[node], f"worker {node} was restarted without being killed"

    # kill -> first acknowledgement, from a message sent after the kill, on that worker's
    # partitions (the restart plus the producer's reconnect)
    restore = []
    for t_kill, node, _ in kills:
        parts = {p for p, leader in leaders.items() if leader == node}
        firsts = [t_ack for m, (p, _, t_ack) in acked.items()
                  if p in parts and sent_at[m] > t_kill]
        if firsts:
            restore.append(min(firsts) - t_kill)
    if restore:
        restore.sort()
        print(f"soak: kill -> first acknowledgement p50 {statistics.median(restore):.2f} s, "
              f"max {restore[-1]:.2f} s over {len(restore)} kills")
        assert restore[-1] <= RESTORE_WITHIN, restore

    # every acknowledged message exactly once, where it was acknowledged, in order
    final = _consume_all(b.bootstrap, topic, PARTITIONS, timeout=120)
    counts = Counter(int(v) for recs in final.values() for _, v in recs)
    dups = {m: c for m, c in counts.items() if c > 1}
    assert not dups, f"{len(dups)} messages stored more than once, e.g. {sorted(dups.items())[:10]}"
    missing = sorted(set(acked) - set(counts))
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:10]}"
    for p, recs in final.items():
        offsets = [o for o, _ in recs]
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets not contiguous"
        for o, v in recs:
            assert acked[int(v)][:2] == (p, o), (
                f"message {int(v)} acknowledged at {acked[int(v)][:2]}, stored at {(p, o)}")
        numbers = [int(v) for _, v in recs]
        assert numbers == sorted(numbers), f"partition {p}: records out of order"

    # what the live consumer read during the kills is what is stored now
    _wait_until(lambda: len(live.seen) >= total, 60)
    live.stop.set()
    live.join(30)
    print(f"soak: live consumer read {len(live.seen)} records; errors seen {dict(live.errors)}")
    assert not live.changed, f"records changed under a reader: {live.changed[:5]}"
    stored = {(p, o): v for p, recs in final.items() for o, v in recs}
    differ = [k for k, v in live.seen.items() if stored.get(k) != v]
    assert not differ, f"{len(differ)} records read live differ from the stored ones: {differ[:5]}"
    assert len(live.seen) == total, f"live consumer read {len(live.seen)} of {total}"
    bad_crc = {name: c for name, c in live.errors.items() if "CRC" in name or "CORRUPT" in name
               or "BAD_MSG" in name}
    assert not bad_crc, f"the live consumer was served corrupt records: {bad_crc}"
