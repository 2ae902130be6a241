"""Loopback TCP ports for the local emulation's coordinators."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bind_error(port: int) -> str | None:
    """Why 127.0.0.1:``port`` cannot be bound (the OS's message), or None if it can."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            return err.strerror or str(err)
    return None
