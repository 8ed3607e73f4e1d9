"""Workers start as forks of a process that has already imported shmq.

Why: a worker started as ``python -m shmq.worker`` spent ~0.55 s of CPU importing shmq, kio,
numpy and asyncio before it could recover a single log (2-core box, Hypothesis kept out); the
broker's start paid that after the controller's own imports, and a SIGKILLed worker was back
only after ~1.2 s.  A fork of a process that has the modules loaded is serving in ~0.1 s.

How (the zygote of Android, Python's ``multiprocessing`` forkserver):

* The controller forks the server once, before its event loop, executor threads, listeners or
  shared memory exist, so what the server holds is only imported code.
* The server waits on a ``SOCK_SEQPACKET`` socket.  A request is the worker's argv (JSON) with
  its descriptors attached (``SCM_RIGHTS``): the control socket and the listening socket, each
  named by the flag that passes it (``--control-fd``, ``--listen-fd``).  The server forks a middle process, which forks
  the worker and exits at once; the server reaps the middle one and answers the worker's pid.
* The controller is a child subreaper (``PR_SET_CHILD_SUBREAPER``): an orphaned worker is
  re-parented to it, not to init, so the controller waits for its workers and reads their exit
  codes as it did for children it spawned itself (``ForkedProcess``).  The re-parenting has
  happened by the time the pid is answered: the middle process has exited.
* The server exits when the controller does (end of file on its socket, and
  ``PR_SET_PDEATHSIG``); a worker still exits when its control channel closes.

If the server cannot answer, the controller starts that worker with ``python -m shmq.worker``;
``SHMQ_FORK_SERVER=0`` in the environment starts every worker that way (to compare, or to
rule the fork server out).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
_MAX_REQUEST = 1 << 20
_ANSWER_WITHIN = 10.0  # seconds


def prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class ForkedProcess:
    """A worker forked by the server and re-parented to this process: ``subprocess.Popen``'s
    ``pid``, ``returncode``, ``wait``, ``poll`` and ``kill``, over ``os.waitpid``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()  # one waitpid at a time (the reaper and shutdown both wait)

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None:
            raise NotImplementedError("ForkedProcess.wait blocks; run it in an executor")
        with self._lock:
            if self.returncode is None:
                try:
                    _, status = os.waitpid(self.pid, 0)
                except ChildProcessError:  # not ours any more (cannot happen as a subreaper)
                    self.returncode = 255
                else:
                    self._reaped(status)
        return self.returncode  # type: ignore[return-value]

    def poll(self) -> int | None:
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self._reaped(status)
            except ChildProcessError:
                self.returncode = 255
            finally:
                self._lock.release()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkServer:
    """The controller's end: ``start()`` before the event loop, ``fork()`` per worker."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.sock.settimeout(_ANSWER_WITHIN)  # a hung server: the caller falls back to exec
        self._lock = threading.Lock()

    @classmethod
    def start(cls, title: str = "shmq fork-server") -> ForkServer | None:
        """Fork the server (None where that is not possible or not wanted: then every worker
        is exec'd)."""
        if os.environ.get("SHMQ_FORK_SERVER") == "0":
            return None
        import shmq.worker.main as worker_main

        worker_main.preload()
        if not prctl(PR_SET_CHILD_SUBREAPER, 1):
            return None
        controller = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError:  # out of processes or memory: the workers are exec'd instead
            ours.close()
            theirs.close()
            return None
        if pid == 0:  # the server
            code = 1
            try:
                ours.close()
                import setproctitle

                setproctitle.setproctitle(title)  # ps: not a second copy of the controller
                _serve(theirs, controller)
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        return cls(pid, ours)

    def fork(self, argv: list[str], fds: dict[str, socket.socket]) -> ForkedProcess:
        """Start a worker with ``argv`` plus ``<flag> <fd>`` for each of ``fds`` (flag ->
        socket, e.g. ``{"--control-fd": control, "--listen-fd": listener}``)."""
        flags = list(fds)
        with self._lock:
            socket.send_fds(self.sock, [json.dumps({"argv": argv, "fds": flags}).encode()],
                            [fds[f].fileno() for f in flags])
            answer = json.loads(self.sock.recv(_MAX_REQUEST) or b"{}")  # timeout: OSError
        if "pid" not in answer:
            raise OSError(f"fork server: {answer.get('error', 'no answer')}")
        return ForkedProcess(int(answer["pid"]))

    def close(self) -> None:
        """End the server (it exits at end of file) and reap it."""
        self.sock.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _serve(sock: socket.socket, controller: int) -> None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != controller:  # the controller died before the prctl
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the controller decides, and closes us
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, _MAX_REQUEST, 4)
        except OSError:
            return
        if not msg:
            return
        try:
            request = json.loads(msg)
            flags = request.get("fds", ["--control-fd"])
            if len(fds) != len(flags):
                raise ValueError(f"expected {len(flags)} descriptors, got {len(fds)}")
            argv = list(request["argv"])
            for flag, fd in zip(flags, fds, strict=True):
                argv += [flag, str(fd)]
            pid = _fork_worker(sock, argv, controller)
            answer: dict[str, Any] = {"pid": pid}
        except Exception as exc:  # noqa: BLE001 - every failure is the controller's to handle
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(answer).encode())


def _fork_worker(server_sock: socket.socket, argv: list[str], controller: int) -> int:
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _become_worker(server_sock, argv, controller)
            os.write(w, struct.pack("=i", pid))
        finally:
            os._exit(0)
    os.close(w)
    try:
        data = os.read(r, 4)
    finally:
        os.close(r)
        os.waitpid(middle, 0)  # the worker is the controller's child from here on
    if len(data) != 4:
        raise OSError("the middle process died before forking the worker")
    return struct.unpack("=i", data)[0]


def _become_worker(server_sock: socket.socket, argv: list[str], controller: int) -> None:
    code = 1
    try:
        server_sock.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        deadline = time.monotonic() + 5
        while os.getppid() != controller:  # until the middle process has exited
            if time.monotonic() > deadline:
                return  # the controller is gone
            time.sleep(0.0005)
        from shmq.worker.main import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report, then exit as a crashed worker would
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
