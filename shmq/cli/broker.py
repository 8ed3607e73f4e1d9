"""``shmq broker``: start the controller and its workers; stop with Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from shmq.cli import CommandError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "broker", help="run a Kafka-compatible broker (controller + partition workers)",
        description="Run shmq: a controller (Kafka node 0, the bootstrap listener) and N "
                    "partition workers. Prints the bootstrap address when ready and writes it to "
                    "<data-dir>/run/broker.json.")
    p.add_argument("--data-dir", help="where logs and metadata live (default: $SHMQ_DATA_DIR "
                   "or ~/.local/share/shmq)")
    p.add_argument("--listeners", default="127.0.0.1:9092",
                   help="host:port of the bootstrap listener; port 0 picks a free port "
                        "(default 127.0.0.1:9092)")
    p.add_argument("--workers", type=int, help="partition worker processes (default: CPU count)")
    p.add_argument("--config", help="a server.properties-style file (k=v lines)")
    p.add_argument("--override", action="append", default=[], metavar="K=V",
                   help="a broker or topic-default property, e.g. num.partitions=6 (repeatable)")
    p.add_argument("--http-listener", default=None, metavar="HOST:PORT",
                   help="where /metrics (Prometheus), /api/v1 (JSON) and the dashboard are "
                        "served; 'none' turns it off (default 127.0.0.1:8090, or a free port "
                        "when 8090 is taken)")
    p.add_argument("--log-file", metavar="PATH",
                   help="write the broker log (every process's) to PATH instead of stderr; "
                        "each process reopens PATH when it is moved, so logrotate (or any "
                        "rename) rotates it (default: stderr, for a service manager)")
    p.add_argument("--no-metrics", action="store_true",
                   help="do not count requests, bytes and latencies (the offsets, groups and "
                        "processes are still served)")
    return p


def _read_properties(path: str) -> dict[str, str]:
    props = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}") from None
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        if "=" not in line:
            raise CommandError(f"{path}:{n}: expected key=value, got {line!r}")
        k, v = line.split("=", 1)
        props[k.strip()] = v.strip()
    return props


def run(args: argparse.Namespace) -> int:
    import asyncio

    from shmq._startup import configure_logging
    from shmq.broker.config import BrokerConfig
    from shmq.errors import ConfigError
    from shmq.limits import raise_nofile
    from shmq.supervisor.controller import BootError, Controller
    from shmq.supervisor.forkserver import ForkServer

    if args.log_file:  # before configure_logging, and inherited by every worker
        os.environ["SHMQ_LOG_FILE"] = str(Path(args.log_file).resolve())
    configure_logging("controller")
    raise_nofile()  # before the fork server: every worker inherits the raised limit
    from shmq.limits import segment_budget
    from shmq.storage.descriptors import CACHE

    CACHE.configure(segment_budget())
    host, _, port = args.listeners.rpartition(":")
    if not host or not port.isdigit():
        raise CommandError(f"--listeners must be host:port, got {args.listeners!r}")
    props = _read_properties(args.config) if args.config else {}
    for item in args.override:
        if "=" not in item:
            raise CommandError(f"--override must be key=value, got {item!r}")
        k, v = item.split("=", 1)
        props[k] = v
    try:
        config = BrokerConfig(host=host, port=int(port))
        config = config.with_properties(props)
        if args.data_dir:
            config = config.__class__(**{**config.__dict__, "data_dir": Path(args.data_dir)})
        if args.workers is not None:
            config = config.__class__(**{**config.__dict__, "workers": args.workers})
        if args.http_listener is not None:
            from shmq.monitor.listener import parse_listener

            try:
                parse_listener(args.http_listener)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            config = config.__class__(**{**config.__dict__, "http_listener": args.http_listener})
        if args.no_metrics:
            config = config.__class__(**{**config.__dict__, "metrics_enabled": False})
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    # forked before the event loop and any thread: workers start as forks of it, imports done
    forks = ForkServer.start(f"shmq fork-server {config.data_dir}")
    try:
        return asyncio.run(Controller(config, forks).run())
    except BootError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot start the broker: {exc}") from None
    finally:
        if forks is not None:
            forks.close()
