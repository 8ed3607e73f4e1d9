"""``shmq console-consumer``: Kafka's ``kafka-console-consumer.sh``, same flags, same output.

Each record is printed as Kafka's ``DefaultMessageFormatter`` prints it; with every
``print.*`` formatter property on (``--formatter-property``, or the older ``--property``)::

    CreateTime:1700000000000<TAB>Partition:0<TAB>Offset:42<TAB>h1:v1,h2:v2<TAB>key<TAB>value

in that order, ``NO_TIMESTAMP`` for a record without one, ``NO_HEADERS`` for a record without
headers, ``null`` (``null.literal``) for a null key, value or header value; ``key.separator``
(TAB), ``line.separator`` (newline) and ``headers.separator`` (``,``) change the separators.  Only
``print.value`` is on by default.  At the end ``Processed a total of N messages`` goes to stderr.

Where reading starts::

    --partition P [--offset n|earliest|latest]   that partition only (default: latest)
    --group G                                     subscribe as member of group G
    otherwise                                     every partition of the topic (or of every
                                                  topic --include matches), from the end, or
                                                  from the beginning with --from-beginning

Without ``--group`` Kafka's tool joins a throwaway group; shmq's tool assigns the partitions
itself instead (no group coordinator needed), which reads the same records.  It stops after
``--max-messages`` records, after ``--timeout-ms`` without one, on Ctrl-C (exit code 130) or
SIGTERM (143), or when stdout is closed.  A member of a group (``--group`` or ``group.id`` in the
consumer properties) commits as Kafka's tool does: every ``auto.commit.interval.ms`` and when it
stops, so the next member continues after the last record printed.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from typing import IO, Any

from shmq.cli import CommandError
from shmq.cli._connect import (
    add_connection_args,
    client_config,
    kafka_error_text,
    load_properties,
    merged_properties,
    parse_key_values,
    rdkafka_logger,
    resolve_bootstrap,
    usage_error,
)

OFFSET_EARLIEST = -2  # ListOffsetsRequest.EARLIEST_TIMESTAMP
OFFSET_LATEST = -1  # ListOffsetsRequest.LATEST_TIMESTAMP
POLL_SECONDS = 0.5  # keeps Ctrl-C responsive
BATCH = 500


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "console-consumer", help="print the records of a topic (kafka-console-consumer.sh)",
        description="This tool helps to read data from Kafka (shmq) topics and outputs it to "
                    "standard output. Flags and output are those of Kafka's "
                    "kafka-console-consumer.sh.")
    add_connection_args(p)
    p.add_argument("--topic", help="the topic to consume from")
    p.add_argument("--include", metavar="REGEX",
                   help="regular expression of the topics to consume from")
    p.add_argument("--partition", type=int, metavar="P",
                   help="the partition to consume from; consumption starts from the end of the "
                        "partition unless --offset is given")
    p.add_argument("--offset", metavar="OFFSET",
                   help="with --partition: the offset to start from, a non-negative number, "
                        "'earliest' or 'latest' (default latest)")
    p.add_argument("--from-beginning", action="store_true",
                   help="start with the earliest record rather than the latest")
    p.add_argument("--max-messages", type=int, metavar="N",
                   help="exit after N records (default: consume until stopped)")
    p.add_argument("--timeout-ms", type=int, metavar="MS",
                   help="exit if no record arrives for MS milliseconds")
    p.add_argument("--group", help="the consumer group to consume as (subscribe)")
    p.add_argument("--isolation-level", choices=("read_committed", "read_uncommitted"),
                   help="read_committed skips records of open and aborted transactions "
                        "(default read_uncommitted)")
    p.add_argument("--skip-message-on-error", action="store_true",
                   help="skip a record that cannot be printed instead of stopping")
    p.add_argument("--formatter-property", "--property", dest="formatter_property",
                   action="append", metavar="KEY=VALUE",
                   help="a formatter property (repeatable): print.timestamp, print.key, "
                        "print.value, print.partition, print.offset, print.headers, "
                        "print.delivery, key.separator, line.separator, headers.separator, "
                        "null.literal")
    p.add_argument("--formatter-config", metavar="FILE",
                   help="a property file of formatter properties")
    p.add_argument("--command-property", "--consumer-property", dest="command_property",
                   action="append", metavar="KEY=VALUE",
                   help="a consumer config property (repeatable)")
    p.add_argument("--command-config", "--consumer.config", dest="command_config",
                   metavar="FILE", help="a consumer config property file")
    return p


class Formatter:
    """Kafka's ``DefaultMessageFormatter``."""

    def __init__(self, props: dict[str, str]) -> None:
        def flag(name: str, default: bool) -> bool:
            return props[name].strip().lower() == "true" if name in props else default

        def text(name: str, default: str) -> bytes:
            return props.get(name, default).encode("utf-8")

        self.print_timestamp = flag("print.timestamp", False)
        self.print_key = flag("print.key", False)
        self.print_value = flag("print.value", True)
        self.print_partition = flag("print.partition", False)
        self.print_offset = flag("print.offset", False)
        self.print_delivery = flag("print.delivery", False)
        self.print_headers = flag("print.headers", False)
        self.key_separator = text("key.separator", "\t")
        self.line_separator = text("line.separator", "\n")
        self.headers_separator = text("headers.separator", ",")
        self.null_literal = text("null.literal", "null")

    def format(self, msg: Any) -> bytes:
        fields: list[bytes] = []
        if self.print_timestamp:
            kind, ts = msg.timestamp()
            if kind == 1:
                fields.append(f"CreateTime:{ts}".encode())
            elif kind == 2:
                fields.append(f"LogAppendTime:{ts}".encode())
            else:
                fields.append(b"NO_TIMESTAMP")
        if self.print_partition:
            fields.append(f"Partition:{msg.partition()}".encode())
        if self.print_offset:
            fields.append(f"Offset:{msg.offset()}".encode())
        if self.print_delivery:
            fields.append(b"Delivery:NONE")
        if self.print_headers:
            headers = msg.headers()
            if not headers:
                fields.append(b"NO_HEADERS")
            else:
                fields.append(self.headers_separator.join(
                    k.encode("utf-8") + b":" + self._bytes(v) for k, v in headers))
        if self.print_key:
            fields.append(self._bytes(msg.key()))
        if self.print_value:
            fields.append(self._bytes(msg.value()))
        # every field ends with key.separator, except the last, which ends the line
        return self.key_separator.join(fields) + self.line_separator if fields else b""

    def _bytes(self, data: bytes | None) -> bytes:
        return self.null_literal if data is None else bytes(data)


def _parse_offset(text: str | None) -> int:
    if text is None:
        return OFFSET_LATEST
    lowered = text.lower()
    if lowered == "earliest":
        return OFFSET_EARLIEST
    if lowered == "latest":
        return OFFSET_LATEST
    try:
        offset = int(text, 10)
    except ValueError:
        offset = -1
    if offset < 0:
        raise usage_error("console-consumer", f"The provided offset value '{text}' is incorrect. "
                                              "Valid values are 'earliest', 'latest', or a "
                                              "non-negative long.")
    return offset


def _check_args(args: argparse.Namespace) -> None:
    """``ConsoleConsumerOptions.checkRequiredArgs``."""
    if (args.topic is None) == (args.include is None):
        raise usage_error("console-consumer", "Exactly one of --topic or --include is required")
    if args.partition is not None:
        if args.topic is None:
            raise usage_error("console-consumer",
                              "The topic is required when partition is specified.")
        if args.from_beginning and args.offset is not None:
            raise usage_error("console-consumer",
                              "Options from-beginning and offset cannot be specified together.")
    elif args.offset is not None:
        raise usage_error("console-consumer",
                          "The partition is required when offset is specified.")


def consumer_config(args: argparse.Namespace, bootstrap: str, file_props: dict[str, str],
                    extra_props: dict[str, str]) -> tuple[dict[str, Any], str | None]:
    """Kafka's ``buildConsumerProps`` as librdkafka config, and the group to subscribe as."""
    groups = []
    for source in (args.group, file_props.get("group.id"), extra_props.get("group.id")):
        if source is not None and source not in groups:
            groups.append(source)
    if len(groups) > 1:
        raise usage_error("console-consumer", "The group ids provided in different places "
                          "(directly using '--group', via '--consumer-property', or via "
                          "'--consumer.config') do not match. Detected group ids: "
                          + ", ".join(f"'{g}'" for g in groups))
    if groups and args.partition is not None:
        raise usage_error("console-consumer",
                          "Options group and partition cannot be specified together.")
    props = {**file_props, **extra_props}
    reset = props.get("auto.offset.reset")
    if reset is not None and args.from_beginning and reset != "earliest":
        raise CommandError(f"Can't simultaneously specify --from-beginning and "
                           f"'auto.offset.reset={reset}', please remove one option")
    if reset is None:
        props["auto.offset.reset"] = "earliest" if args.from_beginning else "latest"
    conf = client_config(props)
    conf["bootstrap.servers"] = bootstrap
    conf.setdefault("client.id", "console-consumer")
    if args.isolation_level is not None or "isolation.level" not in conf:
        conf["isolation.level"] = args.isolation_level or "read_uncommitted"
    # Kafka's Java consumer creates a missing topic it is asked for (when the broker allows).
    conf.setdefault("allow.auto.create.topics", "true")
    group = groups[0] if groups else None
    if group is None:
        # librdkafka wants a group.id even to assign; nothing is committed to it
        conf["group.id"] = f"console-consumer-{random.randrange(100000)}"
        conf["enable.auto.commit"] = "false"
    else:
        conf["group.id"] = group
    return conf, group


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    from shmq.cli import warn_deprecated

    soon = "is deprecated and will be removed in a future version."
    warn_deprecated(args, [
        ("--consumer-property", f"Option --consumer-property {soon} Use --command-property "
                                "instead."),
        ("--consumer.config", f"Option --consumer.config {soon} Use --command-config instead."),
        ("--property", f"Option --property {soon} Use --formatter-property instead.")])
    start = _parse_offset(args.offset) if args.partition is not None else None
    if args.max_messages is not None and args.max_messages < 0:
        args.max_messages = None  # Kafka: -1 means no limit
    formatter_props = load_properties(args.formatter_config) if args.formatter_config else {}
    formatter_props.update(parse_key_values(args.formatter_property))
    formatter = Formatter(formatter_props)
    file_props = merged_properties([args.command_config], [])
    extra_props = parse_key_values(args.command_property)
    bootstrap = resolve_bootstrap(args, {**file_props, **extra_props})
    conf, group = consumer_config(args, bootstrap, file_props, extra_props)
    out: IO[bytes] = getattr(sys.stdout, "buffer", None) or sys.stdout  # type: ignore[assignment]
    consumer = ConsoleConsumer(conf, formatter, out, args.skip_message_on_error)
    _stop_on_sigterm()
    try:
        return consumer.run(args, group, start)
    finally:
        if consumer.started:  # not when it could not start: then the error is the one line
            _report_count(consumer.count)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: Kafka's tool closes its consumer in a shutdown hook, so a
    group member leaves the group and commits what it printed instead of holding its partitions
    until the session times out."""


def _stop_on_sigterm() -> None:
    import signal

    def stop(signum: int, frame: object) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, stop)


def _report_count(count: int) -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    print(f"Processed a total of {count} messages", file=sys.stderr)


class ConsoleConsumer:
    def __init__(self, conf: dict[str, Any], formatter: Formatter, out: IO[bytes],
                 skip_on_error: bool) -> None:
        self.conf = conf
        self.formatter = formatter
        self.out = out
        self.skip_on_error = skip_on_error
        self.count = 0
        self.consumer: Any = None
        self.started = False
        self._reported: set[str] = set()

    def run(self, args: argparse.Namespace, group: str | None, start: int | None) -> int:
        from confluent_kafka import Consumer, KafkaException

        conf = dict(self.conf)
        conf.setdefault("logger", rdkafka_logger("console-consumer"))
        try:
            self.consumer = Consumer(conf)
        except KafkaException as exc:
            raise CommandError(kafka_error_text(exc)) from None
        try:
            try:
                self._start(args, group, start)
                self.started = True
                return self._loop(args.max_messages, args.timeout_ms)
            except KeyboardInterrupt as exc:
                return 143 if isinstance(exc, Terminated) else 130
            except KafkaException as exc:
                raise CommandError(kafka_error_text(exc)) from None
        finally:
            self._close()

    def _close(self) -> None:
        try:
            self.consumer.close()
        except KeyboardInterrupt:
            pass
        except Exception:  # closing is best effort; the records are printed already
            pass

    # --- where to start ------------------------------------------------------------------------

    def _start(self, args: argparse.Namespace, group: str | None, start: int | None) -> None:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

        if group is not None:
            if args.include is not None:
                self.consumer.subscribe([f"^{args.include}$"])
            else:
                self.consumer.subscribe([args.topic])
            return
        timeout = 30.0 if args.timeout_ms is None else max(5.0, args.timeout_ms / 1000)
        if args.include is not None:
            pattern = _include_pattern(args.include)
            metadata = self.consumer.list_topics(timeout=timeout)
            topics = sorted(t for t in metadata.topics if pattern.fullmatch(t))
            partitions = {t: sorted(metadata.topics[t].partitions) for t in topics
                          if metadata.topics[t].error is None}
        else:
            metadata = self.consumer.list_topics(args.topic, timeout=timeout)
            info = metadata.topics.get(args.topic)
            if info is None or info.error is not None or not info.partitions:
                why = f": {info.error.str()}" if info is not None and info.error else ""
                raise CommandError(f"topic {args.topic} does not exist{why}")
            partitions = {args.topic: sorted(info.partitions)}
        if args.partition is not None:
            if args.partition not in partitions[args.topic]:
                raise CommandError(f"partition {args.partition} of topic {args.topic} does not "
                                   f"exist (it has {len(partitions[args.topic])} partitions)")
            position = OFFSET_LATEST if start is None else start
            where = {OFFSET_EARLIEST: OFFSET_BEGINNING, OFFSET_LATEST: OFFSET_END}.get(
                position, position)
            self.consumer.assign([TopicPartition(args.topic, args.partition, where)])
            return
        beginning = self.conf.get("auto.offset.reset") in ("earliest", "smallest", "beginning")
        where = OFFSET_BEGINNING if beginning else OFFSET_END
        self.consumer.assign([TopicPartition(t, p, where)
                              for t, parts in partitions.items() for p in parts])

    # --- the loop ------------------------------------------------------------------------------

    def _loop(self, max_messages: int | None, timeout_ms: int | None) -> int:
        from confluent_kafka import KafkaError

        waited_since = time.monotonic()
        while max_messages is None or self.count < max_messages:
            want = BATCH if max_messages is None else min(BATCH, max_messages - self.count)
            poll = POLL_SECONDS
            if timeout_ms is not None and timeout_ms >= 0:
                left = timeout_ms / 1000 - (time.monotonic() - waited_since)
                if left < 0:
                    return 0  # Kafka: a TimeoutException ends the loop, exit code 0
                poll = min(poll, left)
            messages = self.consumer.consume(want, poll)
            if not messages:
                if _reader_gone(self.out):
                    self._write([])  # reports the closed stdout
                    return 0
                continue
            chunks: list[bytes] = []
            for msg in messages:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                     KafkaError.TOPIC_AUTHORIZATION_FAILED):
                        self._write(chunks)
                        self._report("Error processing message, terminating consumer process: "
                                     f"{err.str()}", always=True)
                        return 1
                    self._report(f"Error while consuming: {err.str()}")
                    continue
                self.count += 1
                try:
                    chunks.append(self.formatter.format(msg))
                except Exception as exc:
                    if not self.skip_on_error:
                        raise
                    self._report(f"Error processing message, skipping this message: {exc}")
            if not self._write(chunks):
                return 0
            waited_since = time.monotonic()
        return 0

    def _write(self, chunks: list[bytes]) -> bool:
        """Print; False when stdout is gone (``| head``)."""
        try:
            if _reader_gone(self.out):
                raise BrokenPipeError
            self.out.write(b"".join(chunks))
            self.out.flush()
        except BrokenPipeError:
            _silence_stdout()
            print("Unable to write to standard out, closing consumer.", file=sys.stderr)
            return False
        return True

    def _report(self, line: str, always: bool = False) -> None:
        if always or line not in self._reported:
            self._reported.add(line)
            print(line, file=sys.stderr)


def _reader_gone(out: IO[bytes]) -> bool:
    """Whether ``out`` is a pipe nobody reads any more (``... | head -1`` after head exits), so
    an idle consumer notices without waiting for a record to write."""
    import select

    try:
        poller = select.poll()
        poller.register(out.fileno(), 0)  # POLLERR/POLLHUP are always reported
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return False
    return any(ev & select.POLLERR for _, ev in events)


def _include_pattern(raw: str) -> re.Pattern[str]:
    try:
        return re.compile(raw)
    except re.error as exc:
        raise CommandError(f"{raw} is an invalid regex: {exc}") from None


def _silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
