"""A Fetch answer whose bytes follow a file slice (v12: a partition's fields after the previous
partition's records, and the closing tagged fields) is written corked (``TCP_CORK``,
``shmq/net/connection.py``): the answer arrives whole and as stored, and the connection is
uncorked after it, so the next (small) answer on it is not held back (a cork left on holds a
partial segment up to 200 ms)."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

from _broker import start_broker
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_wire import Wire, _recv_exact, plain, read_entity, record_batch
from kio.index import load_response_schema

from shmq.net.connection import _bytes_after_slice
from shmq.storage.slices import FileSlice


def test_bytes_after_a_slice_are_what_corks_an_answer() -> None:
    s = FileSlice(None, 0, 10)  # type: ignore[arg-type]
    assert _bytes_after_slice([b"head", s, b"\x00\x00\x00"])  # v12: closing tags
    assert _bytes_after_slice([b"head", s, b"next partition", s, b""])
    assert not _bytes_after_slice([b"head", s, b""])  # v11, one partition: nothing after
    assert not _bytes_after_slice([b"a quick answer"])
    assert not _bytes_after_slice([memoryview(b"head"), s])


def _answer(s: socket.socket) -> bytes:
    size = struct.unpack(">i", _recv_exact(s, 4))[0]
    return _recv_exact(s, size)


def test_corked_fetch_answer_is_whole_and_the_next_answer_is_not_held(tmp_path: Path) -> None:
    topic, parts = "corked", 3
    b = start_broker(tmp_path / "data", workers=1)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, parts)], operation_timeout=30)[topic].result(30)
        stored: dict[int, bytes] = {}
        with Wire(b.bootstrap) as w:
            leader = w.leader(topic, 0)
            for p in range(parts):
                batch = record_batch([(b"k", os.urandom(1000 + p), 0) for _ in range(20)])
                out = w.send(0, 8, {"transactional_id": None, "acks": -1, "timeout": 10_000,
                                    "topic_data": [{"name": topic, "partition_data": [
                                        {"index": p, "records": batch}]}]}, to=leader)
                assert out["responses"][0]["partition_responses"][0]["error_code"] == 0, out
                stored[p] = batch
            fetch = w.frame(1, 12, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 50 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
                "forgotten_topics_data": [],
                "topics": [{"topic": topic, "partitions": [
                    {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0,
                     "last_fetched_epoch": -1, "log_start_offset": -1,
                     "partition_max_bytes": 1 << 20} for p in range(parts)]}]})
            versions = w.frame(18, 3, {"client_software_name": "t",
                                       "client_software_version": "1"})
        s = socket.create_connection(leader, timeout=30)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for _ in range(3):
                s.sendall(struct.pack(">i", len(fetch)) + fetch)
                data = _answer(s)
                answer = plain(read_entity(load_response_schema(1, 12), data, 5)[0])
                got = {p["partition_index"]: p["records"] for t in answer["responses"]
                       for p in t["partitions"]}
                for p in range(parts):
                    assert got[p] is not None and len(got[p]) == len(stored[p]), p
                    assert got[p][61:] == stored[p][61:], p
                # the next answer, one small write, leaves at once: the socket is uncorked
                start = time.monotonic()
                s.sendall(struct.pack(">i", len(versions)) + versions)
                _answer(s)
                assert time.monotonic() - start < 0.15
        finally:
            s.close()
    finally:
        assert b.stop() == 0, b.log_path.read_text()
