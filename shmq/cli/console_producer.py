"""``shmq console-producer``: Kafka's ``kafka-console-producer.sh``, same flags, same input format.

Each line of stdin is one record.  With the reader properties (``--reader-property``, or the
older ``--property``) a line may carry headers and a key before the value, Kafka's
``LineMessageReader`` rules exactly::

    parse.headers=true parse.key=true     h1:v1,h2:v2<TAB>key<TAB>value
    parse.key=true                        key<TAB>value
    parse.headers=true                    h1:v1,h2:v2<TAB>value

``key.separator`` (TAB), ``headers.delimiter`` (TAB), ``headers.separator`` (``,``, a regular
expression) and ``headers.key.separator`` (``:``) change the separators; a key, value or header
value equal to ``null.marker`` is sent as null; ``ignore.error=true`` sends a line that lacks a
separator instead of stopping.  A ``>`` prompt is printed only when stdin and stdout are both
terminals.

Producer settings follow Kafka's: ``--command-config``/``--producer.config`` file, then
``--command-property``/``--producer-property`` on top, then the flags (``--timeout`` is
``linger.ms``, 1000 by default; ``--request-required-acks`` is ``acks``, -1; ``--batch-size``
16384; ``--compression-codec`` none, or gzip when given without a value).  Keys are partitioned
with murmur2 like Kafka's Java producer.  A record that cannot be delivered is reported on stderr
and makes the exit code 1.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from typing import Any

from shmq.cli import CommandError
from shmq.cli._connect import (
    add_connection_args,
    client_config,
    kafka_error_text,
    merged_properties,
    rdkafka_logger,
    resolve_bootstrap,
    usage_error,
)

LINE_READER = "org.apache.kafka.tools.LineMessageReader"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "console-producer", help="send lines of stdin as records (kafka-console-producer.sh)",
        description="This tool helps to read data from standard input and publish it to Kafka "
                    "(shmq). Flags and input format are those of Kafka's "
                    "kafka-console-producer.sh.")
    add_connection_args(p)
    p.add_argument("--broker-list", help=argparse.SUPPRESS)
    p.add_argument("--topic", required=True, help="REQUIRED: the topic to produce messages to")
    p.add_argument("--sync", action="store_true",
                   help="send each record synchronously, one at a time as they arrive")
    p.add_argument("--compression-codec", nargs="?", const="gzip", metavar="CODEC",
                   help="none, gzip, snappy, lz4 or zstd; gzip if given without a value "
                        "(default none)")
    p.add_argument("--batch-size", type=int, metavar="SIZE",
                   help="batch.size: bytes of records to send in one batch (default 16384)")
    p.add_argument("--max-partition-memory-bytes", type=int, metavar="SIZE",
                   help="also batch.size (overrides --batch-size)")
    p.add_argument("--message-send-max-retries", type=int, metavar="N",
                   help="retries (default 3)")
    p.add_argument("--retry-backoff-ms", type=int, metavar="MS",
                   help="retry.backoff.ms (default 100)")
    p.add_argument("--timeout", type=int, metavar="MS",
                   help="linger.ms: how long a record may wait for a batch to fill "
                        "(default 1000)")
    p.add_argument("--request-required-acks", metavar="ACKS",
                   help="acks: -1/all, 0 or 1 (default -1)")
    p.add_argument("--request-timeout-ms", type=int, metavar="MS",
                   help="request.timeout.ms (default 1500)")
    p.add_argument("--metadata-expiry-ms", type=int, metavar="MS",
                   help="metadata.max.age.ms")
    p.add_argument("--max-block-ms", type=int, metavar="MS",
                   help="accepted for compatibility; librdkafka does not block on send")
    p.add_argument("--max-memory-bytes", type=int, metavar="BYTES",
                   help="buffer.memory: bytes of records waiting to be sent")
    p.add_argument("--socket-buffer-size", type=int, metavar="SIZE",
                   help="socket.send.buffer.bytes")
    p.add_argument("--line-reader", metavar="CLASS",
                   help=f"only {LINE_READER} (the default) is available")
    p.add_argument("--reader-property", "--property", dest="reader_property", action="append",
                   metavar="KEY=VALUE",
                   help="a line reader property (repeatable): parse.key, key.separator, "
                        "parse.headers, headers.delimiter, headers.separator, "
                        "headers.key.separator, null.marker, ignore.error")
    p.add_argument("--reader-config", metavar="FILE",
                   help="a property file of line reader properties")
    p.add_argument("--command-property", "--producer-property", dest="command_property",
                   action="append", metavar="KEY=VALUE",
                   help="a producer config property (repeatable), e.g. linger.ms=5")
    p.add_argument("--command-config", "--producer.config", dest="command_config",
                   metavar="FILE", help="a producer config property file")
    return p


class LineReader:
    """Kafka's ``LineMessageReader``: one line of text to (headers, key, value)."""

    def __init__(self, props: dict[str, str]) -> None:
        self.parse_key = props.get("parse.key", "").strip().lower() == "true"
        self.key_separator = props.get("key.separator", "\t")
        self.parse_headers = props.get("parse.headers", "").strip().lower() == "true"
        self.headers_delimiter = props.get("headers.delimiter", "\t")
        self.headers_separator = props.get("headers.separator", ",")
        self.headers_key_separator = props.get("headers.key.separator", ":")
        self.ignore_error = props.get("ignore.error", "").strip().lower() == "true"
        self.null_marker = props.get("null.marker")
        self.line_number = 0
        try:
            self._headers_pattern = re.compile(self.headers_separator)
        except re.error as exc:
            raise CommandError(f"headers.separator is not a valid regular expression: {exc}"
                               ) from None
        pairs = [
            ("headers.delimiter", self.headers_delimiter, "headers.separator",
             self.headers_separator),
            ("headers.delimiter", self.headers_delimiter, "headers.key.separator",
             self.headers_key_separator),
            ("headers.separator", self.headers_separator, "headers.key.separator",
             self.headers_key_separator),
        ]
        for a, va, b, vb in pairs:
            if va == vb:
                raise CommandError(f"{a} and {b} may not be equal")
        if self.null_marker is not None:
            for name, value in (("key.separator", self.key_separator),
                                ("headers.separator", self.headers_separator),
                                ("headers.delimiter", self.headers_delimiter),
                                ("headers.key.separator", self.headers_key_separator)):
                if value == self.null_marker:
                    raise CommandError(f"null.marker and {name} may not be equal")

    def _parse(self, enabled: bool, line: str, start: int, demarcation: str,
               name: str) -> str | None:
        if not enabled:
            return None
        index = line.find(demarcation, start)
        if index == -1:
            if self.ignore_error:
                return None
            raise CommandError(f"No {name} found on line number {self.line_number}: '{line}'")
        return line[start:index]

    def _bytes(self, text: str | None) -> bytes | None:
        if text is None or text == self.null_marker:
            return None
        return text.encode("utf-8", "surrogateescape")

    def _split_headers(self, headers: str) -> list[tuple[str, bytes | None]]:
        parts = self._headers_pattern.split(headers)
        if len(parts) > 1:  # Java's split drops trailing empty strings
            while parts and parts[-1] == "":
                parts.pop()
        out: list[tuple[str, bytes | None]] = []
        for pair in parts:
            i = pair.find(self.headers_key_separator)
            if i == -1:
                if self.ignore_error:
                    out.append((pair, None))
                    continue
                raise CommandError(f"No header key separator found in pair '{pair}' on line "
                                   f"number {self.line_number}")
            key = pair[:i]
            if key == self.null_marker:
                raise CommandError("Header keys should not be equal to the null marker "
                                   f"'{self.null_marker}' as they can't be null")
            out.append((key, self._bytes(pair[i + len(self.headers_key_separator):])))
        return out

    def record(self, line: str) -> tuple[list[tuple[str, bytes | None]] | None, bytes | None,
                                         bytes | None]:
        """(headers, key, value) of one line (without its line terminator)."""
        headers = self._parse(self.parse_headers, line, 0, self.headers_delimiter,
                              "headers delimiter")
        header_offset = 0 if headers is None else len(headers) + len(self.headers_delimiter)
        key = self._parse(self.parse_key, line, header_offset, self.key_separator,
                          "key separator")
        key_offset = 0 if key is None else len(key) + len(self.key_separator)
        value = line[header_offset + key_offset:]
        parsed_headers = None
        if headers is not None and headers != self.null_marker:
            parsed_headers = self._split_headers(headers)
        return parsed_headers, self._bytes(key), self._bytes(value)


def producer_config(args: argparse.Namespace, bootstrap: str,
                    props: dict[str, str]) -> dict[str, Any]:
    """Kafka's ``ConsoleProducerConfig.producerProps`` as librdkafka config."""
    conf = client_config(props)
    conf["bootstrap.servers"] = bootstrap
    conf["compression.type"] = ("none" if args.compression_codec is None
                                else args.compression_codec or "gzip")
    conf.setdefault("client.id", "console-producer")
    conf.setdefault("partitioner", "murmur2_random")  # Kafka's partitioning of keys

    def merge(key: str, value: Any, default: Any, *aliases: str) -> None:
        # CommandLineUtils.maybeMergeOptions: a flag given wins, its default only fills a gap
        if value is not None:
            for alias in aliases:
                conf.pop(alias, None)
            conf[key] = value
        elif default is not None and key not in conf and not any(a in conf for a in aliases):
            conf[key] = default

    merge("linger.ms", args.timeout, 1000, "queue.buffering.max.ms")
    merge("acks", args.request_required_acks, "-1", "request.required.acks")
    merge("request.timeout.ms", args.request_timeout_ms, 1500)
    merge("retries", args.message_send_max_retries, 3, "message.send.max.retries")
    merge("retry.backoff.ms", args.retry_backoff_ms, 100)
    merge("socket.send.buffer.bytes", args.socket_buffer_size, None)
    if args.max_memory_bytes is not None:
        conf["queue.buffering.max.kbytes"] = max(1, args.max_memory_bytes // 1024)
    merge("batch.size", args.max_partition_memory_bytes or args.batch_size, 16384)
    merge("metadata.max.age.ms", args.metadata_expiry_ms, None)
    # Kafka's delivery.timeout.ms (2 min), not librdkafka's 5 min
    merge("message.timeout.ms", None, 120000, "delivery.timeout.ms")
    return conf


def run(args: argparse.Namespace) -> int:
    from shmq.cli import warn_deprecated

    soon = "is deprecated and will be removed in a future version."
    warn_deprecated(args, [
        ("--producer-property", f"Warning: --producer-property {soon} Use --command-property "
                                "instead."),
        ("--producer.config", f"Warning: --producer.config {soon} Use --command-config instead."),
        ("--property", f"Warning: --property {soon} Use --reader-property instead."),
        ("--max-partition-memory-bytes", "Warning: --max-partition-memory-bytes is deprecated "
                                         "and will be removed in Apache Kafka 5.0. Use "
                                         "--batch-size instead.")])
    if args.line_reader and args.line_reader != LINE_READER:
        raise usage_error("console-producer", f"--line-reader {args.line_reader} is not "
                                              f"available; shmq has {LINE_READER} only")
    reader_props = merged_properties([args.reader_config], [args.reader_property])
    reader = LineReader(reader_props)
    props = merged_properties([args.command_config], [args.command_property])
    if not args.bootstrap_server and args.broker_list:
        args.bootstrap_server = args.broker_list
    bootstrap = resolve_bootstrap(args, props)
    conf = producer_config(args, bootstrap, props)
    return ConsoleProducer(conf, args.topic, reader, args.sync).run(_stdin())


def _stdin() -> io.TextIOBase:
    """stdin as text: UTF-8 (bad bytes replaced, as Java's reader does); ``\\n``, ``\\r\\n``
    and ``\\r`` all end a line, as with ``BufferedReader.readLine``."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:
        return sys.stdin  # type: ignore[return-value]
    return io.TextIOWrapper(buffer, encoding="utf-8", errors="replace", newline=None)


class ConsoleProducer:
    def __init__(self, conf: dict[str, Any], topic: str, reader: LineReader, sync: bool) -> None:
        from confluent_kafka import KafkaException, Producer

        conf = dict(conf)
        conf.setdefault("logger", rdkafka_logger("console-producer"))
        try:
            self.producer = Producer(conf)
        except KafkaException as exc:
            raise CommandError(kafka_error_text(exc)) from None
        self.topic = topic
        self.reader = reader
        self.sync = sync
        self.failed = 0
        self.prompt = _interactive()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            return
        self.failed += 1
        key, value = msg.key(), msg.value()
        key_text = "null" if key is None else f"{len(key)} bytes"
        value_text = "null" if value is None else f"{len(value)} bytes"
        sys.stdout.flush()
        print(f"Error when sending message to topic {msg.topic()} with key: {key_text}, "
              f"value: {value_text} with error: {err.str()}", file=sys.stderr)

    def send(self, headers: Any, key: bytes | None, value: bytes | None) -> None:
        from confluent_kafka import KafkaException

        while True:
            try:
                self.producer.produce(self.topic, value=value, key=key, headers=headers,
                                      on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                self.producer.poll(0.1)
            except KafkaException as exc:
                raise CommandError(kafka_error_text(exc)) from None
        if self.sync:
            self.producer.flush()
            if self.failed:
                raise CommandError("the record could not be delivered; stopping (--sync)")
        else:
            self.producer.poll(0)

    def run(self, lines: io.TextIOBase) -> int:
        try:
            try:
                while True:
                    self.reader.line_number += 1
                    if self.prompt:
                        sys.stdout.write(">")
                        sys.stdout.flush()
                    line = lines.readline()
                    if not line:
                        break
                    if line.endswith("\n"):
                        line = line[:-1]
                    self.send(*self.reader.record(line))
            finally:
                remaining = self._flush()
        except KeyboardInterrupt:
            return 130
        if remaining:
            sys.stdout.flush()
            print(f"Error: {remaining} records were not delivered", file=sys.stderr)
        return 1 if self.failed or remaining else 0

    def _flush(self) -> int:
        try:
            return int(self.producer.flush())
        except KeyboardInterrupt:  # a second Ctrl-C: give up on what is still queued
            return int(self.producer.flush(0))


def _interactive() -> bool:
    """Java's ``System.console() != null``: stdin and stdout are both terminals."""
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False
