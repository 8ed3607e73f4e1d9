"""``shmq topics``: Kafka's ``kafka-topics.sh`` (``TopicCommand``), same flags, same text.

Exactly one action::

    --create   --topic T [--partitions N] [--replication-factor 1] [--config k=v ...]
               [--replica-assignment 1,2,1] [--if-not-exists]   prints "Created topic T."
    --list     [--topic REGEX] [--exclude-internal]   one name a line, sorted
    --describe [--topic REGEX] [--if-exists] [filters]
    --delete   --topic REGEX [--if-exists]            prints nothing
    --alter    --topic REGEX [--partitions N [--replica-assignment 1,2,1,2]] [--config k=v ...]
               [--if-exists]

``--topic`` is a regular expression (full match; ``,`` means ``|``) everywhere but ``--create``,
as in Kafka.  ``--describe`` prints, TAB-separated::

    Topic: T<TAB>TopicId: <base64><TAB>PartitionCount: N<TAB>ReplicationFactor: R<TAB>Configs: k=v,...
    <TAB>Topic: T<TAB>Partition: P<TAB>Leader: L<TAB>Replicas: 1<TAB>Isr: 1<TAB>Elr: N/A<TAB>LastKnownElr: N/A

``Configs:`` lists the topic's non-default configs, from DescribeConfigs (a broker without
DescribeConfigs gets an empty list).  Partition counts only grow: ``--alter --partitions`` with a
smaller count fails with the broker's INVALID_PARTITIONS message.  ``--alter --config`` (Kafka
2's spelling) sets topic configs through IncrementalAlterConfigs, like ``shmq configs``.
``--replica-assignment`` lists each partition's brokers (``:`` between replicas, ``,`` between
partitions; shmq's brokers are the workers, one replica each); with ``--alter`` it lists every
partition and only the new ones are sent, as in Kafka.

A partition whose last write failed (a full disk, an I/O error; shmq's broker lists its leader in
Metadata's ``offline_replicas``) gets two more columns, ``Offline: 1`` and ``StorageError:
<reason>`` (the reason from the local broker's HTTP listener; "unknown" for a remote one), and
counts as unavailable for ``--unavailable-partitions``; both go away when appends succeed again.

A failure is one line, ``Error while executing topic command : <message>``, and exit code 1.
Two deliberate differences from Kafka 4: that line goes to stderr (Kafka prints it on stdout and
a stack trace on stderr), and argument errors Kafka 4 prints bare (``Topic 'x' does not exist as
expected``) carry the same prefix, as in Kafka 3.  A wrong command line is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from shmq.cli import CommandError
from shmq.cli._connect import (
    add_connection_args,
    api_timeout,
    client_config,
    kafka_error_text,
    load_properties,
    resolve_bootstrap,
    usage_error,
)

ERROR_PREFIX = "Error while executing topic command : "
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
SHORT_MAX = 32767
ZERO_UUID = "AAAAAAAAAAAAAAAAAAAAAA"

# Kafka's default exception messages, for errors the broker sent without a message.
_KAFKA_MESSAGES = {
    3: "This server does not host this topic-partition.",
    17: "The request attempted to perform an operation on an invalid topic.",
    36: "Topic with this name already exists.",
    37: "Number of partitions is below 1.",
    38: "Replication factor is below 1 or larger than the number of available brokers.",
    40: "Configuration is invalid.",
}

_ACTIONS = ("create", "list", "alter", "describe", "delete")
_REPORTS = ("under_replicated_partitions", "unavailable_partitions", "under_min_isr_partitions",
            "at_min_isr_partitions")


class TopicCommandError(Exception):
    """Printed as ``Error while executing topic command : <message>``."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "topics", help="create, list, describe, alter or delete topics (kafka-topics.sh)",
        description="This tool helps to create, delete, describe, or change a topic. Flags and "
                    "output are those of Kafka's kafka-topics.sh.")
    add_connection_args(p)
    p.add_argument("--command-config", metavar="FILE",
                   help="property file containing configs to be passed to the admin client")
    actions = p.add_argument_group("actions (exactly one)")
    actions.add_argument("--list", action="store_true", help="list all available topics")
    actions.add_argument("--create", action="store_true", help="create a new topic")
    actions.add_argument("--delete", action="store_true", help="delete a topic")
    actions.add_argument("--alter", action="store_true",
                         help="alter the number of partitions of a topic")
    actions.add_argument("--describe", action="store_true",
                         help="list details for the given topics")
    p.add_argument("--topic", metavar="TOPIC",
                   help="the topic to create, alter, describe or delete; a regular expression "
                        "except with --create")
    p.add_argument("--partitions", type=int, metavar="N",
                   help="the number of partitions for the topic being created or altered "
                        "(default with --create: the broker's num.partitions)")
    p.add_argument("--replication-factor", type=int, metavar="N",
                   help="the replication factor of the topic being created (shmq: 1)")
    p.add_argument("--replica-assignment", metavar="ASSIGNMENT",
                   help="a list of manual partition-to-broker assignments for the topic being "
                        "created or altered: broker_id_for_part1_replica1 : "
                        "broker_id_for_part1_replica2 , broker_id_for_part2_replica1 : ...")
    p.add_argument("--config", action="append", metavar="NAME=VALUE",
                   help="a topic configuration override for the topic being created "
                        "(repeatable), e.g. retention.ms=3600000")
    p.add_argument("--if-exists", action="store_true",
                   help="with --alter, --delete or --describe: only act if the topic exists")
    p.add_argument("--if-not-exists", action="store_true",
                   help="with --create: do not fail if the topic already exists")
    p.add_argument("--exclude-internal", action="store_true",
                   help="exclude internal topics when listing or describing topics")
    p.add_argument("--topics-with-overrides", action="store_true",
                   help="with --describe: only show topics that have overridden configs")
    p.add_argument("--under-replicated-partitions", action="store_true",
                   help="with --describe: only show under-replicated partitions")
    p.add_argument("--unavailable-partitions", action="store_true",
                   help="with --describe: only show partitions whose leader is not available")
    p.add_argument("--under-min-isr-partitions", action="store_true",
                   help="with --describe: only show partitions whose ISR is below "
                        "min.insync.replicas")
    p.add_argument("--at-min-isr-partitions", action="store_true",
                   help="with --describe: only show partitions whose ISR is at "
                        "min.insync.replicas")
    return p


def _check_args(args: argparse.Namespace) -> str:
    """The action, after Kafka's ``TopicCommandOptions.checkArgs`` rules."""
    chosen = [a for a in _ACTIONS if getattr(args, a)]
    if len(chosen) != 1:
        raise usage_error("topics", "Command must include exactly one action: --list, "
                                    "--describe, --create, --alter or --delete")
    action = chosen[0]
    if action not in ("list", "describe") and not args.topic:
        raise usage_error("topics", 'Missing required argument "[topic]"')
    if action == "alter" and args.partitions is None and not args.config:
        raise usage_error("topics", 'Missing required argument "[partitions]"')
    allowed = {
        "config": ("create", "alter"),
        "partitions": ("create", "alter"),
        "replication_factor": ("create",),
        "replica_assignment": ("create", "alter"),
        "if_exists": ("alter", "delete", "describe"),
        "if_not_exists": ("create",),
        "exclude_internal": ("list", "describe"),
        "topics_with_overrides": ("describe",),
        **{report: ("describe",) for report in _REPORTS},
    }
    for option, actions in allowed.items():
        if getattr(args, option) not in (None, False) and action not in actions:
            raise usage_error("topics", f'Option "[{option.replace("_", "-")}]" can\'t be used '
                                        f'with option "[{action}]"')
    if action == "create" and args.replica_assignment:
        for option in ("partitions", "replication_factor"):
            if getattr(args, option) is not None:
                raise usage_error("topics", 'Option "[replica-assignment]" can\'t be used with '
                                            f'option "[{option.replace("_", "-")}]"')
    if args.topics_with_overrides and any(getattr(args, r) for r in _REPORTS):
        raise usage_error("topics", 'Option "[topics-with-overrides]" can\'t be used with the '
                                    "partition report options")
    return action


def run(args: argparse.Namespace) -> int:
    action = _check_args(args)
    props = load_properties(args.command_config) if args.command_config else {}
    bootstrap = resolve_bootstrap(args, props)
    try:
        service = TopicService(bootstrap, props)
        service.data_dir = args.data_dir
        service.local = not args.bootstrap_server and not props.get("bootstrap.servers")
        getattr(service, f"do_{action}")(args)
    except TopicCommandError as exc:
        _error(str(exc))
        return 1
    except CommandError:
        raise
    except Exception as exc:  # a KafkaException: the broker or librdkafka said no
        from confluent_kafka import KafkaException

        if isinstance(exc, KafkaException):
            _error(_message(exc))
            return 1
        raise
    return 0


def _error(message: str) -> None:
    sys.stdout.flush()
    print(f"{ERROR_PREFIX}{message}", file=sys.stderr)


def _message(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else None
    code = getattr(err, "code", None)
    text = kafka_error_text(exc)
    if callable(code) and text.startswith("Broker: ") and code() in _KAFKA_MESSAGES:
        return _KAFKA_MESSAGES[code()]
    return text


def topic_filter(raw: str) -> re.Pattern[str]:
    """Kafka's ``TopicFilter.IncludeList``: ``,`` means ``|``, blanks and surrounding quotes go."""
    regex = raw.strip().replace(",", "|").replace(" ", "")
    regex = re.sub(r"""^["']+""", "", regex)
    regex = re.sub(r"""["']+$""", "", regex)
    try:
        return re.compile(regex)
    except re.error:
        raise TopicCommandError(f"{regex} is an invalid regex.") from None


def parse_topic_configs(items: list[str] | None) -> dict[str, str]:
    """``--config k=v``: Java's ``split("\\s*=\\s*")`` must give exactly two parts."""
    configs: dict[str, str] = {}
    for item in items or ():
        parts = re.split(r"\s*=\s*", item)
        while parts and parts[-1] == "":  # String.split drops trailing empty strings
            parts.pop()
        if len(parts) != 2:
            raise TopicCommandError("requirement failed: Invalid topic config: all configs to be "
                                    'added must be in the format "key=val".')
        configs[parts[0].strip()] = parts[1].strip()
    return configs


def parse_replica_assignment(raw: str | None) -> list[list[int]]:
    """``TopicCommand.parseReplicaAssignment``: partitions split by ``,``, replicas by ``:``;
    no broker twice in a partition, the same replica count everywhere."""
    if not raw:
        return []
    out: list[list[int]] = []
    for i, part in enumerate(raw.split(",")):
        brokers = []
        for item in part.split(":"):
            try:
                brokers.append(int(item.strip()))
            except ValueError:
                raise TopicCommandError(f'For input string: "{item.strip()}"') from None
        twice = sorted({b for b in brokers if brokers.count(b) > 1})
        if twice:
            raise TopicCommandError("Partition replica lists may not contain duplicate entries: "
                                    + ",".join(map(str, twice)))
        out.append(brokers)
        if len(brokers) != len(out[0]):
            raise TopicCommandError(f"Partition {i} has different replication factor: "
                                    f"[{', '.join(map(str, brokers))}]")
    return out


class TopicService:
    def __init__(self, bootstrap: str, props: dict[str, str]) -> None:
        from confluent_kafka.admin import AdminClient

        conf = client_config(props)
        conf["bootstrap.servers"] = bootstrap
        conf.setdefault("log_level", 0)  # failures come back through the futures
        self.timeout = api_timeout(props)
        self.bootstrap = bootstrap.split(",")[0].strip()
        self.plaintext = conf.get("security.protocol", "plaintext").lower() == "plaintext"
        self.data_dir: str | None = None
        self.local = False
        try:
            self.admin = AdminClient(conf)
        except Exception as exc:
            raise TopicCommandError(_message(exc)) from None

    # --- helpers -------------------------------------------------------------------------------

    def _wait(self, futures: dict[Any, Any]) -> dict[Any, Any]:
        return {key: future.result() for key, future in futures.items()}

    def get_topics(self, topic: str | None, exclude_internal: bool) -> list[str]:
        metadata = self.admin.list_topics(timeout=self.timeout)
        names = sorted(metadata.topics)
        pattern = topic_filter(topic) if topic is not None else None
        return [n for n in names
                if (pattern is None or pattern.fullmatch(n))
                and not (exclude_internal and n in INTERNAL_TOPICS)]

    @staticmethod
    def ensure_topic_exists(found: list[str], topic: str | None, require: bool) -> None:
        if topic and require and not found:
            raise TopicCommandError(f"Topic '{topic}' does not exist as expected")

    # --- actions -------------------------------------------------------------------------------

    def do_create(self, args: argparse.Namespace) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        name = args.topic
        configs = parse_topic_configs(args.config)
        if "." in name or "_" in name:
            print("WARNING: Due to limitations in metric names, topics with a period ('.') or "
                  "underscore ('_') could collide. To avoid issues it is best to use either, "
                  "but not both.")
        rf = args.replication_factor
        if rf is not None and not 1 <= rf <= SHORT_MAX:
            raise TopicCommandError(f"The replication factor must be between 1 and {SHORT_MAX} "
                                    "inclusive")
        if args.partitions is not None and args.partitions < 1:
            raise TopicCommandError("The partitions must be greater than 0")
        assignment = parse_replica_assignment(args.replica_assignment)
        if assignment:  # librdkafka wants the count beside it (it sends -1 / -1, as Java does)
            new = NewTopic(name, num_partitions=len(assignment), replica_assignment=assignment,
                           config=configs)
        else:
            new = NewTopic(name, num_partitions=-1 if args.partitions is None else args.partitions,
                           replication_factor=-1 if rf is None else rf, config=configs)
        futures = self.admin.create_topics([new], request_timeout=self.timeout)
        try:
            self._wait(futures)
        except KafkaException as exc:
            from confluent_kafka import KafkaError

            err = exc.args[0] if exc.args else None
            if (args.if_not_exists and isinstance(err, KafkaError)
                    and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                return
            raise
        print(f"Created topic {name}.")

    def do_list(self, args: argparse.Namespace) -> None:
        # Kafka prints the names joined by newlines with println: an empty line when none.
        print("\n".join(self.get_topics(args.topic, args.exclude_internal)))

    def do_delete(self, args: argparse.Namespace) -> None:
        topics = self.get_topics(args.topic, args.exclude_internal)
        self.ensure_topic_exists(topics, args.topic, not args.if_exists)
        if topics:
            self._wait(self.admin.delete_topics(topics, request_timeout=self.timeout))

    def do_alter(self, args: argparse.Namespace) -> None:
        from confluent_kafka.admin import NewPartitions

        topics = self.get_topics(args.topic, args.exclude_internal)
        self.ensure_topic_exists(topics, args.topic, not args.if_exists)
        configs = parse_topic_configs(args.config)
        if topics and configs:  # Kafka 2's --alter --config, done as kafka-configs.sh does it
            from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

            self._wait(self.admin.incremental_alter_configs(
                [ConfigResource(ConfigResource.Type.TOPIC, t, incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in configs.items()]) for t in topics],
                request_timeout=self.timeout))
        if topics and args.partitions is not None:
            if args.partitions < 1:
                raise TopicCommandError("The partitions must be greater than 0")
            assignment = parse_replica_assignment(args.replica_assignment)
            grow = []
            for t in topics:
                if assignment:  # the whole list is given: the new partitions' part is sent
                    current = len(self.admin.list_topics(t, timeout=self.timeout)
                                  .topics[t].partitions)
                    grow.append(NewPartitions(t, args.partitions, assignment[current:]))
                else:
                    grow.append(NewPartitions(t, args.partitions))
            self._wait(self.admin.create_partitions(grow, request_timeout=self.timeout))

    def do_describe(self, args: argparse.Namespace) -> None:
        from confluent_kafka import TopicCollection

        topics = self.get_topics(args.topic, args.exclude_internal)
        self.ensure_topic_exists(topics, args.topic, not args.if_exists)
        if not topics:
            return
        descriptions = self._wait(self.admin.describe_topics(
            TopicCollection(topics), request_timeout=self.timeout))
        configs = self._describe_configs(topics)
        reports = [r for r in _REPORTS if getattr(args, r)]
        live = self._live_brokers() if args.unavailable_partitions else set()
        offline = self._offline(topics)
        out = []
        for name in topics:
            desc = descriptions[name]
            entries = configs.get(name, {})
            overrides = {k: e for k, e in entries.items() if not e.is_default}
            partitions = sorted(desc.partitions, key=lambda p: p.id)
            if not reports and (not args.topics_with_overrides or overrides) and partitions:
                out.append(_topic_line(desc, partitions, overrides))
            if args.topics_with_overrides:
                continue
            min_isr = _int_config(entries, "min.insync.replicas", 1)
            for part in partitions:
                down = offline.get((name, part.id))
                if reports and not any(_report(r, part, min_isr, live, down) for r in reports):
                    continue
                out.append(_partition_line(name, part, down))
        if out:
            print("\n".join(out))

    def _describe_configs(self, topics: list[str]) -> dict[str, dict[str, Any]]:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import ConfigResource

        try:
            futures = self.admin.describe_configs(
                [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics],
                request_timeout=self.timeout)
            results = self._wait(futures)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError._UNSUPPORTED_FEATURE:
                return {}  # no DescribeConfigs: no overrides we can show
            raise
        return {resource.name: entries for resource, entries in results.items()}

    def _offline(self, topics: list[str]) -> dict[tuple[str, int], tuple[list[int], str]]:
        """Partitions with offline replicas (Metadata v12's ``offline_replicas``, which
        librdkafka does not hand on): shmq lists a partition's leader there while its last write
        failed (a full disk, an I/O error).  The reason comes from the local broker's HTTP
        listener when the bootstrap is that broker; otherwise it is "unknown"."""
        if not self.plaintext:
            return {}
        from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
        from kio.schema.types import TopicName

        from shmq.cli.configs import kafka_call

        request = MetadataRequest(
            topics=tuple(MetadataRequestTopic(topic_id=None, name=TopicName(t)) for t in topics),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        try:
            answer = kafka_call(self.bootstrap, request, self.timeout)
        except Exception:  # noqa: BLE001  an old or odd broker: Kafka's columns only
            return {}
        found = {(str(t.name), int(p.partition_index)): [int(r) for r in p.offline_replicas]
                 for t in answer.topics for p in t.partitions if p.offline_replicas}
        if not found:
            return {}
        reasons = self._storage_reasons()
        return {key: (ids, reasons.get(key, "unknown")) for key, ids in found.items()}

    def _storage_reasons(self) -> dict[tuple[str, int], str]:
        """``storage_errors`` of the local broker's ``/api/v1/snapshot``, when the bootstrap is
        the broker of ``--data-dir`` (or the default data dir) and it has an HTTP listener."""
        import json
        import urllib.request

        from shmq.cli.top import _run_info

        info = _run_info(self.data_dir) or {}
        http = info.get("http")
        if not http or not (self.local or info.get("bootstrap") == self.bootstrap):
            return {}
        url = (http if http.startswith(("http://", "https://")) else "http://" + http)
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/api/v1/snapshot",
                                        timeout=min(self.timeout, 5.0)) as r:
                snap = json.loads(r.read())
            return {(str(e["topic"]), int(e["partition"])): str(e["error"])
                    for e in snap.get("storage_errors", [])}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def _live_brokers(self) -> set[int]:
        metadata = self.admin.list_topics(timeout=self.timeout)
        return set(metadata.brokers)


def kafka_uuid(uuid: Any) -> str:
    """Kafka's ``Uuid.toString()``: URL-safe base64 without padding (confluent-kafka's ``str``
    uses the standard alphabet, ``+`` and ``/``)."""
    import base64

    if uuid is None:
        return ZERO_UUID
    raw = b"".join((bits % (1 << 64)).to_bytes(8, "big")
                   for bits in (uuid.get_most_significant_bits(),
                                uuid.get_least_significant_bits()))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _node_ids(nodes: Any) -> str:
    return ",".join(str(n.id) for n in nodes or ())


def _leader_id(part: Any) -> int | None:
    leader = part.leader
    if leader is None or getattr(leader, "id", -1) < 0:
        return None
    return int(leader.id)


def _topic_line(desc: Any, partitions: list[Any], overrides: dict[str, Any]) -> str:
    configs = ",".join(f"{k}={e.value}" for k, e in overrides.items())
    line = f"Topic: {desc.name}"
    topic_id = kafka_uuid(desc.topic_id)
    if topic_id != ZERO_UUID:
        line += f"\tTopicId: {topic_id}"
    line += f"\tPartitionCount: {len(partitions)}"
    line += f"\tReplicationFactor: {len(partitions[0].replicas)}"
    line += f"\tConfigs: {configs}"
    return line


def _partition_line(topic: str, part: Any,
                    down: tuple[list[int], str] | None = None) -> str:
    """Kafka's columns; then, only for a partition with offline replicas (shmq: its last write
    failed), ``Offline: <ids>`` and ``StorageError: <reason>`` (Kafka 4 prints neither)."""
    leader = _leader_id(part)
    line = (f"\tTopic: {topic}\tPartition: {part.id}"
            f"\tLeader: {'none' if leader is None else leader}"
            f"\tReplicas: {_node_ids(part.replicas)}\tIsr: {_node_ids(part.isr)}"
            "\tElr: N/A\tLastKnownElr: N/A")
    if down is not None:
        line += f"\tOffline: {','.join(map(str, down[0]))}\tStorageError: {down[1]}"
    return line


def _int_config(entries: dict[str, Any], name: str, default: int) -> int:
    entry = entries.get(name)
    try:
        return int(entry.value) if entry is not None else default
    except (TypeError, ValueError):
        return default


def _report(report: str, part: Any, min_isr: int, live: set[int],
            down: tuple[list[int], str] | None = None) -> bool:
    leader = _leader_id(part)
    isr = len(part.isr or ())
    if report == "under_replicated_partitions":
        return len(part.replicas or ()) - isr > 0
    if report == "unavailable_partitions":  # shmq: also a leader whose writes fail
        return leader is None or leader not in live or (down is not None and leader in down[0])
    if report == "under_min_isr_partitions":
        return leader is None or isr < min_isr
    return isr == min_isr  # at_min_isr_partitions
