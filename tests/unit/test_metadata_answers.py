"""Metadata answers are cached per metadata generation (``handlers/metadata.py``): a repeated
request gets the same bytes with its own correlation id, and every change a client must see
(a topic created, deleted or grown, a leader moved, a storage error flagged) is answered anew.

The store is mutated in place as in the controller, and replaced from JSON as in a worker."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from shmq.broker.config import BrokerConfig
from shmq.broker.context import BrokerContext
from shmq.broker.handlers import metadata as metadata_handler
from shmq.broker.metadata import ClusterMetadata, MetadataStore
from shmq.protocol.codec import RequestHeader
from shmq.protocol.kio_guard import read_entity

WORKERS = [1, 2]
VERSION = 12


class _Reader:
    """A state table reader whose STORAGE_ERROR flags the test sets."""

    closed = False

    def __init__(self) -> None:
        self.failing: set[int] = set()

    def flagged(self, mask: int) -> set[int]:
        return set(self.failing)


@pytest.fixture
def store(tmp_path: Path) -> MetadataStore:
    s = MetadataStore(tmp_path)
    s.metadata.brokers = {0: ("127.0.0.1", 9092), 1: ("127.0.0.1", 9093),
                          2: ("127.0.0.1", 9094)}
    s.create_topic("t", 3, WORKERS)
    return s


def _ctx(store: MetadataStore, tmp_path: Path) -> BrokerContext:
    return BrokerContext(node_id=0, config=BrokerConfig(data_dir=tmp_path, auto_create_topics=False),
                         metadata=store.metadata, controller=None,  # type: ignore[arg-type]
                         state_reader=_Reader())


def _build(cls: type, **fields: Any) -> Any:
    """``cls`` with the fields its version has."""
    return cls(**{f.name: fields[f.name] for f in dataclasses.fields(cls) if f.name in fields})


def _ask(ctx: BrokerContext, topics: list[str] | None, correlation_id: int = 7,
         version: int = VERSION) -> tuple[bytes, dict[str, Any]]:
    """(the framed answer, {topic: [(partition, leader, epoch, offline)] or error code})."""
    cls = load_request_schema(3, version)
    topic_cls = sys.modules[cls.__module__].MetadataRequestTopic
    request = _build(cls, topics=None if topics is None else tuple(
        _build(topic_cls, topic_id=uuid.UUID(int=0), name=n) for n in topics),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    header = RequestHeader(3, version, correlation_id, "test")
    pieces = asyncio.run(metadata_handler.handle(ctx, header, request))
    framed = b"".join(bytes(p) for p in pieces)
    assert int.from_bytes(framed[:4], "big") == len(framed) - 4
    assert int.from_bytes(framed[4:8], "big") == correlation_id
    response = load_response_schema(3, version)
    body, _ = read_entity(response, framed, 8 + (response.__header_schema__.__version__ >= 1))
    out: dict[str, Any] = {}
    for t in body.topics:
        out[t.name] = int(t.error_code) or [
            (int(p.partition_index), int(p.leader_id), int(getattr(p, "leader_epoch", -1)),
             [int(x) for x in getattr(p, "offline_replicas", ())]) for p in t.partitions]
    out["brokers"] = sorted((int(b.node_id), b.port) for b in body.brokers)
    return framed, out


def test_a_repeated_request_is_answered_from_the_cache(store, tmp_path) -> None:
    ctx = _ctx(store, tmp_path)
    first, answer = _ask(ctx, ["t"], correlation_id=1)
    assert answer["t"] == [(0, 1, 0, []), (1, 2, 0, []), (2, 1, 0, [])]
    cached = dict(ctx.metadata_answers)
    second, _ = _ask(ctx, ["t"], correlation_id=2)
    assert second[8:] == first[8:] and second[4:8] != first[4:8]
    assert ctx.metadata_answers == cached  # nothing was built again
    _ask(ctx, ["t", "nope"])  # other topics: an answer of its own
    _ask(ctx, ["t"], version=1)  # another version: an answer of its own
    assert len(ctx.metadata_answers) == len(cached) + 2


def test_every_change_of_the_metadata_is_answered_anew(store, tmp_path) -> None:
    """In place, as the controller's store changes (each change is a new generation)."""
    ctx = _ctx(store, tmp_path)
    assert len(_ask(ctx, ["t", "u"])[1]["t"]) == 3
    assert _ask(ctx, ["t", "u"])[1]["u"] == 3  # UNKNOWN_TOPIC_OR_PARTITION
    store.create_topic("u", 2, WORKERS)  # CreateTopics
    assert len(_ask(ctx, ["t", "u"])[1]["u"]) == 2
    assert set(_ask(ctx, None)[1]) == {"t", "u", "brokers"}
    store.add_partitions("t", 5, WORKERS)  # CreatePartitions
    assert [p[0] for p in _ask(ctx, ["t", "u"])[1]["t"]] == [0, 1, 2, 3, 4]
    store.delete_topic("u")  # DeleteTopics
    assert _ask(ctx, ["t", "u"])[1]["u"] == 3
    assert set(_ask(ctx, None)[1]) == {"t", "brokers"}
    moved = store.reassign_missing([2])  # worker 1 gone: its partitions move, epochs bump
    assert moved
    assert _ask(ctx, ["t"])[1]["t"][0] == (0, 2, 1, [])
    store.metadata.brokers[2] = ("127.0.0.1", 9999)  # a worker restarted on a new port
    store.save()
    assert (2, 9999) in _ask(ctx, ["t"])[1]["brokers"]


def test_a_storage_error_flag_is_answered_at_once(store, tmp_path) -> None:
    ctx = _ctx(store, tmp_path)
    assert _ask(ctx, ["t"])[1]["t"][1][3] == []
    slot = store.metadata.topics["t"].partitions[1].slot
    ctx.state_reader.failing.add(slot)  # no metadata change: only the flag
    assert _ask(ctx, ["t"])[1]["t"][1][3] == [2]
    ctx.state_reader.failing.clear()
    assert _ask(ctx, ["t"])[1]["t"][1][3] == []


def test_a_worker_replacing_its_copy_is_answered_anew(store, tmp_path) -> None:
    """A worker gets a new ``ClusterMetadata`` from JSON on every update."""
    ctx = _ctx(store, tmp_path)
    ctx.metadata = ClusterMetadata.from_json(store.metadata.to_json())
    assert len(_ask(ctx, ["t"])[1]["t"]) == 3
    store.add_partitions("t", 4, WORKERS)
    ctx.metadata = ClusterMetadata.from_json(store.metadata.to_json())
    assert len(_ask(ctx, ["t"])[1]["t"]) == 4


def test_the_cache_stays_bounded(store, tmp_path) -> None:
    ctx = _ctx(store, tmp_path)
    for i in range(200):
        _ask(ctx, [f"x{i}"])
    assert len(ctx.metadata_answers) <= metadata_handler._CACHED_ANSWERS + 2
