"""``shmq producer-perf-test``: Kafka's ``kafka-producer-perf-test.sh``, same flags, same output.

It produces ``--num-records`` records to ``--topic`` as fast as it can (``--throughput -1``) or
paced to about ``--throughput`` records/s, and prints, exactly as Kafka's ``ProducerPerformance``
does, one line per reporting window (5 s unless ``--reporting-interval``) and a final line::

    %d records sent, %.1f records/sec (%.2f MB/sec), %.1f ms avg latency, %.1f ms max latency.
    %d records sent, %f records/sec (%.2f MB/sec), %.2f ms avg latency, %.2f ms max latency,
        %d ms 50th, %d ms 95th, %d ms 99th, %d ms 99.9th.                      (one line)

MB is 1024 x 1024 bytes.  A record counts when its delivery report says it was written; its
latency is librdkafka's ``Message.latency()``, read in the delivery callback: from the
``produce()`` call to the broker's acknowledgement.  Kafka's Java tool keeps whole milliseconds;
shmq keeps the fraction, so the averages and maxima are not rounded down to 0 on a fast broker,
and the percentiles are printed as Kafka prints them (``%d``, rounded down).  Like Kafka, at most
about 500,000 latencies are kept (one every ``num-records / 500,000``) for the percentiles.

Payloads: ``--record-size N`` sends N random uppercase letters per record (Kafka draws new letters
for every record; shmq draws a pool of up to 1,000 payloads once and cycles through it, so the
generator does not limit the rate); ``--payload-file F`` sends payloads split from F at
``--payload-delimiter`` (a regular expression, newline by default), each record a random one of
them; ``--payload-monotonic`` sends the record's number as text.

Producer settings: ``--command-config``/``--producer.config`` file, then
``--command-property``/``--producer-props`` on top; ``bootstrap.servers`` comes from
``--bootstrap-server``, else from those properties, else from the local broker (``--data-dir``).
Everything else is librdkafka's default (acks=all, linger.ms=5, as Kafka 4's Java producer).
``--transactional-id`` or ``--transaction-duration-ms`` (or ``transactional.id`` in the
properties) produce in transactions committed every ``--transaction-duration-ms`` (3000).
``--warmup-records N`` adds a second final line for the records after the first N
("... steady state records sent, ...").

On a terminal a progress bar (rich) runs under the report lines; through a pipe the output is
exactly Kafka's.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import re
import sys
import time
import uuid
from array import array
from typing import Any

from shmq.cli import CommandError
from shmq.cli._connect import (
    add_connection_args,
    client_config,
    kafka_error_text,
    load_properties,
    rdkafka_logger,
    resolve_bootstrap,
    usage_error,
)
from shmq.cli._perf_report import Reporter, print_metrics

COMMAND = "producer-perf-test"
DEFAULT_TRANSACTION_ID_PREFIX = "performance-producer-"
DEFAULT_TRANSACTION_DURATION_MS = 3000
MAX_LATENCY_SAMPLES = 500_000  # ProducerPerformance.Stats: numRecords / min(numRecords, 500000)
PAYLOAD_POOL = 1000
POLL_EVERY = 1000  # records between poll(0) calls (serve delivery reports, refresh the bar)
MB = 1024 * 1024


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND, help="measure producer throughput and latency (kafka-producer-perf-test.sh)",
        description="This tool is used to verify the producer performance. To enable "
                    "transactions, you can specify a transactional id or set a transaction "
                    "duration using --transaction-duration-ms. Flags and output are those of "
                    "Kafka's kafka-producer-perf-test.sh.")
    add_connection_args(p)
    p.add_argument("--topic", required=True, metavar="TOPIC",
                   help="REQUIRED: produce messages to this topic")
    p.add_argument("--num-records", required=True, type=int, metavar="NUM-RECORDS",
                   help="REQUIRED: number of messages to produce")
    payload = p.add_mutually_exclusive_group(required=True)
    payload.add_argument("--record-size", type=int, metavar="RECORD-SIZE",
                         help="message size in bytes (exactly one of --record-size, "
                              "--payload-file or --payload-monotonic)")
    payload.add_argument("--payload-file", metavar="PAYLOAD-FILE",
                         help="file to read the message payloads from (UTF-8 text); each "
                              "message is a randomly selected payload")
    payload.add_argument("--payload-monotonic", action="store_true",
                         help="payload is a monotonically increasing integer")
    p.add_argument("--payload-delimiter", default="\\n", metavar="PAYLOAD-DELIMITER",
                   help="delimiter (a regular expression) between the payloads of "
                        "--payload-file (default: new line)")
    p.add_argument("--throughput", required=True, type=float, metavar="THROUGHPUT",
                   help="REQUIRED: throttle maximum message throughput to *approximately* "
                        "THROUGHPUT messages/sec; -1 disables throttling")
    p.add_argument("--command-property", "--producer-props", dest="command_property",
                   nargs="+", action="extend", metavar="PROP-NAME=PROP-VALUE",
                   help="producer config properties (bootstrap.servers, client.id, ...); they "
                        "take precedence over --command-config")
    p.add_argument("--command-config", "--producer.config", dest="command_config",
                   metavar="CONFIG-FILE", help="producer config properties file")
    p.add_argument("--print-metrics", action="store_true",
                   help="print out metrics (librdkafka statistics) at the end of the test")
    p.add_argument("--transactional-id", metavar="TRANSACTIONAL-ID",
                   help="produce in transactions with this transactional id")
    p.add_argument("--transaction-duration-ms", type=int, metavar="TRANSACTION-DURATION",
                   help="commit a transaction after this many ms (default 3000 when "
                        "transactions are on)")
    p.add_argument("--warmup-records", type=int, default=0, metavar="WARMUP-RECORDS",
                   help="records to treat as warm-up: a second final line reports the rest "
                        "(steady state)")
    p.add_argument("--reporting-interval", type=int, default=5000, metavar="INTERVAL-MS",
                   help="interval in milliseconds at which to print progress info "
                        "(default 5000)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw throughput and latency over time into FILE.png (shmq)")
    return p


# --- the statistics Kafka prints -----------------------------------------------------------------


class Stats:
    """``ProducerPerformance.Stats``: totals, one reporting window, sampled latencies (ms)."""

    def __init__(self, num_records: int, interval_ms: int, steady_state: bool,
                 printer: Any) -> None:
        self.start = time.monotonic()
        self.window_start = self.start
        self.interval = interval_ms / 1000
        self.sampling = max(1, num_records // max(1, min(num_records, MAX_LATENCY_SAMPLES)))
        self.latencies = array("d")
        self.iteration = 0
        self.count = 0
        self.bytes = 0
        self.total_latency = 0.0
        self.max_latency = 0.0
        self.steady_state = steady_state
        self.print_line = printer
        self.suppress = False
        self._new_window()

    def _new_window(self) -> None:
        self.window_start = time.monotonic()
        self.window_count = 0
        self.window_bytes = 0
        self.window_total_latency = 0.0
        self.window_max_latency = 0.0

    def record(self, latency_ms: float, size: int, now: float) -> None:
        self.count += 1
        self.bytes += size
        self.total_latency += latency_ms
        if latency_ms > self.max_latency:
            self.max_latency = latency_ms
        self.window_count += 1
        self.window_bytes += size
        self.window_total_latency += latency_ms
        if latency_ms > self.window_max_latency:
            self.window_max_latency = latency_ms
        if self.iteration % self.sampling == 0:
            self.latencies.append(latency_ms)
        if now - self.window_start >= self.interval:
            if self.steady_state and self.count == self.window_count:
                self.print_line("In steady state.")
            if not self.suppress:
                self.print_line(self.window_line())
            self._new_window()
        self.iteration += 1

    def window_line(self) -> str:
        elapsed = time.monotonic() - self.window_start
        rate = self.window_count / elapsed if elapsed > 0 else 0.0
        mb = self.window_bytes / elapsed / MB if elapsed > 0 else 0.0
        avg = self.window_total_latency / self.window_count if self.window_count else float("nan")
        return (f"{self.window_count} records sent, {rate:.1f} records/sec ({mb:.2f} MB/sec), "
                f"{_java(avg, 1)} ms avg latency, {self.window_max_latency:.1f} ms max latency.")

    def total_line(self) -> str:
        elapsed = time.monotonic() - self.start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        mb = self.bytes / elapsed / MB if elapsed > 0 else 0.0
        avg = self.total_latency / self.count if self.count else float("nan")
        p50, p95, p99, p999 = percentiles(self.latencies, (0.5, 0.95, 0.99, 0.999))
        label = " steady state" if self.steady_state else ""
        return (f"{self.count}{label} records sent, {rate:f} records/sec ({mb:.2f} MB/sec), "
                f"{_java(avg, 2)} ms avg latency, {self.max_latency:.2f} ms max latency, "
                f"{p50} ms 50th, {p95} ms 95th, {p99} ms 99th, {p999} ms 99.9th.")


def percentiles(samples: array, qs: tuple[float, ...]) -> list[int]:
    """Kafka's ``Stats.percentiles``: the sample at index ``(int)(q * n)`` of the sorted samples,
    as whole milliseconds (0 when there are none)."""
    ordered = sorted(samples)
    if not ordered:
        return [0 for _ in qs]
    return [int(ordered[min(len(ordered) - 1, int(q * len(ordered)))]) for q in qs]


def _java(value: float, digits: int) -> str:
    """``%.Nf`` as Java prints NaN (a run that delivered nothing: 0 / 0)."""
    return "NaN" if value != value else f"{value:.{digits}f}"


# --- configuration -------------------------------------------------------------------------------


def _props(args: argparse.Namespace) -> dict[str, str]:
    """``ProducerPerformance.readProps``: the config file, then ``k=v`` items on top; an item
    that is not exactly one ``k=v`` pair is an error."""
    props = load_properties(args.command_config) if args.command_config else {}
    for item in args.command_property or ():
        pieces = item.split("=")
        if len(pieces) != 2:
            raise usage_error(COMMAND, f"Invalid property: {item}")
        props[pieces[0]] = pieces[1]
    return props


def _check(args: argparse.Namespace) -> None:
    """``ProducerPerformance.ConfigPostProcessor``'s checks."""
    if args.num_records <= 0:
        raise usage_error(COMMAND, "--num-records should be greater than zero")
    if args.warmup_records < 0:
        args.warmup_records = 0
    if args.warmup_records >= args.num_records:
        raise usage_error(COMMAND, "The value for --warmup-records must be strictly fewer than "
                                   "the number of records in the test, --num-records.")
    if args.record_size is not None and args.record_size <= 0:
        raise usage_error(COMMAND, "--record-size should be greater than zero")
    if args.transaction_duration_ms is not None and args.transaction_duration_ms <= 0:
        raise usage_error(COMMAND, "--transaction-duration-ms should be greater than zero")
    if args.reporting_interval <= 0:
        raise usage_error(COMMAND, "--reporting-interval should be greater than zero")
    if args.plot:
        from shmq.cli._perf_plot import check_plot_path

        try:
            check_plot_path(args.plot)
        except ValueError as exc:
            raise usage_error(COMMAND, str(exc)) from None


def producer_config(args: argparse.Namespace, props: dict[str, str]
                    ) -> tuple[dict[str, Any], int | None]:
    """librdkafka config and the transaction duration (None: no transactions)."""
    bootstrap = resolve_bootstrap(args, props)
    conf = client_config(props)
    conf["bootstrap.servers"] = bootstrap
    conf.setdefault("client.id", "perf-producer-client")
    if "delivery.timeout.ms" in conf:
        conf.setdefault("message.timeout.ms", conf.pop("delivery.timeout.ms"))
    duration = args.transaction_duration_ms
    if duration is not None or args.transactional_id or "transactional.id" in conf:
        conf["transactional.id"] = (args.transactional_id or conf.get("transactional.id")
                                    or DEFAULT_TRANSACTION_ID_PREFIX + str(uuid.uuid4()))
        duration = duration or DEFAULT_TRANSACTION_DURATION_MS
    else:  # librdkafka wants message.timeout.ms <= transaction.timeout.ms (60 s) otherwise
        conf.setdefault("message.timeout.ms", 120000)  # Kafka's delivery.timeout.ms, not 5 min
    if args.print_metrics:
        conf["statistics.interval.ms"] = 1000
    return conf, duration


def read_payload_file(path: str, delimiter: str) -> list[bytes]:
    """``ProducerPerformance.readPayloadFile``: UTF-8 text split at the delimiter (a regular
    expression, as ``Scanner.useDelimiter`` takes it)."""
    absolute = os.path.abspath(path)
    print(f"Reading payloads from: {absolute}")
    try:
        if os.path.getsize(path) == 0:
            raise CommandError("File does not exist or empty file provided.")
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        raise CommandError("File does not exist or empty file provided.") from None
    try:
        pieces = re.split(delimiter, text)
    except re.error as exc:
        raise usage_error(COMMAND, f"--payload-delimiter is not a valid regular expression: "
                                   f"{exc}") from None
    while pieces and pieces[-1] == "":  # Scanner returns no token after the last delimiter
        pieces.pop()
    if pieces and pieces[0] == "":  # ... nor before a leading one
        pieces.pop(0)
    payloads = [p.encode("utf-8") for p in pieces]
    print(f"Number of messages read: {len(payloads)}")
    if not payloads:
        raise CommandError("File does not exist or empty file provided.")
    return payloads


def random_payloads(size: int, count: int) -> list[bytes]:
    """``count`` payloads of ``size`` random uppercase letters (Kafka's ``nextInt(26) + 65``)."""
    rng = random.Random(0)
    letters = bytes(range(65, 91))
    return [bytes(rng.choices(letters, k=size)) for _ in range(count)]


# --- the run ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    _check(args)
    from shmq.cli import warn_deprecated

    soon = "has been deprecated and will be removed in a future version."
    warn_deprecated(args, [
        ("--producer-props", f"Option --producer-props {soon} Use --command-property instead."),
        ("--producer.config", f"Option --producer.config {soon} Use --command-config instead.")])
    delimiter = "\n" if args.payload_delimiter == "\\n" else args.payload_delimiter
    props = _props(args)
    conf, transaction_ms = producer_config(args, props)
    if args.payload_file is not None:
        payloads = read_payload_file(args.payload_file, delimiter)
    elif args.record_size is not None:
        payloads = random_payloads(args.record_size, min(args.num_records, PAYLOAD_POOL))
    else:
        payloads = []
    return ProducerPerfTest(args, conf, payloads, transaction_ms).run()


class ProducerPerfTest:
    def __init__(self, args: argparse.Namespace, conf: dict[str, Any], payloads: list[bytes],
                 transaction_ms: int | None) -> None:
        self.args = args
        self.conf = dict(conf)
        self.payloads = payloads
        self.transaction_ms = transaction_ms
        self.failed = 0
        self.errors: set[str] = set()
        self.last_stats: str | None = None
        self.report = Reporter()
        self.stats: Stats | None = None
        self.steady: Stats | None = None
        self.timeline: Any = None
        if args.plot:
            from shmq.cli._perf_plot import Timeline

            self.timeline = Timeline()

    def _delivered(self, err: Any, msg: Any) -> None:
        self._record(err, msg, False)

    def _delivered_steady(self, err: Any, msg: Any) -> None:
        """A record sent after the warm-up (Kafka's PerfCallback holds the steady-state stats
        of the moment it was sent, so earlier records never count there)."""
        self._record(err, msg, True)

    def _record(self, err: Any, msg: Any, steady: bool) -> None:
        if err is not None:
            self.failed += 1
            text = err.str()
            if text not in self.errors:  # Kafka prints every stack trace; one line per cause
                self.errors.add(text)
                sys.stdout.flush()
                print(f"Error when sending message to topic {msg.topic()}: {text}",
                      file=sys.stderr)
            return
        latency = msg.latency()
        latency_ms = latency * 1000 if latency is not None else 0.0
        now = time.monotonic()
        size = len(msg)
        assert self.stats is not None
        self.stats.record(latency_ms, size, now)
        if self.timeline is not None:
            self.timeline.add(now, size, latency_ms)
        if steady and self.steady is not None:
            self.steady.record(latency_ms, size, now)

    def _stats_cb(self, text: str) -> None:
        self.last_stats = text

    def run(self) -> int:
        from confluent_kafka import KafkaException, Producer

        args = self.args
        conf = self.conf
        conf.setdefault("logger", rdkafka_logger(COMMAND))
        conf["on_delivery"] = self._delivered
        if args.print_metrics:
            conf["stats_cb"] = self._stats_cb
        try:
            producer = Producer(conf)
            if self.transaction_ms is not None:
                producer.init_transactions(30)
        except KafkaException as exc:
            raise CommandError(kafka_error_text(exc)) from None
        try:
            with self.report.progress_bar("acknowledged", self.args.num_records):
                self._produce(producer)
                remaining = self._flush(producer)
        except KeyboardInterrupt:
            return 130
        except KafkaException as exc:
            raise CommandError(kafka_error_text(exc)) from None
        assert self.stats is not None
        self.report.line(self.stats.total_line())
        if self.steady is not None:
            self.report.line(self.steady.total_line())
        if args.print_metrics:
            self._print_metrics(producer)
        if self.timeline is not None:
            from shmq.cli._perf_plot import plot

            plot(self.timeline, args.plot, f"producer-perf-test: {args.topic}",
                 "latency (ms, produce to ack)")
        if remaining:
            sys.stdout.flush()
            print(f"Error: {remaining} records were not delivered", file=sys.stderr)
        return 1 if self.failed or remaining else 0

    def _produce(self, producer: Any) -> None:
        args = self.args
        topic = args.topic
        n = args.num_records
        warmup = args.warmup_records
        payloads = self.payloads
        pool = len(payloads)
        choose = random.Random(0).randrange
        from_file = args.payload_file is not None
        monotonic_payload = args.payload_monotonic
        throughput = args.throughput
        paced = throughput > 0
        transactions = self.transaction_ms is not None
        transaction_s = (self.transaction_ms or 0) / 1000
        in_transaction = 0
        transaction_start = 0.0
        produce, poll, clock = producer.produce, producer.poll, time.monotonic
        if warmup > 0:
            self.report.line(f"Warmup first {warmup} records. Steady state results will print "
                        "after the complete test summary.")
        self.stats = Stats(n, args.reporting_interval, False, self.report.line)
        start = self.stats.start
        advance = self.report.advance
        for i in range(n):
            if from_file:
                payload = payloads[choose(pool)]
            elif monotonic_payload:
                payload = str(i).encode()
            else:
                payload = payloads[i % pool]
            if transactions and in_transaction == 0:
                producer.begin_transaction()
                transaction_start = clock()
            if warmup and i == warmup:
                self.steady = Stats(n - warmup, args.reporting_interval, True, self.report.line)
                self.stats.suppress = True
                produce = functools.partial(producer.produce, on_delivery=self._delivered_steady)
            while True:
                try:
                    produce(topic, payload)
                    break
                except BufferError:  # librdkafka's queue is full: let deliveries drain it
                    poll(0.005)
            in_transaction += 1
            if transactions and clock() - transaction_start >= transaction_s:
                producer.commit_transaction()
                in_transaction = 0
            if paced:
                # ThroughputThrottler: never ahead of `throughput` records/s since the start
                due = start + (i + 1) / throughput
                wait = due - clock()
                while wait > 0:
                    poll(wait)
                    wait = due - clock()
            if i % POLL_EVERY == 0:
                poll(0)
                advance(self.stats.count)
        if transactions and in_transaction:
            producer.commit_transaction()

    def _flush(self, producer: Any) -> int:
        """Wait for every delivery report (librdkafka fails a record after message.timeout.ms,
        Kafka's delivery.timeout.ms: 2 minutes by default, so this ends)."""
        while True:
            left = int(producer.flush(0.1))
            if self.stats is not None:
                self.report.advance(self.stats.count + self.failed)
            if not left:
                return 0

    def _print_metrics(self, producer: Any) -> None:
        deadline = time.monotonic() + 2.5
        self.last_stats = None
        while self.last_stats is None and time.monotonic() < deadline:
            producer.poll(0.1)
        print_metrics(self.last_stats, self.conf.get("client.id", "perf-producer-client"),
                      "producer")
