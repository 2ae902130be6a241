"""One emulated TPU VM: a process group that boots by running its startup script.

Booting does what the GCE guest agent does on a TPU VM: read ``startup-script`` from the
VM's own metadata server and run it with bash. The process group (a new session,
:class:`infra.local.supervisor.ProcessGroup`) holds the script, its log prefixer and the
trainer, so signals reach all of them, like a VM shutdown:

* ``SIGTERM``: shutdown / preemption notice;
* ``SIGKILL``: power loss / hardware fault.

The VM's local disk is a directory (``MULTISLICE_HOME``); :meth:`EmulatedVM.wipe_disk` is
what recreating the VM does to it. Output goes to one log file per VM, appended across
boots with a line marking each boot.
"""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

from infra.local.metadata import PREFIX, MetadataServer
from infra.local.supervisor import ProcessGroup


class EmulatedVM:
    """A TPU VM of slice ``slice_id`` with worker index ``worker``.

    Args:
      slice_id, worker: position in the queued resource.
      node: the id of the slice's node (``StackConfig.node_ids[slice_id]``).
      home: the VM's local disk (``MULTISLICE_HOME``).
      log_path: where the VM's console output is appended.
      metadata: the VM's metadata server (attributes may change between boots).
    """

    def __init__(self, slice_id: int, worker: int, node: str, home: Path, log_path: Path, metadata: MetadataServer):
        self.slice_id = slice_id
        self.worker = worker
        self.node = node
        self.home = home
        self.log_path = log_path
        self.metadata = metadata
        #: The processes of the current boot; None before the first.
        self.group: ProcessGroup | None = None
        self.boots = 0

    @property
    def name(self) -> str:
        """``slice S worker W``, as the startup script prefixes the VM's log lines."""
        return f"slice {self.slice_id} worker {self.worker}"

    @property
    def pgid(self) -> int | None:
        return self.group.pgid if self.group is not None else None

    def boot(self, env: dict[str, str]) -> ProcessGroup:
        """Fetch the startup script from metadata and run it in a new process group.

        Raises:
          urllib.error.URLError: the metadata server does not answer (10 s timeout).
        """
        request = urllib.request.Request(
            f"http://{self.metadata.address}{PREFIX}startup-script", headers={"Metadata-Flavor": "Google"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            script = response.read()
        self.home.mkdir(parents=True, exist_ok=True)
        script_path = self.home / "startup-script"
        script_path.write_bytes(script)
        self.boots += 1
        self.group = ProcessGroup.start(
            self.name,
            ["bash", str(script_path)],
            log_path=self.log_path,
            env={**env, "GCE_METADATA_IP": self.metadata.address, "MULTISLICE_HOME": str(self.home)},
            cwd=self.home,
            append=True,
            header=f"===== boot {self.boots} of {self.name} =====",
        )
        return self.group

    def wipe_disk(self) -> None:
        """Recreating a VM gives it a fresh boot disk."""
        shutil.rmtree(self.home, ignore_errors=True)
