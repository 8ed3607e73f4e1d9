"""What ``shmq topics``, ``console-producer`` and ``console-consumer`` share: where the broker is,
and the ``key=value`` properties Kafka's tools take on the command line and in files.

Finding the broker::

    --bootstrap-server HOST:PORT[,...]      wins
    bootstrap.servers in the client config  (--command-config / --command-property ...)
    <data-dir>/run/broker.json "bootstrap"  --data-dir, else $SHMQ_DATA_DIR or ~/.local/share/shmq

Properties follow Kafka's rules: ``--property k=v`` splits at the first ``=`` (a missing value is
the empty string, as in ``CommandLineUtils.parseKeyValueArgs``), and config files are Java
``.properties`` files (``Utils.loadProps``: ``=``, ``:`` or blanks between key and value, ``#``
and ``!`` comments, backslash escapes and line continuations).

The clients are librdkafka's (confluent-kafka), so a config written for Kafka's Java clients is
translated: keys librdkafka spells differently are renamed, Java-only keys (serializer classes,
``max.block.ms`` ...) are dropped.  Anything else goes to librdkafka as is, which rejects what it
does not know with a one-line error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shmq.cli import CommandError, UsageError

NO_BROKER = "no broker found: pass --bootstrap-server or start one with `shmq broker`"

# Java client config -> librdkafka config (None: no librdkafka equivalent, dropped).
_JAVA_ONLY: dict[str, str | None] = {
    "key.serializer": None,
    "value.serializer": None,
    "key.deserializer": None,
    "value.deserializer": None,
    "partitioner.class": None,
    "interceptor.classes": None,
    "max.block.ms": None,
    "max.poll.records": None,
    "default.api.timeout.ms": None,
    "retry.backoff.max.ms": "retry.backoff.max.ms",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "metadata.max.age.ms": "metadata.max.age.ms",
}


def add_connection_args(p: argparse.ArgumentParser) -> None:
    """``--bootstrap-server`` and ``--data-dir`` (where to look for a local broker)."""
    p.add_argument("--bootstrap-server", metavar="HOST:PORT",
                   help="the broker(s) to connect to; default: the broker running in --data-dir")
    p.add_argument("--data-dir", metavar="DIR",
                   help="find a local broker through DIR/run/broker.json when --bootstrap-server "
                        "is not given (default: $SHMQ_DATA_DIR or ~/.local/share/shmq)")


def usage_error(command: str, message: str) -> UsageError:
    """A bad command line, reported like argparse's errors (exit code 2)."""
    return UsageError(f"shmq {command}: error: {message} (see 'shmq {command} --help')")


# --- properties --------------------------------------------------------------------------------


def parse_key_values(items: Iterable[str] | None) -> dict[str, str]:
    """``CommandLineUtils.parseKeyValueArgs``: ``k=v`` split at the first ``=``; ``k`` alone or
    ``k=`` is the empty value."""
    props: dict[str, str] = {}
    for item in items or ():
        key, _, value = item.partition("=")
        props[key] = value
    return props


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2:i + 6]):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _logical_lines(text: str) -> Iterable[str]:
    """Lines of a .properties file with comments dropped and continuations joined."""
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if pending is None:
            if not line or line[0] in "#!":
                continue
        else:
            line = pending + line
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes continues the line
            pending = line[:-1]
            continue
        pending = None
        yield line
    if pending:
        yield pending


def _split_property(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t\f":
            break
        i += 1
    key = line[:i]
    blanks = " \t\f"
    j = i
    if j < len(line) and line[j] in blanks:  # "key  = value" or "key value"
        while j < len(line) and line[j] in blanks:
            j += 1
        if j < len(line) and line[j] in "=:":
            j += 1
    elif j < len(line):  # "key=value" / "key:value"
        j += 1
    while j < len(line) and line[j] in blanks:
        j += 1
    return _unescape(key), _unescape(line[j:])


def load_properties(path: str) -> dict[str, str]:
    """A Java ``.properties`` file as a dict (``Utils.loadProps``)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise CommandError(f"{path} (No such file or directory)") from None
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
    return dict(_split_property(line) for line in _logical_lines(text))


def merged_properties(files: Iterable[str | None], items: Iterable[Iterable[str] | None]
                      ) -> dict[str, str]:
    """Config files first, then ``k=v`` arguments on top (Kafka: the arguments take precedence)."""
    props: dict[str, str] = {}
    for path in files:
        if path:
            props.update(load_properties(path))
    for group in items:
        props.update(parse_key_values(group))
    return props


def client_config(props: dict[str, str]) -> dict[str, Any]:
    """A Kafka (Java) client config as librdkafka config."""
    conf: dict[str, Any] = {}
    for key, value in props.items():
        if key in _JAVA_ONLY:
            target = _JAVA_ONLY[key]
            if target is not None:
                conf[target] = value
        elif key == "buffer.memory":
            try:
                conf["queue.buffering.max.kbytes"] = max(1, int(value) // 1024)
            except ValueError:
                raise CommandError(f"buffer.memory must be a number of bytes, got {value!r}"
                                   ) from None
        else:
            conf[key] = value
    return conf


def api_timeout(props: dict[str, str], default: float = 30.0) -> float:
    """Seconds to wait for an admin call: ``default.api.timeout.ms`` if the config sets it."""
    raw = props.get("default.api.timeout.ms")
    if raw is None:
        return default
    try:
        return max(0.001, int(raw) / 1000)
    except ValueError:
        raise CommandError(f"default.api.timeout.ms must be a number, got {raw!r}") from None


# --- finding the broker ------------------------------------------------------------------------


def default_data_dir() -> Path:
    from shmq.broker.config import DEFAULT_DATA_DIR

    return Path(DEFAULT_DATA_DIR)


def find_local_broker(data_dir: str | os.PathLike[str] | None) -> str:
    """The bootstrap address the broker running in ``data_dir`` wrote to ``run/broker.json``."""
    directory = Path(data_dir).expanduser() if data_dir else default_data_dir()
    run_file = directory / "run" / "broker.json"
    try:
        info = json.loads(run_file.read_text())
    except FileNotFoundError:
        raise CommandError(f"{NO_BROKER} (no {run_file})") from None
    except (OSError, ValueError) as exc:
        raise CommandError(f"{NO_BROKER} (cannot read {run_file}: "
                           f"{getattr(exc, 'strerror', None) or exc})") from None
    bootstrap = info.get("bootstrap") if isinstance(info, dict) else None
    if not isinstance(bootstrap, str) or not bootstrap:
        raise CommandError(f"{NO_BROKER} ({run_file} names no bootstrap address)")
    pid = info.get("controller_pid")
    if isinstance(pid, int) and pid > 0 and not _alive(pid):
        raise CommandError(f"{NO_BROKER} (the broker that wrote {run_file}, pid {pid}, "
                           "is not running)")
    return bootstrap


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def resolve_bootstrap(args: argparse.Namespace, props: dict[str, str] | None = None) -> str:
    """``--bootstrap-server``, else ``bootstrap.servers`` from the client config, else the local
    broker of ``--data-dir`` (or the default data dir)."""
    if getattr(args, "bootstrap_server", None):
        return str(args.bootstrap_server)
    if props and props.get("bootstrap.servers"):
        return props["bootstrap.servers"]
    return find_local_broker(getattr(args, "data_dir", None))


class _OncePerMessage:
    """A logging filter that lets each distinct librdkafka message (digits aside) through once:
    a broker that is down is reported, not reported twenty times a second."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: Any) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        fac, text = (str(args[0]), str(args[-1])) if len(args) >= 2 else ("", record.getMessage())
        key = (fac, re.sub(r"\d+", "#", text))
        if key in self.seen:
            return False
        self.seen.add(key)
        text = re.sub(r"^\[thrd:[^\]]*\]: ", "", text)
        record.msg, record.args = "%s: %s", (record.levelname.lower(), text)
        return True


def rdkafka_logger(name: str) -> Any:
    """A logger for librdkafka's ``logger`` config: warnings and errors on stderr, each once."""
    import logging

    logger = logging.getLogger(f"shmq.cli.rdkafka.{name}")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_OncePerMessage())
        logger.addHandler(handler)
        logger.propagate = False
        try:
            logger.setLevel(os.environ.get("SHMQ_LOG_LEVEL", "WARNING").upper())
        except ValueError:
            logger.setLevel(logging.WARNING)
    return logger


def kafka_error_text(exc: BaseException) -> str:
    """The message of a confluent-kafka exception (its KafkaError's text), else ``str(exc)``."""
    err = exc.args[0] if exc.args else None
    text = getattr(err, "str", None)
    if callable(text):
        return str(text())
    return str(exc)


__all__ = [
    "NO_BROKER",
    "add_connection_args",
    "api_timeout",
    "client_config",
    "find_local_broker",
    "kafka_error_text",
    "load_properties",
    "merged_properties",
    "parse_key_values",
    "rdkafka_logger",
    "resolve_bootstrap",
    "usage_error",
]
