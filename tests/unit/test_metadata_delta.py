"""The controller sends a worker only the topics that changed (``MetadataStore.message_for``),
and the worker's copy (``ClusterMetadata.updated``) equals the whole metadata after every kind
of change; the whole metadata's JSON is the same bytes as ``json.dumps`` of all of it."""

from __future__ import annotations

import json
from pathlib import Path

from shmq.broker.metadata import ClusterMetadata, MetadataStore

WORKERS = [1, 2]


def _whole_json(meta: ClusterMetadata) -> str:
    """What ``to_json`` wrote before it was assembled from parts."""
    topics = {name: {**t.__dict__, "configs": t.configs,
                     "partitions": [p.__dict__ for p in t.partitions]}
              for name, t in meta.topics.items()}
    return json.dumps({**meta.__dict__, "topics": topics,
                       "brokers": {str(k): list(v) for k, v in meta.brokers.items()}},
                      sort_keys=True)


class _Worker:
    """A worker's side of the control channel: the copy it keeps."""

    def __init__(self) -> None:
        self.meta: ClusterMetadata | None = None

    def receive(self, line: str) -> dict:
        msg = json.loads(line)  # one line of JSON, as ControlChannel.receive parses it
        assert msg["type"] == "metadata"
        if "base" not in msg:
            self.meta = ClusterMetadata.from_dict(msg["metadata"])
        else:
            assert self.meta is not None and msg["base"] == self.meta.generation
            self.meta = self.meta.updated(msg["head"], msg["topics"], msg["removed"])
        return msg


def test_workers_get_only_what_changed(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path)
    store.metadata.brokers = {1: ("127.0.0.1", 1), 2: ("127.0.0.1", 2)}
    store.create_topic("big", 500, WORKERS)
    store.create_topic("small", 3, WORKERS, {"retention.ms": "1000"})
    worker = _Worker()
    line, sent = store.message_for(None, -1)
    first = worker.receive(line)
    assert "base" not in first and set(first["metadata"]["topics"]) == {"big", "small"}
    base = store.metadata.generation

    def step(expect_topics: set[str], expect_removed: list[str]) -> None:
        nonlocal sent, base
        line, sent = store.message_for(sent, base)
        msg = worker.receive(line)
        assert set(msg["topics"]) == expect_topics, msg["topics"].keys()
        assert msg["removed"] == expect_removed
        base = store.metadata.generation
        assert worker.meta is not None
        assert worker.meta.to_json() == store.text() == _whole_json(store.metadata)
        # the topics in the order a worker parsing the whole JSON has them (names sorted)
        assert list(worker.meta.topics) == list(ClusterMetadata.from_json(store.text()).topics)
        assert ClusterMetadata.from_json(store.text()).to_json() == store.text()

    store.register_internal_topic("__consumer_offsets", 50, {"cleanup.policy": "compact"})
    step({"__consumer_offsets"}, [])  # not the 500 partitions of "big" again
    store.add_partitions("small", 5, WORKERS)
    step({"small"}, [])
    store.set_configs(2, "big", {"retention.ms": "5"})
    step({"big"}, [])
    store.set_configs(4, "1", {"log.retention.ms": "7"})  # a broker config: the head only
    step(set(), [])
    store.metadata.next_producer_id += 1000
    store.save()
    step(set(), [])
    store.delete_topic("small")
    step(set(), ["small"])
    store.create_topic("small", 2, WORKERS)  # the same name again: another topic id
    step({"small"}, [])
    moved = store.reassign_missing([1])  # worker 2 is gone: its partitions move to 1
    assert moved
    step({"big", "small"}, [])
    assert worker.meta is not None
    assert all(p.leader == 1 for t in worker.meta.topics.values() if not t.internal
               for p in t.partitions)


def test_the_whole_metadata_has_the_same_bytes(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path)
    assert store.text() == _whole_json(store.metadata)  # no topic yet
    store.create_topic("b", 3, WORKERS)
    store.create_topic("a\"quoted", 2, WORKERS, {"x": "é"})  # escaped in JSON
    store.metadata.broker_configs[""] = {"log.retention.ms": "1"}
    store.save()
    assert store.text() == _whole_json(store.metadata)
    assert MetadataStore(tmp_path).text() == store.text()  # read back from the file
