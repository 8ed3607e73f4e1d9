"""``shmq top``: the broker at a glance in the terminal, refreshed live; ``q`` quits.

Where the numbers come from:

* a local shmq broker (``--data-dir``, or the default one) or ``--url http://HOST:PORT``: its
  HTTP listener's ``/api/v1/snapshot``, the dashboard's data (processes, rates, latency, topics,
  partitions, groups and lag);
* ``--bootstrap-server`` of any Kafka cluster (shmq, Apache Kafka): the Kafka protocol through
  librdkafka's AdminClient (topics and their offsets, consumer groups, members and lag; rates
  come from the offsets' growth between refreshes).  When that address is the local broker's,
  its HTTP listener is used instead.

The screen is rich's ``Live``; keys are read from the terminal in cbreak mode without echo
(``q`` or Ctrl-C quits, ``p`` toggles the partitions).  ``--once`` prints one screen and exits
(no terminal needed).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from pathlib import Path
from typing import Any

from shmq.cli import CommandError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "top", help="watch a broker live in the terminal (processes, topics, groups, lag)",
        description="A live overview of a broker: processes, throughput, latency, topics and "
                    "consumer groups with lag. Press q to quit.")
    p.add_argument("--bootstrap-server", metavar="HOST:PORT",
                   help="any Kafka cluster (read over the Kafka protocol); default: the local "
                        "broker of --data-dir")
    p.add_argument("--data-dir", metavar="DIR",
                   help="find a local broker through DIR/run/broker.json (default: "
                        "$SHMQ_DATA_DIR or ~/.local/share/shmq)")
    p.add_argument("--url", metavar="http://HOST:PORT",
                   help="a shmq broker's HTTP listener (its --http-listener)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes (default 1)")
    p.add_argument("--topic", action="append", default=[], help="show only these topics")
    p.add_argument("--group", action="append", default=[], help="show only these groups")
    p.add_argument("--once", action="store_true", help="print one screen and exit")
    return p


# -- sources ---------------------------------------------------------------------------------


def _run_info(data_dir: str | None) -> dict[str, Any] | None:
    from shmq.cli._connect import default_data_dir

    directory = Path(data_dir).expanduser() if data_dir else default_data_dir()
    try:
        info = json.loads((directory / "run" / "broker.json").read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


class HttpSource:
    """A shmq broker's ``/api/v1/snapshot``."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            self.url = "http://" + self.url

    def snapshot(self) -> dict[str, Any]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/api/v1/snapshot", timeout=5) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise CommandError(f"cannot read {self.url}/api/v1/snapshot: "
                               f"{getattr(exc, 'reason', exc)}") from None

    def close(self) -> None:
        pass


class KafkaSource:
    """Any Kafka cluster through librdkafka: topics, offsets, groups and lag, rates from the
    growth of the offsets between two refreshes (no processes or latency: Kafka's protocol
    does not carry them)."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        from shmq.cli._connect import rdkafka_logger

        conf = {"bootstrap.servers": bootstrap, "logger": rdkafka_logger("shmq.top")}
        self.bootstrap = bootstrap
        self.admin = AdminClient(conf)
        self.consumer = Consumer({**conf, "group.id": "shmq-top", "enable.auto.commit": False})
        self.started = time.time()
        self.last: tuple[float, dict[str, int]] | None = None

    def snapshot(self) -> dict[str, Any]:
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

        try:
            md = self.admin.list_topics(timeout=10)
        except KafkaException as exc:
            raise CommandError(f"cannot reach {self.bootstrap}: {exc}") from None
        topics: list[dict[str, Any]] = []
        hw_of: dict[tuple[str, int], int] = {}
        now = time.time()
        for name in sorted(md.topics):
            if name.startswith("__"):
                continue
            plist = []
            for pid in sorted(md.topics[name].partitions):
                p = md.topics[name].partitions[pid]
                try:
                    low, high = self.consumer.get_watermark_offsets(TopicPartition(name, pid),
                                                                    timeout=5)
                except KafkaException:
                    low = high = -1
                hw_of[(name, pid)] = high
                plist.append({"partition": pid, "leader": p.leader, "leader_epoch": -1,
                              "replicas": list(p.replicas), "isr": list(p.isrs),
                              "log_start": low, "high_watermark": high, "last_stable": high,
                              "log_end": high})
            topics.append({"name": name, "internal": False, "partitions": len(plist),
                           "partition_list": plist})
        ends: dict[str, int] = {t["name"]: sum(max(p["high_watermark"], 0)
                                               for p in t["partition_list"]) for t in topics}
        rates: dict[str, Any] = {"topics": {}}
        if self.last is not None:
            dt = max(now - self.last[0], 1e-3)
            rates["messages_in"] = sum(max(0, ends[n] - self.last[1].get(n, ends[n]))
                                       for n in ends) / dt
            for n in ends:
                if n in self.last[1]:
                    rates["topics"][n] = {"messages_in": max(0, ends[n] - self.last[1][n]) / dt}
        self.last = (now, ends)
        groups = []
        try:
            listed = self.admin.list_consumer_groups(request_timeout=10).result()
            ids = sorted(g.group_id for g in listed.valid)
            described = {}
            if ids:
                for gid, fut in self.admin.describe_consumer_groups(
                        ids, request_timeout=10).items():
                    try:
                        described[gid] = fut.result()
                    except KafkaException:
                        pass
            for gid in ids:
                d = described.get(gid)
                offsets = []
                try:
                    res = self.admin.list_consumer_group_offsets(
                        [ConsumerGroupTopicPartitions(gid)], request_timeout=10)[gid].result()
                    for tp in res.topic_partitions:
                        if tp.offset < 0:
                            continue
                        hw = hw_of.get((tp.topic, tp.partition))
                        lag = None if hw is None or hw < 0 else max(0, hw - tp.offset)
                        offsets.append({"topic": tp.topic, "partition": tp.partition,
                                        "committed": tp.offset, "log_end": hw, "lag": lag})
                except KafkaException:
                    pass
                members = []
                for m in (d.members if d is not None else []):
                    assignment: dict[str, list[int]] = {}
                    for tp in (m.assignment.topic_partitions if m.assignment else []):
                        assignment.setdefault(tp.topic, []).append(tp.partition)
                    members.append({"member_id": m.member_id, "client_id": m.client_id,
                                    "host": m.host, "assignment": sorted(assignment.items())})
                state = str(d.state).rsplit(".", 1)[-1].title() if d is not None else "?"
                groups.append({"group": gid, "state": state, "members": members,
                               "offsets": offsets,
                               "lag": sum(o["lag"] or 0 for o in offsets)})
        except KafkaException:
            pass
        return {"time": now, "source": "kafka",
                "broker": {"bootstrap": self.bootstrap, "cluster_id": md.cluster_id or "",
                           "brokers": sorted(md.brokers), "uptime_s": now - self.started,
                           "workers": None, "workers_alive": None, "data_dir": ""},
                "processes": [], "topics": topics, "groups": groups, "requests": [],
                "rates": rates}

    def close(self) -> None:
        self.consumer.close()


def pick_source(args: argparse.Namespace) -> Any:
    if args.url:
        return HttpSource(args.url)
    info = _run_info(args.data_dir)
    local_http = info.get("http") if info else None
    if args.bootstrap_server:
        if local_http and info and info.get("bootstrap") == args.bootstrap_server:
            return HttpSource(local_http)
        return KafkaSource(args.bootstrap_server)
    if info is None:
        from shmq.cli._connect import find_local_broker

        find_local_broker(args.data_dir)   # raises the usual "no broker found" message
        raise CommandError("no broker found")
    if not local_http:
        if info.get("bootstrap"):   # the listener is off: read it over the Kafka protocol
            return KafkaSource(info["bootstrap"])
        raise CommandError("the local broker has no HTTP listener (--http-listener none)")
    return HttpSource(local_http)


# -- rendering -------------------------------------------------------------------------------


def _num(x: Any, digits: int = 0) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and digits:
        return f"{x:,.{digits}f}"
    return f"{x:,.0f}" if isinstance(x, (int, float)) else str(x)


def _bytes(x: Any) -> str:
    if x is None:
        return "-"
    x = float(x)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return f"{x:,.1f} {unit}" if unit != "B" else f"{x:,.0f} B"
        x /= 1024
    return str(x)


def _duration(s: Any) -> str:
    if s is None:
        return "-"
    s = int(s)
    d, h, m = s // 86400, s % 86400 // 3600, s % 3600 // 60
    return (f"{d}d{h:02d}h" if d else f"{h}h{m:02d}m" if h else f"{m}m{s % 60:02d}s")


def render(snap: dict[str, Any], args: argparse.Namespace, show_partitions: bool) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    b = snap["broker"]
    rates = snap.get("rates") or {}
    lat = rates.get("latency") or {}
    head = Text()
    head.append("shmq top", style="bold blue")
    head.append(f"  bootstrap {b.get('bootstrap', '')}  cluster {b.get('cluster_id', '')}  ")
    if b.get("workers") is not None:
        ok = b["workers_alive"] == b["workers"]
        head.append(f"workers {b['workers_alive']}/{b['workers']}",
                    style="green" if ok else "bold red")
    else:
        head.append(f"brokers {len(b.get('brokers', []))}")
    head.append(f"  uptime {_duration(b.get('uptime_s'))}\n")
    head.append(f"in {_num(rates.get('messages_in'))} msg/s  {_bytes(rates.get('bytes_in'))}/s"
                f"   out {_num(rates.get('messages_out'))} msg/s  "
                f"{_bytes(rates.get('bytes_out'))}/s")
    for api in ("Produce", "Fetch"):
        if api in lat:
            head.append(f"   {api.lower()} p50 {lat[api]['p50_ms']:.2f} ms "
                        f"p99 {lat[api]['p99_ms']:.2f} ms")
    parts: list[Any] = [head]
    failing = snap.get("storage_errors") or []
    if failing:  # a full disk, an I/O error: said first, in red, until appends succeed again
        alert = Text()
        for e in failing[:8]:
            alert.append(f"storage error {e['topic']}-{e['partition']}: {e['error']} "
                         "(appends refused, reads served)\n", style="bold red")
        if len(failing) > 8:
            alert.append(f"... and {len(failing) - 8} more partitions\n", style="bold red")
        parts.append(alert)
    if snap.get("processes"):
        t = Table(title="processes", title_justify="left", expand=True, box=None)
        for col in ("process", "pid", "state", "CPU %", "RSS", "fds", "conns", "restarts",
                    "uptime"):
            t.add_column(col, justify="left" if col in ("process", "state") else "right")
        for p in snap["processes"]:
            t.add_row(p["name"], _num(p.get("pid")), "up" if p.get("alive") else "DOWN",
                      _num(p.get("cpu_percent"), 1), _bytes(p.get("rss_bytes")),
                      _num(p.get("open_fds")), _num(p.get("connections")),
                      _num(p.get("restarts")), _duration(p.get("uptime_s")))
        parts.append(t)
    trates = rates.get("topics") or {}
    t = Table(title="topics", title_justify="left", expand=True, box=None)
    for col in ("topic", "partitions", "messages", "in/s", "out/s", "size", "segments"):
        t.add_column(col, justify="left" if col == "topic" else "right")
    for topic in snap["topics"]:
        if args.topic and topic["name"] not in args.topic:
            continue
        r = trates.get(topic["name"], {})
        end = sum(max(p.get("high_watermark", 0), 0) - max(p.get("log_start", 0), 0)
                  for p in topic["partition_list"])
        t.add_row(topic["name"], _num(topic["partitions"]), _num(end),
                  _num(r.get("messages_in")), _num(r.get("messages_out")),
                  _bytes(topic.get("size_bytes")), _num(topic.get("segments")))
        if show_partitions:
            for p in topic["partition_list"]:
                t.add_row(Text(f"  {topic['name']}-{p['partition']}", style="dim"),
                          f"leader {p['leader']}",
                          f"{_num(p.get('log_start'))}..{_num(p.get('high_watermark'))}",
                          f"LSO {_num(p.get('last_stable'))}", f"LEO {_num(p.get('log_end'))}",
                          _bytes(p.get("size_bytes")), _num(p.get("segments")))
    parts.append(t)
    t = Table(title="consumer groups", title_justify="left", expand=True, box=None)
    for col in ("group", "state", "members", "lag", "partitions (committed/end lag)"):
        t.add_column(col, justify="right" if col in ("members", "lag") else "left")
    for g in snap["groups"]:
        if args.group and g["group"] not in args.group:
            continue
        detail = "  ".join(f"{o['topic']}-{o['partition']} {_num(o['committed'])}/"
                           f"{_num(o['log_end'])} {_num(o['lag'])}" for o in g["offsets"][:8])
        if len(g["offsets"]) > 8:
            detail += f"  (+{len(g['offsets']) - 8})"
        t.add_row(g["group"], g["state"], _num(len(g["members"])),
                  Text(_num(g["lag"]), style="bold yellow" if g["lag"] else ""), detail)
    parts.append(t)
    parts.append(Text("q quit   p partitions", style="dim"))
    return Group(*parts)


# -- the loop --------------------------------------------------------------------------------


class _Keys:
    """The terminal in cbreak mode without echo while ``top`` runs (restored on exit)."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        self.saved: Any = None

    def __enter__(self) -> _Keys:
        if self.fd is not None:
            import termios
            import tty

            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None and self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def read(self, timeout: float) -> str:
        """A key pressed within ``timeout`` seconds, or ""."""
        if self.fd is None:
            time.sleep(timeout)
            return ""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        return os.read(self.fd, 32).decode(errors="replace") if ready else ""


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    if args.interval <= 0:
        raise CommandError("--interval must be positive")
    source = pick_source(args)
    console = Console()
    try:
        if args.once:
            source.snapshot()   # a first reading, so the second one has rates
            time.sleep(min(args.interval, 1.0))
            console.print(render(source.snapshot(), args, True))
            return 0
        show_partitions = False
        with _Keys() as keys, Live(render(source.snapshot(), args, show_partitions),
                                   console=console, screen=True, auto_refresh=False) as live:
            while True:
                deadline = time.monotonic() + args.interval
                while (left := deadline - time.monotonic()) > 0:
                    key = keys.read(left)
                    if "q" in key.lower():
                        return 0
                    if "p" in key.lower():
                        show_partitions = not show_partitions
                        break
                live.update(render(source.snapshot(), args, show_partitions), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        source.close()
