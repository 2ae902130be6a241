"""infra.emulated.gcs: the emulated Cloud Storage (fake-gcs-server) keeps what it stores across
restarts, is found by the storage clients through their own settings, leaves no process or
port behind, and says in one line why it cannot start."""

from __future__ import annotations

import os
import platform
import socket

import psutil
import pytest

from infra.emulated import gcs, gcs_clients
from infra.emulated.gcs import GcsServer, GcsServerError
from training.run_dir import RunDir


def listening(port: int) -> bool:
    """True if a socket listens on TCP ``port`` (closed connections lingering in TIME_WAIT
    are not a server left behind: a new server binds the port with SO_REUSEADDR)."""
    return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in psutil.net_connections("tcp"))


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("acme-ml-dev-dev-ckpt", None),
        ("a_b.c-d", None),
        ("ab", "3–63"),
        ("a" * 64, "3–63"),
        (".".join(["a" * 63] * 3), None),
        ("Upper", "lowercase"),
        ("-dash", "starting and ending"),
        ("192.168.5.4", "IP address"),
        ("goog-bucket", "goog"),
        ("my-google-runs", "google"),
    ],
)
def test_bucket_names_cloud_storage_would_refuse(name, problem):
    error = gcs.bucket_name_error(name)
    assert error is None if problem is None else problem in error


def test_objects_survive_a_restart_of_the_server(tmp_path):
    first = GcsServer(tmp_path / "gcs", tmp_path / "server.log")
    with first:
        assert first.create_bucket("b-1") is True
        restore = gcs_clients.point_clients_at(first.url)
        try:
            RunDir("gs://b-1/runs/r").write("metrics/00000000.jsonl", b'{"step": 1}\n')
        finally:
            restore()
    assert (tmp_path / "gcs" / "b-1" / "runs" / "r" / "metrics" / "00000000.jsonl").is_file()  # the backend's layout
    second = GcsServer(tmp_path / "gcs", tmp_path / "server.log")
    with second, gcs_clients.clients_pointed_at(tmp_path / "gcs", tmp_path / "server.log", second.url) as stored:
        assert stored
        assert second.create_bucket("b-1") is False  # it still exists
        assert RunDir("gs://b-1/runs/r").read("metrics/00000000.jsonl") == b'{"step": 1}\n'


def test_stop_leaves_no_process_and_no_port(tmp_path):
    server = GcsServer(tmp_path / "gcs", tmp_path / "server.log")
    server.start()
    pid, port = server.group.pgid, server.port
    assert listening(port)
    server.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not listening(port) and not server.alive()


def test_a_taken_fixed_port_is_one_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(GcsServerError, match=rf"^--gcs-port {port} is already in use \(.*\); choose another port"):
            GcsServer(tmp_path / "gcs", tmp_path / "server.log", port=port).start()


def test_a_missing_binary_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(gcs.BINARY_ENV, str(tmp_path / "nope"))
    with pytest.raises(
        GcsServerError, match=rf"{gcs.BINARY_ENV}=.*nope is not an executable file; install fake-gcs-server"
    ):
        GcsServer(tmp_path / "gcs", tmp_path / "server.log").start()


def test_no_wheel_binary_for_this_platform_says_how_to_proceed(monkeypatch):
    monkeypatch.delenv(gcs.BINARY_ENV, raising=False)
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    with pytest.raises(GcsServerError) as error:
        gcs.find_binary()
    assert "has no binary for linux-riscv64" in str(error.value) and f"set {gcs.BINARY_ENV}=" in str(error.value)


def test_a_server_that_exits_at_start_is_reported_with_its_last_line(tmp_path, monkeypatch):
    fake = tmp_path / "fake-gcs-server"
    fake.write_text("#!/bin/sh\necho 'starting'\necho 'fatal: cannot open the backend' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv(gcs.BINARY_ENV, str(fake))
    with pytest.raises(
        GcsServerError, match=r"exited at start with status 3: fatal: cannot open the backend \(its log: "
    ):
        GcsServer(tmp_path / "gcs", tmp_path / "server.log").start()


def test_clients_are_pointed_at_a_running_or_a_temporary_server(tmp_path):
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    with gcs_clients.clients_pointed_at(tmp_path / "none", tmp_path / "server.log") as stored:
        assert stored is False  # nothing stored yet: no server started
    with GcsServer(tmp_path / "gcs", tmp_path / "server.log") as running:
        with gcs_clients.clients_pointed_at(tmp_path / "gcs", tmp_path / "server.log", running.url) as stored:
            assert stored and os.environ["STORAGE_EMULATOR_HOST"] == running.url
        assert os.environ.get("STORAGE_EMULATOR_HOST") == before
    with gcs_clients.clients_pointed_at(tmp_path / "gcs", tmp_path / "server.log", running.url) as stored:
        url = os.environ["STORAGE_EMULATOR_HOST"]  # the recorded server is gone: a temporary one
        assert stored and url != running.url and os.environ["TENSORSTORE_GCS_HTTP_URL"] == url
    assert os.environ.get("STORAGE_EMULATOR_HOST") == before
    assert not listening(int(url.rsplit(":", 1)[1]))  # the temporary server was stopped


def test_a_port_another_server_took_first_is_not_taken_for_this_one(tmp_path, monkeypatch):
    """A free port is free only until someone binds it: when another storage server (another
    emulation, another test) takes it first, it answers on it while this one exits with "address
    already in use". The start must not take that answer for its own (its clients would write to
    the other server's buckets): it tries another port."""
    import http.server
    import threading

    class Answers(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server naming)
            body = b'{"kind": "storage#buckets"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    taken = other.server_address[1]
    ports = iter([taken])
    real = gcs.free_port
    monkeypatch.setattr(gcs, "free_port", lambda: next(ports, None) or real())
    server = GcsServer(tmp_path / "gcs", tmp_path / "server.log")
    try:
        server.start()
        assert server.port != taken and server.create_bucket("mine")  # its own, empty server
    finally:
        server.stop()
        other.shutdown()
        other.server_close()
