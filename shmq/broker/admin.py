"""What the controller decides for CreateTopics, CreatePartitions and (Incremental)AlterConfigs.

Pure functions over the cluster metadata: they return the per-resource results to answer and the
changes to make, and change nothing themselves.  The controller persists the changes (one atomic
metadata rewrite each) and pushes the new metadata to every worker before it answers, so the
client that altered a config reads it back from any node.  Requests are JSON-shaped dicts
because workers forward them over the control channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shmq.broker.context import TopicRequest, TopicResult
from shmq.broker.dynamic_configs import (
    BROKER,
    DELETE,
    INVALID_REQUEST,
    TOPIC,
    ConfigChangeError,
    InvalidValueError,
    apply_ops,
    broker_def,
    topic_def,
    validate_topic_configs,
)
from shmq.broker.metadata import INTERNAL_TOPICS, ClusterMetadata, validate_topic_name
from shmq.storage.log_config import LogConfig

NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC, TOPIC_ALREADY_EXISTS = 0, 3, 17, 36
INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, INVALID_REPLICA_ASSIGNMENT = 37, 38, 39
INVALID_CONFIG, POLICY_VIOLATION = 40, 44
# QuorumController.MAX_RECORDS_PER_USER_OP: one admin request may write at most this many
# metadata records (a topic is one record, each of its configs one, each partition one);
# beyond it the whole request fails with POLICY_VIOLATION
MAX_RECORDS_PER_USER_OP = 10_000
EXCESSIVE_BATCH = "Unable to perform excessively large batch operation."
CLUSTER_METADATA_TOPIC = "__cluster_metadata"


class AssignmentError(Exception):
    """A manual replica assignment Kafka refuses, with the error code to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _result(name: str, code: int = NONE, message: str | None = None) -> dict[str, Any]:
    return {"name": name, "error_code": code, "error_message": message}


def collision_key(name: str) -> str:
    """``Topic.unifyCollisionChars``: '.' and '_' collide in metric names."""
    return name.replace(".", "_")


def collision_index(meta: ClusterMetadata) -> dict[str, str]:
    """Unified name -> an existing topic with '.' or '_' (``topicsWithCollisionChars``); the
    coordinators' internal topics exist in shmq too, outside the metadata."""
    names = [*meta.topics, *INTERNAL_TOPICS]
    return {collision_key(n): n for n in names if "." in n or "_" in n}


def validate_assignment(replicas: list[int], workers: list[int],
                        replication_factor: int | None) -> None:
    """``ReplicationControlManager.validateManualPartitionAssignment``: a non-empty replica list
    of registered brokers, none twice, as many as the other partitions have.  The registered
    brokers of shmq are its workers (nodes 1..N); the controller, node 0, holds no partitions."""
    if not replicas:
        raise AssignmentError(INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment "
                                                          "includes an empty replica list.")
    previous = None
    for broker in sorted(replicas):
        if broker not in workers:
            raise AssignmentError(INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment "
                                  f"includes broker {broker}, but no such broker is registered.")
        if broker == previous:
            raise AssignmentError(INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment "
                                  f"includes the broker {broker} more than once.")
        previous = broker
    if replication_factor is not None and len(replicas) != replication_factor:
        raise AssignmentError(INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment "
                              f"includes a partition with {len(replicas)} replica(s), but this "
                              "is not consistent with previous partitions, which have "
                              f"{replication_factor} replica(s).")


def _one_replica(replication_factor: int) -> None:
    if replication_factor != 1:
        raise AssignmentError(INVALID_REPLICATION_FACTOR, "Unable to replicate the partition "
                              f"{replication_factor} time(s): shmq keeps one replica per "
                              "partition for now.")


@dataclass
class TopicCreation:
    """A topic CreateTopics creates: its result's index, partition leaders, configs."""

    index: int
    name: str
    leaders: list[int] | None  # one per partition (manual assignment), or None: round-robin
    partitions: int
    configs: dict[str, str]


def _placement(t: TopicRequest, default_partitions: int,
               workers: list[int]) -> tuple[int, list[int] | None]:
    """(partition count, leaders of a manual assignment or None): ``createTopic``'s checks."""
    if t.assignments:
        if t.replication_factor != -1:
            raise AssignmentError(INVALID_REQUEST, "A manual partition assignment was specified, "
                                                   "but replication factor was not set to -1.")
        if t.num_partitions != -1:
            raise AssignmentError(INVALID_REQUEST, "A manual partition assignment was specified, "
                                                   "but numPartitions was not set to -1.")
        placed: dict[int, list[int]] = {}
        factor: int | None = None
        for index, brokers in t.assignments:
            if index in placed:
                raise AssignmentError(INVALID_REPLICA_ASSIGNMENT, "Found multiple manual "
                                      f"partition assignments for partition {index}")
            validate_assignment(list(brokers), workers, factor)
            factor = len(brokers)
            placed[index] = list(brokers)
        if any(i not in placed for i in range(len(placed))):
            raise AssignmentError(INVALID_REPLICA_ASSIGNMENT, "partitions should be a "
                                                              "consecutive 0-based integer sequence")
        _one_replica(factor or 0)
        return len(placed), [placed[i][0] for i in range(len(placed))]
    if t.replication_factor < -1 or t.replication_factor == 0:
        raise AssignmentError(INVALID_REPLICATION_FACTOR, "Replication factor must be larger "
                                                          "than 0, or -1 to use the default value.")
    if t.num_partitions < -1 or t.num_partitions == 0:
        raise AssignmentError(INVALID_PARTITIONS, "Number of partitions was set to an invalid "
                                                  "non-positive value.")
    _one_replica(1 if t.replication_factor == -1 else t.replication_factor)
    return (default_partitions if t.num_partitions == -1 else t.num_partitions), None


def plan_create_topics(meta: ClusterMetadata, topics: Sequence[TopicRequest], base: LogConfig,
                       default_partitions: int,
                       workers: list[int]) -> tuple[list[TopicResult], list[TopicCreation]]:
    """Kafka's CreateTopics (``ControllerApis.createTopics``, ``ReplicationControlManager.
    createTopics/createTopic``): the result of every topic and the topics to create.

    Checked in Kafka's order: names given twice, ``__cluster_metadata``, the name (legal, no
    '.'/'_' collision with an existing topic), existence, configs (no null values, valid), then
    the partitions: a manual assignment (with ``num_partitions`` and ``replication_factor`` -1,
    registered brokers, consecutive partitions) or a count and a replication factor.  shmq keeps
    one replica, so a replication factor other than 1 is INVALID_REPLICATION_FACTOR.  A request
    that would write more than 10,000 metadata records fails as a whole, as Kafka's does.  Topics
    created by the same request collide with each other too (Kafka checks only existing ones,
    and would refuse the second when the pair is later mirrored to it)."""
    from shmq.broker.dynamic_configs import describe_topic

    names = [t.name for t in topics]
    duplicated = [n for n in dict.fromkeys(names) if names.count(n) > 1]
    collisions = collision_index(meta)
    results: list[TopicResult] = []
    creations: list[TopicCreation] = []
    records = 0
    for t in topics:
        if t.name in duplicated or t.name == CLUSTER_METADATA_TOPIC:
            continue  # answered after the others, as ControllerApis does
        name = t.name
        reason = validate_topic_name(name)
        colliding = collisions.get(collision_key(name)) if "." in name or "_" in name else None
        if colliding is not None and colliding != name:
            results.append(TopicResult(name, INVALID_TOPIC, f"Topic '{name}' collides with "
                                                            f"existing topic: {colliding}"))
            continue
        if reason:
            results.append(TopicResult(name, INVALID_TOPIC, reason))
            continue
        if name in meta.topics:
            results.append(TopicResult(name, TOPIC_ALREADY_EXISTS,
                                       f"Topic '{name}' already exists."))
            continue
        if name in INTERNAL_TOPICS:
            results.append(TopicResult(name, INVALID_REQUEST,
                                       f"'{name}' is an internal topic of the coordinators"))
            continue
        nulls = [k for k, v in t.configs.items() if v is None]
        if nulls:
            results.append(TopicResult(name, INVALID_CONFIG, "Null value not supported for "
                                                             f"topic configs: {','.join(nulls)}"))
            continue
        try:
            configs = validate_topic_configs(t.configs, base)
            count, leaders = _placement(t, default_partitions, workers)
        except AssignmentError as exc:
            results.append(TopicResult(name, exc.code, str(exc)))
            continue
        except ConfigChangeError as exc:  # an unknown or invalid config
            results.append(TopicResult(name, exc.code, str(exc)))
            continue
        records += 1 + len(configs) + count
        if records > MAX_RECORDS_PER_USER_OP:
            return [TopicResult(n, POLICY_VIOLATION, EXCESSIVE_BATCH) for n in names], []
        entries = describe_topic(meta, base, meta.controller_id, name, None, configs)
        results.append(TopicResult(
            name, NONE, None, None, count, 1,
            [[e.name, None if e.sensitive else e.value, e.read_only, e.source, e.sensitive]
             for e in entries]))
        creations.append(TopicCreation(len(results) - 1, name, leaders, count, configs))
        if "." in name or "_" in name:
            collisions.setdefault(collision_key(name), name)
    results += [TopicResult(n, INVALID_REQUEST, "Duplicate topic name.") for n in duplicated]
    if CLUSTER_METADATA_TOPIC in names:
        results.append(TopicResult(CLUSTER_METADATA_TOPIC, INVALID_REQUEST, "Creation of "
                                   f"internal topic {CLUSTER_METADATA_TOPIC} is prohibited."))
    return results, creations


def plan_create_partitions(meta: ClusterMetadata, topics: list[dict[str, Any]],
                           workers: list[int]) -> tuple[list[dict[str, Any]],
                                                        dict[str, list[int] | None]]:
    """Kafka's CreatePartitions (``ReplicationControlManager.createPartitions``): a count can
    only grow; a manual assignment names the replicas of each new partition, checked like
    CreateTopics' (registered brokers: the workers; as many replicas as the topic has).

    Returns the results and, per topic to grow, the leaders of its new partitions (None:
    round-robin).  More than 10,000 new partitions in one request fail it as a whole."""
    results: list[dict[str, Any]] = []
    grow: dict[str, list[int] | None] = {}
    names = [t["name"] for t in topics]
    duplicated = [n for n in dict.fromkeys(names) if names.count(n) > 1]
    records = 0
    for t in topics:
        name, count, assignments = t["name"], int(t["count"]), t.get("assignments")
        if name in duplicated:
            continue
        info = meta.topics.get(name)
        current = len(info.partitions) if info is not None else 0
        if info is None:  # Kafka: UnknownTopicOrPartitionException(), no message
            results.append(_result(name, UNKNOWN_TOPIC_OR_PARTITION, None))
        elif name in INTERNAL_TOPICS:
            results.append(_result(name, INVALID_REQUEST,
                                   f"Cannot add partitions to the internal topic '{name}'."))
        elif count == current:
            results.append(_result(name, INVALID_PARTITIONS,
                                   f"Topic already has {current} partition(s)."))
        elif count < current:
            results.append(_result(name, INVALID_PARTITIONS,
                                   f"The topic {name} currently has {current} partition(s); "
                                   f"{count} would not be an increase."))
        elif assignments is not None and len(assignments) != count - current:
            results.append(_result(name, INVALID_REPLICA_ASSIGNMENT,
                                   f"Attempted to add {count - current} additional "
                                   f"partition(s), but only {len(assignments)} assignment(s) "
                                   "were specified."))
        else:
            factor = len(info.partitions[0].replicas)
            try:
                for replicas in assignments or ():
                    validate_assignment(list(replicas), workers, factor)
            except AssignmentError as exc:
                results.append(_result(name, exc.code, str(exc)))
                continue
            records += count - current
            if records > MAX_RECORDS_PER_USER_OP:
                return [_result(n, POLICY_VIOLATION, EXCESSIVE_BATCH) for n in names], {}
            results.append(_result(name))
            grow[name] = None if assignments is None else [a[0] for a in assignments]
    results += [_result(n, INVALID_REQUEST, "Duplicate topic name.") for n in duplicated]
    return results, grow


def _check_keys_and_nulls(ops: list[tuple[str, int, str | None]], incremental: bool) -> None:
    """``ConfigAdminManager.preprocess*``, before anything else about the resource: a config
    named twice, or a null value for anything but an incremental DELETE, is INVALID_REQUEST."""
    names = [name for name, _, _ in ops]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigChangeError(INVALID_REQUEST, "Error due to duplicate config keys")
    nulls = [name for name, op, value in ops if value is None and not (incremental and op == DELETE)]
    if nulls:
        raise ConfigChangeError(INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}")


def plan_alter_configs(meta: ClusterMetadata, base: LogConfig, resources: list[dict[str, Any]],
                       incremental: bool) -> tuple[list[dict[str, Any]],
                                                   dict[tuple[int, str], dict[str, str]]]:
    """Each resource: {resource_type, resource_name, configs: [[name, op, value], ...]}.

    Returns one {error_code, error_message} per resource, and the new config maps to store."""
    results: list[dict[str, Any]] = []
    changes: dict[tuple[int, str], dict[str, str]] = {}
    keys = [(r["resource_type"], r["resource_name"]) for r in resources]
    for r in resources:
        rtype, name = r["resource_type"], r["resource_name"]
        ops = [(c[0], int(c[1]), c[2]) for c in r["configs"]]
        try:
            if keys.count((rtype, name)) > 1:
                raise ConfigChangeError(INVALID_REQUEST, f"Duplicate resource {name} in request")
            _check_keys_and_nulls(ops, incremental)
            if rtype == TOPIC:
                reason = validate_topic_name(name)
                if reason:
                    raise ConfigChangeError(INVALID_TOPIC, reason)
                info = meta.topics.get(name)
                if info is None:
                    raise ConfigChangeError(UNKNOWN_TOPIC_OR_PARTITION,
                                            f"The topic '{name}' does not exist.")
                new = apply_ops(info.configs, ops, topic_def, incremental)
                new = validate_topic_configs(new, base)
                if new != info.configs:
                    changes[(rtype, name)] = new
            elif rtype == BROKER:
                if name and not (name.isdigit() and int(name) in meta.brokers):
                    raise ConfigChangeError(INVALID_REQUEST, f"Unknown broker id {name}")
                current = meta.broker_configs.get(name, {})
                try:
                    new = apply_ops(current, ops, broker_def, incremental)
                except InvalidValueError as exc:
                    raise ConfigChangeError(INVALID_REQUEST, str(exc)) from None
                # the topic defaults they make must still be a valid LogConfig
                from shmq.broker.dynamic_configs import BROKER_TO_TOPIC, log_config

                log_config(base, {BROKER_TO_TOPIC[k]: v for k, v in new.items()
                                  if k in BROKER_TO_TOPIC})
                if new != current:
                    changes[(rtype, name)] = new
            else:
                raise ConfigChangeError(INVALID_REQUEST,
                                        f"Unsupported resource type {rtype} for shmq")
        except ConfigChangeError as exc:
            results.append({"error_code": exc.code, "error_message": str(exc)})
            continue
        except ValueError as exc:  # LogConfig's own cross-field checks
            results.append({"error_code": 40, "error_message": str(exc)})
            continue
        results.append({"error_code": NONE, "error_message": None})
    return results, changes
