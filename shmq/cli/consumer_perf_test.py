"""``shmq consumer-perf-test``: Kafka's ``kafka-consumer-perf-test.sh``, same flags, same output.

It consumes ``--messages`` (Kafka 4.2: ``--num-records``) records of ``--topic`` (or of the topics
``--include`` matches) and prints Kafka's ``ConsumerPerformance`` header and result line::

    start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
    %s, %s, %.4f, %.4f, %d, %.4f, %d, %d, %.4f, %.4f

Bytes are key + value bytes, MB is 1024 x 1024 bytes; the times are ``--date-format``
(``yyyy-MM-dd HH:mm:ss:SSS``, Java's ``SimpleDateFormat`` letters, local time).  The run is timed
from just after the consumer is created to the last record (or to the ``--timeout`` without a
record that ends it, with Kafka's ``WARNING: Exiting before consuming the expected number of
messages ...``); ``rebalance.time.ms`` is the time until the group assigned partitions, and
``fetch.*`` are the rates over the rest.  ``--show-detailed-stats`` prints instead, every
``--reporting-interval`` ms, ``time, threadId, ...`` lines over the last interval.

Group: like Kafka's tool it subscribes as a member of ``--group`` (default
``perf-consumer-<random>``) and starts at the earliest offset, or at the latest with
``--from-latest``, when the group has no committed offset.  A broker without a group coordinator
(FindCoordinator answers COORDINATOR_NOT_AVAILABLE; shmq before its group coordinator) cannot
take a subscription: the tool then says so on stderr and assigns every partition itself
(``rebalance.time.ms`` 0, nothing committed), which reads the same records.  The probe is a
DescribeGroups through AdminClient, bounded by ``--coordinator-probe-ms``.

Consumer settings: ``--command-config``/``--consumer.config`` file, then ``--command-property``
on top, then the flags (``--fetch-size`` is ``max.partition.fetch.bytes``, 1 MiB;
``--socket-buffer-size`` is ``socket.receive.buffer.bytes``, 2 MiB; ``check.crcs`` false).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
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
from shmq.cli._perf_report import Reporter, print_metrics

COMMAND = "consumer-perf-test"
HEADER_FIELDS = ", rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
HEADER = "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec"
DETAILED_HEADER = "time, threadId, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec"
POLL_SECONDS = 0.1  # Kafka polls with Duration.ofMillis(100)
BATCH = 10_000
MB = 1024 * 1024


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND, help="measure consumer throughput (kafka-consumer-perf-test.sh)",
        description="This tool is used to verify the consumer performance. Flags and output "
                    "are those of Kafka's kafka-consumer-perf-test.sh.")
    add_connection_args(p)
    p.add_argument("--broker-list", help=argparse.SUPPRESS)
    p.add_argument("--topic", help="the topic to consume from")
    p.add_argument("--include", metavar="REGEX",
                   help="regular expression specifying the topics to consume from")
    p.add_argument("--num-records", "--messages", dest="num_records", type=int, metavar="COUNT",
                   help="REQUIRED: the number of messages to consume")
    p.add_argument("--group", metavar="GID",
                   help="the group id to consume on (default perf-consumer-<random>)")
    p.add_argument("--fetch-size", type=int, default=1024 * 1024, metavar="SIZE",
                   help="the amount of data to fetch in a single request per partition "
                        "(max.partition.fetch.bytes, default 1048576)")
    p.add_argument("--from-latest", action="store_true",
                   help="if the consumer does not already have an established offset to consume "
                        "from, start with the latest message present in the log rather than the "
                        "earliest message")
    p.add_argument("--socket-buffer-size", type=int, default=2 * 1024 * 1024, metavar="SIZE",
                   help="the size of the tcp RECV size (default 2097152)")
    p.add_argument("--command-config", "--consumer.config", dest="command_config",
                   metavar="CONFIG-FILE", help="consumer config properties file")
    p.add_argument("--command-property", "--consumer-property", dest="command_property",
                   action="append", metavar="KEY=VALUE",
                   help="a consumer config property (repeatable)")
    p.add_argument("--print-metrics", action="store_true",
                   help="print out the metrics (librdkafka statistics)")
    p.add_argument("--show-detailed-stats", action="store_true",
                   help="if set, stats are reported for each reporting interval as configured by "
                        "--reporting-interval")
    p.add_argument("--timeout", type=int, default=10_000, metavar="MS",
                   help="the maximum allowed time in milliseconds between returned records "
                        "(default 10000)")
    p.add_argument("--reporting-interval", type=int, default=5000, metavar="INTERVAL-MS",
                   help="interval in milliseconds at which to print progress info "
                        "(default 5000)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw throughput and end-to-end latency over time into FILE.png "
                        "(shmq)")
    p.add_argument("--date-format", default="yyyy-MM-dd HH:mm:ss:SSS", metavar="FORMAT",
                   help="the date format to use for formatting the time field "
                        "(java.text.SimpleDateFormat letters; default yyyy-MM-dd HH:mm:ss:SSS)")
    p.add_argument("--hide-header", action="store_true",
                   help="if set, skips printing the header for the stats")
    p.add_argument("--coordinator-probe-ms", type=int, default=2000, metavar="MS",
                   help="shmq: how long to wait for the group coordinator before assigning the "
                        "partitions directly (default 2000)")
    return p


# --- dates ---------------------------------------------------------------------------------------

_DATE_TOKEN = re.compile(r"'[^']*'|y+|M+|d+|H+|h+|m+|s+|S+|a|E+|Z|z|[A-Za-z]")


def java_date(fmt: str, epoch_ms: int) -> str:
    """``SimpleDateFormat(fmt).format(epoch_ms)`` in local time, for the common letters."""
    t = time.localtime(epoch_ms / 1000)
    millis = epoch_ms % 1000

    def one(m: re.Match[str]) -> str:
        tok = m.group(0)
        c, n = tok[0], len(tok)
        if c == "'":
            return tok[1:-1] if n > 2 else "'"
        if c == "y":
            return f"{t.tm_year % 100:02d}" if n == 2 else f"{t.tm_year:0{n}d}"
        if c == "M":
            if n >= 4:
                return time.strftime("%B", t)
            if n == 3:
                return time.strftime("%b", t)
            return f"{t.tm_mon:0{n}d}"
        if c == "E":
            return time.strftime("%A" if n >= 4 else "%a", t)
        numbers = {"d": t.tm_mday, "H": t.tm_hour, "h": (t.tm_hour % 12) or 12, "m": t.tm_min,
                   "s": t.tm_sec, "S": millis}
        if c in numbers:
            return f"{numbers[c]:0{n}d}"
        if c == "a":
            return "AM" if t.tm_hour < 12 else "PM"
        if c == "Z":
            return time.strftime("%z", t)
        if c == "z":
            return time.strftime("%Z", t)
        raise usage_error(COMMAND, f"Illegal pattern character '{c}' in --date-format")

    return _DATE_TOKEN.sub(one, fmt)


def _rate(amount: float, seconds: float) -> str:
    """``%.4f`` of amount / seconds as Java prints it (Infinity, NaN)."""
    if seconds == 0:
        if amount == 0:
            return "NaN"
        return "Infinity"
    return f"{amount / seconds:.4f}"


# --- configuration -------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> None:
    if args.num_records is None:
        raise usage_error(COMMAND, "Missing required argument \"[messages]\" (--num-records)")
    if (args.topic is None) == (args.include is None):
        raise usage_error(COMMAND, "Exactly one of the following arguments is required: "
                                   "--topic, --include")
    if args.reporting_interval <= 0:
        raise usage_error(COMMAND, "Reporting interval must be greater than 0.")
    if getattr(args, "plot", None):
        from shmq.cli._perf_plot import check_plot_path

        try:
            check_plot_path(args.plot)
        except ValueError as exc:
            raise usage_error(COMMAND, str(exc)) from None
    if args.fetch_size <= 0:
        raise usage_error(COMMAND, "--fetch-size must be greater than 0")
    java_date(args.date_format, 0)  # a bad pattern is a usage error before anything runs


def consumer_config(args: argparse.Namespace, props: dict[str, str]) -> dict[str, Any]:
    """``ConsumerPerfOptions.props`` as librdkafka config."""
    if not args.bootstrap_server and args.broker_list:
        args.bootstrap_server = args.broker_list
    bootstrap = resolve_bootstrap(args, props)
    conf = client_config(props)
    conf["bootstrap.servers"] = bootstrap
    conf["group.id"] = args.group or props.get("group.id") or (
        f"perf-consumer-{random.randrange(100_000)}")
    conf["socket.receive.buffer.bytes"] = args.socket_buffer_size
    conf["max.partition.fetch.bytes"] = args.fetch_size
    conf["auto.offset.reset"] = "latest" if args.from_latest else "earliest"
    conf["check.crcs"] = False
    conf.setdefault("client.id", "perf-consumer-client")
    if args.print_metrics:
        conf["statistics.interval.ms"] = 1000
    return conf


def run(args: argparse.Namespace) -> int:
    _check(args)
    from shmq.cli import warn_deprecated

    warn_deprecated(args, [
        ("--messages", "Warning: --messages is deprecated. Use --num-records instead."),
        ("--consumer.config", "Warning: --consumer.config is deprecated. Use --command-config "
                              "instead.")])
    props = merged_properties([args.command_config], [args.command_property])
    conf = consumer_config(args, props)
    return ConsumerPerfTest(args, conf).run()


# --- the run ------------------------------------------------------------------------------------


class ConsumerPerfTest:
    def __init__(self, args: argparse.Namespace, conf: dict[str, Any]) -> None:
        self.args = args
        self.conf = conf
        self.messages = 0
        self.bytes = 0
        self.join_ms = 0  # total time waiting for an assignment
        self.join_round_ms = 0  # ... since the last detailed-stats line
        self.timeline: Any = None  # --plot
        self.join_start = 0.0
        self.assigned: set[tuple[str, int]] = set()
        self.last_stats: str | None = None
        self.report = Reporter()

    # --- group membership (ConsumerPerfRebListener) ---------------------------------------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        if not self.assigned:
            elapsed = int((time.time() - self.join_start) * 1000)
            self.join_ms += elapsed
            self.join_round_ms += elapsed
        self.assigned.update((p.topic, p.partition) for p in partitions)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned.difference_update((p.topic, p.partition) for p in partitions)
        if not self.assigned:
            self.join_start = time.time()

    def _coordinator_available(self) -> bool:
        """Whether the broker answers for the group: DescribeGroups (after FindCoordinator)
        returns within --coordinator-probe-ms."""
        from confluent_kafka.admin import AdminClient

        keys = ("bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username",
                "sasl.password", "ssl.ca.location", "client.id")
        admin = AdminClient({**{k: self.conf[k] for k in keys if k in self.conf},
                             "logger": rdkafka_logger(COMMAND)})
        wait = max(0.1, self.args.coordinator_probe_ms / 1000)
        try:
            futures = admin.describe_consumer_groups([self.conf["group.id"]],
                                                     request_timeout=wait)
            for future in futures.values():
                future.result(timeout=wait + 1)
        except Exception:  # noqa: BLE001 - timed out, COORDINATOR_NOT_AVAILABLE, unsupported
            return False
        return True

    def _subscribe_or_assign(self, consumer: Any, group: bool) -> None:
        from confluent_kafka import TopicPartition

        args = self.args
        if args.include is not None:
            try:
                pattern = re.compile(args.include)
            except re.error as exc:
                raise CommandError(f"{args.include} is an invalid regex: {exc}") from None
        if group:
            topics = [f"^{args.include}$"] if args.include is not None else [args.topic]
            consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke)
            return
        sys.stdout.flush()
        print(f"{COMMAND}: no group coordinator answers for group {self.conf['group.id']}; "
              "assigning every partition instead (nothing is committed)", file=sys.stderr)
        wait = max(5.0, args.timeout / 1000)
        metadata = consumer.list_topics(args.topic, timeout=wait) if args.topic is not None \
            else consumer.list_topics(timeout=wait)
        if args.topic is not None:
            info = metadata.topics.get(args.topic)
            if info is None or info.error is not None or not info.partitions:
                why = f": {info.error.str()}" if info is not None and info.error else ""
                raise CommandError(f"topic {args.topic} does not exist{why}")
            wanted = {args.topic: info}
        else:
            wanted = {name: t for name, t in metadata.topics.items()
                      if pattern.fullmatch(name) and t.error is None}
        committed_default = -1 if args.from_latest else -2  # OFFSET_END / OFFSET_BEGINNING
        consumer.assign([TopicPartition(name, p, committed_default)
                         for name, t in sorted(wanted.items()) for p in sorted(t.partitions)])

    # --- consuming -------------------------------------------------------------------------------

    def run(self) -> int:
        from confluent_kafka import Consumer, KafkaException

        args = self.args
        conf = dict(self.conf)
        conf.setdefault("logger", rdkafka_logger(COMMAND))
        if args.print_metrics:
            conf["stats_cb"] = self._stats_cb
        if not args.hide_header:
            print((DETAILED_HEADER if args.show_detailed_stats else HEADER) + HEADER_FIELDS,
                  flush=True)
        # asked before the clock starts: without a coordinator the probe waits it out
        group = self._coordinator_available()
        if not group:
            # nothing to commit to; librdkafka's close() would wait for the coordinator
            conf["enable.auto.commit"] = False
        try:
            consumer = Consumer(conf)
        except KafkaException as exc:
            raise CommandError(kafka_error_text(exc)) from None
        try:
            start = self.join_start = time.time()
            with self.report.progress_bar("consumed", args.num_records):
                self._subscribe_or_assign(consumer, group)
                self._consume(consumer)
            end = time.time()
            if args.print_metrics:
                deadline = time.monotonic() + 2.5
                self.last_stats = None
                while self.last_stats is None and time.monotonic() < deadline:
                    consumer.poll(0.1)
        except KeyboardInterrupt:
            _close(consumer)
            return 130
        except KafkaException as exc:
            _close(consumer)
            raise CommandError(kafka_error_text(exc)) from None
        _close(consumer)
        if not args.show_detailed_stats:
            elapsed = end - start
            fetch_ms = int((end - start) * 1000) - self.join_ms
            mb = self.bytes / MB
            print(f"{java_date(args.date_format, int(start * 1000))}, "
                  f"{java_date(args.date_format, int(end * 1000))}, "
                  f"{mb:.4f}, {_rate(mb, elapsed)}, {self.messages}, "
                  f"{_rate(self.messages, elapsed)}, {self.join_ms}, {fetch_ms}, "
                  f"{_rate(mb, fetch_ms / 1000)}, {_rate(self.messages, fetch_ms / 1000)}",
                  flush=True)
        if args.print_metrics:
            print_metrics(self.last_stats, conf.get("client.id", "perf-consumer-client"),
                          "consumer")
        if self.timeline is not None:
            from shmq.cli._perf_plot import plot

            plot(self.timeline, args.plot, f"consumer-perf-test: {args.topic}",
                 "latency (ms, record timestamp to consumed)")
        return 0

    def _stats_cb(self, text: str) -> None:
        self.last_stats = text

    def _consume(self, consumer: Any) -> None:
        from confluent_kafka import KafkaError

        args = self.args
        wanted = args.num_records
        timeout = args.timeout / 1000
        interval = args.reporting_interval / 1000
        detailed = args.show_detailed_stats
        timeline = None
        if args.plot:
            from shmq.cli._perf_plot import Timeline

            timeline = self.timeline = Timeline()
        now = time.time()
        last_report = last_consumed = now
        last_messages = last_bytes = 0
        messages = nbytes = 0
        reported: set[str] = set()
        while messages < wanted and now - last_consumed <= timeout:
            batch = consumer.consume(min(BATCH, wanted - messages), POLL_SECONDS)
            now = time.time()
            if batch:
                last_consumed = now
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                     KafkaError.TOPIC_AUTHORIZATION_FAILED):
                        raise CommandError(err.str())
                    if err.str() not in reported:
                        reported.add(err.str())
                        print(f"Error while consuming: {err.str()}", file=sys.stderr)
                    continue
                messages += 1
                key = msg.key()
                size = len(msg) + (len(key) if key is not None else 0)
                nbytes += size
                if timeline is not None:   # end to end: now minus the record's timestamp
                    ts = msg.timestamp()[1]
                    timeline.add(time.monotonic(), size, now * 1000 - ts if ts > 0 else None)
                if now - last_report >= interval:
                    if detailed:
                        self.report.line(self._progress_line(nbytes, last_bytes, messages,
                                                        last_messages, last_report, now))
                    self.join_round_ms = 0
                    last_report, last_messages, last_bytes = now, messages, nbytes
            self.report.advance(messages)
        if messages < wanted:
            self.report.line("WARNING: Exiting before consuming the expected number of messages: "
                        f"timeout ({args.timeout} ms) exceeded. You can use the --timeout "
                        "option to increase the timeout.")
        self.messages, self.bytes = messages, nbytes

    def _progress_line(self, nbytes: int, last_bytes: int, messages: int, last_messages: int,
                       start: float, end: float) -> str:
        """``printConsumerProgress``: one ``--show-detailed-stats`` line."""
        elapsed_ms = int(end * 1000) - int(start * 1000)
        total_mb = nbytes / MB
        interval_mb = (nbytes - last_bytes) / MB
        fetch_ms = elapsed_ms - self.join_round_ms
        interval_messages = messages - last_messages
        fetch_mb_s = 0.0 if fetch_ms <= 0 else 1000 * interval_mb / fetch_ms
        fetch_msg_s = 0.0 if fetch_ms <= 0 else 1000 * interval_messages / fetch_ms
        return (f"{java_date(self.args.date_format, int(end * 1000))}, 0, {total_mb:.4f}, "
                f"{_rate(1000 * interval_mb, elapsed_ms)}, {messages}, "
                f"{_rate(1000 * interval_messages, elapsed_ms)}, {self.join_round_ms}, "
                f"{fetch_ms}, {fetch_mb_s:.4f}, {fetch_msg_s:.4f}")


def _close(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception:  # noqa: BLE001 - closing is best effort; the numbers are measured
        pass
