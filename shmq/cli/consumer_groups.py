"""``shmq consumer-groups``: Kafka's ``kafka-consumer-groups.sh`` (``ConsumerGroupCommand``).

Exactly one action::

    --list           [--state [S,...]] [--type [T,...]]     group ids, or a GROUP/STATE/TYPE table
    --describe       --group G... | --all-groups
                     [--offsets (default) | --members [--verbose] | --state]
    --delete         --group G... | --all-groups
    --reset-offsets  --group G... | --all-groups   --topic T[:P,P...]... | --all-topics
                     --to-earliest | --to-latest | --to-current | --to-offset N | --shift-by N
                     | --to-datetime YYYY-MM-DDTHH:mm:SS.sss | --by-duration PnDTnHnMnS
                     | --from-file CSV
                     [--dry-run (default) | --execute] [--export]
    --delete-offsets --group G --topic T[:P,P...]...

The tables are Kafka's, byte for byte (``printf`` widths, trailing blanks, the blank line before
each block, ``-`` for a missing value).  ``--describe`` (``--offsets``)::

    <blank>
    GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG             CONSUMER-ID     HOST            CLIENT-ID
    g1              events          0          90              100             10              rdkafka-…       /127.0.0.1      rdkafka

GROUP, TOPIC, CONSUMER-ID and HOST are ``max(15, longest)`` wide; rows are the members' partitions
(members with the most partitions first, each sorted by topic and partition) and then the
partitions the group has committed offsets for but nobody is assigned.  ``--members`` and
``--state`` follow ``ConsumerGroupCommand.printMembers`` / ``printStates`` of Kafka 4.3 (the
members header is printed even when there are none; ``--members --verbose`` adds
``CURRENT-EPOCH CURRENT-ASSIGNMENT TARGET-EPOCH TARGET-ASSIGNMENT``, ``topic:0,1;other:0``, the
epochs ``-`` for a classic group), ``--offsets --verbose`` Kafka 4's ``LEADER-EPOCH``.
``--reset-offsets`` prints ``GROUP TOPIC PARTITION NEW-OFFSET`` with GROUP and TOPIC
``max(15, longest)`` wide (``OffsetsUtils.printOffsetsToReset``), ``--export`` the CSV
``--from-file`` reads.  The layouts are checked line by line against Kafka's own tool on the same
state (tests/integration/test_kafka_tools.py).

Where this differs from Kafka, on purpose: an error goes to stderr as one line and makes the
exit code 1 (Kafka prints ``\\nError: ...`` on stdout, sometimes with a Java stack trace, and
exits 0); a wrong command line is a usage error, exit code 2.  ``--bootstrap-server`` may be left out to use
the broker running in ``--data-dir``.

The protocol is librdkafka's (confluent-kafka's ``AdminClient``), so the command works against any
Kafka broker.  The one exception is ``--delete-offsets``: confluent-kafka has no
DeleteConsumerGroupOffsets, so OffsetDelete v0 goes to the group's coordinator over a plain TCP
connection, encoded by kio (PLAINTEXT listeners only).
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shmq.cli import CommandError
from shmq.cli._connect import (
    add_connection_args,
    client_config,
    load_properties,
    resolve_bootstrap,
    usage_error,
)

MISSING = "-"  # ConsumerGroupCommand.MISSING_COLUMN_VALUE
DEFAULT_TIMEOUT_MS = 5000
FAILED = "Executing consumer group command failed due to "

_ACTIONS = ("list", "describe", "delete", "reset_offsets", "delete_offsets")
_SCENARIOS = ("to_offset", "shift_by", "to_datetime", "by_duration", "to_earliest", "to_latest",
              "to_current", "from_file")

# Kafka's GroupState names (GroupState.toString) and the states a consumer group can be in.
_STATES = ("PreparingRebalance", "CompletingRebalance", "Stable", "Dead", "Empty", "Assigning",
           "Reconciling")
_TYPES = ("Classic", "Consumer")
_REBALANCING = ("PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling")

# Kafka's Errors messages for the codes a group command meets (librdkafka's texts differ).
KAFKA_MESSAGES = {
    3: "This server does not host this topic-partition.",
    5: "There is no leader for this topic-partition as we are in the middle of a leadership "
       "election.",
    14: "The coordinator is loading and hence can't process requests.",
    15: "The coordinator is not available.",
    16: "This is not the correct coordinator.",
    22: "Specified group generation id is not valid.",
    24: "The configured groupId is invalid.",
    25: "The coordinator is not aware of this member.",
    27: "The group is rebalancing, so a rejoin is needed.",
    29: "Topic authorization failed.",
    30: "Group authorization failed.",
    35: "The version of API is not supported.",
    68: "The group is not empty.",
    69: "The group id does not exist.",
    86: "Deleting offsets of a topic is forbidden while the consumer group is actively "
        "subscribed to it.",
}
# Kafka's exception class for a code, as its tools print an error (``Throwable.toString``)
KAFKA_EXCEPTIONS = {
    14: "CoordinatorLoadInProgressException", 15: "CoordinatorNotAvailableException",
    16: "NotCoordinatorException", 24: "InvalidGroupIdException",
    30: "GroupAuthorizationException", 68: "GroupNotEmptyException",
    69: "GroupIdNotFoundException",
}
GROUP_ID_NOT_FOUND = 69
NOT_COORDINATOR = 16
TIMED_OUT = -185  # librdkafka's RD_KAFKA_RESP_ERR__TIMED_OUT


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "consumer-groups",
        help="list, describe, delete consumer groups, reset their offsets "
             "(kafka-consumer-groups.sh)",
        description="This tool helps to list all consumer groups, describe a consumer group, "
                    "delete consumer group info, or reset consumer group offsets. Flags and "
                    "output are those of Kafka's kafka-consumer-groups.sh.")
    add_connection_args(p)
    p.add_argument("--command-config", metavar="FILE",
                   help="property file containing configs to be passed to the admin client")
    p.add_argument("--timeout", metavar="MS", default=None,
                   help=f"milliseconds to wait for each request to the broker "
                        f"(default {DEFAULT_TIMEOUT_MS})")
    actions = p.add_argument_group("actions (exactly one)")
    actions.add_argument("--list", action="store_true", help="list all consumer groups")
    actions.add_argument("--describe", action="store_true",
                         help="describe consumer groups and list the offset lag (number of "
                              "messages not yet processed) of their partitions")
    actions.add_argument("--delete", action="store_true",
                         help="delete the committed offsets and ownership information of whole "
                              "consumer groups (they must be empty)")
    actions.add_argument("--reset-offsets", action="store_true",
                         help="reset the committed offsets of inactive consumer groups: "
                              "--dry-run (the default) shows the plan, --execute applies it")
    actions.add_argument("--delete-offsets", action="store_true",
                         help="delete the committed offsets of one group for some topics")
    scope = p.add_argument_group("scope")
    scope.add_argument("--group", action="append", metavar="GROUP",
                       help="the consumer group to act on (repeatable)")
    scope.add_argument("--all-groups", action="store_true", help="apply to all consumer groups")
    scope.add_argument("--topic", action="append", metavar="TOPIC[:P,P...]",
                       help="with --reset-offsets or --delete-offsets: a topic, optionally with "
                            "the partitions to act on, e.g. events:0,1 (repeatable)")
    scope.add_argument("--all-topics", action="store_true",
                       help="with --reset-offsets: every topic the group has offsets for")
    describe = p.add_argument_group("with --describe")
    describe.add_argument("--offsets", action="store_true",
                          help="the group's partitions with their offsets and lag (default)")
    describe.add_argument("--members", action="store_true", help="the members of the group")
    describe.add_argument("--verbose", action="store_true",
                          help="more columns: the assignment of each member (--members), the "
                               "leader epoch of each committed offset (--offsets)")
    describe.add_argument("--state", nargs="?", const="", metavar="STATES",
                          help="with --describe: the coordinator, strategy, state and size of "
                               "the group; with --list: a STATE column, and with a value "
                               "(e.g. stable,empty) only the groups in those states")
    describe.add_argument("--type", nargs="?", const="", metavar="TYPES",
                          help="with --list: a TYPE column, and with a value (classic, "
                               "consumer) only the groups of those types")
    reset = p.add_argument_group("with --reset-offsets (exactly one target)")
    reset.add_argument("--to-earliest", action="store_true", help="reset to the earliest offset")
    reset.add_argument("--to-latest", action="store_true", help="reset to the latest offset")
    reset.add_argument("--to-current", action="store_true",
                       help="reset to the current offset (the latest where there is none)")
    reset.add_argument("--to-offset", metavar="OFFSET", help="reset to this offset")
    reset.add_argument("--shift-by", metavar="N",
                       help="move the current offset by N (positive or negative)")
    reset.add_argument("--to-datetime", metavar="DATETIME",
                       help="reset to the first offset at or after this time, "
                            "YYYY-MM-DDTHH:mm:SS.sss (UTC unless a zone like +02:00 is given)")
    reset.add_argument("--by-duration", metavar="DURATION",
                       help="reset to the first offset at or after now minus DURATION, "
                            "PnDTnHnMnS (e.g. PT1H30M)")
    reset.add_argument("--from-file", metavar="CSV",
                       help="reset to the offsets in a CSV file of topic,partition,offset "
                            "(or group,topic,partition,offset) lines")
    reset.add_argument("--dry-run", action="store_true",
                       help="only show the new offsets (the default)")
    reset.add_argument("--execute", action="store_true", help="commit the new offsets")
    reset.add_argument("--export", action="store_true",
                       help="print the new offsets as CSV (for --from-file)")
    return p


# --- the command line --------------------------------------------------------------------------


@dataclass
class Request:
    """The checked command line."""

    action: str
    groups: list[str]
    all_groups: bool
    topics: list[str]
    timeout: float  # seconds
    scenario: str | None = None
    to_offset: int | None = None
    shift_by: int | None = None
    timestamp_ms: int | None = None  # --to-datetime / --by-duration
    execute: bool = False
    export: bool = False
    list_states: set[str] | None = None
    list_types: set[str] | None = None
    describe_what: str = "offsets"
    verbose: bool = False
    from_file: str | None = None
    warnings: list[str] = field(default_factory=list)


def _opt(name: str) -> str:
    return f"[{name.replace('_', '-')}]"


def _invalid_with(used: str, other: str) -> Exception:
    return usage_error("consumer-groups",
                       f'Option "{_opt(used)}" can\'t be used with option "{_opt(other)}"')


def _parse_long(value: str, option: str) -> int:
    """A Java ``Long`` option value (joptsimple's message when it is not one)."""
    number = int(value) if re.fullmatch(r"[+-]?[0-9]+", value) else None
    if number is None or not -(2**63) <= number < 2**63:
        raise usage_error("consumer-groups", f"Cannot parse argument '{value}' of option {option}")
    return number


def check_args(args: argparse.Namespace, now_ms: int | None = None) -> Request:
    """``ConsumerGroupCommandOptions.checkArgs``, then the values parsed."""
    chosen = [a for a in _ACTIONS if getattr(args, a)]
    if len(chosen) != 1:
        raise usage_error("consumer-groups", "Command must include exactly one action: --list, "
                                             "--describe, --delete, --reset-offsets, "
                                             "--delete-offsets")
    action = chosen[0]
    groups = list(dict.fromkeys(args.group or ()))
    topics = list(args.topic or ())
    has_group = bool(groups)
    scope = "[group], [all-groups]"
    for flag, allowed in (("members", "describe"), ("verbose", "describe"),
                          ("offsets", "describe"), ("type", "list")):
        if getattr(args, flag) not in (None, False) and action != allowed:
            raise usage_error("consumer-groups", f"Option(s) {_opt(flag)} are unavailable given "
                                                 "other options on the command line")
    if args.state is not None and action not in ("describe", "list"):
        raise usage_error("consumer-groups", "Option(s) [state] are unavailable given other "
                                             "options on the command line")
    if has_group and args.all_groups:
        raise _invalid_with("group", "all_groups")
    if has_group and action == "list":
        raise _invalid_with("group", "list")
    if topics and action in ("list", "describe"):
        raise _invalid_with("topic", action)
    scenarios = [s for s in _SCENARIOS if getattr(args, s) not in (None, False)]
    if action != "reset_offsets":
        for extra in (*scenarios, "dry_run", "execute", "export", "all_topics"):
            if getattr(args, extra) not in (None, False):
                raise _invalid_with(extra, action)
    if args.timeout is None:
        timeout_ms = DEFAULT_TIMEOUT_MS
    else:
        timeout_ms = _parse_long(args.timeout, "timeout")
        if timeout_ms <= 0:
            raise usage_error("consumer-groups", f"--timeout must be positive, got {timeout_ms}")
    request = Request(action=action, groups=groups, all_groups=args.all_groups, topics=topics,
                      timeout=timeout_ms / 1000)

    if action == "list":
        if args.state:
            request.list_states = parse_states(args.state)
        elif args.state is not None:
            request.list_states = set()
        if args.type:
            request.list_types = parse_types(args.type)
        elif args.type is not None:
            request.list_types = set()
    elif action == "describe":
        if not has_group and not args.all_groups:
            raise usage_error("consumer-groups", f"Option [describe] takes one of these options: "
                                                 f"{scope}")
        subs = [s for s in ("members", "offsets", "state") if getattr(args, s) not in (None, False)]
        if len(subs) > 1:
            raise usage_error("consumer-groups", "Option [describe] takes at most one of these "
                                                 "options: [members], [offsets], [state]")
        if args.state:
            raise usage_error("consumer-groups", "Option [describe] does not take a value for "
                                                 "[state]")
        request.describe_what = subs[0] if subs else "offsets"
        request.verbose = args.verbose
    elif action == "delete":
        if not has_group and not args.all_groups:
            raise usage_error("consumer-groups", f"Option [delete] takes one of these options: "
                                                 f"{scope}")
        if topics:
            raise usage_error("consumer-groups", "The consumer does not support topic-specific "
                                                 "offset deletion from a consumer group.")
        if args.all_topics:
            raise _invalid_with("all_topics", "delete")
    elif action == "delete_offsets":
        if len(groups) != 1 or not topics:
            raise usage_error("consumer-groups", "Option [delete-offsets] takes the following "
                                                 "options: [group], [topic]")
        if args.all_groups or args.all_topics:
            raise _invalid_with("all_groups" if args.all_groups else "all_topics",
                                "delete_offsets")
        for topic in topics:
            if ":" in topic:
                parse_topic_partitions(topic)
    else:
        _check_reset(args, request, scenarios, has_group, now_ms)
    return request


def _check_reset(args: argparse.Namespace, request: Request, scenarios: list[str],
                 has_group: bool, now_ms: int | None) -> None:
    if args.dry_run and args.execute:
        raise usage_error("consumer-groups", "Option [reset-offsets] only accepts one of "
                                             "[execute] and [dry-run]")
    if not has_group and not args.all_groups:
        raise usage_error("consumer-groups", "Option [reset-offsets] takes one of these options: "
                                             "[group], [all-groups]")
    if len(scenarios) > 1:
        raise _invalid_with(scenarios[0], scenarios[1])
    if not scenarios:
        raise usage_error("consumer-groups", "Option [reset-offsets] requires one of the "
                                             "following scenarios: "
                          + ", ".join(_opt(s) for s in _SCENARIOS))
    if request.topics and args.all_topics:
        raise _invalid_with("topic", "all_topics")
    if not request.topics and not args.all_topics and not args.from_file:
        raise usage_error("consumer-groups", "One of the reset scopes should be defined: "
                                             "--all-topics, --topic.")
    for topic in request.topics:
        if ":" in topic:
            parse_topic_partitions(topic)
    scenario = scenarios[0]
    request.scenario = scenario
    request.execute = args.execute
    request.export = args.export
    request.from_file = args.from_file
    if scenario == "to_offset":
        request.to_offset = _parse_long(args.to_offset, "to-offset")
    elif scenario == "shift_by":
        request.shift_by = _parse_long(args.shift_by, "shift-by")
    elif scenario == "to_datetime":
        request.timestamp_ms = parse_datetime(args.to_datetime)
    elif scenario == "by_duration":
        now = int(time.time() * 1000) if now_ms is None else now_ms
        request.timestamp_ms = now - parse_duration_ms(args.by_duration)
    if not args.dry_run and not args.execute:
        request.warnings.append(
            "WARN: No action will be performed as the --execute option is missing. In version "
            "5.0, this command will require either --dry-run or --execute to be specified. You "
            "should add the --dry-run option explicitly if you are scripting this command and "
            "want to keep the current default behavior without prompting.")


def parse_states(text: str) -> set[str]:
    """``groupStatesFromString``: comma-separated, case-insensitive state names."""
    by_lower = {s.lower(): s for s in _STATES}
    parsed = {by_lower.get(s.strip().lower()) for s in text.split(",")}
    if None in parsed:
        raise usage_error("consumer-groups", f"Invalid state list '{text}'. Valid states are: "
                                             + ", ".join(_STATES))
    return {s for s in parsed if s is not None}


def parse_types(text: str) -> set[str]:
    """``consumerGroupTypesFromString``: classic and/or consumer."""
    by_lower = {t.lower(): t for t in _TYPES}
    parsed = {by_lower.get(t.strip().lower()) for t in text.split(",")}
    if None in parsed:
        raise usage_error("consumer-groups", f"Invalid types list '{text}'. Valid types are: "
                                             + ", ".join(_TYPES))
    return {t for t in parsed if t is not None}


def parse_topic_partitions(arg: str) -> list[tuple[str, int]]:
    """``topic:0,1,2`` (``GroupOffsetsResetter.parseTopicsWithPartitions``)."""
    parts = arg.split(":")
    while parts and parts[-1] == "":  # Java's String.split drops trailing empty strings
        parts.pop()
    if len(parts) != 2:
        raise usage_error("consumer-groups",
                          f"Invalid topic arg '{arg}', expected topic name and partitions")
    topic, partitions = parts
    out = []
    for partition in partitions.split(","):
        try:
            number: int | None = int(partition, 10)
        except ValueError:
            number = None
        if number is None or not -(2**31) <= number < 2**31:
            raise usage_error("consumer-groups", f"Invalid partition '{partition}' specified in "
                                                 f"topic arg '{arg}'")
        out.append((topic, number))
    return out


_DATETIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{1,3})"
                       r"(Z|[+-]\d{2}(?::?\d{2})?)")


def parse_datetime(text: str) -> int:
    """``Utils.getDateTime``: ``yyyy-MM-dd'T'HH:mm:ss.SSS`` and an optional zone (``Z``,
    ``+hh``, ``+hhmm``, ``+hh:mm``; none means UTC), as milliseconds since the epoch."""
    import datetime

    parts = text.split("T")
    while parts and parts[-1] == "":  # Java's String.split drops trailing empty strings
        parts.pop()
    if len(parts) < 2:
        raise CommandError(f"{FAILED}Error parsing timestamp. It does not contain a 'T' "
                           "according to ISO8601 format")
    stamp = text
    if not any(c in parts[1] for c in "+-Z"):
        stamp += "Z"
    m = _DATETIME.fullmatch(stamp)
    if m is None:
        raise CommandError(f'{FAILED}Unparseable date: "{stamp}"')
    year, month, day, hour, minute, second, millis = (int(g) for g in m.groups()[:7])
    zone = m[8]
    offset = datetime.timedelta(0)
    if zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
    try:
        moment = datetime.datetime(year, month, day, hour, minute, second, millis * 1000,
                                   tzinfo=datetime.timezone(offset))
    except ValueError:  # SimpleDateFormat is not lenient here: no 2024-02-30
        raise CommandError(f'{FAILED}Unparseable date: "{stamp}"') from None
    return int(moment.timestamp() * 1000)


_DURATION = re.compile(r"([-+]?)P(?:([-+]?[0-9]+)D)?(T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?"
                       r"(?:([-+]?[0-9]+)(?:[.,]([0-9]{0,9}))?S)?)?", re.IGNORECASE)


def parse_duration_ms(text: str) -> int:
    """``java.time.Duration.parse`` (``PnDTnHnMn.nS``) in milliseconds."""
    m = _DURATION.fullmatch(text)
    if m is None or m[3] == "T" or not any(m[i] for i in (2, 4, 5, 6)):
        raise CommandError(f"{FAILED}Text cannot be parsed to a Duration")
    days, hours, minutes, seconds = (int(m[i]) if m[i] else 0 for i in (2, 4, 5, 6))
    fraction = (m[7] or "").ljust(9, "0")
    nanos = int(fraction) if m[6] else 0
    if m[6] and m[6].startswith("-"):
        nanos = -nanos
    total = ((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000 + nanos // 1_000_000
    return -total if m[1] == "-" else total


# --- what is printed ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionRow:
    """One line of ``--describe --offsets`` (``PartitionAssignmentState``)."""

    group: str
    topic: str | None
    partition: int | None
    offset: int | None  # the committed offset
    log_end_offset: int | None
    consumer_id: str | None
    host: str | None
    client_id: str | None
    leader_epoch: int | None = None

    @property
    def lag(self) -> int | None:
        if self.offset is None or self.offset == -1 or self.log_end_offset is None:
            return None
        return self.log_end_offset - self.offset


@dataclass(frozen=True)
class MemberRow:
    """One line of ``--describe --members`` (``MemberAssignmentState``)."""

    group: str
    consumer_id: str
    host: str
    client_id: str
    group_instance_id: str  # "" when the member is not static
    assignment: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class GroupStateRow:
    """The line of ``--describe --state`` (``GroupInformation``)."""

    group: str
    coordinator: str  # "host:port  (id)"
    assignment_strategy: str
    state: str
    num_members: int


def _text(value: object) -> str:
    return MISSING if value is None else str(value)


def _line(widths: Sequence[int], values: Sequence[object]) -> str:
    """Java's ``%-Ns`` for each width, joined by blanks; a width of 0 is a bare ``%s``."""
    return " ".join(f"{_text(v):<{w}}" if w else _text(v) for w, v in zip(widths, values, strict=False))


def format_offsets(rows: Sequence[PartitionRow], verbose: bool = False) -> str:
    """``printOffsets``: a blank line, the header, the rows."""
    group_w = max([15, *(len(r.group) for r in rows)])
    topic_w = max([15, *(len(_text(r.topic)) for r in rows)])
    consumer_w = max([15, *(len(_text(r.consumer_id)) for r in rows)])
    host_w = max([15, *(len(_text(r.host)) for r in rows)])
    if verbose:
        widths = [group_w, topic_w, 10, 15, 15, 15, 15, consumer_w, host_w, 0]
        header: list[object] = ["GROUP", "TOPIC", "PARTITION", "LEADER-EPOCH", "CURRENT-OFFSET",
                                "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    else:
        widths = [group_w, topic_w, 10, 15, 15, 15, consumer_w, host_w, 0]
        header = ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                  "CONSUMER-ID", "HOST", "CLIENT-ID"]
    lines = [_line(widths, header)]
    for r in rows:
        values: list[object] = [r.group, r.topic, r.partition, r.offset, r.log_end_offset,
                                r.lag, r.consumer_id, r.host, r.client_id]
        if verbose:
            values.insert(3, r.leader_epoch)
        lines.append(_line(widths, values))
    return "".join("\n" + line for line in lines) + "\n"


def assignment_text(assignment: Sequence[tuple[str, int]]) -> str:
    """``getAssignmentString``: ``topic:0,1,2;other:0``, topics sorted, ``-`` when empty."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in assignment:
        by_topic.setdefault(topic, []).append(partition)
    if not by_topic:
        return MISSING
    return ";".join(sorted(f"{t}:{','.join(str(p) for p in sorted(ps))}"
                           for t, ps in by_topic.items()))


def format_members(rows: Sequence[MemberRow], verbose: bool = False) -> str:
    """``printMembers``: a blank line, the header (also when there are no members), one line
    per member.  Each line ends with the blank after ``#PARTITIONS`` (Kafka's format has it);
    ``verbose`` adds the KIP-848 epoch and assignment columns (``-`` epochs and no target
    assignment for a classic group's members)."""
    group_w = max([15, *(len(r.group) for r in rows)])
    consumer_w = max([15, *(len(r.consumer_id) for r in rows)])
    instance_w = max([17, *(len(r.group_instance_id) for r in rows)])
    host_w = max([15, *(len(r.host) for r in rows)])
    client_w = max([15, *(len(r.client_id) for r in rows)])
    current_w = max([20, *(len(assignment_text(r.assignment)) for r in rows)])
    with_instance = any(r.group_instance_id for r in rows)
    if with_instance:
        widths = [group_w, consumer_w, instance_w, host_w, client_w, 15]
        header = ["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    else:
        widths = [group_w, consumer_w, host_w, client_w, 15]
        header = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    verbose_widths = [15, current_w, 15, 20]  # %-15s %-Ns %-15s %-Ns
    head = _line(widths, header) + " "
    if verbose:
        head += _line(verbose_widths, ["CURRENT-EPOCH", "CURRENT-ASSIGNMENT", "TARGET-EPOCH",
                                       "TARGET-ASSIGNMENT"])
    out = ["\n" + head + "\n"]
    for r in rows:
        values: list[object] = [r.group, r.consumer_id, r.host, r.client_id, len(r.assignment)]
        if with_instance:
            values.insert(2, r.group_instance_id)
        line = _line(widths, values) + " "
        if verbose:
            line += _line(verbose_widths, [MISSING, assignment_text(r.assignment), MISSING,
                                           MISSING])
        out.append(line + "\n")
    return "".join(out)


def format_state(row: GroupStateRow) -> str:
    """``printStates``: a blank line, the header, the group's line."""
    widths = [max(15, len(row.group)), max(25, len(row.coordinator)), 20, 20, 0]
    header = ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"]
    values = [row.group, row.coordinator, row.assignment_strategy or MISSING, row.state,
              row.num_members]
    return "\n" + _line(widths, header) + "\n" + _line(widths, values) + "\n"


def format_group_list(listings: Sequence[tuple[str, str, str]], with_type: bool,
                      with_state: bool) -> str:
    """``printGroupInfo``: ``(group, type, state)`` triples under GROUP [TYPE] [STATE]."""
    group_w = max([15, *(len(g) for g, _, _ in listings)]) + 10
    widths = [group_w] + [20] * (int(with_type) + int(with_state))

    def pick(group: str, kind: str, state: str) -> list[str]:
        return [group] + ([kind] if with_type else []) + ([state] if with_state else [])

    lines = [_line(widths, pick("GROUP", "TYPE", "STATE"))]
    lines += [_line(widths, pick(*listing)) for listing in listings]
    return "".join(line + "\n" for line in lines)


def format_reset(plan: dict[str, dict[tuple[str, int], int]]) -> str:
    """``OffsetsUtils.printOffsetsToReset``: each line starts with a newline (``%n...``), GROUP
    and TOPIC ``max(15, longest)`` wide, the header only when some group was planned, and one
    newline at the end in any case."""
    group_w = max([15, *(len(g) for g in plan)])
    topic_w = max([15, *(len(t) for offsets in plan.values() for t, _ in offsets)])
    widths = [group_w, topic_w, 10, 0]
    lines = [_line(widths, ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"])] if plan else []
    for group, offsets in plan.items():
        for (topic, partition), offset in sorted(offsets.items()):
            lines.append(_line(widths, [group, topic, partition, offset]))
    return "".join("\n" + line for line in lines) + "\n"


def format_export(plan: dict[str, dict[tuple[str, int], int]], single_group: bool) -> str:
    """``exportOffsetsToCsv`` and the ``println`` after it."""
    lines = []
    for group, offsets in plan.items():
        for (topic, partition), offset in sorted(offsets.items()):
            fields = [topic, str(partition), str(offset)]
            lines.append(",".join(fields if single_group else [group, *fields]))
    return "".join(line + "\n" for line in lines) + "\n"


def format_delete_offsets(results: dict[tuple[str, int], str | None]) -> str:
    """The TOPIC PARTITION STATUS table of ``--delete-offsets`` (``None`` = deleted; a partition
    of -1 stands for a topic that could not be described)."""
    topic_w = max([15, *(len(t) for t, _ in results)])
    widths = [topic_w, 10, 15]
    lines = [_line(widths, ["TOPIC", "PARTITION", "STATUS"])]
    for (topic, partition), error in sorted(results.items(), key=lambda kv: kv[0][0] + str(kv[0][1])):
        status = "Successful" if error is None else f"Error: {error}"
        lines.append(_line(widths, [topic, partition if partition >= 0 else MISSING, status]))
    return "".join("\n" + line for line in lines) + "\n"


# --- the command -------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    request = check_args(args)
    for warning in request.warnings:
        _warn(warning)
    props = load_properties(args.command_config) if args.command_config else {}
    bootstrap = resolve_bootstrap(args, props)
    service = GroupService(bootstrap, props, request)
    try:
        return getattr(service, f"do_{request.action}")()
    except CommandError:
        raise
    except Exception as exc:
        from confluent_kafka import KafkaException

        if not isinstance(exc, KafkaException):
            raise
        raise service.failure(exc) from None


def kafka_message(exc: object) -> str:
    """Kafka's message for a confluent-kafka exception or KafkaError (librdkafka's texts say
    "Broker: Group not empty" where Kafka says "The group is not empty.")."""
    code = error_code(exc)
    err = _kafka_error(exc)
    text = str(err.str()) if err is not None else str(exc)
    if code in KAFKA_MESSAGES and (text.startswith("Broker: ") or not text):
        return KAFKA_MESSAGES[code]
    return text


def kafka_exception_text(exc: object) -> str:
    """``Throwable.toString`` of the Java exception Kafka's tool would hold for ``exc``."""
    name = KAFKA_EXCEPTIONS.get(error_code(exc) or 0)
    message = kafka_message(exc)
    return f"org.apache.kafka.common.errors.{name}: {message}" if name else message


def _kafka_error(exc: object) -> Any:
    """The KafkaError of a KafkaException (or the KafkaError itself), else None."""
    if callable(getattr(exc, "code", None)) and callable(getattr(exc, "str", None)):
        return exc
    args = getattr(exc, "args", None)
    err = args[0] if args else None
    return err if callable(getattr(err, "code", None)) and callable(getattr(err, "str", None)) \
        else None


def error_code(exc: object) -> int | None:
    err = _kafka_error(exc)
    return int(err.code()) if err is not None else None


def _warn(line: str) -> None:
    sys.stdout.flush()
    print(line, file=sys.stderr)


def _error(line: str) -> None:
    _warn(f"Error: {line}")


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def kafka_state(state: Any) -> str:
    """confluent-kafka's ``ConsumerGroupState`` as Kafka's ``GroupState.toString``."""
    name = getattr(state, "name", str(state))
    return {
        "PREPARING_REBALANCING": "PreparingRebalance",
        "COMPLETING_REBALANCING": "CompletingRebalance",
        "STABLE": "Stable",
        "DEAD": "Dead",
        "EMPTY": "Empty",
        "ASSIGNING": "Assigning",
        "RECONCILING": "Reconciling",
    }.get(name, "Unknown")


def kafka_type(kind: Any) -> str:
    """``ConsumerGroupType`` as ``GroupType.toString``; a broker too old to say (ListGroups < v5)
    only has classic groups."""
    name = getattr(kind, "name", None)
    return {"CONSUMER": "Consumer", "CLASSIC": "Classic"}.get(str(name), "Classic")


class GroupService:
    """The actions, on top of confluent-kafka's AdminClient (``ConsumerGroupService``)."""

    def __init__(self, bootstrap: str, props: dict[str, str], request: Request) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.request = request
        self.timeout = request.timeout
        conf = client_config(props)
        conf["bootstrap.servers"] = bootstrap
        conf.setdefault("log_level", 0)  # failures come back through the futures
        try:
            self.admin = AdminClient(conf)
        except Exception as exc:
            raise CommandError(kafka_message(exc)) from None

    def failure(self, exc: object) -> CommandError:
        """The one line for a request that failed."""
        if error_code(exc) == TIMED_OUT:  # librdkafka says only "Local: Timed out"
            return CommandError(f"{FAILED}no answer from {self.bootstrap} within "
                                f"{round(self.timeout * 1000)} ms (--timeout)")
        return CommandError(FAILED + kafka_message(exc))

    # --- reading the cluster -------------------------------------------------------------------

    def list_group_listings(self) -> list[Any]:
        result = self.admin.list_consumer_groups(request_timeout=self.timeout).result()
        # librdkafka asks every broker; one that answers NOT_COORDINATOR coordinates no group
        # and has nothing to add to the list (Kafka brokers answer an empty list instead).
        errors = [e for e in result.errors or () if error_code(e) != NOT_COORDINATOR]
        if errors and not result.valid:
            raise self.failure(errors[0])
        for text in dict.fromkeys(kafka_message(e) for e in errors):
            _warn(f"WARN: {text}")
        return sorted(result.valid or (), key=lambda listing: listing.group_id)

    def target_groups(self) -> list[str]:
        if self.request.all_groups:
            return [listing.group_id for listing in self.list_group_listings()]
        return self.request.groups

    def describe(self, groups: Sequence[str]) -> dict[str, Any]:
        """Each group's description, or the exception describing it raised."""
        from confluent_kafka import KafkaException

        if not groups:
            return {}
        futures = self.admin.describe_consumer_groups(list(groups), request_timeout=self.timeout)
        out: dict[str, Any] = {}
        for group in groups:
            try:
                out[group] = futures[group].result()
            except KafkaException as exc:
                if error_code(exc) != GROUP_ID_NOT_FOUND:
                    raise
                out[group] = exc
        return out

    def committed(self, group: str) -> dict[tuple[str, int], Any]:
        """The group's committed offsets: ``(topic, partition) -> TopicPartition``."""
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException

        futures = self.admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=self.timeout)
        try:
            result = futures[group].result()
        except KafkaException as exc:
            if error_code(exc) == GROUP_ID_NOT_FOUND:
                return {}
            raise
        return {(tp.topic, tp.partition): tp for tp in result.topic_partitions or ()
                if tp.error is None and tp.offset >= 0}

    def topic_partitions(self, topics: Iterable[str]) -> dict[str, list[Any]]:
        """``describeTopics``: each topic's partitions (TopicPartitionInfo), or raise."""
        from confluent_kafka import TopicCollection

        names = sorted(set(topics))
        if not names:
            return {}
        futures = self.admin.describe_topics(TopicCollection(names), request_timeout=self.timeout)
        return {name: sorted(futures[name].result().partitions, key=lambda p: p.id)
                for name in names}

    def log_offsets(self, partitions: Iterable[tuple[str, int]], spec: Any
                    ) -> dict[tuple[str, int], int | None]:
        """``getLogOffsets``: the offset ``spec`` finds in each partition; None where the broker
        could not say (no leader, the topic is gone)."""
        from confluent_kafka import KafkaException, TopicPartition

        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        futures = self.admin.list_offsets({TopicPartition(t, p): spec for t, p in wanted},
                                          request_timeout=self.timeout)
        out: dict[tuple[str, int], int | None] = dict.fromkeys(wanted)
        for tp, future in futures.items():
            try:
                out[(tp.topic, tp.partition)] = future.result().offset
            except KafkaException:
                pass
        return out

    def log_end_offsets(self, partitions: Iterable[tuple[str, int]]
                        ) -> dict[tuple[str, int], int | None]:
        from confluent_kafka.admin import OffsetSpec

        return self.log_offsets(partitions, OffsetSpec.latest())

    def log_start_offsets(self, partitions: Iterable[tuple[str, int]]
                          ) -> dict[tuple[str, int], int | None]:
        from confluent_kafka.admin import OffsetSpec

        return self.log_offsets(partitions, OffsetSpec.earliest())

    # --- --list --------------------------------------------------------------------------------

    def do_list(self) -> int:
        listings = self.list_group_listings()
        states, types = self.request.list_states, self.request.list_types
        if states is None and types is None:
            _out("".join(f"{listing.group_id}\n" for listing in listings))
            return 0
        rows = []
        for listing in listings:
            state = kafka_state(getattr(listing, "state", None))
            kind = kafka_type(getattr(listing, "type", None))
            if states and state not in states:
                continue
            if types and kind not in types:
                continue
            rows.append((listing.group_id, kind, state))
        _out(format_group_list(rows, with_type=types is not None, with_state=states is not None))
        return 0

    # --- --describe ----------------------------------------------------------------------------

    def do_describe(self) -> int:
        groups = self.target_groups()
        descriptions = self.describe(groups)
        failed = False
        for group in sorted(descriptions):
            desc = descriptions[group]
            state = "Dead" if isinstance(desc, Exception) else kafka_state(desc.state)
            if state == "Dead":  # Kafka 4.3's tool over DescribeGroups v6 (GROUP_ID_NOT_FOUND)
                _error("Executing consumer group command failed due to org.apache.kafka.common."
                       f"errors.GroupIdNotFoundException: Group {group} not found.")
                failed = True
                continue
            what = self.request.describe_what
            if what == "offsets":
                rows = self.offset_rows(group, desc)
                if self._announce(group, state, len(rows)):
                    _out(format_offsets(rows, self.request.verbose))
            elif what == "members":  # Kafka prints the header in any case
                members = member_rows(group, desc)
                shown = members if self._announce(group, state, len(members)) else []
                _out(format_members(shown, self.request.verbose))
            else:
                self._announce(group, state, 1)
                _out(format_state(state_row(group, desc, state)))
        return 1 if failed else 0

    @staticmethod
    def _announce(group: str, state: str, rows: int) -> bool:
        """``shouldPrintMemberState``: the warnings before a group's table; whether to print it."""
        if state == "Empty":
            _warn(f"\nConsumer group '{group}' has no active members.")
        elif state in _REBALANCING:
            _warn(f"\nWarning: Consumer group '{group}' is rebalancing.")
        return rows > 0

    def offset_rows(self, group: str, desc: Any) -> list[PartitionRow]:
        """``collectGroupsOffsets`` for one group."""
        committed = self.committed(group)
        members = [m for m in desc.members if _assigned(m)]
        members.sort(key=lambda m: -len(_assigned(m)))  # stable: the broker's order otherwise
        assigned = {tp for m in members for tp in _assigned(m)}
        unassigned = sorted(set(committed) - assigned)
        ends = self.log_end_offsets([*assigned, *unassigned])

        def row(tp: tuple[str, int], member: Any | None) -> PartitionRow:
            mine = committed.get(tp)
            epoch = getattr(mine, "leader_epoch", None) if mine is not None else None
            return PartitionRow(
                group=group, topic=tp[0], partition=tp[1],
                offset=mine.offset if mine is not None else None,
                log_end_offset=ends.get(tp),
                consumer_id=member.member_id if member is not None else MISSING,
                host=member.host if member is not None else MISSING,
                client_id=member.client_id if member is not None else MISSING,
                leader_epoch=epoch if epoch is not None and epoch >= 0 else None)

        rows = [row(tp, m) for m in members for tp in sorted(_assigned(m))]
        rows += [row(tp, None) for tp in unassigned]
        return rows

    # --- --delete ------------------------------------------------------------------------------

    def do_delete(self) -> int:
        from confluent_kafka import KafkaException

        groups = self.target_groups()
        if not groups:
            _out("Deletion of requested consumer groups () was successful.\n")
            return 0
        futures = self.admin.delete_consumer_groups(groups, request_timeout=self.timeout)
        deleted, failed = [], {}
        for group in groups:
            try:
                futures[group].result()
                deleted.append(group)
            except KafkaException as exc:
                failed[group] = kafka_exception_text(exc)
        quoted = ", ".join(f"'{g}'" for g in deleted)
        if not failed:
            _out(f"Deletion of requested consumer groups ({quoted}) was successful.\n")
            return 0
        _error("Deletion of some consumer groups failed:")
        for group, why in failed.items():
            _warn(f"* Group '{group}' could not be deleted due to: {why}")
        if deleted:
            _out(f"\nThese consumer groups were deleted successfully: {quoted}\n")
        return 1

    # --- --reset-offsets -----------------------------------------------------------------------

    def do_reset_offsets(self) -> int:
        groups = self.target_groups()
        descriptions = self.describe(groups)
        plan: dict[str, dict[tuple[str, int], int]] = {}
        failed = False
        for group in groups:
            desc = descriptions[group]
            state = "Dead" if isinstance(desc, Exception) else kafka_state(desc.state)
            if state not in ("Empty", "Dead"):
                _error(f"Assignments can only be reset if the group '{group}' is inactive, but "
                       f"the current state is {state}.")
                plan[group] = {}
                failed = True
                continue
            plan[group] = self.reset_group(group)
        if self.request.export:
            _out(format_export(plan, single_group=len(self.request.groups) == 1))
        else:
            _out(format_reset(plan))
        return 1 if failed else 0

    def reset_group(self, group: str) -> dict[tuple[str, int], int]:
        """``resetOffsetsForInactiveGroup``: the new offsets, committed with --execute."""
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

        request = self.request
        file_plan = read_reset_file(request.from_file, request.groups) if request.from_file \
            else None
        if file_plan is not None:
            if group not in file_plan:
                _error(f"No reset plan for group {group} found.")
                return {}
            partitions = sorted(file_plan[group])
        elif request.topics:
            partitions = self.partitions_to_reset(request.topics)
        else:  # --all-topics
            partitions = sorted(self.committed(group))
        self.check_partitions(partitions)
        new = self.prepare(group, partitions, file_plan)
        if request.execute and new:
            futures = self.admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o)
                                                      for (t, p), o in sorted(new.items())])],
                request_timeout=self.timeout)
            try:
                result = futures[group].result()
            except KafkaException as exc:
                raise self.failure(exc) from None
            for tp in result.topic_partitions or ():
                if tp.error is not None:
                    raise CommandError(f"{FAILED}{tp.topic}-{tp.partition}: "
                                       f"{kafka_message(KafkaException(tp.error))}")
        return new

    def partitions_to_reset(self, topic_args: Sequence[str]) -> list[tuple[str, int]]:
        """``parseTopicPartitionsToReset``: ``t:0,1`` as given, plain ``t`` as all of it."""
        listed = [tp for arg in topic_args if ":" in arg for tp in parse_topic_partitions(arg)]
        whole = [arg for arg in topic_args if ":" not in arg]
        described = self.topic_partitions(whole)
        listed += [(t, p.id) for t in sorted(described) for p in described[t]]
        return list(dict.fromkeys(listed))

    def check_partitions(self, partitions: Sequence[tuple[str, int]]) -> None:
        """``checkAllTopicPartitionsValid``: every partition exists and has a leader."""
        from confluent_kafka import KafkaException

        topics = {t for t, _ in partitions}
        existing: dict[tuple[str, int], Any] = {}
        for topic in sorted(topics):
            try:
                infos = self.topic_partitions([topic])[topic]
            except KafkaException as exc:
                if error_code(exc) != 3:  # UNKNOWN_TOPIC_OR_PART: its partitions do not exist
                    raise
                continue
            existing.update({(topic, p.id): p for p in infos})
        missing = [tp for tp in partitions if tp not in existing]
        if missing:
            names = ",".join(f"{t}-{p}" for t, p in missing)
            raise CommandError(f'{FAILED}The partitions "{names}" do not exist')
        leaderless = [tp for tp in partitions if existing[tp].leader is None]
        if leaderless:
            names = ",".join(f"{t}-{p}" for t, p in leaderless)
            raise CommandError(f'{FAILED}The partitions "{names}" have no leader')

    def prepare(self, group: str, partitions: Sequence[tuple[str, int]],
                file_plan: dict[str, dict[tuple[str, int], int]] | None
                ) -> dict[tuple[str, int], int]:
        """``prepareOffsetsToReset``."""
        request = self.request
        scenario = request.scenario
        if file_plan is not None:
            return self.clamp(file_plan[group])
        if scenario == "to_offset":
            assert request.to_offset is not None
            return self.clamp(dict.fromkeys(partitions, request.to_offset))
        if scenario in ("to_earliest", "to_latest"):
            found = (self.log_start_offsets if scenario == "to_earliest"
                     else self.log_end_offsets)(partitions)
            which = "starting" if scenario == "to_earliest" else "ending"
            for tp, offset in found.items():
                if offset is None:
                    raise CommandError(f"Error getting {which} offset of topic partition: "
                                       f"{tp[0]}-{tp[1]}")
            return {tp: int(found[tp]) for tp in partitions}  # type: ignore[arg-type]
        if scenario == "shift_by":
            assert request.shift_by is not None
            current = self.committed(group)
            wanted = {}
            for tp in partitions:
                if tp not in current:
                    raise CommandError(f"Cannot shift offset for partition {tp[0]}-{tp[1]} "
                                       "since there is no current committed offset")
                wanted[tp] = current[tp].offset + request.shift_by
            return self.clamp(wanted)
        if scenario in ("to_datetime", "by_duration"):
            assert request.timestamp_ms is not None
            return self.offsets_for_time(partitions, request.timestamp_ms)
        # to_current: the committed offset, the log end where there is none
        current = self.committed(group)
        new = {tp: current[tp].offset for tp in partitions if tp in current}
        ends = self.log_end_offsets([tp for tp in partitions if tp not in current])
        for tp, offset in ends.items():
            if offset is None:
                raise CommandError(f"Error getting ending offset of topic partition: "
                                   f"{tp[0]}-{tp[1]}")
            new[tp] = offset
        return new

    def clamp(self, wanted: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """``checkOffsetsRange``: offsets outside [log start, log end] move to the nearest end."""
        starts = self.log_start_offsets(wanted)
        ends = self.log_end_offsets(wanted)
        out = {}
        for tp, offset in wanted.items():
            end, start = ends.get(tp), starts.get(tp)
            name = f"{tp[0]}-{tp[1]}"
            if end is not None and offset > end:
                _warn(f"WARN: New offset ({offset}) is higher than latest offset for topic "
                      f"partition {name}. Value will be set to {end}")
                offset = end
            elif start is not None and offset < start:
                _warn(f"WARN: New offset ({offset}) is lower than earliest offset for topic "
                      f"partition {name}. Value will be set to {start}")
                offset = start
            out[tp] = offset
        return out

    def offsets_for_time(self, partitions: Sequence[tuple[str, int]], timestamp_ms: int
                         ) -> dict[tuple[str, int], int]:
        """``getLogTimestampOffsets``: the first offset at or after the time; the log end for a
        partition with no such record."""
        from confluent_kafka.admin import OffsetSpec

        found = self.log_offsets(partitions, OffsetSpec.for_timestamp(timestamp_ms))
        out: dict[tuple[str, int], int] = {}
        past_end = []
        for tp in partitions:
            offset = found.get(tp)
            if offset is None or offset < 0:
                past_end.append(tp)
            else:
                out[tp] = offset
        for tp in past_end:
            _warn(f"Warn: Partition {tp[1]} from topic {tp[0]} is empty. Falling back to latest "
                  "known offset.")
        ends = self.log_end_offsets(past_end)
        for tp in past_end:
            end = ends.get(tp)
            if end is None:
                raise CommandError(f"Error getting offset by timestamp of topic partition: "
                                   f"{tp[0]}-{tp[1]}")
            out[tp] = end
        return {tp: out[tp] for tp in partitions}

    # --- --delete-offsets ----------------------------------------------------------------------

    def do_delete_offsets(self) -> int:
        from confluent_kafka import KafkaException

        group = self.request.groups[0]
        results: dict[tuple[str, int], str | None] = {}
        partitions = [tp for arg in self.request.topics if ":" in arg
                      for tp in parse_topic_partitions(arg)]
        for topic in sorted({arg for arg in self.request.topics if ":" not in arg}):
            try:
                partitions += [(topic, p.id) for p in self.topic_partitions([topic])[topic]]
            except KafkaException as exc:
                results[(topic, -1)] = kafka_message(exc)
        partitions = list(dict.fromkeys(partitions))
        top, per_partition = delete_offsets(self.bootstrap, group, partitions, self.timeout,
                                            self.describe([group]).get(group))
        for tp in partitions:
            code = per_partition.get(tp, top)
            results[tp] = None if code == 0 else KAFKA_MESSAGES.get(code, f"error code {code}")
        if top in (24, 69, 30, 68):  # INVALID_GROUP_ID, GROUP_ID_NOT_FOUND, GROUP_AUTH., NON_EMPTY
            _error(KAFKA_MESSAGES[top])
            return 1
        if top == 0 and all(error is None for error in results.values()):
            _out(f"Request succeeded for deleting offsets from group {group}.\n")
            _out(format_delete_offsets(results))
            return 0
        if top in (0, 86, 29, 3):
            _error("Encountered some partition-level error, see the follow-up details.")
        else:
            _error(f"Encountered some unknown error: {KAFKA_MESSAGES.get(top, top)}")
        _out(format_delete_offsets(results))
        return 1


def _assigned(member: Any) -> list[tuple[str, int]]:
    assignment = getattr(member, "assignment", None)
    return [(tp.topic, tp.partition) for tp in getattr(assignment, "topic_partitions", None) or ()]


def member_rows(group: str, desc: Any) -> list[MemberRow]:
    """``collectGroupsMembers`` for one group."""
    return [MemberRow(group=group, consumer_id=m.member_id or "", host=m.host or "",
                      client_id=m.client_id or "", group_instance_id=m.group_instance_id or "",
                      assignment=tuple(sorted(_assigned(m))))
            for m in desc.members]


def state_row(group: str, desc: Any, state: str) -> GroupStateRow:
    node = desc.coordinator
    coordinator = f"{node.host}:{node.port}  ({node.id_string})" if node is not None else MISSING
    return GroupStateRow(group=group, coordinator=coordinator,
                         assignment_strategy=desc.partition_assignor or "", state=state,
                         num_members=len(desc.members))


def read_reset_file(path: str, groups: Sequence[str]) -> dict[str, dict[tuple[str, int], int]]:
    """``parseResetPlan``: ``topic,partition,offset`` lines for a single --group, else
    ``group,topic,partition,offset``."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f.read().split("\n") if line.strip()]
    except FileNotFoundError:
        raise CommandError(f"{FAILED}{path} (No such file or directory)") from None
    plan: dict[str, dict[tuple[str, int], int]] = {}
    old_format = bool(lines) and len(lines[0].split(",")) == 3
    for line in lines:
        fields = line.split(",")
        try:
            if len(groups) == 1 and old_format and len(fields) == 3:
                group, (topic, partition, offset) = groups[0], fields
            elif len(fields) == 4:
                group, topic, partition, offset = fields
            else:
                raise ValueError(line)
            plan.setdefault(group, {})[(topic, int(partition))] = int(offset)
        except ValueError:
            raise CommandError(f"{FAILED}cannot parse the reset plan line '{line}' of {path}"
                               ) from None
    return plan


# --- OffsetDelete (not in confluent-kafka) -----------------------------------------------------


def delete_offsets(bootstrap: str, group: str, partitions: Sequence[tuple[str, int]],
                   timeout: float, description: Any) -> tuple[int, dict[tuple[str, int], int]]:
    """Send OffsetDelete v0 to the group's coordinator: ``(top-level error code, partition ->
    error code)``.  The coordinator comes from DescribeGroups when the group exists, else from
    FindCoordinator v0 through the first bootstrap server.

    OffsetDelete v0 (non-flexible; request header v1, response header v0)::

        request   group_id string | [topic name string | [partition_index int32]]
        response  error_code int16 | throttle_time_ms int32
                  | [name string | [partition_index int32 | error_code int16]]
    """
    from kio.schema.find_coordinator.v0.request import FindCoordinatorRequest
    from kio.schema.find_coordinator.v0.response import FindCoordinatorResponse
    from kio.schema.offset_delete.v0.request import (
        OffsetDeleteRequest,
        OffsetDeleteRequestPartition,
        OffsetDeleteRequestTopic,
    )
    from kio.schema.offset_delete.v0.response import OffsetDeleteResponse
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import i32

    node = getattr(description, "coordinator", None)
    if node is not None and getattr(node, "host", None):
        address = (node.host, int(node.port))
    else:
        address = _first_server(bootstrap)
        found = _call(address, FindCoordinatorRequest(key=group), FindCoordinatorResponse,
                      timeout)
        if found.error_code != 0:
            code = int(found.error_code)
            raise CommandError(FAILED + KAFKA_MESSAGES.get(code, f"error code {code}"))
        address = (found.host, int(found.port))
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    body = OffsetDeleteRequest(group_id=GroupId(group), topics=tuple(
        OffsetDeleteRequestTopic(name=TopicName(topic), partitions=tuple(
            OffsetDeleteRequestPartition(partition_index=i32(p)) for p in ps))
        for topic, ps in by_topic.items()))
    response = _call(address, body, OffsetDeleteResponse, timeout)
    per_partition = {(t.name, int(p.partition_index)): int(p.error_code)
                     for t in response.topics for p in t.partitions}
    return int(response.error_code), per_partition


def _first_server(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0].strip()
    first = re.sub(r"^[A-Za-z_]+://", "", first)
    host, _, port = first.rpartition(":")
    try:
        return host.strip("[]") or "localhost", int(port)
    except ValueError:
        raise CommandError(f"{FAILED}invalid bootstrap server '{first}'") from None


def _call(address: tuple[str, int], body: Any, response_cls: Any, timeout: float) -> Any:
    """One request on a fresh connection (request header v1); its response body (response
    header v0: the correlation id)."""
    import socket
    import struct

    from kio.serial import entity_writer

    from shmq.errors import RemoteProtocolError
    from shmq.protocol.kio_guard import read_entity

    correlation_id = 1
    client_id = b"shmq-consumer-groups"
    payload = io.BytesIO()
    payload.write(struct.pack(">hhih", body.__api_key__, body.__version__, correlation_id,
                              len(client_id)))
    payload.write(client_id)
    entity_writer(type(body))(payload, body)
    frame = payload.getvalue()
    where = f"{address[0]}:{address[1]}"
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
            if not 4 <= size <= 1 << 20:
                raise CommandError(f"{FAILED}the coordinator at {where} sent a {size}-byte frame")
            data = _recv_exactly(sock, size)
    except OSError as exc:
        raise CommandError(f"{FAILED}cannot reach the coordinator at {where}: "
                           f"{exc.strerror or exc}") from None
    if struct.unpack_from(">i", data, 0)[0] != correlation_id:
        raise CommandError(f"{FAILED}the coordinator at {where} answered another request")
    try:
        return read_entity(response_cls, data, 4)[0]
    except RemoteProtocolError as exc:
        raise CommandError(f"{FAILED}the coordinator at {where} sent a bad response: {exc}"
                           ) from None


def _recv_exactly(sock: Any, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionResetError("the connection closed before the whole response")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
