"""What a fresh shmq process does before its first heavy import (entry points only)."""

from __future__ import annotations

import logging
import os
import sys


def skip_hypothesis() -> None:
    """Keep Hypothesis out of a broker, worker or command-line process.

    kio, the control-plane codec, registers a Hypothesis strategy for each of its primitive
    types whenever Hypothesis is importable, which it is wherever shmq's test extras are
    installed.  That import cost ~0.4 s of every process start on the 2-core box
    (``python -X importtime``: ``kio.static.primitive`` 390 ms with Hypothesis; all of
    ``kio.index`` 21 ms without), which is most of a worker's restart after a crash.  No shmq
    process uses Hypothesis.  A ``None`` entry in ``sys.modules`` makes ``import hypothesis``
    raise ImportError, which kio handles by skipping the registration.

    Only for a fresh process: never call it where Hypothesis may be wanted later (pytest, or a
    program that imports shmq as a library).
    """
    if "hypothesis" not in sys.modules:
        sys.modules["hypothesis"] = None  # type: ignore[assignment]


def configure_logging(name: str) -> None:
    """Warnings and errors by default, plus the INFO lines of the process life cycle (a worker's
    start with what recovery did, restarts); ``SHMQ_LOG_LEVEL`` sets one level for everything.

    To stderr (a service manager collects and rotates it), or with ``SHMQ_LOG_FILE`` (``shmq
    broker --log-file``) appended to that file by every process through a ``WatchedFileHandler``:
    each reopens the path when the file was moved or removed, so an outside rotation (logrotate's
    default ``create`` mode) loses nothing and needs no signal.  Rotating inside the broker would
    race: N processes write the one file."""
    level = os.environ.get("SHMQ_LOG_LEVEL")
    path = os.environ.get("SHMQ_LOG_FILE")
    handlers = None
    if path:
        from logging.handlers import WatchedFileHandler

        class PrivateWatchedFileHandler(WatchedFileHandler):
            def _open(self):  # type: ignore[no-untyped-def]
                fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)

        handlers = [PrivateWatchedFileHandler(path)]
    logging.basicConfig(level=level or "WARNING",
                        format=f"%(asctime)s {name} %(levelname)s %(message)s",
                        handlers=handlers,
                        force=True)  # a fork of the controller has its handler already
    if not level:
        for lifecycle in ("shmq.worker", "shmq.controller"):
            logging.getLogger(lifecycle).setLevel(logging.INFO)
