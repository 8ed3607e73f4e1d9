"""Prometheus families from a snapshot: one custom collector, no multiprocess mode.

The names are those existing dashboards and alerts use (reference/ecosystem.md §5.2):

* kafka_exporter (danielqsj): ``kafka_brokers``, ``kafka_topic_partitions{topic}``,
  ``kafka_topic_partition_current_offset`` / ``_oldest_offset`` / ``_in_sync_replica`` /
  ``_leader`` / ``_replicas`` / ``_leader_is_preferred`` / ``_under_replicated_partition``
  ``{topic,partition}``, ``kafka_consumergroup_current_offset`` / ``_lag``
  ``{consumergroup,topic,partition}``, their ``_sum{consumergroup,topic}`` and
  ``kafka_consumergroup_members{consumergroup}``;
* Kafka's JMX MBeans through the JMX exporter's stock Kafka rules (``lowercaseOutputName``):
  ``kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec,topic=T`` becomes
  ``kafka_server_brokertopicmetrics_messagesin_total{topic="T"}`` (and without ``topic`` the
  broker's total), ``RequestMetrics`` ``RequestsPerSec{request,version}`` becomes
  ``kafka_network_requestmetrics_requests_total``, the ``TotalTimeMs``-style histograms become
  summaries: ``{quantile="0.50" .. "0.999"}`` in ms (computed here over about the last minute
  from the histograms) and ``_count`` (the JMX exporter's rules have no ``_sum``; it is here), ``kafka.log:type=Log,name=Size`` becomes ``kafka_log_log_size{topic,partition}``;
* shmq's own, with real histograms: ``shmq_request_time_seconds{request,phase}``,
  ``shmq_log_flush_seconds``, ``shmq_purgatory_wait_seconds{operation}``, per-partition counters
  and offsets, and per process ``shmq_process_*{process}`` (CPU, RSS, fds, restarts, uptime).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector as _Collector
from prometheus_client.samples import Sample

from shmq._fast import _metrics_reference as L
from shmq.monitor.collector import QUANTILES, Collector, api_name

_LE = [f"{b / 1e9:g}" for b in L.BUCKET_BOUNDS_NS] + ["+Inf"]
_KAFKA_TIMES = {"total": "totaltimems", "queue": "requestqueuetimems", "local": "localtimems",
                "remote": "remotetimems", "send": "responsesendtimems"}


def _kafka_request(api: int) -> str:
    """RequestMetrics' ``request`` label: consumers' fetches are ``FetchConsumer`` in Kafka."""
    return "FetchConsumer" if api == 1 else api_name(api)


def _quantile_label(q: float) -> str:
    return {0.5: "0.50", 0.75: "0.75", 0.95: "0.95", 0.98: "0.98", 0.99: "0.99",
            0.999: "0.999"}[q]


def _buckets(counts: list[int], sum_s: float) -> tuple[list[tuple[str, float]], float]:
    out: list[tuple[str, float]] = []
    acc = 0.0
    for le, n in zip(_LE, counts, strict=True):
        acc += n
        out.append((le, acc))
    return out, sum_s


def families(snap: dict[str, Any], collector: Collector | None = None) -> Iterator[Metric]:
    """Every family for one snapshot (``Collector.snapshot``)."""
    broker = snap["broker"]
    yield GaugeMetricFamily("shmq_up", "1 while the broker answers", value=1)
    info = GaugeMetricFamily("shmq_broker_info", "the broker's identity", labels=[
        "cluster_id", "bootstrap", "host"])
    info.add_metric([broker["cluster_id"], broker["bootstrap"], broker["host"]], 1)
    yield info
    yield GaugeMetricFamily("shmq_workers", "partition worker processes", value=broker["workers"])
    yield GaugeMetricFamily("shmq_workers_alive", "partition workers serving",
                            value=broker["workers_alive"])
    yield GaugeMetricFamily("kafka_brokers", "Number of Brokers in the Kafka Cluster.",
                            value=len(broker["brokers"]))
    yield GaugeMetricFamily("kafka_controller_kafkacontroller_activecontrollercount",
                            "the controller (node 0) is active", value=1)

    # -- processes ------------------------------------------------------------------------------
    cpu = CounterMetricFamily("shmq_process_cpu_seconds", "user and system CPU time",
                              labels=["process"])
    cpu_pct = GaugeMetricFamily("shmq_process_cpu_percent", "CPU use over the last second",
                                labels=["process"])
    rss = GaugeMetricFamily("shmq_process_resident_memory_bytes", "resident memory",
                            labels=["process"])
    fds = GaugeMetricFamily("shmq_process_open_fds", "open file descriptors", labels=["process"])
    restarts = CounterMetricFamily("shmq_process_restarts", "restarts by the supervisor",
                                   labels=["process"])
    start = GaugeMetricFamily("shmq_process_start_time_seconds", "start time, Unix seconds",
                              labels=["process"])
    uptime = GaugeMetricFamily("shmq_process_uptime_seconds", "seconds since the process started",
                               labels=["process"])
    up = GaugeMetricFamily("shmq_process_up", "1 while the process runs", labels=["process"])
    conns = GaugeMetricFamily("kafka_server_socket_server_metrics_connection_count",
                              "open Kafka connections", labels=["listener", "networkProcessor"])
    conns_total = CounterMetricFamily("shmq_connections_opened", "Kafka connections accepted",
                                      labels=["process"])
    proto = CounterMetricFamily("shmq_protocol_errors",
                                "connections closed for a malformed or unsupported request",
                                labels=["process"])
    for p in snap["processes"]:
        name = p["name"]
        up.add_metric([name], 1 if p.get("alive") else 0)
        restarts.add_metric([name], p.get("restarts", 0))
        if "cpu_seconds" in p:
            cpu.add_metric([name], p["cpu_seconds"])
            cpu_pct.add_metric([name], p["cpu_percent"])
            rss.add_metric([name], p["rss_bytes"])
            fds.add_metric([name], p["open_fds"])
            start.add_metric([name], p["start_time"])
            uptime.add_metric([name], p.get("uptime_s", 0.0))
        if "connections" in p:
            conns.add_metric(["PLAINTEXT", str(p["node_id"])], p["connections"])
            conns_total.add_metric([name], p["connections_total"])
            proto.add_metric([name], p["protocol_errors"])
    yield from (cpu, cpu_pct, rss, fds, restarts, start, uptime, up, conns, conns_total, proto)

    # -- topics and partitions ------------------------------------------------------------------
    topic_partitions = GaugeMetricFamily("kafka_topic_partitions",
                                         "Number of partitions for this Topic", labels=["topic"])
    tp = ["topic", "partition"]
    current = GaugeMetricFamily("kafka_topic_partition_current_offset",
                                "Current Offset of a Broker at Topic/Partition", labels=tp)
    oldest = GaugeMetricFamily("kafka_topic_partition_oldest_offset",
                               "Oldest Offset of a Broker at Topic/Partition", labels=tp)
    leader = GaugeMetricFamily("kafka_topic_partition_leader",
                               "Leader Broker ID of this Topic/Partition", labels=tp)
    replicas = GaugeMetricFamily("kafka_topic_partition_replicas",
                                 "Number of Replicas for this Topic/Partition", labels=tp)
    isr = GaugeMetricFamily("kafka_topic_partition_in_sync_replica",
                            "Number of In-Sync Replicas for this Topic/Partition", labels=tp)
    preferred = GaugeMetricFamily("kafka_topic_partition_leader_is_preferred",
                                  "1 if Topic/Partition is using the Preferred Broker", labels=tp)
    under = GaugeMetricFamily("kafka_topic_partition_under_replicated_partition",
                              "1 if Topic/Partition is under Replicated", labels=tp)
    log_size = GaugeMetricFamily("kafka_log_log_size", "bytes in the partition's segments",
                                 labels=tp)
    log_end = GaugeMetricFamily("kafka_log_log_logendoffset", "log end offset", labels=tp)
    log_start = GaugeMetricFamily("kafka_log_log_logstartoffset", "log start offset", labels=tp)
    segments = GaugeMetricFamily("kafka_log_log_numlogsegments", "segments of the partition",
                                 labels=tp)
    hw = GaugeMetricFamily("shmq_partition_high_watermark", "high watermark", labels=tp)
    lso = GaugeMetricFamily("shmq_partition_last_stable_offset", "last stable offset", labels=tp)
    p_counters = {key: CounterMetricFamily(f"shmq_partition_{key}", help_, labels=tp)
                  for key, help_ in (("messages_in", "records appended"),
                                     ("bytes_in", "bytes appended"),
                                     ("messages_out", "records fetched (offsets delivered)"),
                                     ("bytes_out", "bytes fetched"))}
    topic_counters = {
        key: CounterMetricFamily(f"kafka_server_brokertopicmetrics_{name}", help_,
                                 labels=["topic"])
        for key, name, help_ in (
            ("messages_in", "messagesin", "MessagesInPerSec"),
            ("bytes_in", "bytesin", "BytesInPerSec"),
            ("bytes_out", "bytesout", "BytesOutPerSec"),
            ("messages_out", "messagesout", "records fetched (shmq; Kafka has no such MBean)"),
            ("produce_requests", "totalproducerequests", "TotalProduceRequestsPerSec"),
            ("fetch_requests", "totalfetchrequests", "TotalFetchRequestsPerSec"),
            ("failed_produce", "failedproducerequests", "FailedProduceRequestsPerSec"),
            ("failed_fetch", "failedfetchrequests", "FailedFetchRequestsPerSec"))}
    partition_count = 0
    for t in snap["topics"]:
        name = t["name"]
        topic_partitions.add_metric([name], t["partitions"])
        for key, fam in topic_counters.items():
            fam.add_metric([name], t.get(key, 0))
        for p in t["partition_list"]:
            partition_count += 1
            labels = [name, str(p["partition"])]
            leader.add_metric(labels, p["leader"])
            replicas.add_metric(labels, len(p["replicas"]))
            isr.add_metric(labels, len(p["isr"]))
            preferred.add_metric(labels, 1 if p["replicas"] and p["replicas"][0] == p["leader"]
                                 else 0)
            under.add_metric(labels, 1 if len(p["isr"]) < len(p["replicas"]) else 0)
            if "high_watermark" in p:
                current.add_metric(labels, p["high_watermark"])
                oldest.add_metric(labels, p["log_start"])
                log_end.add_metric(labels, p["log_end"])
                log_start.add_metric(labels, p["log_start"])
                hw.add_metric(labels, p["high_watermark"])
                lso.add_metric(labels, p["last_stable"])
            if "size_bytes" in p:
                log_size.add_metric(labels, p["size_bytes"])
                segments.add_metric(labels, p["segments"])
                for key, fam in p_counters.items():
                    fam.add_metric(labels, p[key])
    yield from (topic_partitions, current, oldest, leader, replicas, isr, preferred, under,
                log_size, log_end, log_start, segments, hw, lso, *p_counters.values())
    # the broker's totals: the same MBeans without a topic (Kafka's allTopicsStats), one more
    # sample without labels in the same family, as the JMX exporter exposes both
    totals = snap["totals"]
    for key, fam in topic_counters.items():
        total = totals.get(key, 0)
        if key == "failed_produce":
            total += snap["waits"].get("failed_produce_other", 0)
        elif key == "failed_fetch":
            total += snap["waits"].get("failed_fetch_other", 0)
        fam.samples.append(Sample(fam.name + "_total", {}, total))
        yield fam
    yield GaugeMetricFamily("kafka_server_replicamanager_partitioncount", "partitions",
                            value=partition_count)
    yield GaugeMetricFamily("kafka_server_replicamanager_leadercount", "partitions led",
                            value=partition_count)
    yield GaugeMetricFamily("kafka_server_replicamanager_underreplicatedpartitions",
                            "single host: replicas are the leader", value=0)
    storage = GaugeMetricFamily("shmq_partition_storage_error",
                                "1 while the partition's last write failed (a full disk, an I/O "
                                "error); appends get KAFKA_STORAGE_ERROR until one succeeds",
                                labels=["topic", "partition", "error"])
    for e in snap.get("storage_errors", ()):
        storage.add_metric([e["topic"], str(e["partition"]), e["error"]], 1)
    yield storage
    yield GaugeMetricFamily("kafka_controller_kafkacontroller_offlinepartitionscount",
                            "partitions without a live leader",
                            value=sum(1 for t in snap["topics"] for p in t["partition_list"]
                                      if "high_watermark" not in p))

    # -- consumer groups --------------------------------------------------------------------------
    g3 = ["consumergroup", "topic", "partition"]
    g_offset = GaugeMetricFamily("kafka_consumergroup_current_offset",
                                 "Current Offset of a ConsumerGroup at Topic/Partition", labels=g3)
    g_lag = GaugeMetricFamily("kafka_consumergroup_lag",
                              "Current Approximate Lag of a ConsumerGroup at Topic/Partition",
                              labels=g3)
    g_offset_sum = GaugeMetricFamily("kafka_consumergroup_current_offset_sum",
                                     "Current Offset of a ConsumerGroup at Topic for all "
                                     "partitions", labels=["consumergroup", "topic"])
    g_lag_sum = GaugeMetricFamily("kafka_consumergroup_lag_sum",
                                  "Current Approximate Lag of a ConsumerGroup at Topic for all "
                                  "partitions", labels=["consumergroup", "topic"])
    g_members = GaugeMetricFamily("kafka_consumergroup_members",
                                  "Amount of members in a consumer group",
                                  labels=["consumergroup"])
    g_state = GaugeMetricFamily("shmq_consumergroup_state", "1 for the group's current state",
                                labels=["consumergroup", "state"])
    for g in snap["groups"]:
        gid = g["group"]
        g_members.add_metric([gid], len(g["members"]))
        g_state.add_metric([gid, g["state"]], 1)
        sums: dict[str, list[int]] = {}
        for o in g["offsets"]:
            labels = [gid, o["topic"], str(o["partition"])]
            g_offset.add_metric(labels, o["committed"])
            acc = sums.setdefault(o["topic"], [0, 0])
            acc[0] += o["committed"]
            if o["lag"] is not None:
                g_lag.add_metric(labels, o["lag"])
                acc[1] += o["lag"]
        for topic, (off, lag) in sums.items():
            g_offset_sum.add_metric([gid, topic], off)
            g_lag_sum.add_metric([gid, topic], lag)
    yield from (g_offset, g_lag, g_offset_sum, g_lag_sum, g_members, g_state)

    # -- requests ---------------------------------------------------------------------------------
    requests = CounterMetricFamily("kafka_network_requestmetrics_requests",
                                   "RequestsPerSec by request and version",
                                   labels=["request", "version"])
    errors = CounterMetricFamily("kafka_network_requestmetrics_errors",
                                 "ErrorsPerSec by request and error (NONE not counted)",
                                 labels=["request", "error"])
    times = HistogramMetricFamily("shmq_request_time_seconds",
                                  "request time by phase: total, queue, local, remote, send",
                                  labels=["request", "phase"])
    # the JMX exporter's emulated summaries: {quantile} gauges (ms) and a _count (and _sum)
    kafka_times = {ph: SummaryMetricFamily(f"kafka_network_requestmetrics_{name}",
                                           f"RequestMetrics {name}: quantiles over about the "
                                           "last minute", labels=["request"])
                   for ph, name in _KAFKA_TIMES.items()}
    quantiles, fsync_q = collector.window_quantiles() if collector is not None else ({}, None)
    for r in snap["requests"]:
        req = _kafka_request(r["api_key"])
        for version, n in r["versions"].items():
            requests.add_metric([req, version], n)
        for err, n in r["errors"].items():
            errors.add_metric([req, err], n)
        qs = quantiles.get(r["api_key"])
        for ph, phase in enumerate(L.PHASES):
            t = r["times"][phase]
            buckets, sum_s = _buckets(t["buckets"], t["sum_s"])
            times.add_metric([r["api"], phase], buckets, sum_s)
            summary = kafka_times[phase]
            for qi, q in enumerate(QUANTILES):
                summary.samples.append(Sample(
                    summary.name, {"request": req, "quantile": _quantile_label(q)},
                    float(qs[ph][qi]) * 1e3 if qs is not None else 0.0))
            summary.add_metric([req], t["count"], t["sum_s"] * 1e3)
    yield from (requests, errors, times, *kafka_times.values())

    # -- flush and purgatory ----------------------------------------------------------------------
    waits = snap["waits"]
    if "fsync" in waits:
        f = waits["fsync"]
        flush = HistogramMetricFamily("shmq_log_flush_seconds", "fsync time of log flushes")
        flush.add_metric([], *_buckets(f["buckets"], f["sum_s"]))
        yield flush
        flush_q = SummaryMetricFamily(
            "kafka_log_logflushstats_logflushrateandtimems",
            "LogFlushRateAndTimeMs: quantiles over about the last minute")
        for qi, qq in enumerate(QUANTILES):
            flush_q.samples.append(Sample(
                flush_q.name, {"quantile": _quantile_label(qq)},
                float(fsync_q[qi]) * 1e3 if fsync_q is not None else 0.0))
        flush_q.add_metric([], f["count"], f["sum_s"] * 1e3)
        yield flush_q
        wait = HistogramMetricFamily("shmq_purgatory_wait_seconds",
                                     "time requests waited: produce for the group commit "
                                     "(acks=all), fetch for data (long poll)",
                                     labels=["operation"])
        size = GaugeMetricFamily("kafka_server_delayedoperationpurgatory_purgatorysize",
                                 "requests waiting now", labels=["delayedOperation"])
        for op, key in (("Produce", "produce"), ("Fetch", "fetch")):
            w = waits[key]
            wait.add_metric([op], *_buckets(w["buckets"], w["sum_s"]))
            size.add_metric([op], max(0, w["waiting"]))
        yield wait
        yield size


class PrometheusCollector(_Collector):
    """The registry's only collector: a fresh snapshot per scrape."""

    def __init__(self, collector: Collector, view: Any = None) -> None:
        self.collector = collector
        self.view = view

    def collect(self) -> Iterator[Metric]:
        snap = self.collector.snapshot(self.view)
        yield from families(snap, self.collector)


def render(collector: Collector, view: dict[str, Any] | None = None) -> bytes:
    """The text exposition format (version 0.0.4) of one scrape."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(collector, view))
    return generate_latest(registry)
