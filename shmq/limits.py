"""The machine's limits: descriptors, and log lines that repeat.

Descriptors.  ``raise_nofile`` lifts the soft ``RLIMIT_NOFILE`` to the hard limit at start, as Go
programs and most servers do (the common default soft limit, 1024, is a relic of ``select``; the
hard limit is what the administrator allows).  ``segment_budget`` is how many segment files a
worker keeps open at once (``shmq.storage.descriptors``): half of what is left after a reserve of
``RESERVED_FDS`` for the process's own files (checkpoints, snapshots, sockets to the controller
and to local clients, shared memory, pipes), the other half for client connections
(``connection_budget``, which also gets half the reserve) and the file slices of fetches in
flight.  With the common 1024: 448 segment files, 512 connections.

Repeated errors.  ``Throttled`` writes a repeated line at most once per interval per key and says
how many it held back, so a broker out of descriptors or disk writes one line every ten seconds,
not one per attempt (issue 19: a broker out of descriptors wrote ~18,000 identical lines a
minute, the event loop's "socket.accept() out of system resource" once per accept attempt).
``install_loop_handler`` puts the same rule in front of asyncio's own exception handler.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from typing import Any

RESERVED_FDS = 128
MIN_SEGMENT_FDS = 16
INTERVAL_S = 10.0


def raise_nofile() -> tuple[int, int]:
    """Soft ``RLIMIT_NOFILE`` up to the hard limit; returns (soft, hard) as they now are."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):  # a hard limit the kernel caps (nr_open): keep the soft one
            pass
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def nofile() -> int:
    """The soft descriptor limit (large when unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def segment_budget(limit: int | None = None) -> int:
    """How many segment files a worker keeps open (see the module docstring)."""
    limit = nofile() if limit is None else limit
    return max(MIN_SEGMENT_FDS, (limit - RESERVED_FDS) // 2)


def connection_budget(limit: int | None = None) -> int:
    """How many client connections a process serves at once: what is left of the descriptor
    limit after the segment files' budget and the reserve (half the reserve: slices of
    fetches in flight and short-lived files come from the other half)."""
    limit = nofile() if limit is None else limit
    return max(16, limit - segment_budget(limit) - RESERVED_FDS // 2)


def open_fds() -> int:
    """Descriptors this process has open now."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own
    except OSError:
        return -1


class Throttled:
    """A logger's repeated lines, at most one per ``interval`` seconds per key, with a count."""

    def __init__(self, logger: logging.Logger, interval: float = INTERVAL_S) -> None:
        self.log = logger
        self.interval = interval
        self._last: dict[Any, float] = {}
        self._held: dict[Any, int] = {}

    def __call__(self, level: int, key: Any, msg: str, *args: Any, **kwargs: Any) -> bool:
        """Log ``msg % args`` unless a line of ``key`` went out less than ``interval`` ago;
        True when it was written."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        held = self._held.pop(key, 0)
        self._last[key] = now
        if held:
            msg += " (%d more like it in the last %.0f s)"
            args = (*args, held, now - last) if last is not None else (*args, held, 0.0)
        self.log.log(level, msg, *args, **kwargs)
        return True

    def held(self, key: Any) -> int:
        """Lines of ``key`` held back since the last one written."""
        return self._held.get(key, 0)

    def reset(self, key: Any) -> int:
        """Forget ``key`` (the condition is over); returns the lines held back."""
        self._last.pop(key, None)
        return self._held.pop(key, 0)


def install_loop_handler(loop: asyncio.AbstractEventLoop, logger: logging.Logger) -> None:
    """Rate-limit the event loop's own error lines (per message) with ``Throttled``."""
    throttled = Throttled(logger)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = context.get("message") or "unhandled exception in the event loop"
        exc = context.get("exception")
        # the first line of a kind with its traceback, as asyncio's default handler writes it
        info = exc if isinstance(exc, BaseException) and message not in throttled._last else None
        throttled(logging.ERROR, message, "%s: %s", message, exc if exc is not None else context,
                  exc_info=info)

    loop.set_exception_handler(handler)
