"""``shmq producer-perf-test`` and ``shmq consumer-perf-test`` as a user runs them: real
subprocesses against a real broker.  The oracles are Kafka's output formats
(``ProducerPerformance.Stats`` and ``ConsumerPerformance``, as regular expressions) and a separate
confluent-kafka consumer that reads the topic back and counts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker

# ProducerPerformance.Stats.printWindow / printTotal (Java's %f is 6 decimals)
WINDOW = re.compile(r"^(\d+) records sent, (\d+\.\d) records/sec \((\d+\.\d\d) MB/sec\), "
                    r"(\d+\.\d|NaN) ms avg latency, (\d+\.\d) ms max latency\.$")
TOTAL = re.compile(r"^(\d+) records sent, (\d+\.\d{6}) records/sec \((\d+\.\d\d) MB/sec\), "
                   r"(\d+\.\d\d|NaN) ms avg latency, (\d+\.\d\d) ms max latency, "
                   r"(\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th\.$")
STEADY = re.compile(TOTAL.pattern.replace("records sent", "steady state records sent", 1))
# ConsumerPerformance: header, then "%s, %s, %.4f, %.4f, %d, %.4f, %d, %d, %.4f, %.4f"
HEADER = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
          "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
DETAILED_HEADER = ("time, threadId, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, "
                   "nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}"
NUM = r"(?:\d+\.\d{4}|NaN|Infinity)"
ROW = re.compile(rf"^({DATE}), ({DATE}), (\d+\.\d{{4}}), ({NUM}), (\d+), ({NUM}), (\d+), "
                 rf"(-?\d+), ({NUM}), ({NUM})$")
DETAILED_ROW = re.compile(rf"^({DATE}), 0, (\d+\.\d{{4}}), ({NUM}), (\d+), ({NUM}), (\d+), "
                          rf"(-?\d+), ({NUM}), ({NUM})$")


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def shmq(*args: str, timeout: float = 90) -> Result:
    proc = subprocess.run([sys.executable, "-m", "shmq", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ}, stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path_factory.mktemp("perf-tools") / "data")
    try:
        yield b
    finally:
        code = b.stop()
        assert code == 0, b.log_path.read_text()


def create(b: RunningBroker, topic: str, partitions: int = 3) -> None:
    r = shmq("topics", "--bootstrap-server", b.bootstrap, "--create", "--topic", topic,
             "--partitions", str(partitions))
    assert r.code == 0, r


def producer_perf(b: RunningBroker, topic: str, *args: str) -> Result:
    return shmq("producer-perf-test", "--bootstrap-server", b.bootstrap, "--topic", topic, *args)


def consumer_perf(b: RunningBroker, topic: str, *args: str) -> Result:
    return shmq("consumer-perf-test", "--bootstrap-server", b.bootstrap, "--topic", topic,
                "--timeout", "5000", *args)


def read_back(b: RunningBroker, topic: str, partitions: int = 3,
              seconds: float = 20) -> list[bytes]:
    """Every value of the topic, read by a consumer of our own (assign, from the beginning,
    until the high watermarks)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "perf-tools-oracle",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        values: list[bytes] = []
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + seconds
        while len(done) < partitions and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                if m.error() is None:
                    values.append(m.value())
                    if m.offset() + 1 >= ends[m.partition()]:
                        done.add(m.partition())
        assert len(done) == partitions, f"read back {len(values)} values, ends {ends}"
        return values
    finally:
        consumer.close()


def test_producer_lines_and_count_match_a_separate_consumer(cluster: RunningBroker) -> None:
    create(cluster, "pt-count")
    r = producer_perf(cluster, "pt-count", "--num-records", "3000", "--record-size", "100",
                      "--throughput", "-1")
    assert (r.code, r.err) == (0, ""), r
    assert len(r.lines) >= 1
    for line in r.lines[:-1]:
        assert WINDOW.match(line), line
    total = TOTAL.match(r.lines[-1])
    assert total, r.lines[-1]
    sent = int(total.group(1))
    assert sent == 3000
    rate, mb = float(total.group(2)), float(total.group(3))
    assert rate > 0 and abs(mb - rate * 100 / 1024 / 1024) < 0.01 + mb * 0.01
    p50, p95, p99, p999 = (int(total.group(i)) for i in range(6, 10))
    assert p50 <= p95 <= p99 <= p999 <= float(total.group(5))
    values = read_back(cluster, "pt-count")
    assert len(values) == sent
    assert all(len(v) == 100 and v.isalpha() and v.isupper() for v in values)


def test_consumer_reports_what_a_separate_consumer_reads(cluster: RunningBroker) -> None:
    create(cluster, "pt-consume")
    r = producer_perf(cluster, "pt-consume", "--num-records", "2500", "--record-size", "64",
                      "--throughput", "-1")
    assert r.code == 0, r
    values = read_back(cluster, "pt-consume")
    assert len(values) == 2500
    r = consumer_perf(cluster, "pt-consume", "--num-records", "2500")
    assert r.code == 0, r
    assert r.lines[0] == HEADER
    assert len(r.lines) == 2, r
    row = ROW.match(r.lines[1])
    assert row, r.lines[1]
    assert int(row.group(5)) == len(values)
    assert float(row.group(3)) == pytest.approx(round(sum(map(len, values)) / 1024 / 1024, 4))
    assert int(row.group(7)) >= 0 and int(row.group(8)) >= 0
    # the new spelling of --messages, and --hide-header
    r = consumer_perf(cluster, "pt-consume", "--num-records", "1000", "--hide-header")
    assert r.code == 0, r
    assert len(r.lines) == 1 and ROW.match(r.lines[0]), r
    assert int(ROW.match(r.lines[0]).group(5)) == 1000  # type: ignore[union-attr]


def test_consumer_timeout_warning_and_detailed_stats(cluster: RunningBroker) -> None:
    create(cluster, "pt-detail", 1)
    assert producer_perf(cluster, "pt-detail", "--num-records", "500", "--record-size", "10",
                         "--throughput", "-1").code == 0
    r = shmq("consumer-perf-test", "--bootstrap-server", cluster.bootstrap, "--topic",
             "pt-detail", "--num-records", "501", "--timeout", "1500", "--show-detailed-stats",
             "--reporting-interval", "1")
    assert r.code == 0, r
    assert r.lines[0] == DETAILED_HEADER
    assert r.lines[-1] == ("WARNING: Exiting before consuming the expected number of messages: "
                           "timeout (1500 ms) exceeded. You can use the --timeout option to "
                           "increase the timeout.")
    detail = r.lines[1:-1]
    assert detail and all(DETAILED_ROW.match(line) for line in detail), r.lines
    counts = [int(DETAILED_ROW.match(line).group(4)) for line in detail]  # type: ignore[union-attr]
    assert counts == sorted(counts) and counts[-1] <= 500
    # --from-latest: nothing new arrives, so nothing is consumed
    r = consumer_perf(cluster, "pt-detail", "--num-records", "1", "--from-latest", "--timeout",
                      "1000")
    assert r.code == 0, r
    assert "WARNING: Exiting before consuming" in r.out
    assert int(ROW.match(r.lines[-1]).group(5)) == 0  # type: ignore[union-attr]


def test_payload_file(cluster: RunningBroker, tmp_path: Path) -> None:
    create(cluster, "pt-file")
    payloads = tmp_path / "payloads.txt"
    payloads.write_text("alpha\nbeta|x\ngamma ray\n")
    r = producer_perf(cluster, "pt-file", "--num-records", "300", "--payload-file",
                      str(payloads), "--throughput", "-1")
    assert r.code == 0, r
    assert r.lines[0] == f"Reading payloads from: {payloads.resolve()}"
    assert r.lines[1] == "Number of messages read: 3"
    assert TOTAL.match(r.lines[-1]) and r.lines[-1].startswith("300 records sent, ")
    values = read_back(cluster, "pt-file")
    assert len(values) == 300
    assert set(values) == {b"alpha", b"beta|x", b"gamma ray"}
    # a delimiter is a regular expression, as with Java's Scanner
    payloads.write_text("one, two,three")
    create(cluster, "pt-file-2")
    r = producer_perf(cluster, "pt-file-2", "--num-records", "50", "--payload-file",
                      str(payloads), "--payload-delimiter", ", ?", "--throughput", "-1")
    assert r.code == 0, r
    assert r.lines[1] == "Number of messages read: 3"
    values = read_back(cluster, "pt-file-2")
    assert len(values) == 50 and set(values) <= {b"one", b"two", b"three"}


def test_throughput_paces_the_producer(cluster: RunningBroker) -> None:
    create(cluster, "pt-rate", 1)
    started = time.monotonic()
    r = producer_perf(cluster, "pt-rate", "--num-records", "400", "--record-size", "10",
                      "--throughput", "400", "--reporting-interval", "300")
    assert r.code == 0, r
    total = TOTAL.match(r.lines[-1])
    assert total, r
    # 400 records at 400/s take about one second; the reported rate is about 400/s
    assert 0.9 <= time.monotonic() - started
    assert 250 <= float(total.group(2)) <= 440
    windows = [WINDOW.match(line) for line in r.lines[:-1]]
    assert len(windows) >= 2 and all(windows), r.lines
    assert sum(int(w.group(1)) for w in windows if w) <= 400


def test_flag_spellings_and_config_file(cluster: RunningBroker, tmp_path: Path) -> None:
    create(cluster, "pt-flags", 1)
    config = tmp_path / "producer.properties"
    config.write_text(f"bootstrap.servers={cluster.bootstrap}\nacks=1\n")
    old = shmq("producer-perf-test", "--topic", "pt-flags", "--num-records", "20",
               "--payload-monotonic", "--throughput", "-1", "--producer.config", str(config),
               "--producer-props", "linger.ms=0", "client.id=perf-old")
    new = shmq("producer-perf-test", "--topic", "pt-flags", "--num-records", "20",
               "--payload-monotonic", "--throughput", "-1", "--command-config", str(config),
               "--command-property", "linger.ms=0")
    assert old.code == new.code == 0, (old, new)
    assert TOTAL.match(old.lines[-1]) and TOTAL.match(new.lines[-1])
    assert old.lines[:2] == [  # Kafka 4.3 names the old spellings, on stdout
        "Option --producer-props has been deprecated and will be removed in a future version. "
        "Use --command-property instead.",
        "Option --producer.config has been deprecated and will be removed in a future version. "
        "Use --command-config instead."]
    values = read_back(cluster, "pt-flags", 1)
    assert sorted(values) == sorted([str(i).encode() for i in range(20)] * 2)
    consumer_config = tmp_path / "consumer.properties"
    consumer_config.write_text(f"bootstrap.servers={cluster.bootstrap}\n")
    r = shmq("consumer-perf-test", "--topic", "pt-flags", "--messages", "40",
             "--consumer.config", str(consumer_config), "--timeout", "5000")
    assert r.code == 0, r
    assert r.lines[:2] == ["Warning: --messages is deprecated. Use --num-records instead.",
                           "Warning: --consumer.config is deprecated. Use --command-config "
                           "instead."]
    assert int(ROW.match(r.lines[-1]).group(5)) == 40  # type: ignore[union-attr]


def test_warmup_records_print_a_steady_state_line(cluster: RunningBroker) -> None:
    create(cluster, "pt-warm", 1)
    r = producer_perf(cluster, "pt-warm", "--num-records", "500", "--record-size", "10",
                      "--throughput", "-1", "--warmup-records", "200")
    assert r.code == 0, r
    assert r.lines[0] == ("Warmup first 200 records. Steady state results will print after the "
                          "complete test summary.")
    assert TOTAL.match(r.lines[-2]) and r.lines[-2].startswith("500 records sent, "), r.lines
    steady = STEADY.match(r.lines[-1])
    assert steady and int(steady.group(1)) == 300, r.lines  # only records sent after warm-up


@pytest.mark.parametrize("args, message", [
    (["producer-perf-test", "--topic", "t", "--num-records", "10", "--throughput", "-1"],
     "one of the arguments --record-size --payload-file --payload-monotonic is required"),
    (["producer-perf-test", "--topic", "t", "--num-records", "10", "--record-size", "1"],
     "the following arguments are required: --throughput"),
    (["producer-perf-test", "--topic", "t", "--num-records", "0", "--record-size", "1",
      "--throughput", "-1"], "--num-records should be greater than zero"),
    (["producer-perf-test", "--topic", "t", "--num-records", "5", "--record-size", "1",
      "--payload-monotonic", "--throughput", "-1"], "not allowed with argument"),
    (["producer-perf-test", "--topic", "t", "--num-records", "5", "--record-size", "1",
      "--throughput", "-1", "--command-property", "acks"], "Invalid property: acks"),
    (["producer-perf-test", "--topic", "t", "--num-records", "5", "--record-size", "x",
      "--throughput", "-1"], "invalid int value"),
    (["consumer-perf-test", "--topic", "t"], "Missing required argument"),
    (["consumer-perf-test", "--topic", "t", "--include", "x", "--num-records", "1"],
     "Exactly one of the following arguments is required: --topic, --include"),
    (["consumer-perf-test", "--topic", "t", "--num-records", "1", "--reporting-interval", "0"],
     "Reporting interval must be greater than 0."),
])
def test_bad_flags_are_one_line(cluster: RunningBroker, args: list[str], message: str) -> None:
    r = shmq(*args, "--bootstrap-server", cluster.bootstrap)
    assert r.code == 2, r
    assert r.out == ""
    assert len(r.err.splitlines()) == 1 and message in r.err, r.err


def test_bad_input_and_unknown_config_are_one_line(cluster: RunningBroker,
                                                   tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    r = producer_perf(cluster, "t", "--num-records", "5", "--payload-file", str(missing),
                      "--throughput", "-1")
    assert r.code == 1, r
    assert r.err == "Error: File does not exist or empty file provided.\n"
    r = producer_perf(cluster, "t", "--num-records", "5", "--record-size", "1", "--throughput",
                      "-1", "--command-property", "no.such.property=1")
    assert r.code == 1, r
    assert r.err.splitlines() == ['Error: No such configuration property: "no.such.property"']


def test_group_subscribes_and_commits(cluster: RunningBroker) -> None:
    """--group joins the group (rebalance.time.ms is the wait for the assignment), reads every
    record, and commits on close like Kafka's tool: a second run of the same group finds
    nothing left and says so."""
    create(cluster, "pt-group")
    assert producer_perf(cluster, "pt-group", "--num-records", "900", "--record-size", "20",
                         "--throughput", "-1").code == 0
    r = consumer_perf(cluster, "pt-group", "--num-records", "900", "--group", "perf-g",
                      "--timeout", "20000")
    assert (r.code, r.err) == (0, ""), r  # no "no group coordinator" fallback
    row = ROW.match(r.lines[-1])
    assert row, r
    assert int(row.group(5)) == len(read_back(cluster, "pt-group")) == 900
    assert int(row.group(7)) > 0  # rebalance.time.ms
    again = consumer_perf(cluster, "pt-group", "--num-records", "1", "--group", "perf-g",
                          "--timeout", "1500")
    assert again.code == 0, again
    assert "WARNING: Exiting before consuming" in again.out
    assert int(ROW.match(again.lines[-1]).group(5)) == 0  # type: ignore[union-attr]


def test_progress_bar_only_on_a_terminal(cluster: RunningBroker) -> None:
    """On a terminal rich draws a bar (cursor movement, then erased: transient); the report
    lines are still printed.  The pipe case is every other test here: Kafka's lines only."""
    import pty

    create(cluster, "pt-tty", 1)
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shmq", "producer-perf-test", "--bootstrap-server",
             cluster.bootstrap, "--topic", "pt-tty", "--num-records", "600", "--record-size",
             "10", "--throughput", "300"],
            stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE,
            env={**os.environ, "TERM": "xterm", "COLUMNS": "100"})
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(leader)
        if proc.stderr is not None:
            proc.stderr.close()
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert "acknowledged" in screen and "\x1b[" in screen  # the bar, drawn with escapes
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen).replace("\r", "\n")
    finals = [line for line in plain.splitlines() if TOTAL.match(line.strip())]
    assert finals and finals[-1].startswith("600 records sent, "), plain


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_draws_throughput_and_latency(cluster: RunningBroker, tmp_path: Path) -> None:
    """--plot FILE.png: both tools still print Kafka's lines, and write a PNG (matplotlib)."""
    pytest.importorskip("matplotlib")
    create(cluster, "pt-plot")
    png = tmp_path / "produce.png"
    r = producer_perf(cluster, "pt-plot", "--num-records", "3000", "--record-size", "100",
                      "--throughput", "2000", "--plot", str(png))
    assert (r.code, r.err) == (0, ""), r
    assert TOTAL.match(r.lines[-1]), r.lines[-1]
    assert _png_size(png) == (1000, 650)
    png = tmp_path / "consume.png"
    r = shmq("consumer-perf-test", "--bootstrap-server", cluster.bootstrap, "--topic", "pt-plot",
             "--messages", "3000", "--plot", str(png))
    assert (r.code, r.err) == (0, ""), r
    assert ROW.match(r.lines[-1]), r.lines[-1]
    assert _png_size(png) == (1000, 650)


@pytest.mark.parametrize("tool", ["producer-perf-test", "consumer-perf-test"])
def test_plot_refuses_a_bad_file_before_the_run(cluster: RunningBroker, tool: str,
                                                tmp_path: Path) -> None:
    count = ["--num-records", "10", "--record-size", "10", "--throughput", "-1"] \
        if tool == "producer-perf-test" else ["--messages", "10"]
    for bad, message in ((str(tmp_path / "x.jpg"), "png"),
                         ("/nonexistent/dir/x.png", "cannot write")):
        r = shmq(tool, "--bootstrap-server", cluster.bootstrap, "--topic", "pt-plot-bad",
                 *count, "--plot", bad)
        assert r.code == 2 and message in r.err and len(r.err.splitlines()) == 1, r
        assert not os.path.exists(bad)
