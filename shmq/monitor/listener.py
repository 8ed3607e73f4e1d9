"""The ``--http-listener`` value, parsed apart from the listener itself: a broker started with
``--http-listener none`` never imports ``shmq.monitor.http`` (h11, the exposition, the
collector: ~70 ms of its start)."""

from __future__ import annotations

__all__ = ["parse_listener"]


def parse_listener(text: str) -> tuple[str, int] | None:
    """``host:port`` (``[::1]:port`` too) or ``none``; raises ValueError otherwise."""
    if text.strip().lower() == "none":
        return None
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--http-listener must be host:port or none, got {text!r}")
    return host, int(port)
