"""What the controller decides for CreatePartitions and (Incremental)AlterConfigs.

Pure functions over the cluster metadata: they return the per-resource results to answer and the
changes to make, and change nothing themselves.  The controller persists the changes (one atomic
metadata rewrite each) and pushes the new metadata to every worker before it answers, so the
client that altered a config reads it back from any node.  Requests are JSON-shaped dicts
because workers forward them over the control channel.
"""

from __future__ import annotations

from typing import Any

from shmq.broker.dynamic_configs import (
    BROKER,
    INVALID_REQUEST,
    TOPIC,
    ConfigChangeError,
    apply_ops,
    broker_def,
    topic_def,
    validate_topic_configs,
)
from shmq.broker.metadata import INTERNAL_TOPICS, ClusterMetadata, validate_topic_name
from shmq.storage.log_config import LogConfig

NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC, INVALID_PARTITIONS = 0, 3, 17, 37
INVALID_REPLICA_ASSIGNMENT = 39


def _result(name: str, code: int = NONE, message: str | None = None) -> dict[str, Any]:
    return {"name": name, "error_code": code, "error_message": message}


def plan_create_partitions(meta: ClusterMetadata, topics: list[dict[str, Any]],
                           max_partitions: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Kafka's ``createPartitions``: a count can only grow; manual assignments must name one
    live node per new partition (shmq keeps one replica)."""
    results, grow = [], {}
    names = [t["name"] for t in topics]
    for t in topics:
        name, count, assignments = t["name"], int(t["count"]), t.get("assignments")
        info = meta.topics.get(name)
        if names.count(name) > 1:
            results.append(_result(name, INVALID_REQUEST, "Duplicate topic in request."))
        elif validate_topic_name(name) is not None and info is None:
            results.append(_result(name, INVALID_TOPIC, validate_topic_name(name)))
        elif info is None:
            results.append(_result(name, UNKNOWN_TOPIC_OR_PARTITION,
                                   f"The topic '{name}' does not exist."))
        elif name in INTERNAL_TOPICS:
            results.append(_result(name, INVALID_REQUEST,
                                   f"Cannot add partitions to the internal topic '{name}'."))
        elif count < len(info.partitions):
            results.append(_result(name, INVALID_PARTITIONS,
                                   f"Topic currently has {len(info.partitions)} partitions, which "
                                   f"is higher than the requested {count}."))
        elif count == len(info.partitions):
            results.append(_result(name, INVALID_PARTITIONS,
                                   f"Topic already has {count} partitions."))
        elif count > max_partitions:
            results.append(_result(name, INVALID_PARTITIONS,
                                   f"The number of partitions {count} is above the limit of "
                                   f"{max_partitions}."))
        elif assignments is not None and not _good_assignments(
                assignments, count - len(info.partitions), meta):
            results.append(_result(name, INVALID_REPLICA_ASSIGNMENT,
                                   f"Invalid replica assignment {assignments}: it must give "
                                   f"{count - len(info.partitions)} new partition(s) one replica "
                                   "on a worker node each."))
        else:
            results.append(_result(name))
            grow[name] = count
    return results, grow


def _good_assignments(assignments: list[list[int]], new: int, meta: ClusterMetadata) -> bool:
    workers = {n for n in meta.brokers if n != meta.controller_id}
    return len(assignments) == new and all(len(a) == 1 and a[0] in workers for a in assignments)


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
            if rtype == TOPIC:
                reason = validate_topic_name(name)
                if reason:
                    raise ConfigChangeError(INVALID_TOPIC, reason)
                info = meta.topics.get(name)
                if info is None:
                    raise ConfigChangeError(UNKNOWN_TOPIC_OR_PARTITION,
                                            f"Topic {name} does not exist")
                new = apply_ops(info.configs, ops, topic_def, incremental)
                new = validate_topic_configs(new, base)
                if new != info.configs:
                    changes[(rtype, name)] = new
            elif rtype == BROKER:
                if name and not (name.isdigit() and int(name) in meta.brokers):
                    raise ConfigChangeError(INVALID_REQUEST, f"Unknown broker id {name}")
                current = meta.broker_configs.get(name, {})
                new = apply_ops(current, ops, broker_def, incremental)
                # the topic defaults they make must still be a valid LogConfig
                from shmq.broker.dynamic_configs import BROKER_TO_TOPIC, log_config

                log_config(base, {BROKER_TO_TOPIC[k]: v for k, v in new.items()})
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
