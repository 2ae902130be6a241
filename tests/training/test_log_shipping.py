"""training/log_shipping.py: the VM side of ``multislice logs``. Every line the trainer writes
reaches the console prefixed; on a TPU VM it also reaches Cloud Logging (here a loopback fake
of its REST API) with the resource and labels ``multislice logs`` filters on; locally, or when
Cloud Logging cannot be reached, the trainer is unaffected."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.config import load_stack
from infra.emulated.metadata import MetadataServer
from infra.logs import cloud
from infra.logs.filter import TRAINER_LOG
from tests.fakes.logging_api import FakeLoggingApi
from training import log_shipping

ROOT = Path(__file__).resolve().parents[2]
DEV = load_stack("dev")


class VmMetadata:
    """A TPU VM's metadata server as the shipper reads it: ``project/project-id``,
    ``instance/zone`` and ``instance/attributes/tpu-env`` with its ``NODE_ID`` line (the
    sources are in docs/vm-boot.md)."""

    def __init__(self, values: dict[str, str]):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                path = self.path.removeprefix("/computeMetadata/v1/")
                value = outer.values.get(path) if self.headers.get("Metadata-Flavor") == "Google" else None
                data = (value or "not found").encode()
                self.send_response(200 if value is not None else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.values = values
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return "{}:{}".format(*self._httpd.server_address[:2])

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def tpu_vm_metadata(slice_id: int) -> dict[str, str]:
    return {
        "project/project-id": DEV.project,
        "instance/zone": f"projects/123456789/zones/{DEV.zone}",
        "instance/attributes/tpu-env": f"ACCELERATOR_TYPE: 'v4-8'\nNODE_ID: '{DEV.node_ids[slice_id]}'\n"
        "WORKER_ID: '0'\n",
    }


@pytest.fixture
def fake():
    server = FakeLoggingApi()
    yield server
    server.stop()


def ship(
    lines: list[str],
    metadata_address: str,
    endpoint: str,
    slice_id: int = 1,
    worker: int = 0,
    run_dir: str = "gs://acme-ml-dev-dev-ckpt/runs/dev",
    until=None,
) -> subprocess.CompletedProcess:
    """Run the shipper on ``lines``; with ``until`` (a predicate), keep its input open until
    that holds (at most 120 s), so that a slow start of the client is not cut by the bounded
    flush at end of input."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GCE_METADATA_IP": metadata_address,
        cloud.ENDPOINT_ENV: endpoint,
        "MULTISLICE_SLICE": str(slice_id),
        "MULTISLICE_WORKER": str(worker),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.log_shipping", run_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    proc.stdin.write("".join(f"{line}\n" for line in lines))
    proc.stdin.flush()
    deadline = time.monotonic() + 120
    while until is not None and not until("".join(err)) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.stdin.close()
    out = proc.stdout.read()
    code = proc.wait(timeout=120)
    reader.join(timeout=60)
    return subprocess.CompletedProcess(proc.args, code, out, "".join(err))


def test_the_vm_writes_the_log_multislice_logs_reads():
    assert log_shipping.LOG_NAME == TRAINER_LOG


def test_labels_come_from_the_tpu_vm_metadata():
    found = log_shipping.target("1", "0", "dev", get=tpu_vm_metadata(1).get)
    assert found == (
        "tpu_worker",
        {"project_id": "acme-ml-dev", "zone": "us-central2-b", "node_id": "multislice-dev-1", "worker_id": "0"},
        {"slice": "1", "worker": "0", "run": "dev"},
    )
    for missing in tpu_vm_metadata(1):
        values = {k: v for k, v in tpu_vm_metadata(1).items() if k != missing}
        assert log_shipping.target("1", "0", "dev", get=values.get) is None, missing


def test_a_tpu_vm_ships_every_line_with_its_labels_and_multislice_logs_reads_them(fake, monkeypatch):
    metadata = VmMetadata(tpu_vm_metadata(1))
    try:
        lines = [
            "2026-11-30T17:00:05+0000 INFO [p1] training: step 10/120 loss 3.6",
            "2026-11-30T17:00:06+0000 ERROR [p1] training: something failed",
            "Traceback (most recent call last):",
        ]
        result = ship(lines, metadata.address, fake.url, until=lambda err: len(fake.entries) == len(lines))
    finally:
        metadata.stop()
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"[slice 1 worker 0] {line}" for line in lines]
    assert "log shipping: to Cloud Logging, log multislice-trainer, node multislice-dev-1 worker 0" in result.stderr
    assert [e["textPayload"] for e in fake.entries] == lines
    assert [e.get("severity", "DEFAULT") for e in fake.entries] == ["INFO", "ERROR", "DEFAULT"]
    for written in fake.entries:
        assert written["logName"] == f"projects/{DEV.project}/logs/{TRAINER_LOG}"
        assert written["resource"] == {
            "type": "tpu_worker",
            "labels": {"project_id": DEV.project, "zone": DEV.zone, "node_id": DEV.node_ids[1], "worker_id": "0"},
        }
        assert written["labels"] == {"slice": "1", "worker": "0", "run": "dev"}
    # ... and `multislice logs` finds them with its own filter.
    read = CliRunner().invoke(app, ["logs", "--stack", "dev", "--slice", "1"], env={cloud.ENDPOINT_ENV: fake.url})
    assert read.exit_code == 0, read.output
    assert read.stdout.splitlines() == result.stdout.splitlines()


def test_the_local_emulation_ships_nothing(fake):
    """The emulated metadata server (infra.local) names no project or zone: prefix only."""
    with MetadataServer({"tpu-env": f"NODE_ID: '{DEV.node_ids[0]}'\nWORKER_ID: '0'\n"}) as metadata:
        result = ship(["hello"], metadata.address, fake.url, slice_id=0)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[slice 0 worker 0] hello\n"
    assert result.stderr == "" and fake.writes == []


def test_a_line_longer_than_the_most_read_at_once_goes_on_in_pieces():
    """One line is read at most ``MAX_LINE_BYTES`` at a time: a line without an end never fills memory."""
    longest = log_shipping.MAX_LINE_BYTES
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MULTISLICE_EMULATED_TPU": "1", "MULTISLICE_SLICE": "0"}
    env["MULTISLICE_WORKER"] = "0"  # the emulation's VMs ship nothing: the console only
    result = subprocess.run(
        [sys.executable, "-m", "training.log_shipping", "/tmp/run"],
        input="x" * (2 * longest + 10) + "\nafter\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "[slice 0 worker 0] " + "x" * longest,
        "[slice 0 worker 0] " + "x" * longest,
        "[slice 0 worker 0] " + "x" * 10,
        "[slice 0 worker 0] after",
    ]


def test_an_unreachable_cloud_logging_changes_nothing_for_the_trainer(fake):
    fake.stop()  # nothing listens there any more
    metadata = VmMetadata(tpu_vm_metadata(0))
    try:
        result = ship(
            [f"line {i}" for i in range(5)],
            metadata.address,
            fake.url,
            slice_id=0,
            until=lambda err: "a Cloud Logging write failed" in err,
        )
    finally:
        metadata.stop()
    assert result.returncode == 0
    assert result.stdout.splitlines() == [f"[slice 0 worker 0] line {i}" for i in range(5)]
    failures = [line for line in result.stderr.splitlines() if "a Cloud Logging write failed" in line]
    assert len(failures) == 1, result.stderr  # said once, not per line
    assert "[slice 0 worker 0] log shipping: 5 line(s) not written to Cloud Logging" in result.stderr.splitlines()


def test_sigterm_does_not_stop_the_shipper_before_the_trainer(fake):
    """systemd stops the unit with SIGTERM to every process: the shipper must outlive the trainer's last line."""
    import signal

    with MetadataServer({}) as metadata:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "GCE_METADATA_IP": metadata.address,
            "MULTISLICE_SLICE": "0",
            "MULTISLICE_WORKER": "0",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "training.log_shipping", "runs/dev"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        proc.stdin.write(b"before\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"[slice 0 worker 0] before\n"
        proc.send_signal(signal.SIGTERM)
        proc.stdin.write(b"saved a checkpoint after the preemption notice\n")
        proc.stdin.close()
        assert proc.stdout.read() == b"[slice 0 worker 0] saved a checkpoint after the preemption notice\n"
        assert proc.wait(timeout=60) == 0


def compute_engine_vm_metadata() -> dict[str, str]:
    """A Compute Engine TPU VM's: no tpu-env; the program's backend key; the instance's id."""
    return {
        "project/project-id": DEV.project,
        "instance/zone": f"projects/123456789/zones/{DEV.zone}",
        "instance/id": "4242424242",
        "instance/attributes/multislice-backend": "compute-engine",
        "instance/attributes/multislice-instance-groups": ",".join(DEV.node_ids),
    }


def test_on_compute_engine_the_lines_go_to_the_instance_with_the_run_labels():
    found = log_shipping.target("1", "2", "dev", get=compute_engine_vm_metadata().get)
    assert found == (
        "gce_instance",
        {"project_id": "acme-ml-dev", "instance_id": "4242424242", "zone": "us-central2-b"},
        {"slice": "1", "worker": "2", "run": "dev"},
    )
    for missing in ("instance/id", "instance/attributes/multislice-backend", "project/project-id", "instance/zone"):
        values = {k: v for k, v in compute_engine_vm_metadata().items() if k != missing}
        assert log_shipping.target("1", "2", "dev", get=values.get) is None, missing


def test_the_units_log_resource_decides_whatever_metadata_the_vm_carries(monkeypatch):
    """MULTISLICE_LOG_RESOURCE (written by the boot from the stack's backend) picks the resource: a
    Compute Engine TPU VM that also carries Cloud TPU's tpu-env ships to its instance."""
    both = compute_engine_vm_metadata() | tpu_vm_metadata(1)
    monkeypatch.setenv(log_shipping.LOG_RESOURCE_ENV, "gce_instance")
    assert log_shipping.target("1", "2", "dev", get=both.get)[0] == "gce_instance"
    monkeypatch.setenv(log_shipping.LOG_RESOURCE_ENV, "tpu_worker")
    assert log_shipping.target("1", "2", "dev", get=both.get)[0] == "tpu_worker"
    assert log_shipping.target("1", "2", "dev", get=compute_engine_vm_metadata().get) is None  # no node to name
    monkeypatch.setenv(log_shipping.LOG_RESOURCE_ENV, "k8s_container")  # not one this shipper writes
    assert log_shipping.target("1", "2", "dev", get=both.get) is None


def test_compute_engine_lines_are_what_multislice_logs_reads(tmp_path):
    """The shipper's entry of a Compute Engine VM matches the filter `multislice logs` sends there."""
    from infra.backends.compute_engine.logs import compute_engine_filter
    from infra.config import load_stack_file
    from tests.helpers.compute_engine_stack import stack_file

    config = load_stack_file(stack_file(tmp_path))
    values = compute_engine_vm_metadata() | {
        "project/project-id": config.project,
        "instance/zone": f"projects/1/zones/{config.zone}",
    }
    found = log_shipping.target("0", "0", config.effective_run_name, get=values.get)
    assert found is not None
    kind, resource, labels = found
    clauses = dict(clause.split("=", 1) for clause in compute_engine_filter(config).split(" AND "))
    assert clauses["resource.type"] == f'"{kind}"'
    assert clauses["resource.labels.project_id"] == f'"{resource["project_id"]}"'
    assert clauses["resource.labels.zone"] == f'"{resource["zone"]}"'
    assert clauses["labels.run"] == f'"{labels["run"]}"'
