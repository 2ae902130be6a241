"""The gke backend's Pods as processes, with the real trainer: the emu stack's release rendered for
the gke backend (``infra.startup.render(spec=...)``) runs as the container of each Pod runs it
(``/bin/bash startup.sh``, no systemd), with the environment GKE and the JobSet give a Pod (GKE's
``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES``, the Pod's ``MEGASCALE_*`` and ``MULTISLICE_RUN_DIR``)
on top of the emulated VMs' own (CPU devices, the emulated Cloud Storage). One slice's Pod gets the
kubelet's SIGTERM while the run is held at a step: every process saves the same agreed step and
the containers end 75, which fails their Jobs (JobSet then recreates every Job); new Pods resume
from that step and complete. Not yet the emulation of ``multislice local up`` (docs/gke.md)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infra import startup
from infra.backends.gke.spec import SPEC as GKE
from infra.config import load_stack_file
from infra.local import gcs, topology
from infra.local.metadata import MetadataServer
from infra.local.ports import free_port
from infra.startup import contract
from tests.fakes.gcs_server import FakeGcs
from tests.fakes.startup_vm import Vm
from tests.helpers.emulation import STACK

#: The step the trainers hold after (training.fault_gate), until the test has sent the SIGTERM.
HOLD_AT = 6


def pod_env(base: dict[str, str], slice_id: int, run_dir: str, home: Path) -> dict[str, str]:
    """What one Pod of the emu stack (one VM a slice) has: GKE's webhook's values, the JobSet's
    Pod spec's (docs/gke.md section 4), and its own disk."""
    return base | {
        "TPU_WORKER_ID": "0",
        "TPU_WORKER_HOSTNAMES": "127.0.0.1",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": str(slice_id),
        "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1",
        contract.RUN_DIR_ENV: run_dir,
        contract.HOME_ENV: str(home),
    }


def start_pods(script: Path, env_of: dict[int, dict[str, str]], logs: dict[int, Path]) -> dict[int, subprocess.Popen]:
    pods = {}
    for slice_id, env in env_of.items():
        with logs[slice_id].open("a") as log:
            pods[slice_id] = subprocess.Popen(
                ["/bin/bash", str(script)],
                env=env,
                cwd=env[contract.HOME_ENV],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    return pods


def wait_all(pods: dict[int, subprocess.Popen], logs: dict[int, Path], timeout: float = 300) -> dict[int, int]:
    """Each Pod's container status, once all ended (or AssertionError with their logs' ends)."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in pods.values()):
        if time.monotonic() > deadline:
            raise AssertionError("the Pods did not end in time:\n" + "\n".join(tail(log) for log in logs.values()))
        time.sleep(0.2)
    return {slice_id: p.returncode for slice_id, p in pods.items()}


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text().splitlines()[-lines:]) if log.exists() else f"{log}: no output"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pods_train_across_slices_save_the_agreed_step_on_a_sigterm_and_new_pods_resume(tmp_path):
    config = load_stack_file(STACK)
    assert config.slices == 2 and config.accelerator.hosts == 1
    rendered = startup.render(config, spec=GKE)
    script = tmp_path / "startup.sh"  # the ConfigMap's file
    script.write_text(rendered.text)
    gate = tmp_path / "gate"
    gate.mkdir()
    logs = {s: tmp_path / f"slice-{s}.log" for s in (0, 1)}
    pods: dict[int, subprocess.Popen] = {}
    with FakeGcs() as storage, MetadataServer({}) as metadata:  # GKE's: a token, no attributes of ours
        storage.create_bucket(config.bucket_name)
        base = topology.vm_environment(
            config,
            emulation_id="gke-pods",
            coordinator_port=free_port(),
            heartbeat_timeout_s=10,
            init_timeout_s=300,
            storage_env=gcs.client_env(storage.endpoint),
            bytecode_dir=tmp_path / "bytecode",
        ) | {contract.METADATA_HOST_ENV: metadata.address}
        try:
            # The first Pods, held after HOLD_AT until the gate opens.
            held = base | {"MULTISLICE_FAULT_GATE": str(gate), "MULTISLICE_FAULT_STEPS": str(HOLD_AT)}
            first = {s: pod_env(held, s, config.run_dir, tmp_path / f"pod-{s}-a") for s in (0, 1)}
            for env in first.values():
                Path(env[contract.HOME_ENV]).mkdir()
            pods = start_pods(script, first, logs)
            line = f"fault gate: step {HOLD_AT} done; waiting"
            deadline = time.monotonic() + 300
            while not all(line in (logs[s].read_text() if logs[s].exists() else "") for s in (0, 1)):
                ended = {s: p.returncode for s, p in pods.items() if p.poll() is not None}
                assert not ended and time.monotonic() < deadline, (ended, tail(logs[0]), tail(logs[1]))
                time.sleep(0.2)
            pods[1].send_signal(signal.SIGTERM)  # the kubelet: the container's first process only
            (gate / str(HOLD_AT)).touch()
            assert wait_all(pods, logs) == {0: 75, 1: 75}, (tail(logs[0]), tail(logs[1]))
            saved = {
                s: [int(n) for n in re.findall(r"preemption notice: saved step (\d+)", logs[s].read_text())]
                for s in (0, 1)
            }
            assert saved[0] == saved[1] and len(saved[0]) == 1 and saved[0][0] >= HOLD_AT, saved
            for s in (0, 1):
                assert "trainer: exited with status 75: it saved a checkpoint after a preemption notice" in (
                    logs[s].read_text()
                )
            # JobSet recreates every Job: new Pods (new containers, empty disks) resume and complete.
            second = {s: pod_env(base, s, config.run_dir, tmp_path / f"pod-{s}-b") for s in (0, 1)}
            for env in second.values():
                Path(env[contract.HOME_ENV]).mkdir()
            pods = start_pods(script, second, logs)
            assert wait_all(pods, logs) == {0: 0, 1: 0}, (tail(logs[0]), tail(logs[1]))
        finally:
            for pod in pods.values():
                Vm.kill_all(pod)
    for s in (0, 1):
        text = logs[s].read_text()
        assert f"[slice ? worker ?] gke: worker 0 of slice {s} (TPU_WORKER_ID, MEGASCALE_SLICE_ID)" in text
        assert f"resuming at step {saved[0][0]}/{config.training.steps}: 2 processes" in text, tail(logs[s])
        assert f"training complete at step {config.training.steps}" in text
        assert "trainer: exited with status 0: training is complete" in text
