"""The ``shmq`` command: one entry point, Kafka's command-line tools as subcommands.

Each subcommand is a module of this package that exposes::

    add_parser(subparsers) -> argparse.ArgumentParser   # registers "<name>" and its flags
    run(args: argparse.Namespace) -> int                # the exit code

Adding a command means appending its module name to ``COMMANDS``; the command is called by the
module name with ``_`` spelled ``-`` (``dump_log`` is ``shmq dump-log``).  A command module
imports only the standard library at module level and defers everything heavier (numpy,
pyarrow, the compiled ``_fast`` leaf) to ``run()``: ``shmq --help`` imports every command module
to list them, while ``shmq <command> ...`` imports only that command's module.

Errors a user can cause (a missing file, a bad flag) end in one line on stderr and a non-zero
exit code, never a traceback: usage errors exit 2 (argparse's convention), a command raises
``CommandError`` (or lets an ``OSError`` escape) to exit 1.  Anything else is a bug in shmq and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

# Module names of the subcommands, in the order ``shmq --help`` lists them.
COMMANDS = [
    "broker",
    "dump_log",
    "demo",
    "topics",
    "configs",
    "get_offsets",
    "console_producer",
    "console_consumer",
    "consumer_groups",
    "transactions",
    "producer_perf_test",
    "consumer_perf_test",
    "top",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """A command could not do what it was asked; ``main`` prints ``Error: <message>``."""


class UsageError(Exception):
    """The command line itself is wrong (raised instead of argparse's print-and-exit)."""


class _ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line on stderr instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


def command_name(module_name: str) -> str:
    return module_name.replace("_", "-")


def _load(module_name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{module_name}")


def _requested_command(argv: Sequence[str]) -> str | None:
    """The module of the subcommand ``argv`` names, if it names one (the top level has no
    options that take a value, so the first word that is not an option is the command)."""
    by_name = {command_name(m): m for m in COMMANDS}
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return by_name.get(word)
    return None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The ``shmq`` parser; only the command ``argv`` names is imported, or all of them."""
    from shmq import __version__

    parser = _ArgumentParser(
        prog="shmq",
        description="shmq: a single-host, Kafka-compatible message broker, and its tools.",
    )
    parser.add_argument("--version", action="version", version=f"shmq {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    subparsers.required = True
    wanted = _requested_command(argv)
    for module_name in [wanted] if wanted else COMMANDS:
        sub = _load(module_name).add_parser(subparsers)
        sub.set_defaults(_module=module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``shmq`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(args_list)
        try:
            args = parser.parse_args(args_list)
        except SystemExit as e:  # --help and --version print, then "exit"
            return e.code if isinstance(e.code, int) else EXIT_OK
        args._argv = args_list  # for warn_deprecated: argparse forgets which alias was used
        return int(_load(args._module).run(args))
    except UsageError as e:
        _print_error(str(e))
        return EXIT_USAGE
    except CommandError as e:
        _print_error(f"Error: {e}")
        return EXIT_ERROR
    except OSError as e:
        if isinstance(e, BrokenPipeError):  # `shmq dump-log ... | head`: stop quietly
            _silence_stdout()
            return EXIT_ERROR
        where = f": {e.filename}" if e.filename else ""
        _print_error(f"Error: {e.strerror or e}{where}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def warn_deprecated(args: argparse.Namespace, lines: Sequence[tuple[str, str]]) -> None:
    """Kafka 4.3's line for each old spelling the command line used (``(flag, line)`` in the
    order Kafka checks them), on stdout as Kafka prints them."""
    used = {word.split("=", 1)[0] for word in getattr(args, "_argv", ()) if word.startswith("--")}
    for flag, line in lines:
        if flag in used:
            print(line, flush=True)


def entry() -> int:
    """The ``shmq`` console script and ``python -m shmq``: ``main`` in a fresh process."""
    from shmq._startup import skip_hypothesis

    skip_hypothesis()
    return main()


def _print_error(line: str) -> None:
    try:
        sys.stdout.flush()  # keep stdout and stderr in order on a terminal
    except (OSError, ValueError):
        pass
    print(line, file=sys.stderr)


def _silence_stdout() -> None:
    # Python would report the broken pipe again when it flushes stdout at exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


__all__ = ["COMMANDS", "CommandError", "UsageError", "build_parser", "command_name", "main"]
