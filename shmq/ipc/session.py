"""The attach handshake on a worker's Unix socket (``<data-dir>/run/worker-<id>.sock``).

The socket is ``SOCK_SEQPACKET`` (one message per packet, descriptors passed with
``SCM_RIGHTS``); messages are small JSON objects.  It lives in the data dir's ``run/`` (0700)
and is itself 0600; on top of that the worker checks every peer's uid with ``SO_PEERCRED`` and
refuses any uid but its own with a message (reliability.md §5: file modes alone are not enough,
root ignores them)::

    client -> worker   {"op": "hello", "version": 1, "submit_bytes": N, "completion_bytes": M}
    worker -> client   {"op": "welcome", "node_id", "worker_pid", "session", "submit_bytes",
                        "completion_bytes", "max_entry"} + fds [region memfd, worker eventfd,
                                                               client eventfd]
                       or {"op": "refused", "error": "..."} and the socket closes
    client -> worker   {"op": "init_producer_id", "id": n}
    worker -> client   {"op": "producer_id", "id": n, "producer_id", "producer_epoch"}

The socket also tells each side that the other died: the worker sees EOF when a client exits
(its rings are reclaimed), a client sees EOF / POLLHUP when the worker exits (it reattaches).
"""

from __future__ import annotations

import array
import json
import os
import socket
from pathlib import Path
from typing import Any

from shmq.errors import ShmqError

VERSION = 1
MAX_MESSAGE = 64 * 1024
MAX_FDS = 4
_SUN_PATH_MAX = 100  # sun_path is 108 bytes; a longer path is reached through /proc/self/fd


class AttachError(ShmqError):
    """The worker refused the session or the handshake failed."""


def socket_path(data_dir: Path | str, node_id: int) -> Path:
    return Path(data_dir) / "run" / f"worker-{node_id}.sock"


class ShortPath:
    """A path usable with ``bind``/``connect`` even when longer than ``sun_path`` allows:
    ``/proc/self/fd/<dir fd>/<name>`` (the directory is held open meanwhile)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        text = str(path)
        if len(text.encode()) > _SUN_PATH_MAX:
            self._fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            text = f"/proc/self/fd/{self._fd}/{path.name}"
        self.text = text

    def __enter__(self) -> str:
        return self.text

    def __exit__(self, *exc: Any) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] = ()) -> None:  # type: ignore[assignment]
    data = json.dumps(message).encode()
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.send(data)


def receive_message(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors it carried; ``(None, [])`` at EOF.  Malformed input
    raises ``AttachError`` (any descriptors that came with it are closed first)."""
    fds = array.array("i")
    data, ancdata, flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    received = list(fds)
    if not data:
        for fd in received:
            os.close(fd)
        return None, []
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise AttachError("message or descriptors truncated")
        message = json.loads(data)
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise AttachError("a session message is a JSON object with an 'op'")
    except (ValueError, AttachError) as exc:
        for fd in received:
            os.close(fd)
        raise AttachError(f"bad session message: {exc}") from None
    return message, received


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end (``SO_PEERCRED``)."""
    import struct

    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
