"""One emulated TPU VM: a session whose first process is the VM's (emulated) systemd.

Booting does what a TPU VM does: the guest agent reads ``startup-script`` from the VM's own
metadata server and systemd runs it in ``google-startup-scripts.service``; the script hands
the trainer to ``multislice-trainer.service``. Here the first process is
``python -m infra.emulated.systemd boot`` (:mod:`infra.emulated.systemd`), which runs the script,
serves its ``systemctl`` and supervises the trainer unit from the unit file the script wrote.
An emulated GKE Pod (``pod_env`` given) has no systemd: its container's first process is
``/bin/bash`` running the script (:func:`pod_command`), with the Pod's environment.
The VM's processes form one session (:class:`VmProcesses`), and signals reach them as they
reach a VM:

* ``SIGTERM``: ACPI shutdown / preemption notice, delivered to the VM's systemd, which stops
  the units (``KillSignal=`` to the trainer, SIGKILL after ``TimeoutStopSec=``) and then the rest;
* ``SIGKILL``: power loss / hardware fault, delivered to every process of the VM at once.

The VM's local disk is a directory (``MULTISLICE_HOME``; unit files in its ``systemd/``,
the ``/run`` analogue in ``run/``); :meth:`EmulatedVM.wipe_disk` is what recreating the VM
does to it. Output goes to one log file per VM (the serial console), appended across boots
with a line marking each boot and its UTC time.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import urllib.request
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from infra.emulated.metadata import PREFIX, MetadataServer
from infra.emulated.service_manager import session_pids
from infra.emulated.stop_signals import signals_held
from infra.emulated.supervisor import ProcessGroup
from infra.vm_contract import HOME_ENV, METADATA_HOST_ENV, NODE_CACHE_ENV, STARTUP_SCRIPT_KEY


class VmProcesses(ProcessGroup):
    """The processes of one emulated VM: a session led by its systemd (``pgid`` = its pid).

    Units run in process groups of their own inside the session (their cgroups), so a VM-wide
    signal cannot be a ``killpg``: SIGKILL goes to every process of the session (power loss),
    any other signal to the VM's systemd alone (it stops the units as systemd does).
    """

    def signal(self, sig: signal.Signals) -> None:
        targets = session_pids(self.pgid) if sig == signal.SIGKILL else [self.proc.pid]
        for pid in targets:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def alive(self) -> bool:
        self.proc.poll()  # reap the leader if it exited, so a zombie does not count
        return bool(session_pids(self.pgid))


class EmulatedVM:
    """A TPU VM of slice ``slice_id`` with worker index ``worker``.

    Args:
      slice_id, worker: position in the queued resource.
      node: the id of the slice's node (``StackConfig.node_ids[slice_id]``).
      home: the VM's local disk (``MULTISLICE_HOME``).
      log_path: where the VM's console output is appended.
      metadata: the VM's metadata server (attributes may change between boots).
      pod_env: a Pod's own environment (:meth:`~infra.backends.interface.Emulation.pod_environment`):
        its container's first process runs the startup script with it, no systemd; None: a VM.
      node_cache: a Pod's node folder (``MULTISLICE_NODE_CACHE``), which outlives its Pods; ``home``
        is then the container's own filesystem, which does not.
      noexec: mount ``node_cache`` non-executable for the Pod, as its node's OS does
        (:mod:`infra.emulated.node_mounts`).
    """

    def __init__(
        self,
        slice_id: int,
        worker: int,
        node: str,
        home: Path,
        log_path: Path,
        metadata: MetadataServer,
        pod_env: dict[str, str] | None = None,
        node_cache: Path | None = None,
        noexec: bool = False,
    ) -> None:
        self.slice_id = slice_id
        self.worker = worker
        self.node = node
        self.home = home
        self.log_path = log_path
        self.metadata = metadata
        self.pod_env = pod_env
        self.node_cache = node_cache
        self.noexec = noexec
        #: The processes of the current boot; None before the first.
        self.group: VmProcesses | None = None
        self.boots = 0

    @property
    def name(self) -> str:
        """``slice S worker W``, as the startup script prefixes the VM's log lines."""
        return f"slice {self.slice_id} worker {self.worker}"

    @property
    def pgid(self) -> int | None:
        return self.group.pgid if self.group is not None else None

    @property
    def unit_dir(self) -> Path:
        """The VM's ``/etc/systemd/system`` (on its disk: it survives a reboot, not a recreation)."""
        return self.home / "systemd"

    def boot(self, env: dict[str, str]) -> VmProcesses:
        """Fetch the startup script from metadata and boot: the VM's systemd runs it.

        Raises:
          urllib.error.URLError: the metadata server does not answer (10 s timeout).
        """
        request = urllib.request.Request(
            f"http://{self.metadata.address}{PREFIX}{STARTUP_SCRIPT_KEY}", headers={"Metadata-Flavor": "Google"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            script = response.read()
        self.home.mkdir(parents=True, exist_ok=True)
        # The VM's /tmp, on its disk (the libtpu lock file's directory too: vm_site): what its
        # processes leave there (a killed trainer's TensorBoard spool, a script's mktemp) goes
        # with the VM's disk, never into this machine's /tmp.
        tmp = self.home / "tmp"
        tmp.mkdir(exist_ok=True)
        script_path = self.home / "startup-script"
        script_path.write_bytes(script)
        runtime = self.home / "run"
        shutil.rmtree(runtime, ignore_errors=True)  # /run is empty at every boot
        node_env: dict[str, str] = {}
        if self.node_cache is not None:
            self.node_cache.mkdir(parents=True, exist_ok=True)
            node_env[NODE_CACHE_ENV] = str(self.node_cache)
        noexec = [self.node_cache] if self.noexec and self.node_cache is not None else []
        self.boots += 1
        # A stop between the fork and the assignment would leave the VM out of the emulator's
        # shutdown: it is raised once self.group holds it.
        with signals_held():
            group = self.group = VmProcesses.start(
                self.name,
                boot_command(script_path, self.unit_dir, runtime)
                if self.pod_env is None
                else pod_command(script_path, noexec),
                log_path=self.log_path,
                env={
                    **env,
                    **(self.pod_env or {}),
                    **node_env,
                    METADATA_HOST_ENV: self.metadata.address,
                    HOME_ENV: str(self.home),
                    "TMPDIR": str(tmp),
                },
                cwd=self.home,
                append=True,
                # The boot's time: `multislice local logs --since` dates the console lines from it.
                header=f"===== boot {self.boots} of {self.name} at {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} =====",
                lifeline=True,  # its systemd powers the VM off when the emulator dies
            )
        return group

    def wipe_disk(self) -> None:
        """Recreating a VM (or a Pod's node) gives it a fresh boot disk."""
        shutil.rmtree(self.home, ignore_errors=True)
        if self.node_cache is not None:
            shutil.rmtree(self.node_cache, ignore_errors=True)

    def new_container(self) -> None:
        """A new Pod on the same node: its container's own filesystem goes (``MULTISLICE_HOME``: the
        releases and virtualenvs unpacked there, its ``/tmp``, its ``/run``), what the node keeps for it
        stays (``node_cache``, a ``hostPath``: the virtualenvs' archives; infra/backends/gke/jobset.py)."""
        shutil.rmtree(self.home, ignore_errors=True)


def boot_command(script: Path, unit_dir: Path, runtime_dir: Path) -> list[str]:
    """The command that boots an emulated VM: its systemd, running ``script`` as the startup
    script with unit files in ``unit_dir`` and ``/run`` in ``runtime_dir``."""
    return [
        sys.executable,
        "-m",
        "infra.emulated.systemd",
        "boot",
        "--unit-dir",
        str(unit_dir),
        "--runtime-dir",
        str(runtime_dir),
        str(script),
    ]


def pod_command(script: Path, noexec: Iterable[Path] = ()) -> list[str]:
    """The command that starts an emulated Pod: its container's first process, ``/bin/bash
    script``, under the lifeline, which passes the kubelet's signals on to it and mounts each of
    ``noexec`` non-executable for it (:mod:`infra.emulated.node_mounts`)."""
    mounts = [arg for folder in noexec for arg in ("--noexec", str(folder))]
    return [sys.executable, "-m", "infra.emulated.lifeline", "--forward", *mounts, "--", "/bin/bash", str(script)]


def process_groups(vms: Iterable[EmulatedVM]) -> list[ProcessGroup]:
    """The process groups of the VMs that have booted."""
    return [vm.group for vm in vms if vm.group is not None]


def trainer_attempts(vms: Iterable[EmulatedVM]) -> list[int]:
    """The pids of the trainer attempts running on ``vms``: a cold ``python -m training run``, or a
    process the VM's warm standby forked (training/standby.py: its command line is the standby's and
    its parent is the standby). What ``local up --crash`` strikes (infra/local/faults.py)."""
    import psutil

    found = []
    for group in process_groups(vms):
        for pid in session_pids(group.pgid):
            try:
                process = psutil.Process(pid)
                cmdline, parent = process.cmdline(), process.parent()
                forked = "training.standby" in cmdline and parent is not None and "training.standby" in parent.cmdline()
            except psutil.Error:  # gone meanwhile
                continue
            if cmdline[1:4] == ["-m", "training", "run"] or forked:
                found.append(pid)
    return found
