"""Monitoring end to end: /metrics and /api/v1 against what real clients did, a real Prometheus
server scraping shmq, the dashboard in Debian's chromium, and `shmq top` in tmux."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from _monitoring import (
    consume,
    get,
    http_address,
    metrics,
    produce,
    require_binary,
    snapshot,
    value,
)

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("SHMQ_TEST_ARTIFACTS", REPO / "build" / "test-artifacts"))


@pytest.fixture
def mbroker(tmp_path: Path) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path / "data", "--http-listener", "127.0.0.1:0")
    try:
        yield b
    finally:
        assert b.stop() == 0, b.log_path.read_text()


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def _eventually(check, timeout: float = 15.0, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (AssertionError, OSError):   # OSError: a server still starting (refused)
            if time.monotonic() > deadline:
                raise
            time.sleep(every)


def test_metrics_and_api_match_the_traffic(mbroker: RunningBroker) -> None:
    """Counts, offsets, groups and lag in /metrics and /api/v1/snapshot are what the clients
    did: 3,000 records into 3 partitions, 1,200 consumed and committed by group g1."""
    addr = http_address(mbroker)
    _create(mbroker.bootstrap, "mon", 3)
    produce(mbroker.bootstrap, "mon", 3000, partitions=3)
    consumer = consume(mbroker.bootstrap, "mon", "g1", 1200)
    try:
        def settled() -> dict:
            m = metrics(addr)
            assert value(m, "kafka_server_brokertopicmetrics_messagesin_total", topic="mon") == 3000
            # lag is per committed partition (kafka_exporter): 1,000 - committed on each
            committed = {int(dict(labels)["partition"]): v for (n, labels), v in m.items()
                         if n == "kafka_consumergroup_current_offset"
                         and ("consumergroup", "g1") in labels}
            assert sum(committed.values()) == 1200
            assert value(m, "kafka_consumergroup_lag_sum", consumergroup="g1", topic="mon") == \
                sum(1000 - c for c in committed.values())
            for p, c in committed.items():
                assert value(m, "kafka_consumergroup_lag", consumergroup="g1", topic="mon",
                             partition=str(p)) == 1000 - c
            # sizes are gauges the workers publish once a second: wait for them too
            sizes = [value(m, "kafka_log_log_size", topic="mon", partition=str(p))
                     for p in range(3)]
            assert all(s > 100_000 for s in sizes), sizes
            return m

        m = _eventually(settled)
        assert value(m, "kafka_server_brokertopicmetrics_messagesin_total") == 3000
        bytes_in = value(m, "kafka_server_brokertopicmetrics_bytesin_total", topic="mon")
        assert 3000 * 100 < bytes_in < 3000 * 100 * 1.5   # batches' framing on top of values
        assert value(m, "kafka_server_brokertopicmetrics_bytesout_total", topic="mon") > 0
        assert value(m, "kafka_server_brokertopicmetrics_failedproducerequests_total") == 0
        assert value(m, "kafka_topic_partitions", topic="mon") == 3
        offsets = [value(m, "kafka_topic_partition_current_offset", topic="mon", partition=str(p))
                   for p in range(3)]
        assert offsets == [1000, 1000, 1000]
        assert value(m, "kafka_consumergroup_members", consumergroup="g1") == 1
        assert value(m, "kafka_brokers") == 3            # node 0 and two workers
        produce_requests = sum(v for (n, labels), v in m.items()
                               if n == "kafka_network_requestmetrics_requests_total"
                               and ("request", "Produce") in labels)
        assert produce_requests > 0
        assert value(m, "kafka_network_requestmetrics_totaltimems_count",
                     request="Produce") == produce_requests
        assert value(m, "shmq_request_time_seconds_count", request="Produce",
                     phase="total") == produce_requests
        assert value(m, "kafka_log_logflushstats_logflushrateandtimems_count") > 0  # acks=all
        # the JoinGroup parked for the initial rebalance delay (100 ms) is remote time, as
        # Kafka counts a request in purgatory; handling it is local time
        join_remote = value(m, "shmq_request_time_seconds_sum", request="JoinGroup",
                            phase="remote")
        join_local = value(m, "shmq_request_time_seconds_sum", request="JoinGroup",
                           phase="local")
        assert join_remote >= 0.09 and join_local < join_remote, (join_remote, join_local)
        # the snapshot: same numbers, plus processes and the group's members and assignment
        snap = snapshot(addr)
        run = mbroker.run_info
        pids = {p["name"]: p["pid"] for p in snap["processes"]}
        assert pids["controller"] == run["controller_pid"]
        assert {pids[f"worker-{w['node_id']}"] for w in run["workers"]} == {
            w["pid"] for w in run["workers"]}
        for p in snap["processes"]:
            assert p["alive"] and p["rss_bytes"] > 1 << 20 and p["open_fds"] > 0
        (topic,) = [t for t in snap["topics"] if t["name"] == "mon"]
        assert topic["messages_in"] == 3000
        assert [p["high_watermark"] for p in topic["partition_list"]] == [1000] * 3
        (group,) = [g for g in snap["groups"] if g["group"] == "g1"]
        assert group["state"] == "Stable"
        assert group["lag"] == value(m, "kafka_consumergroup_lag_sum", consumergroup="g1",
                                     topic="mon")
        (member,) = group["members"]
        assert member["assignment"] == [["mon", [0, 1, 2]]]
    finally:
        consumer.close()


def test_counters_survive_a_worker_restart(mbroker: RunningBroker) -> None:
    """Counters live in the controller's shared memory: a SIGKILLed worker's restart keeps
    them; its open connections are not counted as open any more; the restart is counted."""
    import signal

    addr = http_address(mbroker)
    _create(mbroker.bootstrap, "surv", 1)
    produce(mbroker.bootstrap, "surv", 500)
    info = json.loads(get(addr, "/api/v1/topics")[2])["topics"]
    (surv,) = [t for t in info if t["name"] == "surv"]
    node = surv["partition_list"][0]["leader"]
    pid = mbroker.worker_pids()[node]
    os.kill(pid, signal.SIGKILL)

    def restarted() -> dict:
        snap = snapshot(addr)
        (proc,) = [p for p in snap["processes"] if p["name"] == f"worker-{node}"]
        assert proc["restarts"] == 1 and proc["alive"] and proc["pid"] != pid
        return snap

    _eventually(restarted, timeout=30)
    produce(mbroker.bootstrap, "surv", 250)
    m = metrics(addr)
    assert value(m, "kafka_server_brokertopicmetrics_messagesin_total", topic="surv") == 750
    assert value(m, "shmq_process_restarts_total", process=f"worker-{node}") == 1


def test_prometheus_server_scrapes_shmq(tmp_path: Path) -> None:
    """Debian's prometheus scrapes the broker every second; its query API then answers the
    messages-in rate and the consumer lag that this test produced and consumed."""
    exe = require_binary("prometheus")
    broker = start_broker(tmp_path / "data", "--http-listener", "127.0.0.1:0")
    prom = None
    consumer = None
    try:
        addr = http_address(broker)
        port = _free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: shmq\n"
            f"    static_configs:\n      - targets: ['{addr}']\n")
        prom_log = open(tmp_path / "prometheus.log", "wb")
        prom = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=prom_log, stderr=prom_log)
        prom_log.close()
        api = f"127.0.0.1:{port}"

        def query(q: str, at: float | None = None) -> list:
            params = {"query": q} | ({"time": f"{at:.3f}"} if at else {})
            status, _, body = get(api, "/api/v1/query?" + urllib.parse.urlencode(params))
            assert status == 200, body
            return json.loads(body)["data"]["result"]

        def target_up() -> None:
            status, _, body = get(api, "/api/v1/targets")
            assert status == 200
            targets = json.loads(body)["data"]["activeTargets"]
            assert targets and targets[0]["health"] == "up", targets

        _eventually(target_up, timeout=60, every=0.5)
        _create(broker.bootstrap, "prom", 1)   # one partition: the committed offset is 1,500
        start = time.time()
        produce(broker.bootstrap, "prom", 4000, rate=500)   # 8 s at 500/s
        end = time.time()
        consumer = consume(broker.bootstrap, "prom", "pg", 1500)
        time.sleep(3)   # a few more scrapes

        def answers() -> tuple[float, float, float]:
            mid = (start + end) / 2
            rate = query('sum(rate(kafka_server_brokertopicmetrics_messagesin_total'
                         '{topic="prom"}[4s]))', mid)
            total = query('sum(kafka_server_brokertopicmetrics_messagesin_total{topic="prom"})')
            lag = query('sum(kafka_consumergroup_lag{consumergroup="pg",topic="prom"})')
            assert rate and total and lag, (rate, total, lag)
            return float(rate[0]["value"][1]), float(total[0]["value"][1]), \
                float(lag[0]["value"][1])

        rate, total, lag = _eventually(answers, timeout=20, every=1)
        assert total == 4000
        assert lag == 2500
        assert 350 <= rate <= 650, rate        # paced at 500/s (a shared, noisy machine)
    finally:
        if consumer is not None:
            consumer.close()
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(20)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        assert broker.stop() == 0, broker.log_path.read_text()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--headless"]


def test_dashboard_in_chromium(mbroker: RunningBroker, tmp_path: Path) -> None:
    """Debian's chromium (Playwright drives it; no browser is downloaded) loads the dashboard
    with no console error and no request leaving the broker, shows the topic, the group and its
    lag, and its charts move while a producer runs; a screenshot is saved."""
    chromium = require_binary("chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    import threading

    addr = http_address(mbroker)
    _create(mbroker.bootstrap, "dash", 1)   # one partition: the group's lag is 1000 - 400
    produce(mbroker.bootstrap, "dash", 1000)
    consumer = consume(mbroker.bootstrap, "dash", "dash-group", 400)
    errors: list[str] = []
    foreign: list[str] = []
    stop = threading.Event()
    producer = threading.Thread(target=lambda: [
        produce(mbroker.bootstrap, "dash", 200, rate=400)
        for _ in range(40) if not stop.is_set()], daemon=True)
    try:
        with sync_api.sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=chromium, headless=True,
                args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1100})
            try:
                page = ctx.new_page()
                page.on("console", lambda m: m.type == "error" and errors.append(m.text))
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("request", lambda r: None if r.url.startswith(f"http://{addr}/")
                        else foreign.append(r.url))
                page.goto(f"http://{addr}/", wait_until="load")
                page.wait_for_selector('#topics tr[data-topic="dash"]', timeout=15_000)
                page.wait_for_selector('#groups tr[data-group="dash-group"]', timeout=15_000)
                group_row = page.inner_text('#groups tr[data-group="dash-group"]')
                assert "600" in group_row.replace(",", ""), group_row     # lag 1000 - 400
                assert "Stable" in group_row
                # partitions open on a click
                page.click('#topics tr[data-topic="dash"]')
                page.wait_for_selector('#topics tr.detail[data-topic="dash"]')
                # charts move while a producer runs: the in-rate series gains non-zero points
                producer.start()
                page.wait_for_function(
                    "() => { const c = window.shmqDashboard.charts.messages;"
                    " return c && c.data[1].filter(v => v > 50).length >= 3; }",
                    timeout=30_000)
                first = page.evaluate("window.shmqDashboard.charts.messages.data[0].length")
                page.wait_for_timeout(2500)
                later = page.evaluate("window.shmqDashboard.charts.messages.data[0].length")
                assert later >= first + 1
                processes = page.inner_text("#processes")
                assert "controller" in processes and "worker-1" in processes
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                shot = ARTIFACTS / "dashboard.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
            finally:
                ctx.close()
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(60)
        consumer.close()
    assert errors == [], errors
    assert foreign == [], foreign


def test_top_in_tmux(mbroker: RunningBroker, tmp_path: Path) -> None:
    """`shmq top` in a tmux pane shows the broker's processes, topic and group lag, keeps
    refreshing, and exits on q."""
    tmux = require_binary("tmux")
    _create(mbroker.bootstrap, "toptopic", 1)
    produce(mbroker.bootstrap, "toptopic", 700)
    consumer = consume(mbroker.bootstrap, "toptopic", "top-group", 200)
    env = {**os.environ, "TERM": "xterm-256color"}
    shmq = [sys.executable, "-m", "shmq", "top", "--data-dir", str(mbroker.data_dir),
            "--interval", "0.5"]
    # the server's socket in the test's directory (-L would leave it in /tmp/tmux-<uid>)
    tm = [tmux, "-S", str(tmp_path / "tmux.sock"), "-f", "/dev/null"]
    try:
        subprocess.run([*tm, "new-session", "-d", "-s", "top", "-x", "160", "-y", "50",
                        " ".join(shlex_quote(a) for a in shmq) + "; echo top-exited=$?; sleep 30"],
                       check=True, env=env)

        def screen() -> str:
            return subprocess.run([*tm, "capture-pane", "-p", "-t", "top"], check=True,
                                  capture_output=True, text=True).stdout

        def shows_state() -> str:
            text = screen()
            assert "toptopic" in text and "top-group" in text and "worker-1" in text, text
            assert "500" in text, text            # the group's lag: 700 - 200
            return text

        _eventually(shows_state, timeout=20)
        produce(mbroker.bootstrap, "toptopic", 300)   # live: the new end offset appears

        def refreshed() -> None:
            assert "1,000" in screen()

        _eventually(refreshed, timeout=15)
        subprocess.run([*tm, "send-keys", "-t", "top", "q"], check=True)

        def exited() -> None:
            assert "top-exited=0" in screen()

        _eventually(exited, timeout=10)
    finally:
        subprocess.run([*tm, "kill-server"], capture_output=True)
        consumer.close()


def shlex_quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def test_top_once_over_the_kafka_protocol(mbroker: RunningBroker) -> None:
    """`shmq top --bootstrap-server` of a broker it cannot find locally reads topics, offsets
    and groups over the Kafka protocol (works against any Kafka cluster)."""
    _create(mbroker.bootstrap, "kt", 1)
    produce(mbroker.bootstrap, "kt", 100)
    consumer = consume(mbroker.bootstrap, "kt", "kgroup", 40)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "shmq", "top", "--bootstrap-server", mbroker.bootstrap,
             "--data-dir", "/nonexistent", "--once", "--interval", "0.2"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "COLUMNS": "160"})
        assert out.returncode == 0, out.stderr
        assert "kt-0 40/100 60" in out.stdout and "kgroup" in out.stdout, out.stdout
    finally:
        consumer.close()


def test_no_http_listener_and_no_metrics(tmp_path: Path) -> None:
    """`--http-listener none` serves nothing; `--no-metrics` keeps the listener with offsets
    and groups but counts nothing."""
    # -X importtime's lines go to the broker's stderr: the listener's module is never loaded
    b = start_broker(tmp_path / "a", "--http-listener", "none",
                     env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    try:
        assert b.run_info["http"] is None
    finally:
        assert b.stop() == 0
    imported = b.log_path.read_text()
    assert "| shmq.supervisor.controller" in imported  # the flag took effect
    assert "shmq.monitor.http" not in imported
    b = start_broker(tmp_path / "b", "--http-listener", "127.0.0.1:0", "--no-metrics")
    try:
        addr = http_address(b)
        assert b.run_info["metrics_table"] is None
        produce(b.bootstrap, "nm", 10)
        m = _eventually(lambda: _has_offset(metrics(addr)))
        assert ("kafka_server_brokertopicmetrics_messagesin_total", (("topic", "nm"),)) in m
        assert value(m, "kafka_server_brokertopicmetrics_messagesin_total", topic="nm") == 0
        assert not snapshot(addr)["broker"]["metrics"]
    finally:
        assert b.stop() == 0


def _has_offset(m: dict) -> dict:
    assert value(m, "kafka_topic_partition_current_offset", topic="nm", partition="0") == 10
    return m


def test_bad_http_listener_flag(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "shmq", "broker", "--data-dir",
                          str(tmp_path / "d"), "--http-listener", "localhost"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "--http-listener" in out.stderr   # as --listeners
