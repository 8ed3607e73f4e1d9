"""Malformed-request battery against a live broker (reliability.md F2).

Raw sockets talk to both the controller (node 0, bootstrap) and a worker while a confluent-kafka
producer and consumer run in parallel.  Every bad request gets Kafka's answer (an error code, or
the connection closed) within 1 s; at the end no worker was restarted, the good clients saw no
error and no stall, and every record stored before or during the battery is still there.

The broker runs with ``socket.request.max.bytes=1048576`` and ``message.max.bytes=10000``.
Requests are built with kafka-python's ``kafka.protocol`` classes (an independent encoder) or by
hand with ``struct`` where they must be malformed.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

MAX_REQUEST = 1048576  # socket.request.max.bytes of the broker under test
MESSAGE_MAX = 10000  # message.max.bytes of the broker under test
ANSWER_WITHIN = 1.0  # seconds: every bad request is answered or closed this fast

NONE, CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, INVALID_TOPIC, UNSUPPORTED_VERSION = 0, 2, 10, 17, 35
API_VERSIONS_KEY = 18

BAD_TOPIC_NAMES = ["", ".", "..", "x" * 250, "a/b", "tøpic", "a b", "ü" * 10]


# -- raw wire helpers -----------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def header(api_key: int, version: int, correlation_id: int = 1, client_id: bytes = b"f2") -> bytes:
    """Request header v1 (non-flexible versions)."""
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def encode(request, correlation_id: int = 1) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="f2-battery")
    return bytes(request.encode(header=True, framed=True))


@dataclass
class Outcome:
    kind: str  # "response", "closed" or "timeout"
    body: bytes = b""
    elapsed: float = 0.0

    def __str__(self) -> str:
        return f"{self.kind} after {self.elapsed:.3f} s {self.body[:32].hex()}"


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def read_frame(sock: socket.socket, timeout: float = ANSWER_WITHIN) -> Outcome:
    """One response frame (size prefix stripped), or how the connection ended."""
    started = time.monotonic()
    sock.settimeout(timeout)
    buf = b""
    need = 4
    try:
        while True:
            chunk = sock.recv(max(need - len(buf), 1))
            if not chunk:
                return Outcome("closed", buf, time.monotonic() - started)
            buf += chunk
            if len(buf) == 4 and need == 4:
                need = 4 + struct.unpack(">i", buf)[0]
            if len(buf) >= need:
                return Outcome("response", buf[4:], time.monotonic() - started)
    except (ConnectionResetError, BrokenPipeError):
        return Outcome("closed", b"", time.monotonic() - started)
    except TimeoutError:
        return Outcome("timeout", buf, time.monotonic() - started)


def exchange(port: int, payload: bytes, timeout: float = ANSWER_WITHIN) -> Outcome:
    """Send ``payload`` on a new connection and read one frame (or the close)."""
    with connect(port) as sock:
        try:
            sock.sendall(payload)
        except (ConnectionResetError, BrokenPipeError):
            return Outcome("closed")
        return read_frame(sock, timeout)


def expect_closed(port: int, payload: bytes, what: str) -> None:
    out = exchange(port, payload)
    assert out.kind == "closed", f"{what} on port {port}: expected the connection closed, got {out}"
    assert out.body == b"", f"{what} on port {port}: bytes sent before closing: {out.body!r}"
    assert out.elapsed < ANSWER_WITHIN


def correlation_of(body: bytes) -> int:
    return struct.unpack_from(">i", body, 0)[0]


def zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def record_batch(values: list[bytes]) -> bytes:
    """A RecordBatch v2 (magic 2, no compression, no producer id) with a correct CRC-32C."""
    ts = int(time.time() * 1000)
    records = b""
    for i, value in enumerate(values):
        body = (b"\x00" + zigzag(0) + zigzag(i) + zigzag(-1) + zigzag(len(value)) + value
                + zigzag(0))
        records += zigzag(len(body)) + body
    after_crc = struct.pack(">hiqqqhii", 0, len(values) - 1, ts, ts, -1, -1, -1,
                            len(values)) + records
    head = struct.pack(">iBI", 0, 2, crc32c.crc32c(after_crc))
    return struct.pack(">qi", 0, len(head) + len(after_crc)) + head + after_crc


def produce_request(topic: str, partition: int, records: bytes, version: int = 3,
                    correlation_id: int = 1) -> bytes:
    P = ProduceRequest
    return encode(P[version](
        transactional_id=None, acks=-1, timeout_ms=5000,
        topic_data=[P.TopicProduceData(name=topic, partition_data=[
            P.TopicProduceData.PartitionProduceData(index=partition, records=records)])]),
        correlation_id)


def produce(port: int, topic: str, partition: int, records: bytes, version: int = 3):
    out = exchange(port, produce_request(topic, partition, records, version, 41), timeout=5)
    assert out.kind == "response", f"Produce v{version} to {topic}-{partition}: {out}"
    assert correlation_of(out.body) == 41
    resp = ProduceResponse[version].decode(out.body, header=True)
    return resp.responses[0].partition_responses[0]


def metadata(port: int, names: list[str] | None, auto_create: bool = True, version: int = 4):
    topics = None if names is None else [MetadataRequest.MetadataRequestTopic(name=n)
                                         for n in names]
    out = exchange(port, encode(MetadataRequest[version](
        topics=topics, allow_auto_topic_creation=auto_create), 7), timeout=5)
    assert out.kind == "response", f"Metadata v{version} {names!r:.80}: {out}"
    assert correlation_of(out.body) == 7
    return MetadataResponse[version].decode(out.body, header=True)


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


# -- good clients running alongside -------------------------------------------------------------


@dataclass
class GoodTraffic:
    """A confluent-kafka idempotent producer (~200 msg/s) and an assigned consumer."""

    bootstrap: str
    topic: str
    partitions: int
    rate: float = 200.0
    sent_at: dict[int, float] = field(default_factory=dict)
    latency: dict[int, float] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    received: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    remaining: int = -1  # messages the producer could not flush at the end
    stop_producing: threading.Event = field(default_factory=threading.Event)
    stop_consuming: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        for t in self.threads:
            t.start()

    def _error(self, who: str):
        return lambda err: self.errors.append(f"{who}: {err}")

    def _produce(self) -> None:
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 2, "batch.size": 4000, "error_cb": self._error("producer")})

        def on_delivery(err, msg) -> None:
            n = int(msg.value())
            if err is not None:
                self.failed[n] = str(err)
            else:
                self.latency[n] = time.monotonic() - self.sent_at[n]

        n = 0
        start = time.monotonic()
        while not self.stop_producing.is_set():
            self.sent_at[n] = time.monotonic()
            producer.produce(self.topic, value=str(n).encode(), partition=n % self.partitions,
                             on_delivery=on_delivery)
            n += 1
            producer.poll(0)
            delay = start + n / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        self.remaining = producer.flush(30)

    def _consume(self) -> None:
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": "f2-good", "enable.auto.commit": False,
            "fetch.wait.max.ms": 100, "error_cb": self._error("consumer")})
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        try:
            while not self.stop_consuming.is_set():
                for msg in consumer.consume(500, 0.1):
                    if msg.error():
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            self.errors.append(f"consumer: {msg.error()}")
                        continue
                    self.received.append(int(msg.value()))
        finally:
            consumer.close()

    def finish(self, timeout: float = 30) -> None:
        """Stop producing, wait until the consumer has seen every acknowledged message."""
        self.stop_producing.set()
        self.threads[0].join(40)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not set(self.latency) <= set(self.received):
            time.sleep(0.1)
        self.stop_consuming.set()
        self.threads[1].join(10)


@dataclass
class Battery:
    broker: RunningBroker
    controller_port: int
    worker_ports: dict[int, int]  # node id -> port
    pids: dict[int, int]
    controller_pid: int
    leaders: dict[str, dict[int, int]]  # topic -> partition -> node id
    known: dict[int, list[bytes]]  # partition of "f2-known" -> values stored before the battery
    traffic: GoodTraffic
    baseline_p99: float = 0.0
    baseline_count: int = 0

    @property
    def ports(self) -> list[int]:
        """The controller's port and one worker's: every case is sent to both."""
        return [self.controller_port, self.worker_ports[min(self.worker_ports)]]

    def leader_port(self, topic: str, partition: int) -> int:
        return self.worker_ports[self.leaders[topic][partition]]


def _create(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        parts = admin.list_topics(topic, timeout=5).topics[topic].partitions
        if len(parts) == partitions and all(p.leader >= 1 for p in parts.values()):
            return {p: parts[p].leader for p in parts}
        time.sleep(0.1)
    raise AssertionError(f"{topic} has no leaders")


def _consume_values(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "f2-check",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + 20
        while (any(len(out[p]) < ends[p] for p in out) and time.monotonic() < deadline):
            for msg in consumer.consume(500, 0.2):
                if not msg.error():
                    out[msg.partition()].append(msg.value())
        return out
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def battery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Battery]:
    data = tmp_path_factory.mktemp("f2") / "data"
    b = start_broker(data, "--override", f"socket.request.max.bytes={MAX_REQUEST}",
                     "--override", f"message.max.bytes={MESSAGE_MAX}", workers=2)
    traffic = None
    try:
        info = b.run_info
        workers = {w["node_id"]: w["port"] for w in info["workers"]}
        leaders = {"f2-known": _create(b.bootstrap, "f2-known", 4),
                   "f2-good": _create(b.bootstrap, "f2-good", 4),
                   "f2-raw": _create(b.bootstrap, "f2-raw", 2)}
        # records stored before the battery, checked after it
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "batch.size": 4000})
        known: dict[int, list[bytes]] = {i: [] for i in range(4)}
        for i in range(400):
            value = b"known-%04d" % i
            p.produce("f2-known", value=value, partition=i % 4)
            known[i % 4].append(value)
        assert p.flush(30) == 0
        traffic = GoodTraffic(b.bootstrap, "f2-good", 4)
        traffic.start()
        time.sleep(2.0)  # baseline latency of the good producer before any bad input
        count = len(traffic.latency)
        # steady state only: the first second includes connecting and InitProducerId
        lat = sorted(v for n, v in list(traffic.latency.items()) if n >= traffic.rate)
        assert len(lat) > 100, f"good producer acknowledged only {count} messages in 2 s"
        battery = Battery(b, int(b.bootstrap.rsplit(":", 1)[1]), workers, b.worker_pids(),
                          info["controller_pid"], leaders, known, traffic,
                          baseline_p99=lat[int(len(lat) * 0.99)], baseline_count=count)
        yield battery
    finally:
        if traffic is not None:
            traffic.stop_producing.set()
            traffic.stop_consuming.set()
            for t in traffic.threads:
                t.join(40)
        code = b.stop()
        if b.proc.stdout is not None:
            b.proc.stdout.close()
    assert code == 0, b.log_path.read_text()


# -- framing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case, payload", [
    ("size 0x7fffffff", struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 1000),
    ("size 0x7fffffff, prefix alone", struct.pack(">i", 0x7FFFFFFF)),
    ("size over socket.request.max.bytes (2 MiB)",
     struct.pack(">i", 2 * MAX_REQUEST) + header(3, 4) + b"\x00" * 4096),
    ("size socket.request.max.bytes + 1", struct.pack(">i", MAX_REQUEST + 1)),
    ("size over 100 MiB", struct.pack(">i", 100 * 1024 * 1024 + 1)),
    ("size 0", struct.pack(">i", 0)),
    ("size 0 then a valid request", struct.pack(">i", 0) + frame(header(18, 0))),
    ("size -1", struct.pack(">i", -1) + b"\x00" * 16),
    ("size -2147483648", struct.pack(">i", -(2**31))),
    ("frame shorter than a request header", frame(b"\x00\x03\x00")),
    ("header without client_id", frame(struct.pack(">hhi", 3, 4, 1))),
    ("client_id longer than the frame", frame(struct.pack(">hhih", 3, 4, 1, 300) + b"abc")),
])
def test_bad_framing_closes_connection(battery: Battery, case: str, payload: bytes) -> None:
    for port in battery.ports:
        expect_closed(port, payload, case)


@pytest.mark.parametrize("api", ["ApiVersions", "Metadata", "Produce"])
@pytest.mark.parametrize("cut", [2, 4, 9, -1])
def test_request_split_across_reads(battery: Battery, api: str, cut: int) -> None:
    """The baseline for the slow-client cases: a valid request whose bytes arrive in two TCP
    segments (inside the size prefix, right after it, inside the header, one byte short) is
    answered like the same request sent at once.  Kafka reassembles frames (NetworkReceive)."""
    topic, part = "f2-raw", 0
    if api == "ApiVersions":
        ports, request = battery.ports, encode(ApiVersionsRequest[0](), 61)
    elif api == "Metadata":
        ports = battery.ports
        request = encode(MetadataRequest[4](topics=None, allow_auto_topic_creation=False), 61)
    else:
        ports = [battery.leader_port(topic, part)]
        request = produce_request(topic, part, record_batch([b"split"]), 3, 61)
    for port in ports:
        with connect(port) as sock:
            sock.sendall(request[:cut])
            time.sleep(0.05)  # the broker reads the first part on its own
            sock.sendall(request[cut:])
            out = read_frame(sock)
        assert out.kind == "response", (
            f"{api} split at byte {cut % len(request)} of {len(request)} on port {port}: {out}")
        assert correlation_of(out.body) == 61


def test_2mib_frame_is_not_read(battery: Battery) -> None:
    """A frame over socket.request.max.bytes is refused on its prefix, not after 2 MiB arrive."""
    for port in battery.ports:
        with connect(port) as sock:
            sock.sendall(struct.pack(">i", 2 * MAX_REQUEST) + header(0, 9))
            out = read_frame(sock)
            assert out.kind == "closed", f"port {port}: {out}"
            with pytest.raises(OSError):  # the peer is gone: a large write fails
                for _ in range(64):
                    sock.sendall(b"\x00" * 65536)


def test_huge_size_prefixes_allocate_nothing(battery: Battery) -> None:
    """"Nothing large is allocated before the frame is known to be valid" (CVE-2022-34917)."""
    pids = {"controller": battery.controller_pid,
            **{f"worker {n}": pid for n, pid in battery.pids.items()}}
    before = {name: vm_rss_kib(pid) for name, pid in pids.items()}
    hostile = [
        struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 65536,
        struct.pack(">i", MAX_REQUEST) + b"\x00" * 65536,  # allowed size, never completed
        # declared counts and lengths far beyond the bytes that follow
        frame(header(3, 4) + struct.pack(">i", 0x7FFFFFFF) + b"\x00\x01a"),
        frame(header(3, 12) + b"\x00" + b"\xff\xff\xff\xff\x07" + b"\x00" * 16),
        frame(header(19, 2) + struct.pack(">i", 0x7FFFFFFF)),
        frame(header(0, 3) + struct.pack(">hhi", -1, -1, 1000) + struct.pack(">i", 0x7FFFFFFF)),
        frame(header(0, 3) + struct.pack(">hhi", -1, -1, 1000) + struct.pack(">ih", 1, 1) + b"t"
              + struct.pack(">ii", 1, 0) + struct.pack(">i", 0x7FFFFFFF) + b"x" * 32),
    ]
    for _ in range(10):
        for port in [battery.controller_port, *battery.worker_ports.values()]:
            for payload in hostile:
                with connect(port) as sock:
                    try:
                        sock.sendall(payload)
                    except (ConnectionResetError, BrokenPipeError):
                        continue
                    out = read_frame(sock, 0.05)
                    assert out.kind in ("closed", "timeout"), f"{payload[:16].hex()}: {out}"
    time.sleep(0.3)
    after = {name: vm_rss_kib(pid) for name, pid in pids.items()}
    grown = {name: (after[name] - before[name]) // 1024 for name in pids}
    assert all(mib <= 20 for mib in grown.values()), f"RSS growth in MiB: {grown}"


def test_random_garbage_after_valid_size_prefix(battery: Battery) -> None:
    rnd = random.Random(0xF2)
    for port in battery.ports:
        for i in range(150):
            body = rnd.randbytes(rnd.randint(1, 400))
            out = exchange(port, frame(body))
            assert out.kind in ("closed", "response"), f"garbage #{i} {body[:16].hex()}: {out}"
            if out.kind == "response":  # garbage that happens to be a request: answered
                assert correlation_of(out.body) == struct.unpack_from(">i", body, 4)[0]


def test_random_bodies_behind_every_supported_header(battery: Battery) -> None:
    """A valid header of each advertised (API, version), then random bytes: answered or closed
    within 1 s, and never a worker restart (checked at the end)."""
    out = exchange(battery.controller_port, encode(ApiVersionsRequest[0](), 3))
    versions = ApiVersionsResponse[0].decode(out.body, header=True).api_keys
    rnd = random.Random(0xBAD)
    for port in battery.ports:
        for key in versions:
            for version in range(key.min_version, key.max_version + 1):
                for size in (0, 3, 40, 300):
                    body = rnd.randbytes(size)
                    corr = rnd.randint(0, 2**31 - 1)
                    payload = frame(header(key.api_key, version, corr) + body)
                    res = exchange(port, payload)
                    assert res.kind in ("closed", "response"), (
                        f"api {key.api_key} v{version} + {size} random bytes on port {port}: {res}")
                    if res.kind == "response":
                        assert correlation_of(res.body) == corr


# -- unsupported APIs and versions -------------------------------------------------------------------


@pytest.mark.parametrize("api_key", [999, 32767, -1, 4, 7, 57])
def test_unknown_or_unserved_api_key(battery: Battery, api_key: int) -> None:
    """Kafka closes the connection on an API key it does not know (or does not serve to
    clients: LeaderAndIsr 4, ControlledShutdown 7, UpdateFeatures 57)."""
    for port in battery.ports:
        out = exchange(port, frame(header(api_key, 0) + b"\x00" * 8))
        assert out.kind in ("closed", "response"), f"API key {api_key} on {port}: {out}"
        if out.kind == "response":  # an error answer is acceptable, a hang is not
            assert correlation_of(out.body) == 1


@pytest.mark.parametrize("version", [5, 99, 32767, -1])
def test_api_versions_unknown_version(battery: Battery, version: int) -> None:
    """KIP-511: a v0 body under header v0, UNSUPPORTED_VERSION and the ApiVersions range."""
    for port in battery.ports:
        out = exchange(port, frame(header(API_VERSIONS_KEY, version, 4242)
                                   + b"\x00\x07unknown\x00\x01\x00" * (version > 2)))
        assert out.kind == "response", f"ApiVersions v{version} on {port}: {out}"
        assert out.elapsed < ANSWER_WITHIN
        corr, error, count = struct.unpack_from(">ihi", out.body, 0)
        assert corr == 4242
        assert error == UNSUPPORTED_VERSION
        entries = [struct.unpack_from(">hhh", out.body, 10 + 6 * i) for i in range(count)]
        assert len(out.body) == 10 + 6 * count, "v0 body expected"
        assert (API_VERSIONS_KEY, 0, 4) in entries, entries
        # kafka-python decodes it as an ApiVersions v0 response too
        decoded = ApiVersionsResponse[0].decode(out.body, header=True)
        assert decoded.error_code == UNSUPPORTED_VERSION
        # the connection stays usable: the client retries with a version in range
        with connect(port) as sock:
            sock.sendall(frame(header(API_VERSIONS_KEY, 99, 1)))
            assert read_frame(sock).kind == "response"
            sock.sendall(encode(ApiVersionsRequest[0](), 2))
            again = read_frame(sock)
            assert again.kind == "response" and correlation_of(again.body) == 2
            assert ApiVersionsResponse[0].decode(again.body, header=True).error_code == NONE


@pytest.mark.parametrize("api_key, version", [
    (1, 99),  # Fetch v99
    (1, 13),  # Fetch 13+ (topic ids) is not advertised
    (1, 3),  # below the advertised Fetch range
    (0, 1),  # Produce v1: advertised (KAFKA-18659) but not served
    (0, 2),
    (0, 12),  # Produce 12 (transactions V2) is not advertised
    (3, 13),  # Metadata v13
    (19, 99),  # CreateTopics v99
    (22, 6),  # InitProducerId v6 (KIP-939)
])
def test_unsupported_version_of_other_api(battery: Battery, api_key: int, version: int) -> None:
    """A request version the broker does not serve: the connection is closed (Kafka cannot
    parse the request) or answered with UNSUPPORTED_VERSION; never a hang."""
    for port in battery.ports:
        out = exchange(port, frame(header(api_key, version) + b"\x00" * 24))
        assert out.kind in ("closed", "response"), f"api {api_key} v{version} on {port}: {out}"
        if out.kind == "response":
            assert correlation_of(out.body) == 1
            assert struct.pack(">h", UNSUPPORTED_VERSION) in out.body, out


# -- record validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 7, 9])
def test_bad_crc_is_corrupt_message_and_not_stored(battery: Battery, version: int) -> None:
    topic, part = "f2-raw", 0
    port = battery.leader_port(topic, part)
    good = record_batch([b"crc-check-%d" % version])
    first = produce(port, topic, part, good, version)
    assert first.error_code == NONE
    corrupt = bytearray(record_batch([b"must-not-be-stored"]))
    corrupt[-4] ^= 0x5A  # a byte of the record value: only the CRC can tell
    res = produce(port, topic, part, bytes(corrupt), version)
    assert res.error_code == CORRUPT_MESSAGE, res
    assert res.base_offset == -1
    corrupt_crc = bytearray(good)
    corrupt_crc[17] ^= 0xFF  # the CRC field itself
    assert produce(port, topic, part, bytes(corrupt_crc), version).error_code == CORRUPT_MESSAGE
    after = produce(port, topic, part, good, version)
    assert after.error_code == NONE
    assert after.base_offset == first.base_offset + 1, "a corrupt batch was appended"


def test_batch_over_message_max_bytes(battery: Battery) -> None:
    topic, part = "f2-raw", 1
    port = battery.leader_port(topic, part)
    first = produce(port, topic, part, record_batch([b"small"]))
    assert first.error_code == NONE
    big = record_batch([b"x" * (MESSAGE_MAX + 100)])
    assert len(big) < MAX_REQUEST
    res = produce(port, topic, part, big)
    assert res.error_code == MESSAGE_TOO_LARGE, res
    many = record_batch([b"y" * 1000 for _ in range(12)])  # 12 small records, one big batch
    assert produce(port, topic, part, many).error_code == MESSAGE_TOO_LARGE
    after = produce(port, topic, part, record_batch([b"small"]))
    assert after.base_offset == first.base_offset + 1, "an oversized batch was appended"


# -- topic names ---------------------------------------------------------------------------------------


def test_invalid_topic_names_in_metadata(battery: Battery) -> None:
    for port in battery.ports:
        for version in (4, 12):
            resp = metadata(port, BAD_TOPIC_NAMES, auto_create=True, version=version)
            by_name = {t.name: t for t in resp.topics}
            assert set(by_name) == set(BAD_TOPIC_NAMES), sorted(by_name)
            for name, t in by_name.items():
                assert t.error_code == INVALID_TOPIC, (version, name[:20], t.error_code)
                assert not t.partitions
    listed = {t.name for t in metadata(battery.controller_port, None).topics}
    assert not listed & set(BAD_TOPIC_NAMES), "an invalid topic was auto-created"


def test_invalid_topic_names_in_create_topics(battery: Battery) -> None:
    C = CreateTopicsRequest
    for port in battery.ports:
        req = C[2](topics=[C.CreatableTopic(name=n, num_partitions=1, replication_factor=1,
                                            assignments=[], configs=[])
                           for n in BAD_TOPIC_NAMES],
                   timeout_ms=5000, validate_only=False)
        out = exchange(port, encode(req, 9), timeout=5)
        assert out.kind == "response", out
        resp = CreateTopicsResponse[2].decode(out.body, header=True)
        codes = {t.name: t.error_code for t in resp.topics}
        assert codes == dict.fromkeys(BAD_TOPIC_NAMES, INVALID_TOPIC), codes
    listed = {t.name for t in metadata(battery.controller_port, None).topics}
    assert not listed & set(BAD_TOPIC_NAMES)
    worker_dirs = [d.name for d in battery.broker.data_dir.glob("worker-*/*")]
    assert not [d for d in worker_dirs if d.rsplit("-", 1)[0] in BAD_TOPIC_NAMES], worker_dirs


def test_produce_to_consumer_offsets_is_refused(battery: Battery) -> None:
    """F2: a client must not write the internal __consumer_offsets topic.  Kafka answers
    INVALID_TOPIC_EXCEPTION ("Cannot append to internal topic"); a topic that does not exist
    (UNKNOWN_TOPIC_OR_PARTITION) is refused too.  Either way nothing is stored."""
    resp = metadata(battery.controller_port, ["__consumer_offsets"], auto_create=True)
    t = resp.topics[0]
    assert t.error_code != NONE or t.is_internal, (
        f"Metadata(allow_auto_topic_creation) created __consumer_offsets as a regular topic "
        f"({len(t.partitions)} partitions, is_internal={t.is_internal})")
    for port in battery.worker_ports.values():
        res = produce(port, "__consumer_offsets", 0, record_batch([b"forged offset commit"]))
        assert res.error_code != NONE, f"Produce to __consumer_offsets on port {port} accepted"


def test_client_fetch_with_replica_id(battery: Battery) -> None:
    """F2 / CVE-2018-1288: a client Fetch carrying replica_id >= 0 is not a follower fetch;
    it must not be served (Kafka: an error per partition, e.g. NOT_LEADER_OR_FOLLOWER without an
    authorizer, TOPIC_AUTHORIZATION_FAILED with one) or the connection is closed."""
    topic, part = "f2-known", 0
    port = battery.leader_port(topic, part)
    F = FetchRequest
    for replica_id in (0, 1, 2, 1000):
        req = F[11](replica_id=replica_id, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                    isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
                    forgotten_topics_data=[],
                    topics=[F.FetchTopic(topic=topic, partitions=[F.FetchTopic.FetchPartition(
                        partition=part, current_leader_epoch=-1, fetch_offset=0,
                        log_start_offset=-1, partition_max_bytes=1 << 20)])])
        out = exchange(port, encode(req, 5))
        assert out.kind in ("closed", "response"), out
        if out.kind == "closed":
            continue
        resp = FetchResponse[11].decode(out.body, header=True)
        p = resp.responses[0].partitions[0]
        assert resp.error_code != NONE or p.error_code != NONE, (
            f"Fetch with replica_id={replica_id} was served as a consumer fetch "
            f"({len(p.records or b'')} bytes of records)")
        assert not p.records


# -- slow and idle clients ---------------------------------------------------------------------------


def test_half_frame_does_not_block_others(battery: Battery) -> None:
    """A client that sends half a frame and stops: the connection stays open (Kafka has no
    request timeout either) and every other client is served meanwhile."""
    full = encode(MetadataRequest[4](topics=None, allow_auto_topic_creation=False), 77)
    stalled = []
    try:
        for port in battery.ports:
            for cut in (2, 6, len(full) // 2):
                sock = connect(port)
                sock.sendall(full[:cut])
                stalled.append((sock, cut))
        for port in battery.ports:
            started = time.monotonic()
            metadata(port, None)
            assert time.monotonic() - started < ANSWER_WITHIN
        for sock, _ in stalled:
            assert read_frame(sock, 0.3).kind == "timeout"  # still open, still waiting
        for sock, cut in stalled:  # the rest arrives: the request is answered
            sock.sendall(full[cut:])
            out = read_frame(sock)
            assert out.kind == "response" and correlation_of(out.body) == 77, out
    finally:
        for sock, _ in stalled:
            sock.close()


def test_slowloris_drip(battery: Battery) -> None:
    """Requests dripped a byte at a time on many connections while good clients run."""
    full = encode(ApiVersionsRequest[0](), 88)
    socks = [connect(port) for port in battery.ports for _ in range(10)]
    results: list[Outcome] = []

    def drip() -> None:
        for i in range(len(full)):
            for s in socks:
                s.sendall(full[i:i + 1])
            time.sleep(0.05)
        for s in socks:
            results.append(read_frame(s, 2))

    t = threading.Thread(target=drip)
    t.start()
    try:
        while t.is_alive():
            for port in battery.ports:
                started = time.monotonic()
                metadata(port, ["f2-known"], auto_create=False)
                assert time.monotonic() - started < ANSWER_WITHIN
            time.sleep(0.05)
        t.join()
    finally:
        for s in socks:
            s.close()
    assert [r.kind for r in results] == ["response"] * len(socks), [str(r) for r in results]


def test_many_idle_connections(battery: Battery) -> None:
    socks: list[socket.socket] = []
    try:
        for port in [battery.controller_port, *battery.worker_ports.values()]:
            for _ in range(300):
                socks.append(connect(port))
        for port in battery.ports:
            started = time.monotonic()
            metadata(port, None)
            assert time.monotonic() - started < ANSWER_WITHIN
    finally:
        for s in socks:
            s.close()


# -- the broker after the battery ---------------------------------------------------------------------


def test_zz_broker_unaffected_after_battery(battery: Battery) -> None:
    """Runs last: 0 worker restarts, good clients unaffected, nothing stored lost."""
    b = battery.broker
    assert b.proc.poll() is None, "the controller exited"
    assert b.worker_pids() == battery.pids, (
        f"worker restarts during the battery: {battery.pids} -> {b.worker_pids()}")
    traffic = battery.traffic
    traffic.finish()
    assert traffic.remaining == 0
    assert not traffic.failed, f"good producer: {len(traffic.failed)} failed sends, e.g. " \
        f"{sorted(traffic.failed.items())[:3]}"
    assert not traffic.errors, f"good clients saw errors: {traffic.errors[:5]}"
    assert len(traffic.latency) == len(traffic.sent_at)
    missing = set(traffic.latency) - set(traffic.received)
    assert not missing, f"good consumer missed {len(missing)} acknowledged messages"
    dups = len(traffic.received) - len(set(traffic.received))
    assert dups == 0, f"good consumer got {dups} duplicates"
    during = sorted(v for n, v in traffic.latency.items()
                    if n >= battery.baseline_count)
    p99 = during[int(len(during) * 0.99)]
    assert p99 <= max(2 * battery.baseline_p99, 0.25), (
        f"good producer p99 latency {p99 * 1000:.0f} ms during the battery, baseline "
        f"{battery.baseline_p99 * 1000:.0f} ms")
    assert _consume_values(b.bootstrap, "f2-known", 4) == battery.known
    log = b.log_path.read_text()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
