"""Zero copy: Fetch record bytes leave the workers through ``os.sendfile``.

Two independent witnesses: the workers' own counters (``run/worker-<id>.stats.json``, rewritten
every second; ``RunningBroker.worker_stats``), and, when ``strace`` can attach to the workers,
the ``sendfile`` system calls themselves.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shmq.protocol.records import iter_batches

TOPIC = "zero-copy"
PARTITIONS = 2
MESSAGES = 5_000
VALUE_SIZE = 1_000  # ~5 MB in all


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    """A broker of its own (counters start at zero), stopped cleanly at the end."""
    b = start_broker(tmp_path / "data")
    try:
        yield b
    finally:
        code = b.stop()
        if b.proc.stdout is not None:
            b.proc.stdout.close()
        assert code == 0, b.log_path.read_text()


def segment_bytes(broker: RunningBroker) -> tuple[int, int]:
    """(bytes, records) of every stored batch of TOPIC."""
    size = records = 0
    for p in range(PARTITIONS):
        for seg in broker.data_dir.glob(f"worker-*/{TOPIC}-{p}/*.log"):
            for b in iter_batches(seg.read_bytes()):
                size += b.size
                records += b.records_count
    return size, records


def produce(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS)], operation_timeout=30)[TOPIC].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "compression.type": "none"})
    for i in range(MESSAGES):
        p.produce(TOPIC, value=os.urandom(VALUE_SIZE), key=b"%d" % i, partition=i % PARTITIONS)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def consume_all(bootstrap: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "zero-copy",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    n = 0
    eof: set[int] = set()
    try:
        c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while (n < MESSAGES or len(eof) < PARTITIONS) and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    eof.add(m.partition())
                    continue
                assert len(m.value()) == VALUE_SIZE
                n += 1
    finally:
        c.close()
    return n


def test_fetch_records_go_through_sendfile(broker: RunningBroker) -> None:
    started = time.time()
    # nothing has been fetched yet: the counters are zero, and producing does not move them
    assert all(s["sendfile_bytes"] == 0 and s["sendfile_calls"] == 0
               for s in broker.worker_stats(0))
    produce(broker.bootstrap)
    stored, records = segment_bytes(broker)
    assert records == MESSAGES and stored > MESSAGES * VALUE_SIZE
    # an idle fetch (nothing to send) does not count either
    idle = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "idle",
                     "enable.auto.commit": False})
    try:
        idle.assign([TopicPartition(TOPIC, p, MESSAGES // PARTITIONS)
                     for p in range(PARTITIONS)])
        assert idle.poll(1.5) is None
    finally:
        idle.close()
    produced = time.time()
    before = broker.worker_stats(produced)
    assert all(s["sendfile_bytes"] == 0 and s["sendfile_calls"] == 0 for s in before), before
    assert produced > started

    assert consume_all(broker.bootstrap) == MESSAGES
    consumed = time.time()
    after = broker.worker_stats(consumed)
    sent = sum(s["sendfile_bytes"] for s in after)
    calls = sum(s["sendfile_calls"] for s in after)
    assert calls > 0
    # every stored batch was fetched once (from offset 0 to the end, no overlap)
    assert stored <= sent <= 2 * stored, (stored, sent, after)
    # each worker sent its own partitions' bytes
    for s in after:
        own = sum(b.size for p in range(PARTITIONS)
                  for seg in broker.data_dir.glob(f"worker-{s['node_id']}/{TOPIC}-{p}/*.log")
                  for b in iter_batches(seg.read_bytes()))
        assert own <= s["sendfile_bytes"], (s, own)


STRACE = shutil.which("strace")
# one call per line with -ff (a file per thread, so no "<unfinished ...>" splits)
_SENDFILE = re.compile(r"^sendfile(?:64)?\(\d+, \d+, \[\d+\](?: => \[\d+\])?, (\d+)\)\s+= (-?\d+)",
                       re.M)


def traced_by(pid: int, tracer: int) -> bool:
    """True when every thread of ``pid`` is ptrace-attached by ``tracer``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        m = re.search(r"^TracerPid:\s+(\d+)", status, re.M)
        if m is None or int(m.group(1)) != tracer:
            return False
    return True


def test_sendfile_syscalls_seen_by_strace(broker: RunningBroker, tmp_path: Path) -> None:
    """The record bytes of a Fetch response are written by sendfile(2) calls in the workers."""
    if STRACE is None:
        pytest.skip("strace is not installed")
    produce(broker.bootstrap)
    stored, _ = segment_bytes(broker)
    pids = list(broker.worker_pids().values())
    out = tmp_path / "strace"
    args = [STRACE, "-ff", "-qq", "-e", "trace=sendfile", "-o", str(out)]
    for pid in pids:
        args += ["-p", str(pid)]
    err = tmp_path / "strace-stderr.txt"
    with open(err, "wb") as f:
        tracer = subprocess.Popen(args, stderr=f)
    try:
        deadline = time.monotonic() + 10
        while not all(traced_by(pid, tracer.pid) for pid in pids):
            if tracer.poll() is not None:
                pytest.skip(f"strace cannot attach to the workers here: {err.read_text()}")
            assert time.monotonic() < deadline, "strace did not attach within 10 s"
            time.sleep(0.05)
        assert consume_all(broker.bootstrap) == MESSAGES
        time.sleep(0.2)
    finally:
        tracer.send_signal(signal.SIGINT)
        try:
            tracer.wait(10)
        except subprocess.TimeoutExpired:
            tracer.kill()
            tracer.wait()
    text = "".join(f.read_text() for f in sorted(tmp_path.glob("strace.*")))
    calls = [(int(n), int(r)) for n, r in _SENDFILE.findall(text)]
    assert calls, f"no sendfile calls traced:\n{text[:2000]}"
    sent = sum(r for _, r in calls if r > 0)
    assert sent >= stored, (sent, stored, text[:2000])
    # the counters agree with the kernel's view
    stats = broker.worker_stats(time.time())
    assert sum(s["sendfile_bytes"] for s in stats) == sent


def test_fetch_answer_bigger_than_the_socket_buffer(tmp_path: Path) -> None:
    """A Fetch answer of one slice per partition to a client that reads slowly: once the socket
    is full the worker waits for it to drain and goes on with ``os.sendfile`` (``send_waits``
    counts the waits; each slice went through ``loop.sendfile`` before), and every partition's
    records arrive whole, in order, as stored."""
    import socket
    import struct

    from kafka_wire import Wire, _recv_exact, plain, read_entity, record_batch
    from kio.index import load_response_schema

    topic, parts = "wide", 64
    b = start_broker(tmp_path / "data", workers=1)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, parts)], operation_timeout=30)[topic].result(30)
        stored: dict[int, bytes] = {}
        with Wire(b.bootstrap) as w:
            leader = w.leader(topic, 0)
            for p in range(parts):
                batch = record_batch([(b"k", os.urandom(4000), 0) for _ in range(32)])
                out = w.send(0, 8, {"transactional_id": None, "acks": -1, "timeout": 10_000,
                                    "topic_data": [{"name": topic, "partition_data": [
                                        {"index": p, "records": batch}]}]}, to=leader)
                assert out["responses"][0]["partition_responses"][0]["error_code"] == 0, out
                stored[p] = batch
            frame = w.frame(1, 11, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 50 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
                "forgotten_topics_data": [],
                "topics": [{"topic": topic, "partitions": [
                    {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0,
                     "log_start_offset": -1, "partition_max_bytes": 1 << 20}
                    for p in range(parts)]}]})
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        s.settimeout(30)
        s.connect(leader)
        try:
            s.sendall(struct.pack(">i", len(frame)) + frame)
            time.sleep(0.5)  # the answer (~8 MiB) fills the socket; the worker waits
            size = struct.unpack(">i", _recv_exact(s, 4))[0]
            data = _recv_exact(s, size)
        finally:
            s.close()
        answer = plain(read_entity(load_response_schema(1, 11), data, 4)[0])
        got = {p["partition_index"]: p["records"] for t in answer["responses"]
               for p in t["partitions"]}
        assert set(got) == set(range(parts))
        for p in range(parts):
            # the stored batch with its offsets assigned: same length, same records
            assert got[p] is not None and len(got[p]) == len(stored[p]), p
            assert got[p][61:] == stored[p][61:], p
        stats = b.worker_stats(time.time())
        assert sum(st["send_waits"] for st in stats) > 0, stats
        # a client that goes away while the worker waits on its full socket: the connection
        # closes, the worker serves the next one
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
        s.connect(leader)
        s.sendall(struct.pack(">i", len(frame)) + frame)
        time.sleep(0.3)
        s.close()
        with Wire(b.bootstrap) as w:
            assert w.leader(topic, 0) == leader
            again = w.send(1, 11, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
                "forgotten_topics_data": [], "topics": [{"topic": topic, "partitions": [
                    {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                     "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]}, to=leader)
            assert again["responses"][0]["partitions"][0]["records"][61:] == stored[0][61:]
    finally:
        assert b.stop() == 0, b.log_path.read_text()
