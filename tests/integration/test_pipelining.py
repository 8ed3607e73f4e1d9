"""Pipelined requests on one connection: answered in order, and quick ones in one write.

librdkafka resolves a new assignment's offsets with one ListOffsets request per partition, all
written at once, and fetches as soon as the first answer arrives; the workers answer such a run
of quick requests in one write (``shmq/net/connection.py``), and never hold an answer back
behind a request that may wait.  The workers' ``responses`` and ``response_writes`` counters
witness the writes; the bytes on the socket witness the order.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.producer import ProduceResponse
from test_wire_bad_input import encode, produce_request, read_frame, record_batch

TOPIC = "pipelined"
PARTITIONS = 8
L = ListOffsetsRequest
EARLIEST, LATEST = -2, -1


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningBroker, int]]:
    """A broker with one worker (every partition on one port) and the topic created."""
    b = start_broker(tmp_path_factory.mktemp("pipelining") / "data", workers=1)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
        deadline = time.monotonic() + 15
        while len(admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions) < PARTITIONS:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        port = b.run_info["workers"][0]["port"]
        yield b, port
    finally:
        code = b.stop()
        assert code == 0, b.log_path.read_text()


def list_offsets(partition: int, correlation_id: int, timestamp: int = EARLIEST) -> bytes:
    T = L.ListOffsetsTopic
    return encode(L[5](replica_id=-1, isolation_level=0, topics=[T(name=TOPIC, partitions=[
        T.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1,
                               timestamp=timestamp)])]), correlation_id)


def read_answers(sock: socket.socket, count: int) -> list[bytes]:
    answers = []
    for _ in range(count):
        out = read_frame(sock, timeout=5)
        assert out.kind == "response", f"answer {len(answers) + 1} of {count}: {out}"
        answers.append(out.body)
    return answers


def counters(broker: RunningBroker, after: float) -> tuple[int, int]:
    (stats,) = broker.worker_stats(after)
    return stats["responses"], stats["response_writes"]


def settled(broker: RunningBroker) -> tuple[int, int]:
    """The counters once nothing else is in flight (two consecutive equal snapshots)."""
    last = counters(broker, time.time())
    for _ in range(10):
        now = counters(broker, time.time())
        if now == last:
            return now
        last = now
    raise AssertionError(f"worker counters still moving: {last}")


def test_pipelined_list_offsets_are_answered_in_order_in_one_write(
        one_worker: tuple[RunningBroker, int]) -> None:
    broker, port = one_worker
    before = settled(broker)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        # one write of all the requests, as librdkafka's offset reset does
        sock.sendall(b"".join(list_offsets(p, 100 + p) for p in range(PARTITIONS)))
        answers = read_answers(sock, PARTITIONS)
    for p, body in enumerate(answers):
        assert struct.unpack_from(">i", body)[0] == 100 + p
        resp = ListOffsetsResponse[5].decode(body, header=True)
        (part,) = resp.topics[0].partitions
        assert (part.partition_index, part.error_code, part.offset) == (p, 0, 0)
    after = settled(broker)
    responses, writes = after[0] - before[0], after[1] - before[1]
    assert responses == PARTITIONS
    # one write when all arrived in one read; a read split by the kernel may add one
    assert writes <= 2, f"{PARTITIONS} pipelined ListOffsets answered in {writes} writes"


def test_a_slow_request_does_not_hold_back_the_answers_before_it(
        one_worker: tuple[RunningBroker, int]) -> None:
    """ListOffsets, Produce (acks=all: it waits for the fsync), ListOffsets(latest): answered in
    request order, and the Produce is stored before the second ListOffsets is answered."""
    broker, port = one_worker
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(list_offsets(3, 201)
                     + produce_request(TOPIC, 3, record_batch([b"a", b"b", b"c"]), 3, 202)
                     + list_offsets(3, 203, LATEST))
        first, produced, latest = read_answers(sock, 3)
    assert [struct.unpack_from(">i", b)[0] for b in (first, produced, latest)] == [201, 202, 203]
    assert ListOffsetsResponse[5].decode(first, header=True).topics[0].partitions[0].offset == 0
    part = ProduceResponse[3].decode(produced, header=True).responses[0].partition_responses[0]
    assert (part.error_code, part.base_offset) == (0, 0)
    resp = ListOffsetsResponse[5].decode(latest, header=True)
    assert resp.topics[0].partitions[0].offset == 3


def test_answers_before_a_malformed_request_are_sent_before_the_close(
        one_worker: tuple[RunningBroker, int]) -> None:
    """A run of quick requests, then a ListOffsets frame cut short (a protocol error): the
    valid ones are answered, then the connection closes; the broker keeps serving."""
    broker, port = one_worker
    bad = list_offsets(0, 399)
    bad = struct.pack(">i", 12) + bad[4:16]  # the header and a few bytes of the body
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(list_offsets(0, 301) + list_offsets(1, 302) + bad)
        answers = read_answers(sock, 2)
        assert [struct.unpack_from(">i", b)[0] for b in answers] == [301, 302]
        assert read_frame(sock, timeout=5).kind == "closed"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(list_offsets(2, 401))
        assert struct.unpack_from(">i", read_answers(sock, 1)[0])[0] == 401



def test_a_consumer_start_of_500_partitions_is_answered_in_one_write(
        one_worker: tuple[RunningBroker, int]) -> None:
    """librdkafka starting a consumer on 1,000 partitions over two workers writes 500
    ListOffsets to each at once, and builds its first Fetch from the partitions answered by then:
    in runs of 64 answers that Fetch named 64 (often empty, so parked for fetch.wait.max.ms)."""
    broker, port = one_worker
    count = 500
    before = settled(broker)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"".join(list_offsets(i % PARTITIONS, 1000 + i) for i in range(count)))
        answers = read_answers(sock, count)
    assert [struct.unpack_from(">i", body)[0] for body in answers] == \
        list(range(1000, 1000 + count))
    after = settled(broker)
    responses, writes = after[0] - before[0], after[1] - before[1]
    assert responses == count
    # one write when all arrived in one read; reads split by the kernel may add a few
    assert writes <= 3, f"{count} pipelined ListOffsets answered in {writes} writes"


def test_pipelined_produces_are_appended_while_an_fsync_runs(tmp_path: Path) -> None:
    """Every segment fsync takes 300 ms (the slow-disk fault hook).  Eight acks=all Produce
    requests written at once on one connection, then a ListOffsets(latest): each Produce is
    appended while the one before waits for its fsync, so one group commit covers the rest
    (about two fsyncs in all, where one request at a time took eight, 2.4 s); the answers come
    in request order with offsets in request order, and the ListOffsets, behind them, sees all
    eight stored."""
    b = start_broker(tmp_path / "data", workers=1,
                     env=dict(os.environ, SHMQ_FAULT_FSYNC_DELAY_MS="300"))
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("slow-disk", 1, 1)])["slow-disk"].result(30)
        port = b.run_info["workers"][0]["port"]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(produce_request("slow-disk", 0, record_batch([b"warm"]), 3, 500))
            read_answers(sock, 1)  # the log exists and its first flush is done
            started = time.monotonic()
            sock.sendall(b"".join(produce_request("slow-disk", 0, record_batch([b"%d" % i]), 3,
                                                  501 + i) for i in range(8))
                         + list_offsets_of("slow-disk", 0, 509, LATEST))
            answers = [read_frame(sock, timeout=10) for _ in range(9)]
            elapsed = time.monotonic() - started
    finally:
        assert b.stop() == 0, b.log_path.read_text()[-3000:]
    assert all(a.kind == "response" for a in answers), [str(a) for a in answers]
    bodies = [a.body for a in answers]
    assert [struct.unpack_from(">i", body)[0] for body in bodies] == list(range(501, 510))
    parts = [ProduceResponse[3].decode(body, header=True).responses[0].partition_responses[0]
             for body in bodies[:8]]
    assert [(p.error_code, p.base_offset) for p in parts] == [(0, 1 + i) for i in range(8)]
    latest = ListOffsetsResponse[5].decode(bodies[8], header=True)
    assert latest.topics[0].partitions[0].offset == 9
    assert elapsed < 1.5, f"8 pipelined acks=all produces took {elapsed:.2f} s (fsync 300 ms)"


def list_offsets_of(topic: str, partition: int, correlation_id: int, timestamp: int) -> bytes:
    T = L.ListOffsetsTopic
    return encode(L[5](replica_id=-1, isolation_level=0, topics=[T(name=topic, partitions=[
        T.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1,
                               timestamp=timestamp)])]), correlation_id)


def test_the_scale_bench_counts_requests_and_long_polls(
        one_worker: tuple[RunningBroker, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The perf tools' ``Counters`` (``perf/suite.py``, used by ``bench_scale.py`` too) read each
    phase's requests and its Fetch long polls from the broker's metrics table: a Fetch of an empty partition parked for its max_wait
    (400 ms) counts as a long poll over 250 ms, one answered after 50 ms does not, and the
    ListOffsets, Fetch and Produce counts are the requests sent (the independent oracle: what
    this test wrote on the socket)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "perf"))
    from suite import Counters

    broker, port = one_worker
    counters = Counters(broker.data_dir)
    try:
        before = counters.read()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"".join(list_offsets(i, 2000 + i) for i in range(5)))
            read_answers(sock, 5)
            for wait_ms, correlation in ((400, 2005), (50, 2006)):
                started = time.monotonic()
                sock.sendall(fetch_empty(PARTITIONS - 1, wait_ms, correlation))
                assert struct.unpack_from(">i", read_answers(sock, 1)[0])[0] == correlation
                assert time.monotonic() - started >= wait_ms / 1000 * 0.9
        # a request is counted once its answer has left (KafkaConnection._record), so the
        # client can read the answer a moment before the worker counts it (a loaded box)
        deadline = time.monotonic() + 5
        while True:
            counted = Counters.since(before, counters.read())
            if counted["Fetch"] >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    finally:
        counters.close()
    assert (counted["ListOffsets"], counted["Fetch"], counted["Produce"]) == (5, 2, 0), counted
    assert counted["long_polls"] == 1, counted
    assert 0.4 <= counted["fetch_wait_s"] < 1.5, counted


def fetch_empty(partition: int, max_wait_ms: int, correlation_id: int) -> bytes:
    """A Fetch (v11, min_bytes 1) of ``partition`` at its end: nothing to read, so parked."""
    F = FetchRequest
    return encode(F[11](
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
        topics=[F.FetchTopic(topic=TOPIC, partitions=[F.FetchTopic.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
            partition_max_bytes=1 << 20)])]), correlation_id)


def test_produce_answers_a_client_reads_late_arrive_whole_and_in_order(
        one_worker: tuple[RunningBroker, int]) -> None:
    """A client writes 16,000 Produce requests before it reads an answer (a small receive
    buffer; each answer ~300 bytes: it repeats the topic's 249-character name): the worker's
    send of a one-piece answer stops part-way once the socket is full and the rest goes through
    the transport (``KafkaConnection._send``).  Every answer arrives whole, in request order,
    with consecutive offsets."""
    broker, port = one_worker
    topic = "late-reader-" + "x" * 237  # 249 characters, Kafka's longest name
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    deadline = time.monotonic() + 15
    while topic not in admin.list_topics(topic, timeout=5).topics:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    count = 16_000
    batch = record_batch([b"late"])
    requests = b"".join(produce_request(topic, 0, batch, 3, 10_000 + i) for i in range(count))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", port))
        writer = threading.Thread(target=sock.sendall, args=(requests,))
        writer.start()
        time.sleep(1.0)  # the worker answers into a full socket meanwhile
        answers = [read_frame(sock, timeout=10) for _ in range(count)]
        writer.join(30)
    assert all(a.kind == "response" for a in answers), [str(a) for a in answers[:3]]
    assert [struct.unpack_from(">i", a.body)[0] for a in answers] == \
        list(range(10_000, 10_000 + count))
    parts = [ProduceResponse[3].decode(a.body, header=True).responses[0].partition_responses[0]
             for a in answers]
    assert all(p.error_code == 0 for p in parts)
    assert [p.base_offset for p in parts] == list(range(count))
