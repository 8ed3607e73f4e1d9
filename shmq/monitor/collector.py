"""What the broker looks like right now: one snapshot from shared memory, metadata and psutil.

Theory of operation
-------------------
Three sources, read without stopping anybody:

* the **metrics table** (``shmq.ipc.metrics_table``): counters and histograms that every broker
  process writes for itself (requests, latencies, fsyncs, waits, connections, per-partition
  bytes and messages, sizes and segment counts), copied whole with numpy;
* the **state table** (``shmq.ipc.state_table``): each partition's log start, high watermark,
  last stable offset and log end, seqlocked, written by its leader;
* the **controller's view** (``controller_view``, built on the controller's event loop, where
  that state lives): topics and their slots, consumer groups with members, assignments and
  committed offsets, and the processes (pids, restarts) it supervises.

``Collector.sample`` (once a second, on the HTTP thread) turns two readings into rates, keeps
the last ``HISTORY`` samples for the dashboard's charts, and measures each process with psutil
(CPU, RSS, open fds, uptime).  ``snapshot`` is the JSON of ``/api/v1/snapshot``; the Prometheus
families are built from the same snapshot in ``shmq.monitor.exposition``.  Lag is Kafka's
(kafka-consumer-groups, kafka_exporter): high watermark minus the committed offset.
"""

from __future__ import annotations

import os
import socket
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from shmq._fast import _metrics_reference as L
from shmq.ipc.state_table import storage_errno
from shmq.protocol import api_versions

HISTORY = 900                 # samples kept for the charts: 15 minutes at one a second
QUANTILE_WINDOW_S = 60.0      # Kafka-style quantile gauges cover about the last minute
QUANTILES = (0.5, 0.75, 0.95, 0.98, 0.99, 0.999)   # the JMX exporter's 50th..999thPercentile

# Kafka's ApiKeys names (``ApiKeys.PRODUCE.name`` is "Produce"), from the constants' names
API_NAMES = {value: "".join(w.capitalize() for w in name.split("_"))
             for name, value in vars(api_versions).items()
             if name.isupper() and isinstance(value, int) and 0 <= value < L.API_SLOTS
             and name not in ("MAX_VERSION",)}
API_NAMES[api_versions.API_VERSIONS] = "ApiVersions"
API_NAMES[api_versions.INIT_PRODUCER_ID] = "InitProducerId"


# a partition's counters in the metrics table: snapshot key -> word of its row
PARTITION_COUNTERS = {"messages_in": L.P_MESSAGES_IN, "bytes_in": L.P_BYTES_IN,
                      "messages_out": L.P_MESSAGES_OUT, "bytes_out": L.P_BYTES_OUT,
                      "produce_requests": L.P_PRODUCE_REQUESTS,
                      "fetch_requests": L.P_FETCH_REQUESTS,
                      "failed_produce": L.P_FAILED_PRODUCE, "failed_fetch": L.P_FAILED_FETCH,
                      "size_bytes": L.P_SIZE_BYTES, "segments": L.P_SEGMENTS}
_COUNTER_WORDS = list(PARTITION_COUNTERS.values())


def _partition_counters(parts: np.ndarray | None, slots: list[int]) -> list[list[int] | None]:
    """Each slot's ``PARTITION_COUNTERS`` values (None for a slot outside the table), taken
    from the table in one numpy step: element by element, a sample of 1,000 partitions cost the
    controller ~5 ms of CPU a second (20 numpy scalar reads a partition)."""
    if parts is None:
        return [None] * len(slots)
    at = np.asarray(slots, dtype=np.int64)
    inside = (at >= 0) & (at < len(parts))
    values = iter(parts[at[inside]][:, _COUNTER_WORDS].tolist())
    return [next(values) if ok else None for ok in inside.tolist()]


def api_name(key: int) -> str:
    return API_NAMES.get(key, f"Api{key}")


def error_name(code: int) -> str:
    """Kafka's Errors enum name of a code (UNKNOWN_SERVER_ERROR, NOT_LEADER_OR_FOLLOWER, ...)."""
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"


def quantile(buckets: np.ndarray, q: float) -> float:
    """The q-quantile in seconds of non-cumulative bucket counts, interpolated linearly inside
    the bucket as Prometheus' ``histogram_quantile`` does; 0 with no observations."""
    total = int(buckets.sum())
    if total == 0:
        return 0.0
    rank = q * total
    seen = 0
    for i, count in enumerate(buckets.tolist()):
        if count and seen + count >= rank:
            low = L.BUCKET_BOUNDS_NS[i - 1] if i > 0 else 0
            if i >= len(L.BUCKET_BOUNDS_NS):      # +Inf: the highest finite bound
                return L.BUCKET_BOUNDS_NS[-1] / 1e9
            high = L.BUCKET_BOUNDS_NS[i]
            return (low + (high - low) * (rank - seen) / count) / 1e9
        seen += count
    return L.BUCKET_BOUNDS_NS[-1] / 1e9


# a metadata store's topics as plain data, made once per generation (every change of the
# metadata is a ``save``, which moves it): made each second for the sampler, a 1,000-partition
# topic cost the controller's loop 1,000 dicts and 2,000 lists a second.  Never changed after.
_TOPICS_VIEWS: weakref.WeakKeyDictionary[Any, tuple[int, list[dict[str, Any]]]] = \
    weakref.WeakKeyDictionary()


def _topics_view(store: Any) -> list[dict[str, Any]]:
    meta = store.metadata
    made = _TOPICS_VIEWS.get(store)
    if made is not None and made[0] == meta.generation:
        return made[1]
    topics = [{"name": name, "internal": info.internal, "partitions": [
        {"partition": p.partition, "slot": p.slot, "leader": p.leader,
         "leader_epoch": p.leader_epoch, "replicas": list(p.replicas), "isr": list(p.isr)}
        for p in info.partitions]} for name, info in sorted(meta.topics.items())]
    _TOPICS_VIEWS[store] = (meta.generation, topics)
    return topics


def controller_view(controller: Any) -> dict[str, Any]:
    """The controller's share of a snapshot, built on its event loop (plain data only)."""
    from shmq.coordinator.group import GroupState, parse_assignment

    store = controller.store
    meta = store.metadata if store is not None else None
    topics = _topics_view(store) if store is not None else []
    groups = []
    coordinator = controller.ctx.coordinator if getattr(controller, "ctx", None) else None
    if coordinator is not None:
        for gid, g in sorted(coordinator.groups.items()):
            if g.is_in(GroupState.DEAD):
                continue
            stable = g.is_in(GroupState.STABLE)
            members = []
            for m in g.members.values():
                assigned = parse_assignment(m.assignment) if stable and m.assignment else None
                members.append({"member_id": m.member_id, "client_id": m.client_id,
                                "host": m.client_host, "instance_id": m.group_instance_id,
                                "assignment": [[t, ps] for t, ps in assigned or []]})
            groups.append({
                "group": gid, "state": g.state.value, "protocol_type": g.protocol_type or "",
                "protocol": g.protocol_name or "", "generation": g.generation,
                "members": members,
                "offsets": [{"topic": t, "partition": p, "committed": o.offset,
                             "commit_timestamp": o.commit_timestamp}
                            for (t, p), o in sorted(g.offsets.items())]})
    processes = [{"name": "controller", "node_id": 0, "pid": os.getpid(), "restarts": 0,
                  "alive": True, "started_by": "", "port": controller.port}]
    for w in controller.workers.values():
        proc = w.proc
        processes.append({
            "name": f"worker-{w.node_id}", "node_id": w.node_id,
            "pid": proc.pid if proc is not None else None, "restarts": w.restarts,
            "alive": proc is not None and w.ready.is_set() and proc.returncode is None,
            "started_by": w.started_by, "port": w.port})
    forks = getattr(controller, "forks", None)
    if forks is not None and getattr(forks, "pid", None):
        processes.append({"name": "fork-server", "node_id": None, "pid": forks.pid,
                          "restarts": 0, "alive": True, "started_by": "", "port": None})
    return {
        "cluster_id": meta.cluster_id if meta is not None else "",
        "brokers": sorted(meta.brokers) if meta is not None else [],
        "bootstrap": f"{controller.config.host}:{controller.port}",
        "data_dir": str(controller.data_dir),
        "topics": topics, "groups": groups, "processes": processes,
        "metrics": controller.metrics_table is not None,
    }


class _Proc:
    """psutil's view of one pid, kept between samples for CPU percentages."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.pid = pid
        self.p = psutil.Process(pid)
        self.p.cpu_percent(None)   # the first call only starts the interval

    def measure(self) -> dict[str, Any]:
        import psutil

        p = self.p
        try:
            with p.oneshot():
                times = p.cpu_times()
                mem = p.memory_info()
                return {"cpu_percent": p.cpu_percent(None),
                        "cpu_seconds": times.user + times.system,
                        "rss_bytes": mem.rss, "open_fds": p.num_fds(),
                        "threads": p.num_threads(), "start_time": p.create_time()}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return {}


class Collector:
    """Samples and snapshots for one broker (lives on the HTTP thread)."""

    def __init__(self, metrics_table: Any, state_table: Any, http_address: str = "",
                 view: Callable[[], dict[str, Any]] | None = None) -> None:
        self.metrics_table = metrics_table
        self.state_table = state_table
        self.http_address = http_address
        self.view = view              # returns a fresh controller view (blocks until it has one)
        self.started = time.time()
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._procs: dict[int, _Proc] = {}
        self._last: tuple[float, dict[str, Any]] | None = None   # (monotonic, totals)
        self._rates: dict[str, Any] = {}
        self._latency_window: deque[tuple[float, np.ndarray]] = deque()
        self._fsync_window: deque[tuple[float, np.ndarray]] = deque()
        self.hostname = socket.gethostname()

    # -- reading ------------------------------------------------------------------------------

    def _tables(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        if self.metrics_table is None or self.metrics_table.closed:
            return None, None
        return self.metrics_table.snapshot()

    def _offsets(self, slot: int) -> dict[str, int]:
        table = self.state_table
        if table is None or table.closed or not 0 <= slot < table.slot_count:
            return {}
        state = table.read(slot)
        if state is None or state.leader < 0:
            return {}
        row: dict[str, Any] = {"log_start": state.log_start,
                               "high_watermark": state.high_watermark,
                               "last_stable": state.last_stable, "log_end": state.log_end}
        failed = storage_errno(state.flags)
        if failed is not None:  # the last write failed: why, until one succeeds again
            row["storage_error"] = os.strerror(failed) if failed else "I/O error"
        return row

    def _measure(self, processes: list[dict[str, Any]]) -> None:
        live = set()
        for proc in processes:
            pid = proc.get("pid")
            if not pid or not proc.get("alive"):
                continue
            live.add(pid)
            entry = self._procs.get(pid)
            if entry is None:
                try:
                    entry = self._procs[pid] = _Proc(pid)
                except Exception:  # noqa: BLE001 - gone already (psutil.NoSuchProcess)
                    continue
            proc.update(entry.measure())
            if "start_time" in proc:
                proc["uptime_s"] = max(0.0, time.time() - proc["start_time"])
        for pid in set(self._procs) - live:
            del self._procs[pid]

    def build(self, view: dict[str, Any] | None = None) -> dict[str, Any]:
        """A full snapshot (without rates: ``snapshot`` adds the last sample's)."""
        view = view if view is not None else (self.view() if self.view else {})
        regions, parts = self._tables()
        processes = [dict(p) for p in view.get("processes", [])]
        self._measure(processes)
        for proc in processes:
            node = proc.get("node_id")
            if regions is not None and node is not None and 0 <= node < len(regions):
                r = regions[node]
                proc["connections"] = int(r[L.CONNECTIONS_OPENED] - r[L.CONNECTIONS_CLOSED])
                proc["connections_total"] = int(r[L.CONNECTIONS_OPENED])
                proc["fsyncs"] = int(r[L.FSYNCS])
                proc["protocol_errors"] = int(r[L.PROTOCOL_ERRORS])
        topics = []
        hw_of: dict[tuple[str, int], int] = {}
        for t in view.get("topics", []):
            plist = []
            sums = dict.fromkeys(PARTITION_COUNTERS, 0)
            counters = _partition_counters(parts, [p["slot"] for p in t["partitions"]])
            for p, values in zip(t["partitions"], counters, strict=True):
                row: dict[str, Any] = {"partition": p["partition"], "leader": p["leader"],
                                       "leader_epoch": p["leader_epoch"],
                                       "replicas": p["replicas"], "isr": p["isr"]}
                row.update(self._offsets(p["slot"]))
                if values is not None:
                    for key, value in zip(PARTITION_COUNTERS, values, strict=True):
                        row[key] = value
                        sums[key] += value
                if "high_watermark" in row:
                    hw_of[(t["name"], p["partition"])] = row["high_watermark"]
                plist.append(row)
            topics.append({"name": t["name"], "internal": t["internal"],
                           "partitions": len(plist), "partition_list": plist, **sums})
        groups = []
        for g in view.get("groups", []):
            offsets = []
            total = 0
            for o in g["offsets"]:
                hw = hw_of.get((o["topic"], o["partition"]))
                lag = None if hw is None or o["committed"] < 0 else max(0, hw - o["committed"])
                offsets.append({**o, "log_end": hw, "lag": lag})
                total += lag or 0
            groups.append({**g, "offsets": offsets, "lag": total})
        requests = []
        waits: dict[str, Any] = {}
        if regions is not None:
            req = regions[:, L.REQUESTS:L.ERRORS].reshape(-1, L.API_SLOTS, L.VERSION_SLOTS)
            err = regions[:, L.ERRORS:L.LATENCY].reshape(-1, L.API_SLOTS, L.ERROR_SLOTS)
            lat = self._latency(regions)
            by_api = req.sum(axis=0)
            errs = err.sum(axis=0)
            for api in np.nonzero(by_api.sum(axis=1))[0].tolist():
                versions = {str(v): int(n) for v, n in enumerate(by_api[api].tolist()) if n}
                errors = {error_name(c - 1): int(n) for c, n in enumerate(errs[api].tolist())
                          if n}
                phases = {}
                for ph, phase in enumerate(L.PHASES):
                    h = lat[api, ph]
                    phases[phase] = {"count": int(h[:L.BUCKETS].sum()),
                                     "sum_s": int(h[L.HIST_SUM]) / 1e9,
                                     "buckets": [int(x) for x in h[:L.BUCKETS]]}
                requests.append({"api_key": api, "api": api_name(api),
                                 "count": int(by_api[api].sum()), "versions": versions,
                                 "errors": errors, "times": phases})
            total = regions.sum(axis=0)
            for key, started, done, hist in (
                    ("produce", L.PRODUCE_WAITS_STARTED, L.PRODUCE_WAITS_DONE,
                     L.PRODUCE_WAIT_HIST),
                    ("fetch", L.FETCH_WAITS_STARTED, L.FETCH_WAITS_DONE, L.FETCH_WAIT_HIST)):
                h = total[hist:hist + L.HIST_WORDS]
                waits[key] = {"waiting": int(total[started]) - int(total[done]),
                              "count": int(h[:L.BUCKETS].sum()),
                              "sum_s": int(h[L.HIST_SUM]) / 1e9,
                              "buckets": [int(x) for x in h[:L.BUCKETS]]}
            h = total[L.FSYNC_HIST:L.FSYNC_HIST + L.HIST_WORDS]
            waits["fsync"] = {"count": int(h[:L.BUCKETS].sum()),
                              "sum_s": int(h[L.HIST_SUM]) / 1e9,
                              "buckets": [int(x) for x in h[:L.BUCKETS]]}
            waits["failed_produce_other"] = int(total[L.FAILED_PRODUCE_OTHER])
            waits["failed_fetch_other"] = int(total[L.FAILED_FETCH_OTHER])
        totals = {k: sum(t[k] for t in topics) for k in
                  ("messages_in", "bytes_in", "messages_out", "bytes_out", "produce_requests",
                   "fetch_requests", "failed_produce", "failed_fetch", "size_bytes")}
        workers = [p for p in processes if p["name"].startswith("worker-")]
        return {
            "time": time.time(),
            "broker": {"cluster_id": view.get("cluster_id", ""),
                       "bootstrap": view.get("bootstrap", ""), "http": self.http_address,
                       "data_dir": view.get("data_dir", ""), "host": self.hostname,
                       "brokers": view.get("brokers", []),
                       "uptime_s": time.time() - self.started,
                       "workers": len(workers),
                       "workers_alive": sum(1 for p in workers if p.get("alive")),
                       "metrics": bool(view.get("metrics")) and regions is not None},
            "processes": processes, "topics": topics, "groups": groups,
            # partitions whose last write failed (a full disk...), until one succeeds again
            "storage_errors": [{"topic": t["name"], "partition": p["partition"],
                                "error": p["storage_error"]}
                               for t in topics for p in t["partition_list"]
                               if "storage_error" in p],
            "requests": requests, "waits": waits, "totals": totals,
        }

    def _latency(self, regions: np.ndarray) -> np.ndarray:
        """Latency histograms of all processes: [api][phase][HIST_WORDS]."""
        lat = regions[:, L.LATENCY:L.LATENCY + L.API_SLOTS * len(L.PHASES) * L.HIST_WORDS]
        return lat.reshape(-1, L.API_SLOTS, len(L.PHASES), L.HIST_WORDS).sum(axis=0)

    # -- sampling -----------------------------------------------------------------------------

    def sample(self, view: dict[str, Any] | None = None) -> dict[str, Any]:
        """Take a reading, turn it into rates against the previous one, and keep it."""
        snap = self.build(view)
        now = time.monotonic()
        totals = {"_": snap["totals"]}
        for t in snap["topics"]:
            totals[t["name"]] = t
        for r in snap["requests"]:
            totals[f"api:{r['api']}"] = {"count": r["count"]}
        rates: dict[str, Any] = {"topics": {}, "apis": {}}
        if self._last is not None:
            then, before = self._last
            dt = max(now - then, 1e-3)
            for name, cur in totals.items():
                old = before.get(name)
                if old is None:
                    continue
                keys = ("count",) if name.startswith("api:") else (
                    "messages_in", "bytes_in", "messages_out", "bytes_out")
                r = {k: max(0, cur[k] - old[k]) / dt for k in keys}
                if name == "_":
                    rates.update(r)
                elif name.startswith("api:"):
                    rates["apis"][name[4:]] = r["count"]
                else:
                    rates["topics"][name] = r
        self._last = (now, {k: {kk: vv for kk, vv in v.items() if isinstance(vv, int)}
                            for k, v in totals.items()})
        # latency of the last interval, and the Kafka-style window of about a minute
        latency: dict[str, Any] = {}
        regions, _ = self._tables()
        if regions is not None:
            lat = self._latency(regions)
            window = self._latency_window
            prev = window[-1][1] if window else None
            window.append((now, lat))
            while len(window) > 2 and now - window[1][0] >= QUANTILE_WINDOW_S:
                window.popleft()
            if prev is not None:
                delta = lat - prev
                for api in (api_versions.PRODUCE, api_versions.FETCH):
                    h = delta[api, L.TOTAL, :L.BUCKETS]
                    latency[api_name(api)] = {"p50_ms": quantile(h, 0.5) * 1e3,
                                              "p99_ms": quantile(h, 0.99) * 1e3,
                                              "count": int(h.sum())}
            total = regions.sum(axis=0)[L.FSYNC_HIST:L.FSYNC_HIST + L.HIST_WORDS]
            self._fsync_window.append((now, total))
            while (len(self._fsync_window) > 2
                   and now - self._fsync_window[1][0] >= QUANTILE_WINDOW_S):
                self._fsync_window.popleft()
        rates["latency"] = latency
        self._rates = rates
        point = {"t": snap["time"], "messages_in": rates.get("messages_in", 0.0),
                 "messages_out": rates.get("messages_out", 0.0),
                 "bytes_in": rates.get("bytes_in", 0.0), "bytes_out": rates.get("bytes_out", 0.0),
                 "produce_p99_ms": latency.get("Produce", {}).get("p99_ms"),
                 "fetch_p99_ms": latency.get("Fetch", {}).get("p99_ms"),
                 "produce_p50_ms": latency.get("Produce", {}).get("p50_ms"),
                 "lag": sum(g["lag"] for g in snap["groups"])}
        if self._last is not None and rates.get("messages_in") is not None:
            self.history.append(point)
        snap["rates"] = rates
        return snap

    def window_quantiles(self) -> tuple[dict[int, np.ndarray], np.ndarray | None]:
        """Per API the [phase][quantile] seconds over the last minute, and the fsync ones."""
        out: dict[int, np.ndarray] = {}
        fsync = None
        if len(self._latency_window) >= 2:
            delta = self._latency_window[-1][1] - self._latency_window[0][1]
            for api in np.nonzero(delta[:, L.TOTAL, :L.BUCKETS].sum(axis=1))[0].tolist():
                out[api] = np.array([[quantile(delta[api, ph, :L.BUCKETS], q) for q in QUANTILES]
                                     for ph in range(len(L.PHASES))])
        if len(self._fsync_window) >= 2:
            d = self._fsync_window[-1][1] - self._fsync_window[0][1]
            fsync = np.array([quantile(d[:L.BUCKETS], q) for q in QUANTILES])
        return out, fsync

    def snapshot(self, view: dict[str, Any] | None = None) -> dict[str, Any]:
        """The current state with the rates of the last sample (``/api/v1/snapshot``)."""
        snap = self.build(view)
        snap["rates"] = self._rates
        rates = self._rates.get("topics", {})
        for t in snap["topics"]:
            t["rates"] = rates.get(t["name"], {})
        return snap
