"""Producer ids expire (issue 21 item 2): Kafka's ``producer.id.expiration.ms``.

Every idempotent client process gets a new producer id, so a broker that never forgets them
grows without bound.  Kafka's ``ProducerStateManager`` drops a producer whose last batch is older
than ``producer.id.expiration.ms`` (1 day; lowered here), checked every
``producer.id.expiration.check.interval.ms`` and when a snapshot is loaded; the next snapshot no
longer holds it.  A retry from an expired producer is then a write from an unknown producer: since
KIP-360 (Kafka 2.5) it is appended with any sequence, not answered as a duplicate.

Short-lived producers are real clients (confluent-kafka and kafka-python, idempotent) and, for
numbers, raw ones: InitProducerId on the controller, then one idempotent Produce to the leader,
which is what a short-lived client process does; pipelined on one connection each.  Memory is
the worker's VmRSS from /proc.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.default_records import DefaultRecordBatchBuilder

EXPIRATION_MS = 4000
CHECK_MS = 250


def overrides(expiration_ms: int = EXPIRATION_MS) -> tuple[str, ...]:
    return ("--override", f"producer.id.expiration.ms={expiration_ms}",
            "--override", f"producer.id.expiration.check.interval.ms={CHECK_MS}")


@contextlib.contextmanager
def running(tmp_path: Path, expiration_ms: int = EXPIRATION_MS) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path / "data", *overrides(expiration_ms), workers=1)
    try:
        yield b
    finally:
        code = b.stop()
        log = b.log_path.read_text()
        shutil.rmtree(tmp_path, ignore_errors=True)
        assert code == 0, log
        assert "Traceback" not in log, log[-5000:]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    with running(tmp_path) as b:
        yield b


def create(b: RunningBroker, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(30)


def worker_port(b: RunningBroker) -> int:
    return int(b.run_info["workers"][0]["port"])


def worker_pid(b: RunningBroker) -> int:
    return int(b.run_info["workers"][0]["pid"])


# -- raw requests, pipelined ------------------------------------------------------------------


def _string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def _header(api_key: int, version: int, correlation_id: int) -> bytes:
    return struct.pack(">hhi", api_key, version, correlation_id) + _string("expiry")


def _frames(sock: socket.socket, count: int) -> list[bytes]:
    buf = bytearray()
    out: list[bytes] = []
    while len(out) < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {count} answers")
        buf += chunk
        while len(buf) >= 4:
            size = struct.unpack_from(">i", buf)[0]
            if len(buf) < 4 + size:
                break
            out.append(bytes(buf[4 : 4 + size]))
            del buf[: 4 + size]
    return out


def pipelined(port: int, requests: list[bytes], window: int = 256) -> list[bytes]:
    """Send framed requests on one connection, ``window`` at a time; their answers in order."""
    answers: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        for i in range(0, len(requests), window):
            part = requests[i : i + window]
            sock.sendall(b"".join(struct.pack(">i", len(r)) + r for r in part))
            answers += _frames(sock, len(part))
    return answers


def init_producer_ids(bootstrap: str, count: int) -> list[int]:
    """``count`` InitProducerId v1 (no transactional id) on the controller: new producer ids."""
    port = int(bootstrap.rsplit(":", 1)[1])
    reqs = [_header(22, 1, i) + struct.pack(">hi", -1, 60000) for i in range(count)]
    out = []
    for i, answer in enumerate(pipelined(port, reqs)):
        corr, _throttle, error, pid, epoch = struct.unpack_from(">iihqh", answer)
        assert (corr, error, epoch) == (i, 0, 0), (corr, error, epoch)
        out.append(pid)
    return out


def idempotent_batch(pid: int, seq: int = 0, values: tuple[bytes, ...] = (b"v",),
                     timestamp: int | None = None) -> bytes:
    """A batch built by kafka-python's DefaultRecordBatchBuilder (epoch 0)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=pid, producer_epoch=0, base_sequence=seq,
                                        batch_size=1 << 20)
    ts = int(time.time() * 1000) if timestamp is None else timestamp
    for i, v in enumerate(values):
        builder.append(i, timestamp=ts, key=None, value=v, headers=[])
    return bytes(builder.build())


def produce_request(topic: str, batch: bytes, correlation_id: int, acks: int = 1) -> bytes:
    return (_header(0, 3, correlation_id) + struct.pack(">hhii", -1, acks, 30000, 1)
            + _string(topic) + struct.pack(">iii", 1, 0, len(batch)) + batch)


def produce_many(port: int, topic: str, batches: list[bytes]) -> list[tuple[int, int]]:
    """(error, base offset) of each batch, one Produce v3 each, pipelined."""
    reqs = [produce_request(topic, b, i) for i, b in enumerate(batches)]
    out = []
    for answer in pipelined(port, reqs):
        pos = 4 + 4  # correlation id, topic count
        (n,) = struct.unpack_from(">h", answer, pos)
        pos += 2 + n + 4 + 4  # topic name, partition count, partition index
        error, base = struct.unpack_from(">hq", answer, pos)
        out.append((error, base))
    return out


def describe_producers(b: RunningBroker, topic: str) -> list:
    from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest

    from shmq.cli.configs import kafka_call

    response = kafka_call(f"127.0.0.1:{worker_port(b)}", DescribeProducersRequest(
        topics=(TopicRequest(name=topic, partition_indexes=(0,)),)), 30)
    part = response.topics[0].partitions[0]
    assert int(part.error_code) == 0
    return list(part.active_producers)


def snapshot_producer_ids(path: Path) -> list[int]:
    """Producer ids in a ``.snapshot`` file, parsed with struct (ProducerSnapshot v1: int16
    version, uint32 crc, int32 count, 46-byte entries starting with the int64 producer id)."""
    data = path.read_bytes()
    version, _crc, count = struct.unpack_from(">hIi", data)
    assert version == 1 and len(data) == 10 + 46 * count
    return [struct.unpack_from(">q", data, 10 + 46 * i)[0] for i in range(count)]


def snapshots(b: RunningBroker, topic: str) -> list[Path]:
    return sorted((b.data_dir / "worker-1" / f"{topic}-0").glob("*.snapshot"))


def wait_for(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


# -- tests ----------------------------------------------------------------------------------------


def _short_lived_clients(bootstrap: str, topic: str, count: int) -> None:
    """``count`` confluent-kafka and ``count`` kafka-python idempotent producers, each writing
    ten records and closing (each gets a producer id of its own), all at once."""
    from kafka import KafkaProducer

    def librdkafka(i: int) -> None:
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for j in range(10):
            p.produce(topic, b"ck-%d-%d" % (i, j), partition=0)
        assert p.flush(30) == 0

    def kafka_python(i: int) -> None:
        p = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        for j in range(10):
            p.send(topic, b"kp-%d-%d" % (i, j), partition=0)
        p.flush(30)
        p.close(30)

    with ThreadPoolExecutor(2 * count) as pool:
        for f in [pool.submit(fn, i) for i in range(count) for fn in (librdkafka, kafka_python)]:
            f.result()


def test_short_lived_idempotent_producers_expire(tmp_path: Path) -> None:
    """10,000 short-lived producers: DescribeProducers lists them, then none after
    producer.id.expiration.ms; the snapshot written at the next roll or shutdown holds none;
    a restart brings none back; a retry from an expired producer is appended again."""
    expiration_ms = 12_000  # room to start them all before the first expires
    with running(tmp_path, expiration_ms) as broker:
        topic = f"expiry-{uuid.uuid4().hex[:8]}"
        create(broker, topic, **{"internal.segment.bytes": str(256 * 1024)})
        _short_lived_clients(broker.bootstrap, topic, 4)
        real = {p.producer_id for p in describe_producers(broker, topic)}
        assert len(real) == 8  # each client process its own producer id
        pids = init_producer_ids(broker.bootstrap, 10_000)
        assert len(set(pids) | real) == 10_008
        results = produce_many(worker_port(broker), topic,
                               [idempotent_batch(pid) for pid in pids])
        assert [e for e, _ in results] == [0] * len(pids)
        listed = {p.producer_id for p in describe_producers(broker, topic)}
        assert listed == set(pids) | real
        rolled = snapshots(broker, topic)  # written at every roll, as Kafka does
        assert rolled and max(len(snapshot_producer_ids(s)) for s in rolled) > 1000
        # the retry of a batch of a live producer is a duplicate: its original offset
        first_pid, first_offset = pids[0], results[0][1]
        assert produce_many(worker_port(broker), topic, [idempotent_batch(first_pid)]) == \
            [(0, first_offset)]
        started = time.monotonic()
        wait_for(lambda: not describe_producers(broker, topic), expiration_ms / 1000 + 30,
                 "every producer id to expire")
        print(f"\n10,008 producer ids gone {time.monotonic() - started:.1f} s after the last "
              f"write (producer.id.expiration.ms={expiration_ms}, checked every {CHECK_MS} ms)")
        # a retry from an expired producer: unknown now, so appended again (KIP-360)
        ((error, offset),) = produce_many(worker_port(broker), topic,
                                          [idempotent_batch(first_pid)])
        assert error == 0 and offset > first_offset
        assert [p.producer_id for p in describe_producers(broker, topic)] == [first_pid]
        wait_for(lambda: not describe_producers(broker, topic), expiration_ms / 1000 + 30,
                 "the retried producer to expire again")
        assert broker.stop() == 0
        newest = snapshots(broker, topic)[-1]
        assert snapshot_producer_ids(newest) == []  # the clean shutdown's snapshot
        again = start_broker(broker.data_dir, *overrides(expiration_ms), workers=1)
        try:
            assert describe_producers(again, topic) == []
        finally:
            assert again.stop() == 0


def _churn(b: RunningBroker, topic: str, count: int, chunk: int = 20_000) -> None:
    """``count`` producer ids, each writing one idempotent batch (ids from a high range: the
    partition does not check that the controller handed them out, nor does Kafka's)."""
    base = 1 << 40
    port = worker_port(b)
    for start in range(0, count, chunk):
        batches = [idempotent_batch(base + start + i) for i in range(min(chunk, count - start))]
        assert all(e == 0 for e, _ in produce_many(port, topic, batches))


def _producer_ids(b: RunningBroker) -> int:
    """The worker's count of known producer ids (its stats file, written every second, counted
    at each expiration check): cheap to ask, unlike a DescribeProducers of 100,000 entries,
    whose own transient objects are not what this measures."""
    (stats,) = b.worker_stats(time.time())
    return int(stats.get("producer_ids", -1))


def _memory_comes_back(b: RunningBroker, count: int,
                       expiration_ms: int = EXPIRATION_MS) -> tuple[int, int, int]:
    topic = f"churn-{uuid.uuid4().hex[:8]}"
    create(b, topic)
    pid = worker_pid(b)
    _churn(b, topic, 2000)  # warm up: buffers, code paths
    wait_for(lambda: _producer_ids(b) == 0, expiration_ms / 1000 + 30, "warm-up expiry")
    before = vm_rss_kib(pid)
    started = time.monotonic()
    _churn(b, topic, count)
    took = time.monotonic() - started
    peak = vm_rss_kib(pid)
    live = _producer_ids(b)
    wait_for(lambda: _producer_ids(b) == 0, expiration_ms / 1000 + 60, "expiry")
    after = vm_rss_kib(pid)
    print(f"\n{count:,} producer ids written in {took:.1f} s ({live:,} live at the end): worker "
          f"VmRSS {before / 1024:.1f} MiB before, {peak / 1024:.1f} MiB with them, "
          f"{after / 1024:.1f} MiB after they expired")
    assert describe_producers(b, topic) == []
    return before, peak, after


def test_worker_memory_comes_back_after_producer_ids_expire(broker: RunningBroker) -> None:
    """20,000 producer ids come and go: the worker's memory is back within 10 % of its start
    (the 100,000 run is the slow test below)."""
    before, peak, after = _memory_comes_back(broker, 20_000)
    assert peak > before + 2 * 1024  # they were there: ~200 bytes each
    assert after <= before * 1.10, (before, peak, after)


@pytest.mark.slow
def test_worker_memory_comes_back_after_100k_producer_ids(tmp_path: Path) -> None:
    """100,000 producer ids, all alive at once (expiration 60 s), then gone."""
    with running(tmp_path, expiration_ms=60_000) as b:
        before, peak, after = _memory_comes_back(b, 100_000, expiration_ms=60_000)
        assert peak > before + 15 * 1024
        assert after <= before * 1.10, (before, peak, after)
