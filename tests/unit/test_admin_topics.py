"""CreateTopics as the controller decides it (``admin.plan_create_topics``), rule by rule from
Kafka 4's ``ControllerApis.createTopics`` and ``ReplicationControlManager.createTopics`` /
``createTopic`` / ``validateManualPartitionAssignment``."""

from __future__ import annotations

from pathlib import Path

import pytest

from shmq.broker.admin import plan_create_topics
from shmq.broker.context import TopicRequest
from shmq.broker.metadata import MetadataStore
from shmq.storage.log_config import LogConfig

WORKERS = [1, 2]
NONE, INVALID_TOPIC, TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS = 0, 17, 36, 37
INVALID_REPLICATION_FACTOR, INVALID_REPLICA_ASSIGNMENT, INVALID_CONFIG = 38, 39, 40
INVALID_REQUEST, POLICY_VIOLATION = 42, 44


@pytest.fixture
def meta(tmp_path: Path):
    store = MetadataStore(tmp_path)
    store.create_topic("t", 2, WORKERS)
    store.create_topic("my.topic", 1, WORKERS)
    return store.metadata


def plan(meta, *topics: TopicRequest, default_partitions: int = 1):
    results, creations = plan_create_topics(meta, topics, LogConfig(), default_partitions,
                                            WORKERS)
    return results, {c.name: (c.partitions, c.leaders) for c in creations}


def codes(results) -> list[tuple[str, int]]:
    return [(r.name, r.error_code) for r in results]


def topic(name: str, partitions: int = 1, rf: int = 1, configs: dict | None = None,
          assignments: list | None = None) -> TopicRequest:
    return TopicRequest(name, partitions, rf, configs or {}, assignments or [])


def test_a_created_topic_is_answered_with_its_configs(meta) -> None:
    """CreateTopics v5+: num_partitions, replication_factor and every effective topic config
    sorted by name with its source (Java's AdminClient reads the list)."""
    results, created = plan(meta, topic("new", 3, configs={"retention.ms": "3600000"}))
    (r,) = results
    assert (r.error_code, r.num_partitions, r.replication_factor) == (NONE, 3, 1)
    names = [c[0] for c in r.configs]
    assert names == sorted(names) and "segment.bytes" in names and len(names) > 30
    by_name = {c[0]: c[1:] for c in r.configs}
    assert by_name["retention.ms"] == ["3600000", False, 1, False]  # DYNAMIC_TOPIC_CONFIG
    assert by_name["segment.bytes"] == ["1073741824", False, 5, False]  # DEFAULT_CONFIG
    assert created == {"new": (3, None)}
    (r,), _ = plan(meta, topic("defaults", -1, -1), default_partitions=4)
    assert (r.error_code, r.num_partitions, r.replication_factor) == (NONE, 4, 1)


def test_manual_assignment_places_each_partition(meta) -> None:
    results, created = plan(meta, topic("m", -1, -1, assignments=[[1, [2]], [0, [1]], [2, [2]]]))
    assert codes(results) == [("m", NONE)] and results[0].num_partitions == 3
    assert created == {"m": (3, [1, 2, 2])}


@pytest.mark.parametrize(("assignments", "partitions", "rf", "code", "message"), [
    ([[0, [1]]], 3, -1, INVALID_REQUEST,
     "A manual partition assignment was specified, but numPartitions was not set to -1."),
    ([[0, [1]]], -1, 1, INVALID_REQUEST,
     "A manual partition assignment was specified, but replication factor was not set to -1."),
    ([[0, [1]], [0, [2]]], -1, -1, INVALID_REPLICA_ASSIGNMENT,
     "Found multiple manual partition assignments for partition 0"),
    ([[0, [1]], [2, [2]]], -1, -1, INVALID_REPLICA_ASSIGNMENT,
     "partitions should be a consecutive 0-based integer sequence"),
    ([[1, [1]]], -1, -1, INVALID_REPLICA_ASSIGNMENT,
     "partitions should be a consecutive 0-based integer sequence"),
    ([[0, [3]]], -1, -1, INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes broker 3, but no such broker is registered."),
    ([[0, [0]]], -1, -1, INVALID_REPLICA_ASSIGNMENT,  # node 0: the controller, not a broker
     "The manual partition assignment includes broker 0, but no such broker is registered."),
    ([[0, []]], -1, -1, INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes an empty replica list."),
    ([[0, [2, 2]]], -1, -1, INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes the broker 2 more than once."),
    ([[0, [1, 2]], [1, [2]]], -1, -1, INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes a partition with 1 replica(s), but this is not "
     "consistent with previous partitions, which have 2 replica(s)."),
    # valid for Kafka with two brokers; shmq keeps one replica
    ([[0, [1, 2]], [1, [2, 1]]], -1, -1, INVALID_REPLICATION_FACTOR,
     "Unable to replicate the partition 2 time(s): shmq keeps one replica per partition for now."),
])
def test_bad_manual_assignments(meta, assignments, partitions, rf, code, message) -> None:
    results, created = plan(meta, topic("m", partitions, rf, assignments=assignments))
    assert [(r.error_code, r.error_message) for r in results] == [(code, message)]
    assert created == {}


@pytest.mark.parametrize(("partitions", "rf", "code", "message"), [
    (0, 1, INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value."),
    (-2, 1, INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value."),
    (1, 0, INVALID_REPLICATION_FACTOR,
     "Replication factor must be larger than 0, or -1 to use the default value."),
    (1, -3, INVALID_REPLICATION_FACTOR,
     "Replication factor must be larger than 0, or -1 to use the default value."),
    (1, 3, INVALID_REPLICATION_FACTOR,
     "Unable to replicate the partition 3 time(s): shmq keeps one replica per partition for now."),
])
def test_bad_counts(meta, partitions, rf, code, message) -> None:
    results, _ = plan(meta, topic("c", partitions, rf))
    assert [(r.error_code, r.error_message) for r in results] == [(code, message)]


def test_names_that_collide_on_dot_and_underscore(meta) -> None:
    """Topic.hasCollisionChars: 'a.b' and 'a_b' would share metric names."""
    results, created = plan(meta, topic("my_topic"), topic("x.y"), topic("x_y"),
                            topic("__consumer.offsets"), topic("my.topic"), topic("t"))
    assert [(r.name, r.error_code, r.error_message) for r in results] == [
        ("my_topic", INVALID_TOPIC, "Topic 'my_topic' collides with existing topic: my.topic"),
        ("x.y", NONE, None),
        ("x_y", INVALID_TOPIC, "Topic 'x_y' collides with existing topic: x.y"),
        ("__consumer.offsets", INVALID_TOPIC,
         "Topic '__consumer.offsets' collides with existing topic: __consumer_offsets"),
        ("my.topic", TOPIC_ALREADY_EXISTS, "Topic 'my.topic' already exists."),
        ("t", TOPIC_ALREADY_EXISTS, "Topic 't' already exists.")]
    assert list(created) == ["x.y"]


def test_cluster_metadata_duplicates_and_null_configs(meta) -> None:
    results, created = plan(meta, topic("__cluster_metadata"), topic("d"), topic("ok"),
                            topic("d"), topic("n", configs={"retention.ms": None,
                                                            "segment.ms": None}))
    assert [(r.name, r.error_code, r.error_message) for r in results] == [
        ("ok", NONE, None),
        ("n", INVALID_CONFIG, "Null value not supported for topic configs: retention.ms,"
                              "segment.ms"),
        ("d", INVALID_REQUEST, "Duplicate topic name."),
        ("__cluster_metadata", INVALID_REQUEST,
         "Creation of internal topic __cluster_metadata is prohibited.")]
    assert list(created) == ["ok"]


def test_config_errors_come_before_partition_errors(meta) -> None:
    (r,), _ = plan(meta, topic("e", 0, configs={"retention.ms": "soon"}))
    assert r.error_code == INVALID_CONFIG and "retention.ms" in r.error_message


def test_one_request_writes_at_most_ten_thousand_records(meta) -> None:
    """QuorumController.MAX_RECORDS_PER_USER_OP: a topic record, a record per config and per
    partition; beyond 10,000 the whole request is POLICY_VIOLATION."""
    results, created = plan(meta, topic("big", 9_999))
    assert codes(results) == [("big", NONE)] and created["big"][0] == 9_999
    results, created = plan(meta, topic("small", 1), topic("big", 10_000), topic("t"))
    assert [(r.name, r.error_code, r.error_message) for r in results] == [
        (n, POLICY_VIOLATION, "Unable to perform excessively large batch operation.")
        for n in ("small", "big", "t")]
    assert created == {}
    results, _ = plan(meta, topic("big", 9_999, configs={"retention.ms": "1"}))
    assert results[0].error_code == POLICY_VIOLATION
    results, _ = plan(meta, topic("a", 5_000), topic("b", 4_998))  # 10,000 records
    assert codes(results) == [("a", NONE), ("b", NONE)]
