"""infra.emulated.ports: a free loopback port outside the kernel's ephemeral range, and why a given
one cannot be bound."""

from __future__ import annotations

import socket

from infra.emulated import ports
from infra.emulated.ports import bind_error, free_port


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


def test_ports_are_picked_below_the_ephemeral_range_the_kernel_gives_connections(tmp_path, monkeypatch):
    # What Linux says here (e.g. "32768\t60999"), and a range of our own.
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    assert all(ports.LOWEST <= free_port() < low for _ in range(20))
    (tmp_path / "range").write_text("40000\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "range")
    assert all(ports.LOWEST <= free_port() < 40000 for _ in range(20))


def test_a_port_taken_on_any_address_is_not_picked(tmp_path, monkeypatch):
    # A range of exactly 1,000 ports, all but one bound on IPv6's loopback: free on 127.0.0.1
    # still, but not on the wildcard address JAX's coordinator binds. The one left is the pick.
    (tmp_path / "range").write_text(f"{ports.LOWEST + 1000}\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "range")
    # Random picks among 1,000 ports with one free: 5,000 tries miss it with probability
    # 0.999**5000 = e**-5 (0.7 %, and it failed CI once that way); 50,000 with e**-50.
    monkeypatch.setattr(ports, "ATTEMPTS", 50_000)
    taken = []
    try:
        for port in range(ports.LOWEST, ports.LOWEST + 1000):
            sock = socket.socket(socket.AF_INET6)
            try:
                sock.bind(("::1", port))
            except OSError:
                sock.close()
                continue  # already taken by something else: just as good
            taken.append(sock)
        left = taken.pop()  # the one port released: free now, and the only one
        free = left.getsockname()[1]
        left.close()
        assert {free_port() for _ in range(3)} == {free}
    finally:
        for sock in taken:
            sock.close()


def test_an_unreadable_or_tiny_range_falls_back_to_the_kernel_s_pick(tmp_path, monkeypatch):
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_low() == ports.DEFAULT_EPHEMERAL_LOW
    (tmp_path / "range").write_text(f"{ports.LOWEST + 10}\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "range")
    port = free_port()
    assert not ports.LOWEST <= port < ports.LOWEST + 10 and bind_error(port) is None
