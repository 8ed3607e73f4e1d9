"""Crash and lifecycle behaviour of the broker's processes (reliability.md C1, in small).

* SIGKILL of a worker in the middle of an acks=all idempotent produce stream: the controller
  restarts it (new pid in ``run/broker.json``), every acknowledged message is present exactly
  once, offsets are contiguous, and no batch on disk (or served) has a bad CRC.
* A worker that fails at boot halts the whole broker with one clear error line, no crash loop.
* SIGTERM of the controller stops everything cleanly; SIGKILL of the controller makes the
  orphaned workers exit by themselves (they watch the control channel).
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import crc32c
import psutil
import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 4


# -- helpers ----------------------------------------------------------------------------------


def _create_topic(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Create ``topic``; return {partition: leader node id}."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=10)
    futures[topic].result(15)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=5)
        parts = md.topics[topic].partitions
        if len(parts) == partitions and all(p.leader >= 0 for p in parts.values()):
            return {p: parts[p].leader for p in parts}
        time.sleep(0.2)
    raise AssertionError(f"no leaders for {topic}")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_until(pred, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


def _consume_all(bootstrap: str, topic: str, partitions: int, timeout: float = 30,
                 starts: dict[int, int] | None = None) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of ``topic`` from offset 0 (or ``starts[p]``) up to the high watermark:
    {p: [(offset, value)]}."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "crash-check", "enable.auto.commit": False,
        "check.crcs": True, "isolation.level": "read_uncommitted",
        "enable.partition.eof": True,
    })
    try:
        ends = {}
        for p in range(partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, (starts or {}).get(p, 0))
                         for p in range(partitions)])
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        done = {p for p in range(partitions) if ends[p] == 0}
        deadline = time.monotonic() + timeout
        while len(done) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= ends[msg.partition()]:
                            done.add(msg.partition())
                        continue
                    raise AssertionError(f"consumer error: {msg.error()}")
                out[msg.partition()].append((msg.offset(), msg.value()))
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
        assert len(done) == partitions, (
            f"consumer did not reach the high watermarks {ends} within {timeout} s: "
            f"got {({p: len(v) for p, v in out.items()})}")
        return out
    finally:
        consumer.close()


def _scan_segments(partition_dir: Path) -> list[tuple[int, int]]:
    """Walk every ``.log`` of a partition dir; assert magic 2 and a good CRC-32C for each batch.

    Returns the (base offset, last offset) of each batch, in file order.
    """
    batches = []
    for seg in sorted(partition_dir.glob("*.log")):
        data = seg.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            base, length = struct.unpack_from(">qi", data, pos)
            if length == 0 and not any(data[pos:]):
                break  # zero padding of a preallocated segment
            assert length >= 49, f"{seg}: batch at byte {pos} has length {length}"
            end = pos + 12 + length
            assert end <= len(data), f"{seg}: batch at byte {pos} runs past the end of the file"
            magic = data[pos + 16]
            assert magic == 2, f"{seg}: batch at byte {pos} has magic {magic}"
            (stored,) = struct.unpack_from(">I", data, pos + 17)
            computed = crc32c.crc32c(data[pos + 21:end])
            assert stored == computed, (
                f"{seg}: batch at byte {pos} (base offset {base}) has CRC {stored:#010x}, "
                f"content gives {computed:#010x}")
            (last_delta,) = struct.unpack_from(">i", data, pos + 23)
            batches.append((base, base + last_delta))
            pos = end
        assert pos == len(data) or not any(data[pos:]), (
            f"{seg}: {len(data) - pos} trailing bytes after the last whole batch")
    return batches


def _stop(b: RunningBroker) -> int:
    """Stop the broker (SIGTERM) and release its stdout pipe; the exit code."""
    try:
        return b.stop()
    finally:
        if b.proc.stdout is not None:
            b.proc.stdout.close()


def _worker_dir(b: RunningBroker, node: int) -> Path:
    return b.data_dir / f"worker-{node}"


# -- SIGKILL of a worker mid-stream --------------------------------------------------------------


class _ConfluentStream:
    """An idempotent acks=all librdkafka producer (Produce v10 here)."""

    def __init__(self, bootstrap: str, on_ack, on_fail) -> None:
        def on_delivery(err, msg) -> None:
            if err is not None:
                on_fail(int(msg.value()), str(err))
            else:
                on_ack(int(msg.value()), msg.partition(), msg.offset())

        def on_error(err) -> None:
            if err.fatal():  # e.g. OUT_OF_ORDER_SEQUENCE_NUMBER after the restart
                self.fatal.append(str(err))

        self.on_delivery = on_delivery
        self.fatal: list[str] = []
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "max.in.flight.requests.per.connection": 5, "linger.ms": 2,
            "message.timeout.ms": 60000, "retries": 1_000_000, "retry.backoff.ms": 50,
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "error_cb": on_error,
        })

    def send(self, topic: str, n: int, partition: int) -> None:
        while True:
            try:
                self.producer.produce(topic, value=str(n).encode(), partition=partition,
                                      on_delivery=self.on_delivery)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)

    def in_flight(self) -> int:
        return len(self.producer)

    def flush(self, timeout: float) -> int:
        remaining = self.producer.flush(timeout)
        self.producer.poll(0)
        if self.fatal:
            raise AssertionError(f"librdkafka fatal error: {self.fatal}")
        return remaining

    def close(self) -> None:
        self.producer.purge()
        self.producer.flush(1)


class _KafkaPythonStream:
    """kafka-python 3's KafkaProducer: idempotent by default (Produce v9 here)."""

    def __init__(self, bootstrap: str, on_ack, on_fail) -> None:
        from kafka import KafkaProducer

        self.on_ack, self.on_fail = on_ack, on_fail
        self.futures: list = []
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
            retries=1_000_000, max_in_flight_requests_per_connection=5, linger_ms=2,
            delivery_timeout_ms=60000, request_timeout_ms=10000, retry_backoff_ms=50,
            reconnect_backoff_ms=50, reconnect_backoff_max_ms=500)

    def send(self, topic: str, n: int, partition: int) -> None:
        fut = self.producer.send(topic, value=str(n).encode(), partition=partition)
        fut.add_callback(lambda md, n=n: self.on_ack(n, md.partition, md.offset))
        fut.add_errback(lambda exc, n=n: self.on_fail(n, repr(exc)))
        self.futures.append(fut)

    def in_flight(self) -> int:
        return sum(1 for f in self.futures if not f.is_done)

    def flush(self, timeout: float) -> int:
        from kafka.errors import KafkaTimeoutError

        try:
            self.producer.flush(timeout)
        except KafkaTimeoutError:
            pass
        return self.in_flight()

    def close(self) -> None:
        self.producer.close(timeout=5)
        # kafka-python 3.0.12 leaks the socket of each refused connect (kafka/net/inet.py
        # sock_connect raises with the socket still open, kept alive by the traceback's frames):
        # close those never-connected sockets here instead of letting them warn at exit
        del self.producer
        self.futures.clear()
        gc.collect()
        for obj in gc.get_objects():
            if isinstance(obj, socket.socket) and obj.fileno() >= 0:
                try:
                    obj.getpeername()
                except OSError:
                    obj.close()


def _flush(stream, timeout: float, fatal: list[str]) -> int:
    """Messages neither acknowledged nor failed after ``timeout`` (-1: a fatal error, noted)."""
    try:
        return stream.flush(timeout)
    except Exception as exc:  # noqa: BLE001 - a fatal idempotence error surfaces here
        fatal.append(repr(exc))
        return -1


@pytest.mark.parametrize("client", [
    "confluent-kafka",
    "kafka-python",
])
def test_worker_sigkill_mid_idempotent_stream(tmp_path: Path, client: str) -> None:
    b = start_broker(tmp_path / "data", workers=2)
    try:
        _run_worker_kill(b, client)
    finally:
        code = _stop(b)
    assert code == 0, b.log_path.read_text()
    # after a clean stop, every batch on disk has a good CRC and offsets are contiguous
    topic = "crash-stream"
    for p in range(PARTITIONS):
        dirs = list(b.data_dir.glob(f"worker-*/{topic}-{p}"))
        assert len(dirs) == 1, dirs
        batches = _scan_segments(dirs[0])
        expected = 0
        for base, last in batches:
            assert base == expected, f"{dirs[0]}: batch at offset {base}, expected {expected}"
            expected = last + 1


def _run_worker_kill(b: RunningBroker, client: str) -> None:
    topic = "crash-stream"
    leaders = _create_topic(b.bootstrap, topic, PARTITIONS)
    victim = leaders[0]
    assert victim >= 1, f"partition 0 led by node {victim}, expected a worker"
    victim_parts = [p for p, n in leaders.items() if n == victim]
    pids_before = b.worker_pids()
    old_pid = pids_before[victim]
    assert _alive(old_pid)

    acked: dict[int, tuple[int, int]] = {}  # message number -> (partition, offset)
    failed: dict[int, str] = {}
    lock = threading.Lock()

    def on_ack(n: int, partition: int, offset: int) -> None:
        with lock:
            acked[n] = (partition, offset)

    def on_fail(n: int, err: str) -> None:
        with lock:
            failed[n] = err

    cls = _ConfluentStream if client == "confluent-kafka" else _KafkaPythonStream
    stream = cls(b.bootstrap, on_ack, on_fail)
    fatal: list[str] = []
    total, rate = 10_000, 2_500.0  # messages, messages per second
    kill_at = (2_500, 7_500)  # the worker is killed twice: its first and its restarted self
    killed: list[int] = []
    in_flight_at_kill: list[int] = []
    try:
        start = time.monotonic()
        n, end = 0, total
        while n < end and n < 10 * total:
            stream.send(topic, n, n % PARTITIONS)
            n += 1
            if len(killed) < len(kill_at) and n >= kill_at[len(killed)] and n % 25 == 0:
                # the restart takes ~1 s on a quiet box, a few on a loaded one: the stream goes
                # on, and the next kill waits until the restarted worker is up
                pid = b.worker_pids()[victim]
                if pid in killed or not _alive(pid):
                    continue
                in_flight = stream.in_flight()
                if not in_flight:  # all acknowledged already (this thread was descheduled on
                    continue       # a loaded box): kill at the next chance instead
                in_flight_at_kill.append(in_flight)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                end = max(end, n + 2_500)  # keep streaming for a second after every kill
            # pace the stream over a few seconds so most of it runs across the restart
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        remaining = _flush(stream, 90, fatal)
    finally:
        stream.close()
    total = n  # every message sent, the extension after a late restart included
    assert len(killed) == len(kill_at), (
        f"worker {victim} was not restarted in time for kill {len(killed) + 1}: "
        f"broker.json lists {b.worker_pids()}")
    assert min(in_flight_at_kill) > 0, f"nothing in flight at a kill: {in_flight_at_kill}"
    assert not fatal, f"producer hit a fatal error across the worker restart: {fatal}"
    assert remaining == 0, f"{remaining} messages neither acknowledged nor failed after 90 s"

    # the controller restarted the worker: a new pid in broker.json, the old one gone
    assert killed[0] == old_pid
    assert _wait_until(lambda: b.worker_pids().get(victim) not in (None, *killed), 30), (
        f"worker {victim} not restarted: broker.json still lists {b.worker_pids()}")
    new_pid = b.worker_pids()[victim]
    assert _alive(new_pid), f"restarted worker {victim} (pid {new_pid}) is not running"
    assert not any(_alive(p) for p in killed)
    others = {n: p for n, p in b.worker_pids().items() if n != victim}
    assert others == {n: p for n, p in pids_before.items() if n != victim}, (
        "a worker that was not killed was restarted too")
    assert b.proc.poll() is None, "the controller exited"

    # a broker restart is transparent to an idempotent acks=all producer: nothing fails
    assert not failed, (f"{len(failed)} of {total} sends failed across the worker restart, "
                        f"e.g. {sorted(failed.items())[:5]}")
    assert len(acked) == total

    # every acknowledged message exactly once, at the offset it was acknowledged with
    consumed = _consume_all(b.bootstrap, topic, PARTITIONS)
    counts = Counter(int(v) for recs in consumed.values() for _, v in recs)
    dups = {n: c for n, c in counts.items() if c > 1}
    assert not dups, (f"{len(dups)} messages stored more than once "
                      f"(victim partitions {victim_parts}), e.g. {sorted(dups.items())[:10]}")
    missing = sorted(set(acked) - set(counts))
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:10]}"
    unknown = sorted(set(counts) - set(acked) - set(failed))
    assert not unknown, f"records nobody sent: {unknown[:10]}"
    for p, recs in consumed.items():
        offsets = [o for o, _ in recs]
        assert offsets == list(range(len(offsets))), (
            f"partition {p}: offsets not contiguous from 0: first gap near "
            f"{next((i for i, o in enumerate(offsets) if o != i), None)}")
        for o, v in recs:
            n = int(v)
            assert acked[n] == (p, o), (
                f"message {n} acknowledged at {acked[n]}, stored at {(p, o)}")
        # per-partition order of the stream is kept (idempotence with 5 in flight)
        numbers = [int(v) for _, v in recs]
        assert numbers == sorted(numbers), f"partition {p}: records out of order"

    # the broker still serves new produce and consume on the restarted worker
    p2 = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "acks": "all"})
    results: list = []
    for i in range(10):
        p2.produce(topic, value=f"after-{i}".encode(), partition=victim_parts[0],
                   on_delivery=lambda err, msg: results.append((err, msg.offset())))
    assert p2.flush(30) == 0
    assert all(err is None for err, _ in results), results
    after = _consume_all(b.bootstrap, topic, PARTITIONS)
    tail = [v for _, v in after[victim_parts[0]][-10:]]
    assert tail == [f"after-{i}".encode() for i in range(10)]


# -- boot failure --------------------------------------------------------------------------------


def test_worker_boot_failure_halts_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "worker-1").write_text("not a directory\n")  # the worker cannot use its log dir
    log_path = tmp_path / "boot-fail.log"
    with open(log_path, "wb") as err:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "shmq", "broker", "--listeners", "127.0.0.1:0",
             "--workers", "2", "--data-dir", str(data)],
            stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"broker still running 20 s after a worker boot failure:\n"
                        f"{log_path.read_text()}")
    elapsed = time.monotonic() - started
    stderr = log_path.read_text()
    assert proc.returncode != 0, stderr
    assert elapsed < 10, f"took {elapsed:.1f} s to halt"
    assert "shmq broker ready" not in out
    error_lines = [ln for ln in stderr.splitlines() if ln.startswith("Error:")]
    assert len(error_lines) == 1, stderr
    assert "worker 1" in error_lines[0] and "worker-1" in error_lines[0], error_lines
    # no crash loop: worker 1 was started (and failed) exactly once
    assert stderr.count("worker 1 failed to start") <= 2, stderr  # worker's log + the Error line
    # the controller ends with that one line, not with asyncio noise after it
    assert "exception was never retrieved" not in stderr, (
        "controller prints an asyncio 'exception was never retrieved' traceback on halt:\n"
        + stderr)
    assert stderr.rstrip().splitlines()[-1] == error_lines[0], stderr
    # the healthy worker was stopped cleanly, none is left running
    assert (data / "worker-2" / ".kafka_cleanshutdown").exists()
    leftovers = [p.info for p in psutil.process_iter(["pid", "cmdline"])
                 if p.info["cmdline"] and str(data) in " ".join(p.info["cmdline"])]
    assert not leftovers, leftovers


# -- controller signals --------------------------------------------------------------------------


def _produce_some(bootstrap: str, topic: str, partitions: int) -> None:
    _create_topic(bootstrap, topic, partitions)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(200):
        p.produce(topic, value=b"v%d" % i, partition=i % partitions)
    assert p.flush(30) == 0


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid``: the workers and the fork server they are forked from."""
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


def test_controller_sigterm_stops_everything_cleanly(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", workers=2)
    pids = b.worker_pids()
    others = set(_descendants(b.proc.pid)) - set(pids.values())
    assert len(others) <= 1, f"more than a fork server besides the workers: {others}"
    try:
        _produce_some(b.bootstrap, "term", 4)
        assert all(_alive(p) for p in pids.values())
        b.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            code = b.proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("controller did not exit within 30 s of SIGTERM")
        elapsed = time.monotonic() - started
    finally:
        _stop(b)
    assert code == 0, b.log_path.read_text()
    assert elapsed < 10, f"clean stop took {elapsed:.1f} s"
    assert _wait_until(lambda: not any(_alive(p) for p in pids.values()), 5), (
        f"workers left running after the controller exited: {pids}")
    assert not [p for p in others if _alive(p)], f"fork server left running: {others}"
    for node in pids:
        assert (_worker_dir(b, node) / ".kafka_cleanshutdown").exists(), node
    assert not (b.data_dir / "run" / "broker.json").exists()
    for p in range(4):
        dirs = list(b.data_dir.glob(f"worker-*/term-{p}"))
        assert len(dirs) == 1
        assert _scan_segments(dirs[0])


def test_sigterm_with_long_polling_consumers_logs_no_error(tmp_path: Path) -> None:
    """A broker stopped while a group's consumer sits in long-polling Fetches (parked in the
    workers) and heartbeats (the controller): the connections are closed before the
    processes' tables, so the handlers end quietly (they logged "internal error ... metrics
    writer is released" tracebacks), and everything exits 0."""
    b = start_broker(tmp_path / "data", workers=2)
    stop = threading.Event()
    assigned = threading.Event()
    errors: list[str] = []

    def consume() -> None:
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "quiet",
                      "auto.offset.reset": "latest", "fetch.wait.max.ms": 5000,
                      "log_level": 0})
        c.subscribe(["quiet"], on_assign=lambda _c, _ps: assigned.set())
        try:
            while not stop.is_set():
                m = c.poll(0.2)
                if m is not None and m.error() is not None and not assigned.is_set():
                    errors.append(str(m.error()))
        finally:
            c.close()

    try:
        _produce_some(b.bootstrap, "quiet", 4)
        t = threading.Thread(target=consume)
        t.start()
        try:
            assert assigned.wait(30), errors
            time.sleep(1.5)  # fetches parked on both workers (nothing new to read)
            b.proc.send_signal(signal.SIGTERM)
            code = b.proc.wait(30)
        finally:
            stop.set()
            t.join(30)
    finally:
        _stop(b)
    log = b.log_path.read_text()
    assert code == 0, log
    bad = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
    assert not bad, "\n".join(bad)


def test_controller_sigkill_orphans_exit(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", workers=2)
    pids = b.worker_pids()
    everyone = _descendants(b.proc.pid)  # the workers and the fork server
    assert set(pids.values()) <= set(everyone)
    try:
        _produce_some(b.bootstrap, "orphan", 2)
        assert all(_alive(p) for p in pids.values())
        b.proc.kill()
        _stop(b)
        killed = time.monotonic()
        gone = _wait_until(lambda: not any(_alive(p) for p in everyone), 5)
        elapsed = time.monotonic() - killed
        alive = [p for p in everyone if _alive(p)]
    finally:
        _stop(b)
        for p in everyone:  # never leave an orphan behind, whatever happened
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    assert gone, f"processes still running 5 s after the controller was killed: {alive}"
    assert elapsed < 5
    # the data dir is usable again: a new broker starts on it and recovers the logs
    b2 = start_broker(b.data_dir, workers=2)
    try:
        consumed = _consume_all(b2.bootstrap, "orphan", 2)
        assert sum(len(v) for v in consumed.values()) == 200
    finally:
        code = _stop(b2)
    assert code == 0, b2.log_path.read_text()


# -- how workers start -------------------------------------------------------------------------


def _restart(b: RunningBroker, node: int) -> int:
    """SIGKILL worker ``node``; the pid of the worker the controller starts in its place."""
    old = b.worker_pids()[node]
    os.kill(old, signal.SIGKILL)
    assert _wait_until(lambda: b.worker_pids().get(node) not in (None, old)
                       and _alive(b.worker_pids()[node]), 30), b.log_path.read_text()
    return b.worker_pids()[node]


def _serves(b: RunningBroker, topic: str, partitions: int) -> None:
    """Create ``topic``, produce to every partition with acks=all and read it all back."""
    _create_topic(b.bootstrap, topic, partitions)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for i in range(20):
        p.produce(topic, value=b"x%d" % i, partition=i % partitions)
    assert p.flush(30) == 0
    assert sum(len(v) for v in _consume_all(b.bootstrap, topic, partitions).values()) >= 20


def _fork_server(b: RunningBroker) -> int:
    (server,) = set(_descendants(b.proc.pid)) - set(b.worker_pids().values())
    return server


def _started_by(b: RunningBroker) -> dict[int, str]:
    return {w["node_id"]: w["started_by"] for w in b.run_info["workers"]}


def test_workers_are_forks_of_the_fork_server_and_children_of_the_controller(
        tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", workers=2)
    try:
        def check(node: int, pid: int) -> None:
            worker = psutil.Process(pid)
            assert worker.ppid() == b.proc.pid  # re-parented to the controller
            assert " ".join(worker.cmdline()).strip() == f"shmq worker {node} {b.data_dir}"

        assert _started_by(b) == {1: "fork", 2: "fork"}
        for node, pid in b.worker_pids().items():
            check(node, pid)
        check(1, _restart(b, 1))
        assert _started_by(b) == {1: "fork", 2: "fork"}
        server = _fork_server(b)
        assert " ".join(psutil.Process(server).cmdline()).strip() == f"shmq fork-server {b.data_dir}"
        _serves(b, "forked", 2)
    finally:
        code = _stop(b)
    assert code == 0, b.log_path.read_text()


def test_a_dead_fork_server_falls_back_to_exec(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", workers=2)
    try:
        server = _fork_server(b)
        os.kill(server, signal.SIGKILL)
        assert _wait_until(lambda: not _alive(server), 5)
        pid = _restart(b, 2)
        assert _started_by(b) == {1: "fork", 2: "exec"}
        assert psutil.Process(pid).ppid() == b.proc.pid
        assert "fork server failed" in b.log_path.read_text()
        _serves(b, "execd", 2)
    finally:
        code = _stop(b)
    assert code == 0, b.log_path.read_text()


def test_a_crash_loop_backs_off_and_never_halts_the_broker(tmp_path: Path) -> None:
    """Seven kills of one worker, each right after it came back: the controller restarts it
    every time (after a doubling delay from the third death in a row), the other worker is never
    touched, and the broker keeps serving.  (It used to halt after 5 deaths in a minute.)"""
    b = start_broker(tmp_path / "data", workers=2)
    try:
        other = b.worker_pids()[2]
        for _ in range(7):
            _restart(b, 1)
        assert b.proc.poll() is None, b.log_path.read_text()
        assert b.worker_pids()[2] == other
        log = b.log_path.read_text()
        assert "restarting it in 0.1 s" in log and "restarting it in 1.6 s" in log, log
        _serves(b, "after-loop", 2)
    finally:
        code = _stop(b)
    assert code == 0, b.log_path.read_text()
