"""Loopback TCP ports for the local emulation's coordinators and servers.

A port the emulation picks is bound later, by another process (a trainer binds its JAX coordinator
seconds after ``local up`` chose the port, once it has imported JAX). A port the kernel handed out
for ``bind(("127.0.0.1", 0))`` comes from its ephemeral range, from which it also gives every
outgoing connection its local port, so on a machine busy with loopback traffic another connection
can take it meanwhile ("Failed to add port to server" from JAX's coordinator, measured in the test
suite under load). :func:`free_port` therefore picks at random below that range, where the kernel
never allocates a port by itself: Linux's ``net.ipv4.ip_local_port_range`` "defines the local port
range that is used by TCP and UDP to choose the local port" (the kernel's ip-sysctl documentation,
https://docs.kernel.org/networking/ip-sysctl.html; default 32768–60999).
"""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

#: Where Linux keeps its ephemeral port range ("low high").
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The range where it cannot be read (Linux's default; macOS starts at 49152).
DEFAULT_EPHEMERAL_LOW = 32768
#: The lowest port :func:`free_port` picks (above the registered ports most services use).
LOWEST = 20000
#: Random picks tried before the kernel's own pick.
ATTEMPTS = 50

_random = random.SystemRandom()
#: What binding ``::`` fails with on a machine without IPv6 (then IPv4's wildcard is asked).
_NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL)


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (:data:`DEFAULT_EPHEMERAL_LOW` where
    :data:`EPHEMERAL_RANGE_FILE` cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def free_port() -> int:
    """A TCP port free now on 127.0.0.1 and on every address (JAX's coordinator binds ``[::]``),
    chosen at random in ``[LOWEST, ephemeral_low())`` (module docstring); the kernel's pick for
    port 0 when that range is empty or every try was taken."""
    low = ephemeral_low()
    for _ in range(ATTEMPTS if low - LOWEST >= 1000 else 0):
        port = _random.randrange(LOWEST, low)
        if bind_error(port) is None and _wildcard_free(port):
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wildcard_free(port: int) -> bool:
    """Whether ``port`` can be bound on every address (IPv6's ``::``, else IPv4's ``0.0.0.0``)."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family) as sock:
                sock.bind((host, port))
            return True
        except OSError as err:
            if family == socket.AF_INET6 and err.errno in _NO_IPV6:
                continue
            return False
    return False


def bind_error(port: int) -> str | None:
    """Why 127.0.0.1:``port`` cannot be bound (the OS's message), or None if it can."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            return err.strerror or str(err)
    return None
