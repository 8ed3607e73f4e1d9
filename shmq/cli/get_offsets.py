"""``shmq get-offsets``: Kafka's ``kafka-get-offsets.sh`` (``GetOffsetShell``).

Prints one ``topic:partition:offset`` line per partition, sorted by topic then partition::

    --topic REGEX              topics to query (default: all); ``--exclude-internal-topics``
    --partitions 0,2           partition ids (with --topic or alone)
    --topic-partitions LIST    instead of both: ``t1:0,t2:1-3,t3:5-,t4:-2,t5`` (topic regexes)
    --time T                   -1/latest (default), -2/earliest, -3/max-timestamp,
                               -4/earliest-local, -5/latest-tiered, or a timestamp in ms

A partition with no offset for the given time (a timestamp after the last record, or
``latest-tiered`` without tiered storage) is left out, as Kafka does; a partition whose lookup
fails is reported on stderr (``Skip getting offsets for topic-partition ...``) and left out.
Nothing matching the filters is an error: one line, exit code 1.
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
    merged_properties,
    resolve_bootstrap,
    usage_error,
)

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
_TIME_NAMES = {"latest": -1, "earliest": -2, "max-timestamp": -3, "earliest-local": -4,
               "latest-tiered": -5}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "get-offsets", help="print the offsets of topic partitions (kafka-get-offsets.sh)",
        description="An interactive shell for getting topic-partition offsets. Flags and "
                    "output are those of Kafka's kafka-get-offsets.sh.")
    add_connection_args(p)
    p.add_argument("--broker-list", help=argparse.SUPPRESS)
    p.add_argument("--command-config", metavar="FILE",
                   help="property file containing configs to be passed to the admin client")
    p.add_argument("--topic-partitions", metavar="LIST",
                   help="comma separated list of topic-partition patterns to get the offsets "
                        "for, each 'topic-regex[:partition|:start-end|:start-|:-end]'; cannot "
                        "be used with --topic or --partitions")
    p.add_argument("--topic", metavar="REGEX",
                   help="the topic to get the offsets for; a regular expression (default: all "
                        "topics)")
    p.add_argument("--partitions", metavar="IDS",
                   help="comma separated list of partition ids (default: all partitions)")
    p.add_argument("--time", default="-1", metavar="TIME",
                   help="timestamp of the offsets before that: -1 or latest (default), -2 or "
                        "earliest, -3 or max-timestamp, -4 or earliest-local, -5 or "
                        "latest-tiered, or a timestamp in milliseconds")
    p.add_argument("--exclude-internal-topics", action="store_true",
                   help="leave out internal topics")
    return p


def parse_time(raw: str) -> int:
    text = raw.strip()
    if text in _TIME_NAMES:
        return _TIME_NAMES[text]
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < -5:
        raise CommandError(f"Malformed time argument {raw}. Please use -1 or latest / -2 or "
                           "earliest / -3 or max-timestamp / -4 or earliest-local / -5 or "
                           "latest-tiered, or a specified long format timestamp")
    return value


def _partition_ids(raw: str) -> set[int]:
    ids = set()
    for item in raw.split(","):
        item = item.strip()
        if not item.isdigit():
            raise usage_error("get-offsets", f"Invalid partition '{item}' in --partitions: "
                                             "partition ids are integers >= 0")
        ids.add(int(item))
    return ids


def _compile(regex: str) -> re.Pattern[str]:
    try:
        return re.compile(regex)
    except re.error:
        raise CommandError(f"{regex} is an invalid regex.") from None


# a filter: (topic regex, lowest partition, highest partition or None, partition ids or None)
Filter = tuple[re.Pattern[str], int, int | None, set[int] | None]


def build_filters(args: argparse.Namespace) -> list[Filter]:
    if args.topic_partitions is not None:
        if args.topic is not None or args.partitions is not None:
            raise usage_error("get-offsets",
                              "--topic-partitions cannot be used with --topic or --partitions")
        filters: list[Filter] = []
        for item in args.topic_partitions.split(","):
            m = re.fullmatch(r"([^:]*)(?::(\d*)(-)?(\d*))?", item.strip())
            if m is None or (m.group(2) == "" and not m.group(3)):
                raise usage_error("get-offsets", f"Invalid topic-partition filter '{item}'")
            topic, lo, dash, hi = m.groups()
            pattern = _compile(topic or ".*")
            if lo is None:
                filters.append((pattern, 0, None, None))
            elif not dash:
                filters.append((pattern, int(lo), int(lo), None))
            else:
                filters.append((pattern, int(lo) if lo else 0, int(hi) - 1 if hi else None,
                                None))
        return filters
    ids = _partition_ids(args.partitions) if args.partitions is not None else None
    return [(_compile(args.topic if args.topic is not None else ".*"), 0, None, ids)]


def _matches(f: Filter, topic: str, partition: int) -> bool:
    pattern, lo, hi, ids = f
    return (pattern.fullmatch(topic) is not None and partition >= lo
            and (hi is None or partition <= hi) and (ids is None or partition in ids))


def run(args: argparse.Namespace) -> int:
    if args.broker_list and not args.bootstrap_server:
        args.bootstrap_server = args.broker_list
    time = parse_time(args.time)
    filters = build_filters(args)
    props = merged_properties([args.command_config], [])
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    conf = client_config(props)
    conf["bootstrap.servers"] = resolve_bootstrap(args, props)
    conf.setdefault("log_level", 0)
    timeout = api_timeout(props)
    try:
        admin = AdminClient(conf)
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise CommandError(kafka_error_text(exc)) from None
    wanted = sorted(
        (name, p) for name, topic in metadata.topics.items()
        if not (args.exclude_internal_topics and name in INTERNAL_TOPICS)
        for p in topic.partitions
        if any(_matches(f, name, p) for f in filters))
    if not wanted:
        raise CommandError("Could not match any topic-partitions with the specified filters")
    if time == -5:  # latest-tiered: no tiered storage, no offset
        return 0
    spec = {-1: OffsetSpec.latest(), -2: OffsetSpec.earliest(), -4: OffsetSpec.earliest(),
            -3: OffsetSpec.max_timestamp()}.get(time) or OffsetSpec.for_timestamp(time)
    futures = admin.list_offsets({TopicPartition(t, p): spec for t, p in wanted},
                                 request_timeout=timeout)
    found: dict[tuple[str, int], int] = {}
    for tp, future in futures.items():
        try:
            info = future.result()
        except KafkaException as exc:
            print(f"Skip getting offsets for topic-partition {tp.topic}-{tp.partition} due to "
                  f"error: {kafka_error_text(exc)}", file=sys.stderr)
            continue
        if info.offset >= 0:
            found[(tp.topic, tp.partition)] = info.offset
    lines = [f"{t}:{p}:{found[(t, p)]}" for t, p in wanted if (t, p) in found]
    if lines:
        print("\n".join(lines))
    return 0
