"""``fsync`` for the storage code, with the slow-disk fault hook of the tests.

``SHMQ_FAULT_FSYNC_DELAY_MS`` (read at import; tests only) makes every fsync of segment data
(``LogSegment.flush``: the group commits acks=all waits for, flush.ms / flush.messages, a log's
close) sleep that long first: what a disk with multi-second flush stalls does to the broker
(issue 19, "a slow disk").  Checkpoints and directories are fsynced without the delay, so that
a broker under test still starts and stops in seconds.  The test box has no device-mapper ``delay``
target (no ``dm`` module, no ``/dev/mapper/control``), so the delay is injected here, in the one
function every durable write goes through.
"""

from __future__ import annotations

import os
import time

FSYNC_DELAY_S = float(os.environ.get("SHMQ_FAULT_FSYNC_DELAY_MS") or 0) / 1000


def fsync(fd: int, *, data_only: bool = False, slowed: bool = False) -> None:
    """``os.fsync`` (``data_only``: ``os.fdatasync``); ``slowed``: under the fault hook."""
    if slowed and FSYNC_DELAY_S:
        time.sleep(FSYNC_DELAY_S)
    if data_only:
        os.fdatasync(fd)
    else:
        os.fsync(fd)
