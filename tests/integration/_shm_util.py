"""Shared helpers of the shared-memory path tests: raw Kafka wire requests built with
kafka-python's protocol classes (an independent encoder) and batches built with its
``DefaultRecordBatchBuilder`` (an independent record encoder)."""

from __future__ import annotations

import socket
import struct
import time

from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords


def build_batch(values: list[bytes], *, pid: int = -1, epoch: int = -1, seq: int = -1,
                compression: int = 0, key: bytes | None = None,
                headers: list | None = None) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                  batch_size=1 << 30)
    ts = int(time.time() * 1000)
    for i, v in enumerate(values):
        b.append(i, timestamp=ts, key=key, value=v, headers=headers or [])
    return bytes(b.build())


class Wire:
    """One connection to a broker port speaking raw Kafka requests."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.corr = 0

    def close(self) -> None:
        self.sock.close()

    def _send(self, request) -> int:
        self.corr += 1
        request.with_header(correlation_id=self.corr, client_id="shm-parity")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        return self.corr

    def _read(self) -> bytes:
        def exact(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = self.sock.recv(n - len(buf))
                if not chunk:
                    raise ConnectionError("closed")
                buf += chunk
            return buf

        size = struct.unpack(">i", exact(4))[0]
        return exact(size)

    def call(self, request, response_cls):
        corr = self._send(request)
        body = self._read()
        assert struct.unpack_from(">i", body)[0] == corr
        return response_cls.decode(body, header=True)

    def produce(self, topic: str, partition: int, records: bytes, acks: int = -1,
                version: int = 7):
        P = ProduceRequest
        req = P[version](transactional_id=None, acks=acks, timeout_ms=5000, topic_data=[
            P.TopicProduceData(name=topic, partition_data=[
                P.TopicProduceData.PartitionProduceData(index=partition, records=records)])])
        if acks == 0:
            self._send(req)
            return None
        resp = self.call(req, ProduceResponse[version])
        return resp.responses[0].partition_responses[0]

    def init_producer_id(self) -> tuple[int, int]:
        req = InitProducerIdRequest[1](transactional_id=None, transaction_timeout_ms=60000)
        resp = self.call(req, _init_response(1))
        assert resp.error_code == 0, resp
        return resp.producer_id, resp.producer_epoch

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20,
              version: int = 11):
        F = FetchRequest
        req = F[version](replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes,
                         isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
                         forgotten_topics_data=[],
                         topics=[F.FetchTopic(topic=topic, partitions=[F.FetchTopic.FetchPartition(
                             partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                             log_start_offset=-1, partition_max_bytes=max_bytes)])])
        resp = self.call(req, FetchResponse[version])
        return resp.responses[0].partitions[0]

    def leaders(self, topic: str) -> dict[int, int]:
        resp = self.call(MetadataRequest[4](topics=[MetadataRequest.MetadataRequestTopic(
            name=topic)], allow_auto_topic_creation=False), MetadataResponse[4])
        brokers = {b.node_id: b.port for b in resp.brokers}
        t = resp.topics[0]
        return {p.partition_index: brokers[p.leader_id] for p in t.partitions}


def _init_response(version: int):
    from kafka.protocol.producer import InitProducerIdResponse

    return InitProducerIdResponse[version]


def decode_records(raw: bytes | None) -> list[tuple]:
    """(offset, timestamp, key, value, headers) of every record, by kafka-python's decoder."""
    out = []
    if not raw:
        return out
    mr = MemoryRecords(raw)
    while mr.has_next():
        batch = mr.next_batch()
        if batch is None:
            break
        for r in batch:
            out.append((r.offset, r.timestamp, r.key, r.value,
                        tuple((k, v) for k, v in r.headers)))
    return out
