"""infra.local.ports: a free loopback port, and why a given one cannot be bound."""

from __future__ import annotations

import socket

from infra.local.ports import bind_error, free_port


def test_a_free_port_can_be_bound_and_a_taken_one_is_explained():
    port = free_port()
    assert 1024 <= port <= 65535
    assert bind_error(port) is None
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        problem = bind_error(port)
        assert problem is not None and "in use" in problem.lower()
    assert bind_error(port) is None  # released again
