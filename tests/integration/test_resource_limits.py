"""Issue 19: a broker meets the limits of its machine with a clear error and keeps serving.

Each limit is real: the broker runs under ``prlimit --nofile`` (descriptors), on a small tmpfs
mounted for the test (a full disk).  Every test checks that nothing acknowledged is lost and that
the broker log says one clear line about the condition, not a flood.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import RunningBroker, start_broker


def _prlimit(soft: int, hard: int) -> tuple[str, ...]:
    return ("prlimit", f"--nofile={soft}:{hard}", "--")


def _api_versions(sock: socket.socket, correlation: int) -> int:
    """One ApiVersions v0 round trip on a raw connection; the answer's error code."""
    client = b"i19"
    body = struct.pack(">hhih", 18, 0, correlation, len(client)) + client
    sock.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
    answer = _recv_exactly(sock, size)
    got, error = struct.unpack_from(">ih", answer)
    assert got == correlation
    return error


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _create(b: RunningBroker, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int,
             **conf: object) -> dict[int, list[tuple[int, bytes]]]:
    """acks=all; returns what was acknowledged, per partition: (offset, value)."""
    acked: dict[int, list[tuple[int, bytes]]] = {}
    errors: list[object] = []

    def done(err: object, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **conf})
    for i, v in enumerate(values):
        p.produce(topic, v, partition=i % partitions, on_delivery=done)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    return acked


def _read_all(bootstrap: str, topic: str, partitions: int, ends: dict[int, int]) -> dict:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "i19", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[tuple[int, bytes]]] = {}
    deadline = time.monotonic() + 60
    try:
        while any(len(got.get(p, [])) < n for p, n in ends.items()):
            assert time.monotonic() < deadline, {p: len(v) for p, v in got.items()}
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            got.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))
    finally:
        c.close()
    return got


def _lines(b: RunningBroker, needle: str) -> list[str]:
    return [ln for ln in b.log_path.read_text().splitlines() if needle in ln]


def test_out_of_descriptors_refuses_with_one_line_and_recovers(tmp_path: Path) -> None:
    """Hard limit 256: connections past what it leaves (128 per process) are closed at once (not left hanging in the backlog,
    not one log line per accept attempt); a connection made before keeps working; once the
    excess connections go, the broker accepts again by itself and nothing acknowledged is lost."""
    b = start_broker(tmp_path / "data", workers=1, prefix=_prlimit(256, 256))
    held: list[socket.socket] = []
    try:
        _create(b, "fd", 4)
        first = _produce(b.bootstrap, "fd", [b"a%d" % i for i in range(200)], 4)
        host, port = b.bootstrap.rsplit(":", 1)
        worker_port = b.run_info["workers"][0]["port"]
        existing = socket.create_connection((host, int(port)), timeout=10)
        existing_w = socket.create_connection((host, worker_port), timeout=10)
        assert _api_versions(existing, 1) == 0
        for target in (int(port), worker_port):
            for _ in range(300):
                s = socket.create_connection((host, target), timeout=10)
                held.append(s)
        time.sleep(1.5)
        refused = 0
        for s in held:
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    refused += 1
            except BlockingIOError:
                pass
        assert refused > 50, refused  # closed at once by each process out of descriptors
        # connections made before keep working
        assert _api_versions(existing, 2) == 0
        assert _api_versions(existing_w, 3) == 0
        lines = _lines(b, "refusing new connections")
        assert 1 <= len(lines) <= 4, lines  # one per process (controller, worker) per 10 s
        for s in held:
            s.close()
        held.clear()
        time.sleep(0.5)
        # recovered on its own: new clients are served, every acknowledged record is there
        second = _produce(b.bootstrap, "fd", [b"b%d" % i for i in range(200)], 4)
        got = _read_all(b.bootstrap, "fd", 4,
                        {p: len(first[p]) + len(second[p]) for p in range(4)})
        for p in range(4):
            assert got[p] == first[p] + second[p]
        assert _lines(b, "accepting connections again")
        existing.close()
        existing_w.close()
    finally:
        for s in held:
            s.close()
        assert b.stop() == 0, b.log_path.read_text()[-3000:]
    assert len(b.log_path.read_text().splitlines()) < 100


def test_soft_limit_raised_to_hard_and_said_in_the_ready_line(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", workers=1, prefix=_prlimit(1024, 4096))
    try:
        pids = [b.proc.pid, *b.worker_pids().values()]
        for pid in pids:
            limits = Path(f"/proc/{pid}/limits").read_text()
            row = next(ln for ln in limits.splitlines() if ln.startswith("Max open files"))
            assert row.split()[3:5] == ["4096", "4096"], row
        assert "4096 file descriptors per process" in b.ready_line, b.ready_line
    finally:
        assert b.stop() == 0
