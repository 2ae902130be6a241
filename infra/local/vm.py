"""One emulated TPU VM: a process group that boots by running its startup script.

Booting does what the GCE guest agent does on a TPU VM: read ``startup-script`` from the
VM's own metadata server and run it with bash. The process group (a new session) holds the
script, its log prefixer and the trainer, so signals reach all of them, like a VM shutdown:

* :meth:`EmulatedVM.signal` ``SIGTERM``: shutdown / preemption notice;
* ``SIGKILL``: power loss / hardware fault.

The VM's local disk is a directory (``MULTISLICE_HOME``); :meth:`wipe_disk` is what
recreating the VM does to it. Output goes to one log file per VM, appended across boots
with a line marking each boot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from infra.local.metadata import PREFIX, MetadataServer


class EmulatedVM:
    """A TPU VM of slice ``slice_id`` with worker index ``worker``.

    Args:
      slice_id, worker: position in the queued resource.
      home: the VM's local disk (``MULTISLICE_HOME``).
      log_path: where the VM's console output is appended.
      metadata: the VM's metadata server (attributes may change between boots).
    """

    def __init__(self, slice_id: int, worker: int, home: Path, log_path: Path, metadata: MetadataServer):
        self.slice_id = slice_id
        self.worker = worker
        self.home = home
        self.log_path = log_path
        self.metadata = metadata
        self.proc: subprocess.Popen | None = None
        self.boots = 0

    @property
    def name(self) -> str:
        return f"slice {self.slice_id} worker {self.worker}"

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def boot(self, env: dict[str, str]) -> None:
        """Fetch the startup script from metadata and run it in a new process group."""
        request = urllib.request.Request(
            f"http://{self.metadata.address}{PREFIX}startup-script", headers={"Metadata-Flavor": "Google"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            script = response.read()
        self.home.mkdir(parents=True, exist_ok=True)
        script_path = self.home / "startup-script"
        script_path.write_bytes(script)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.boots += 1
        with open(self.log_path, "ab") as log:
            log.write(f"===== boot {self.boots} of {self.name} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                ["bash", str(script_path)],
                cwd=self.home,
                env={**env, "GCE_METADATA_IP": self.metadata.address, "MULTISLICE_HOME": str(self.home)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def poll(self) -> int | None:
        """Exit status of the startup script, or None while it runs (or before boot)."""
        return self.proc.poll() if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def group_alive(self) -> bool:
        """True while any process of the VM's process group exists (children may outlive bash)."""
        if self.proc is None:
            return False
        self.proc.poll()
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every process of the VM."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float) -> None:
        """SIGTERM, wait up to ``grace_s`` for the whole group to exit, then SIGKILL."""
        if not self.group_alive():
            return
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.group_alive():
            time.sleep(0.1)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole group and reap the script."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.group_alive():
            time.sleep(0.05)

    def wipe_disk(self) -> None:
        """Recreating a VM gives it a fresh boot disk."""
        import shutil

        shutil.rmtree(self.home, ignore_errors=True)
