"""``shmq configs``: Kafka's ``kafka-configs.sh`` (``ConfigCommand``) for topics and brokers.

::

    --describe --entity-type topics|brokers [--entity-name X | --entity-default] [--all]
    --alter    --entity-type topics|brokers (--entity-name X | --entity-default)
               [--add-config k=v,k2=[a,b]] [--add-config-file F] [--delete-config k,k2]

``--topic X`` is ``--entity-type topics --entity-name X``; ``--broker N`` is ``--entity-type
brokers --entity-name N``; ``--broker-defaults`` is ``--entity-type brokers --entity-default``.
``--describe`` prints, as Kafka does (entries sorted by name; without ``--all`` only the configs
set dynamically on that entity)::

    Dynamic configs for topic events are:
      retention.ms=1000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=1000, DEFAULT_CONFIG:log.retention.hours=168}

``--alter`` uses IncrementalAlterConfigs (SET for added configs, DELETE for deleted ones) and
prints ``Completed updating config for topic events.`` (``... for broker 1.``, ``Completed
updating default config for brokers in the cluster.``).

Errors are one line on stderr and exit code 1: Kafka's own message for a command line it refuses
(``Invalid config(s): x``), else ``Error while executing config command with args '...': <the
broker's message>`` (Kafka prints that first part, then a stack trace).  Usage errors exit 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from shmq.cli._connect import (
    add_connection_args,
    api_timeout,
    client_config,
    kafka_error_text,
    load_properties,
    merged_properties,
    resolve_bootstrap,
    usage_error,
)

ENTITY_TYPES = ("topics", "brokers")
KAFKA_ONLY_TYPES = ("clients", "users", "ips", "broker-loggers", "client-metrics", "groups")
_SOURCE_FILTER = {"topics": "DYNAMIC_TOPIC_CONFIG", "brokers": "DYNAMIC_BROKER_CONFIG"}


class ConfigCommandError(Exception):
    """A failure printed as its message alone (Kafka: InvalidConfigurationException and
    IllegalArgumentException)."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "configs", help="describe or alter topic and broker configs (kafka-configs.sh)",
        description="This tool helps to manipulate and describe entity config for a topic or "
                    "broker. Flags and output are those of Kafka's kafka-configs.sh.")
    add_connection_args(p)
    p.add_argument("--command-config", metavar="FILE",
                   help="property file containing configs to be passed to the admin client")
    p.add_argument("--describe", action="store_true",
                   help="list configs for the given entity")
    p.add_argument("--alter", action="store_true", help="alter the configuration for the entity")
    p.add_argument("--all", action="store_true",
                   help="with --describe: list all configs, not only the dynamic ones")
    p.add_argument("--entity-type", action="append", metavar="TYPE",
                   help="type of entity: topics or brokers")
    p.add_argument("--entity-name", action="append", metavar="NAME",
                   help="name of entity: a topic name or a broker id")
    p.add_argument("--entity-default", action="store_true",
                   help="with --entity-type brokers: the cluster-wide default broker configs")
    p.add_argument("--topic", metavar="TOPIC", help="the topic's configs "
                   "(--entity-type topics --entity-name TOPIC)")
    p.add_argument("--broker", metavar="ID", help="the broker's configs "
                   "(--entity-type brokers --entity-name ID)")
    p.add_argument("--broker-defaults", action="store_true",
                   help="the default broker configs (--entity-type brokers --entity-default)")
    p.add_argument("--add-config", metavar="K=V,...",
                   help="key value pairs of configs to add; square brackets group values that "
                        "contain commas: 'k1=v1,k2=[v1,v2,v2],k3=v3'")
    p.add_argument("--add-config-file", metavar="FILE",
                   help="path to a properties file of configs to add")
    p.add_argument("--delete-config", metavar="K,...", help="config keys to remove: 'k1,k2'")
    return p


def _entity(args: argparse.Namespace) -> tuple[str, str | None]:
    """(entity type, name or None for all, "" for the default), after ConfigCommand's checks."""
    types = list(args.entity_type or [])
    names = list(args.entity_name or [])
    if args.topic is not None:
        types.append("topics")
        names.append(args.topic)
    if args.broker is not None:
        types.append("brokers")
        names.append(args.broker)
    default = args.entity_default or args.broker_defaults
    if args.broker_defaults:
        types.append("brokers")
    if not types:
        raise usage_error("configs", "--entity-type must be specified (or --topic, --broker, "
                                     "--broker-defaults)")
    if len(set(types)) > 1 or len(names) > 1 or (names and default):
        raise usage_error("configs", "Only one entity can be described or altered at a time")
    etype = types[0]
    if etype in KAFKA_ONLY_TYPES:
        raise usage_error("configs", f"shmq has no {etype} configs: --entity-type must be "
                                     "topics or brokers")
    if etype not in ENTITY_TYPES:
        raise usage_error("configs", f"Invalid entity type {etype}, the entity type must be one "
                                     f"of {', '.join(ENTITY_TYPES)}")
    if default and etype != "brokers":
        raise usage_error("configs", "--entity-default is only valid with --entity-type brokers")
    name = "" if default else (names[0] if names else None)
    if etype == "brokers" and name and not name.isdigit():
        raise ConfigCommandError(f"The entity name for brokers must be a valid integer broker "
                                 f"id, but it is: {name}")
    if etype == "topics" and name == "":
        raise ConfigCommandError("the topic name must not be empty")
    return etype, name


def parse_configs_to_add(raw: str | None, path: str | None) -> dict[str, str]:
    """``--add-config``: split at commas outside brackets, each item ``k=v`` at the first ``=``;
    ``[a,b]`` keeps its commas and loses its brackets (``ConfigCommand.parseConfigsToBeAdded``)."""
    configs: dict[str, str] = {}
    if raw:
        for item in re.split(r",(?=[^\]]*(?:\[|$))", raw):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigCommandError("requirement failed: Invalid entity config: all "
                                         'configs to be added must be in the format "key=val".')
            value = value.strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            configs[key.strip()] = value
    if path:
        configs.update(load_properties(path))
    return configs


def run(args: argparse.Namespace) -> int:
    if args.describe == args.alter:
        raise usage_error("configs", "Command must include exactly one action: --describe, "
                                     "--alter")
    if args.all and not args.describe:
        raise usage_error("configs", 'Option "[all]" can\'t be used with option "[alter]"')
    changes = args.add_config or args.add_config_file or args.delete_config
    if args.describe and changes:
        raise usage_error("configs", "--add-config and --delete-config can only be used with "
                                     "--alter")
    if args.alter and not changes:
        raise usage_error("configs", "At least one of --add-config, --add-config-file or "
                                     "--delete-config must be specified with --alter")
    props = merged_properties([args.command_config], [])
    try:
        etype, name = _entity(args)
        if args.alter and name is None:
            raise ConfigCommandError("an entity name must be specified with --alter")
        service = ConfigService(resolve_bootstrap(args, props), props)
        if args.describe:
            service.describe(etype, name, args.all)
        else:
            added = parse_configs_to_add(args.add_config, args.add_config_file)
            deleted = [k.strip() for k in (args.delete_config or "").split(",") if k.strip()]
            assert name is not None
            service.alter(etype, name, added, deleted)
    except ConfigCommandError as exc:
        _error(str(exc))
        return 1
    except BrokenPipeError:
        raise
    except (BrokerError, OSError) as exc:
        why = exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)
        _error(f"Error while executing config command with args '{_args_text()}': {why}")
        return 1
    except Exception as exc:
        from confluent_kafka import KafkaException

        if isinstance(exc, KafkaException):
            _error(f"Error while executing config command with args "
                   f"'{_args_text()}': {kafka_error_text(exc)}")
            return 1
        raise
    return 0


def _args_text() -> str:
    argv = sys.argv[1:]
    if argv and argv[0] == "configs":
        argv = argv[1:]
    return " ".join(argv)


def _error(message: str) -> None:
    sys.stdout.flush()
    print(message, file=sys.stderr)


def _resource(etype: str, name: str) -> Any:
    from confluent_kafka.admin import ConfigResource

    return ConfigResource(ConfigResource.Type.TOPIC if etype == "topics"
                          else ConfigResource.Type.BROKER, name)


class BrokerError(Exception):
    """The broker refused: printed after ``Error while executing config command with args``."""


_SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
            3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
            6: "DYNAMIC_BROKER_LOGGER_CONFIG", 7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}
TOPIC, BROKER = 2, 4
DELETE, SET = 1, 0


def kafka_call(address: str, request: Any, timeout: float) -> Any:
    """One request over a fresh connection, encoded and decoded by kio.

    librdkafka's AdminClient neither asks for synonyms nor accepts the empty broker name of the
    cluster-wide defaults, so DescribeConfigs and IncrementalAlterConfigs are sent here."""
    import io
    import socket
    import struct

    from kio.index import load_response_schema
    from kio.serial import entity_reader, entity_writer

    header = request.__header_schema__(
        request_api_key=request.__api_key__, request_api_version=request.__version__,
        correlation_id=1, client_id="shmq-configs")
    out = io.BytesIO()
    entity_writer(type(header))(out, header)
    entity_writer(type(request))(out, request)
    payload = out.getvalue()
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        frame = memoryview(_read_exactly(sock, size))
    cls = load_response_schema(request.__api_key__, request.__version__)
    _, pos = entity_reader(cls.__header_schema__)(frame, 0)
    body, _ = entity_reader(cls)(frame, pos)
    return body


def _read_exactly(sock: Any, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise BrokerError("the broker closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _check(result: Any) -> None:
    code = int(result.error_code)
    if code:
        from kio.schema.errors import ErrorCode

        raise BrokerError(result.error_message or ErrorCode(code).name.upper())


class ConfigService:
    def __init__(self, bootstrap: str, props: dict[str, str]) -> None:
        from confluent_kafka.admin import AdminClient

        conf = client_config(props)
        conf["bootstrap.servers"] = bootstrap
        conf.setdefault("log_level", 0)  # failures come back through the futures
        self.timeout = api_timeout(props)
        self.admin = AdminClient(conf)
        self.metadata = self.admin.list_topics(timeout=self.timeout)
        self.bootstrap = bootstrap.split(",")[0].strip()

    def _address(self, etype: str, name: str) -> str:
        """Broker configs go to that broker (Kafka requires it), the rest to the bootstrap."""
        broker = self.metadata.brokers.get(int(name)) if etype == "brokers" and name else None
        return f"{broker.host}:{broker.port}" if broker is not None else self.bootstrap

    def _entries(self, etype: str, name: str) -> list[Any]:
        from kio.schema.describe_configs.v1.request import (
            DescribeConfigsRequest,
            DescribeConfigsResource,
        )
        from kio.static.primitive import i8

        request = DescribeConfigsRequest(resources=(DescribeConfigsResource(
            resource_type=i8(TOPIC if etype == "topics" else BROKER), resource_name=name,
            configuration_keys=None),), include_synonyms=True)
        response = kafka_call(self._address(etype, name), request, self.timeout)
        (result,) = response.results
        _check(result)
        return sorted(result.configs, key=lambda e: e.name)

    def _names(self, etype: str) -> list[str]:
        if etype == "topics":
            return sorted(self.metadata.topics)
        return [str(n) for n in sorted(self.metadata.brokers)] + [""]

    def describe(self, etype: str, name: str | None, describe_all: bool) -> None:
        if name and not describe_all and (
                (etype == "topics" and name not in self.metadata.topics)
                or (etype == "brokers" and not (name.isdigit()
                                                and int(name) in self.metadata.brokers))):
            # Kafka's describeResourceConfig: a line on stdout and exit code 0, not an error
            print(f"The {etype[:-1]} '{name}' doesn't exist and doesn't have dynamic config.")
            return
        names = self._names(etype) if name is None else [name]
        singular = etype[:-1]
        out = []
        for entity in names:
            if entity == "":
                out.append(f"Default configs for {etype} in the cluster are:")
                wanted: str | None = "DYNAMIC_DEFAULT_BROKER_CONFIG"
            else:
                out.append(f"{'All' if describe_all else 'Dynamic'} configs for {singular} "
                           f"{entity} are:")
                wanted = None if describe_all else _SOURCE_FILTER[etype]
            for e in self._entries(etype, entity):
                if wanted is not None and _SOURCES.get(int(e.config_source)) != wanted:
                    continue
                sensitive = str(bool(e.is_sensitive)).lower()
                out.append(f"  {e.name}={_text(e.value)} sensitive={sensitive} "
                           f"synonyms={{{_synonyms(e)}}}")
        print("\n".join(out))

    def alter(self, etype: str, name: str, added: dict[str, str], deleted: list[str]) -> None:
        from kio.schema.incremental_alter_configs.v0.request import (
            AlterableConfig,
            AlterConfigsResource,
            IncrementalAlterConfigsRequest,
        )
        from kio.static.primitive import i8

        if etype == "topics" and name not in self.metadata.topics:
            raise ConfigCommandError(f"The topic '{name}' does not exist.")
        if deleted:
            known = {e.name for e in self._entries(etype, name)}
            if etype == "brokers":
                from shmq.broker.dynamic_configs import DYNAMIC_BROKER_CONFIGS, DYNAMIC_BROKER_OWN

                known |= DYNAMIC_BROKER_CONFIGS | DYNAMIC_BROKER_OWN
            invalid = [k for k in deleted if k not in known]
            if invalid:
                raise ConfigCommandError(f"Invalid config(s): {','.join(invalid)}")
        ops = [AlterableConfig(name=k, config_operation=i8(SET), value=v)
               for k, v in added.items()]
        ops += [AlterableConfig(name=k, config_operation=i8(DELETE), value=None) for k in deleted]
        request = IncrementalAlterConfigsRequest(resources=(AlterConfigsResource(
            resource_type=i8(TOPIC if etype == "topics" else BROKER), resource_name=name,
            configs=tuple(ops)),), validate_only=False)
        response = kafka_call(self._address(etype, name), request, self.timeout)
        for result in response.responses:
            _check(result)
        if name == "":
            print(f"Completed updating default config for {etype} in the cluster.")
        else:
            print(f"Completed updating config for {etype[:-1]} {name}.")


def _text(value: str | None) -> str:
    return "null" if value is None else value


def _synonyms(entry: Any) -> str:
    return ", ".join(f"{_SOURCES.get(int(s.source), 'UNKNOWN')}:{s.name}={_text(s.value)}"
                     for s in entry.synonyms or ())
