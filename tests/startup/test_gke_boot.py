"""The startup script as a gke Pod's container runs it (``/bin/bash startup.sh``, no systemd): the same
release as a VM's, its place from the environment GKE and the JobSet give the Pod, the trainer in
the foreground with the unit's environment, a SIGTERM to the container's process passed on to the
trainer, and the container ending with the trainer's status (docs/gke.md sections 4 to 6)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import startup
from infra.backends.gke.spec import SPEC as GKE
from infra.config import StackConfig
from infra.emulated import node_mounts
from tests.fakes.startup_vm import ROOT, RUN_DIR, Vm, dev_stack, gcs  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def pod_script(dev_stack: StackConfig) -> startup.RenderedScript:
    return startup.render(dev_stack, project_root=ROOT, spec=GKE)


@pytest.fixture
def pod(tmp_path, pod_script, gcs) -> Iterator[Vm]:
    machine = Vm(tmp_path, pod_script.text, {}, gcs)  # GKE's metadata server: a token, no attributes of ours
    with machine.metadata:
        yield machine


#: Runs its arguments with SIGINT at its default action, as a container's runtime starts the
#: container's process. The suite may not have it: started in the background (`pytest &`, `nohup`),
#: it inherits SIGINT ignored, and bash can neither trap nor reset a signal ignored when it started,
#: so the container would never see the SIGINT. An exec wrapper, not ``preexec_fn``: that runs
#: Python in a fork of this multithreaded process (JAX's threads), where a lock another thread held
#: can deadlock the child before its exec (https://docs.python.org/3/library/subprocess.html#popen-constructor).
WITH_DEFAULT_SIGINT = [
    sys.executable,
    "-I",
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]


#: Runs its arguments with the folder its first argument names mounted non-executable, as a GKE node's
#: Container-Optimized OS mounts the node folder a hostPath brings into the container.
WITH_NOEXEC = [
    sys.executable,
    "-c",
    "import os, sys; from pathlib import Path; from infra.emulated.node_mounts import enter_noexec; "
    "enter_noexec([Path(sys.argv[1])]); os.execv(sys.argv[2], sys.argv[2:])",
]


def cache_env(node: Path) -> dict[str, str]:
    """A Pod's MULTISLICE_NODE_CACHE: its node's folder (the JobSet's hostPath)."""
    return {"MULTISLICE_NODE_CACHE": str(node)}


def container(machine: Vm, *, use_fake_python: bool = True, noexec: Path | None = None, **env: str) -> subprocess.Popen:
    """Start the Pod's container: ``/bin/bash startup.sh`` as its one process (its own session),
    with SIGINT at its default action as a container's runtime starts it (``use_fake_python``
    False: the boot builds its virtualenv, with the harness's fake uv; ``noexec``: a folder mounted
    non-executable for it, created if missing)."""
    mount: list[str] = []
    if noexec is not None:
        problem = node_mounts.noexec_problem()
        if problem is not None:
            pytest.skip(f"this machine cannot mount a folder non-executable for a process: {problem}")
        noexec.mkdir(parents=True, exist_ok=True)
        mount = [*WITH_NOEXEC, str(noexec)]
    return subprocess.Popen(
        [*mount, *WITH_DEFAULT_SIGINT, "/bin/bash", str(machine.script)],
        env=machine.env(use_fake_python=use_fake_python, **env),
        cwd=machine.home,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        Vm.kill_all(proc)
    return proc.returncode, out


#: What the JobSet's Pod of worker 1 of slice 1 has: GKE's TPU_WORKER_ID, the Pod's own values.
SLICE_1_WORKER_1 = {"TPU_WORKER_ID": "1", "MEGASCALE_SLICE_ID": "1", "MULTISLICE_RUN_DIR": RUN_DIR}


def test_the_pod_runs_the_trainer_in_the_foreground_with_the_units_environment(pod, pod_script):
    code, out = finish(container(pod, **SLICE_1_WORKER_1))
    assert code == 0, out
    assert f"[slice ? worker ?] gke: worker 1 of slice 1 (TPU_WORKER_ID, MEGASCALE_SLICE_ID), run dir {RUN_DIR}" in out
    assert "[slice 1 worker 1] boot: done; the trainer runs in the foreground: the container ends with it" in out
    assert "[slice 1 worker 1] fake trainer attempt 1 on stdout" in out
    assert "[slice 1 worker 1] trainer: exited with status 0: training is complete" in out
    assert pod.attempts == 1
    release = pod.home / "releases" / pod_script.release_id
    assert pod.argv(1)[1:] == ["-m", "training", "run", "--config", f"{release}/config.json", "--run-dir", RUN_DIR]
    env = pod.environ(1)
    assert {
        k: env.get(k) for k in ("MULTISLICE_SLICE", "MULTISLICE_WORKER", "TPU_WORKER_ID", "MEGASCALE_SLICE_ID")
    } == {
        "MULTISLICE_SLICE": "1",
        "MULTISLICE_WORKER": "1",
        "TPU_WORKER_ID": "1",
        "MEGASCALE_SLICE_ID": "1",
    }
    assert env["MULTISLICE_IDENTITY"] == "environment" and env["MULTISLICE_LOG_RESOURCE"] == "k8s_container"
    assert env["PYTHONPATH"].split(":")[0] == str(release)
    assert not pod.unit_dir.exists()  # no systemd unit in a container


def test_one_slice_is_slice_0_without_megascale_values(pod):
    code, out = finish(container(pod, TPU_WORKER_ID="0", MULTISLICE_RUN_DIR=RUN_DIR))
    assert code == 0, out
    assert "[slice 0 worker 0] fake trainer attempt 1 on stdout" in out


@pytest.mark.parametrize(
    ("mode", "status", "line"),
    [
        (
            "config-error",
            78,
            "exited with status 78: its configuration cannot work here; the container ends (the JobSet's failure "
            "policy decides what follows)",
        ),
        ("always-fail", 5, "exited with status 5 (exit-code)"),
    ],
)
def test_the_container_ends_with_the_trainers_status_and_nothing_restarts_it(pod, mode, status, line):
    code, out = finish(container(pod, FAKE_MODE=mode, **SLICE_1_WORKER_1))
    assert code == status, out
    assert f"[slice 1 worker 1] trainer: {line}" in out
    assert pod.attempts == 1  # the Pod's restart policy and the JobSet decide what follows


def test_a_sigterm_to_the_container_reaches_the_trainer_which_saves_and_ends_75(pod):
    proc = container(pod, FAKE_MODE="save-on-term", **SLICE_1_WORKER_1)
    try:
        pod.wait_for_file("ready.1", proc)
        proc.send_signal(signal.SIGTERM)  # the kubelet signals the container's first process only
        code, out = finish(proc)
    finally:
        Vm.kill_all(proc)
    assert code == 75, out
    assert (pod.fake_dir / "saved.1").is_file()
    assert (
        "[slice 1 worker 1] trainer: exited with status 75: it saved a checkpoint after a stop notice "
        "(a preemption, a maintenance event, a stop)"
        " or to change its slice count (elastic)" in out
    )


def test_the_sigterm_reaches_every_process_of_the_trainers_group(pod):
    # As systemd signals a unit's cgroup: a command's own child saves too, though its parent ignores it.
    proc = container(pod, FAKE_MODE="group-term", **SLICE_1_WORKER_1)
    try:
        pod.wait_for_file("ready.1", proc)
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
    finally:
        Vm.kill_all(proc)
    assert code == 75, out
    assert (pod.fake_dir / "child-saved.1").read_text() == "saved\n"


def test_a_sigint_to_the_container_reaches_the_trainer(pod):
    # The fake trainer handles SIGTERM only: SIGINT's default action ends it (a child started
    # without job control would have it ignored, and the container would wait for ever).
    proc = container(pod, FAKE_MODE="wait-term", **SLICE_1_WORKER_1)
    try:
        pod.wait_for_file("ready.1", proc)
        proc.send_signal(signal.SIGINT)
        code, out = finish(proc, timeout=60)
    finally:
        Vm.kill_all(proc)
    assert code == 128 + signal.SIGINT, out
    assert "[slice 1 worker 1] trainer: ended by signal INT (signal)" in out


def test_a_trainer_killed_by_a_signal_ends_the_container_with_128_plus_it(pod):
    proc = container(pod, FAKE_MODE="wait-term", **SLICE_1_WORKER_1)
    try:
        pod.wait_for_file("ready.1", proc)
        (trainer,) = pod.trainer_processes()
        subprocess.run(["kill", "-KILL", str(trainer)], check=True)
        code, out = finish(proc)
    finally:
        Vm.kill_all(proc)
    assert code == 128 + signal.SIGKILL, out
    assert "[slice 1 worker 1] trainer: ended by signal KILL (signal)" in out


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MULTISLICE_RUN_DIR": RUN_DIR}, "TPU_WORKER_ID='' is not a worker number: GKE sets it"),
        ({"TPU_WORKER_ID": "one", "MULTISLICE_RUN_DIR": RUN_DIR}, "TPU_WORKER_ID='one' is not a worker number"),
        (
            {"TPU_WORKER_ID": "0", "MEGASCALE_SLICE_ID": "", "MULTISLICE_RUN_DIR": RUN_DIR},
            "MEGASCALE_SLICE_ID='' is not a slice number",
        ),
        ({"TPU_WORKER_ID": "0"}, "MULTISLICE_RUN_DIR='' is not a run directory"),
        (
            {"TPU_WORKER_ID": "0", "MULTISLICE_RUN_DIR": "gs://a b"},
            "MULTISLICE_RUN_DIR='gs://a b' is not a run directory",
        ),
    ],
)
def test_a_pod_without_its_place_stops_with_one_line_naming_the_variable(pod, env, message):
    code, out = finish(container(pod, **env))
    assert code == 1, out
    assert f"[slice ? worker ?] error: {message}" in out
    assert pod.attempts == 0


def test_a_pod_started_again_on_its_node_unpacks_the_virtualenv_its_node_keeps(pod, pod_script):
    """The Pod's MULTISLICE_HOME is its container's own filesystem; its node keeps a folder across Pods
    (a hostPath: infra/backends/gke/jobset.py), mounted non-executable as a GKE node's OS mounts it. The
    first Pod on a node builds the virtualenv and archives it there; the next one on that node (JobSet
    recreates every Job after another slice's preemption), in a new container, unpacks it and builds
    nothing."""
    node = pod.tmp / "node"
    code, first = finish(container(pod, use_fake_python=False, noexec=node, **SLICE_1_WORKER_1, **cache_env(node)))
    assert code == 0, first
    sha = pod_script.requirements_sha256
    assert f"release {pod_script.release_id[:12]} (unpacked by this boot)" in first
    assert f"[slice 1 worker 1] venv: building venvs/{sha[:12]}" in first
    assert f"[slice 1 worker 1] venv: archived venvs/{sha[:12]} in the node cache" in first
    built = (pod.fake_dir / "calls").read_text().splitlines()
    assert len(built) == 4  # pip (uv), uv python install, uv venv, uv pip install (tests/startup/test_faults.py)
    assert sorted(p.name for p in (node / "venvs").iterdir()) == [f"{sha}.tar"]
    shutil.rmtree(pod.home)  # a new Pod: a new container, the node's folder as it was
    pod.home.mkdir()
    code, again = finish(container(pod, use_fake_python=False, noexec=node, **SLICE_1_WORKER_1, **cache_env(node)))
    assert code == 0, again
    assert f"[slice 1 worker 1] venv: unpacked venvs/{sha[:12]} from the node cache" in again
    assert "venv: building" not in again and (pod.fake_dir / "calls").read_text().splitlines() == built
    assert "[slice 1 worker 1] fake trainer attempt 2 on stdout" in again  # the unpacked virtualenv's Python
    assert pod.argv(2)[0] == str(pod.home / "venvs" / sha / "bin" / "python")


def test_a_damaged_archive_in_the_node_cache_is_removed_and_the_virtualenv_built(pod, pod_script):
    node = pod.tmp / "node"
    sha = pod_script.requirements_sha256
    (node / "venvs").mkdir(parents=True)
    (node / "venvs" / f"{sha}.tar").write_bytes(b"not a tar")
    code, out = finish(container(pod, use_fake_python=False, noexec=node, **SLICE_1_WORKER_1, **cache_env(node)))
    assert code == 0, out
    assert f"venv: the node cache's archive of venvs/{sha[:12]} is damaged; removing it" in out
    assert f"venv: building venvs/{sha[:12]}" in out and f"venv: archived venvs/{sha[:12]}" in out
    assert tarfile.is_tarfile(node / "venvs" / f"{sha}.tar")


def test_the_virtualenv_cannot_run_from_a_non_executable_node_folder(pod):
    """Why the node's folder holds archives only: with MULTISLICE_HOME on it (a hostPath under a GKE
    node's /var, as the JobSet mounted it before), uv cannot be run from there, nor the virtualenv."""
    node = pod.tmp / "node"
    node.mkdir()
    code, out = finish(
        container(pod, use_fake_python=False, noexec=node, MULTISLICE_HOME=str(node), **SLICE_1_WORKER_1)
    )
    assert code == 1, out
    assert f"venv: pip did not install the uv binary at {node}/venvs/.build." in out
    assert "[slice 1 worker 1] error: venv: the build failed" in out
    assert pod.attempts == 0
