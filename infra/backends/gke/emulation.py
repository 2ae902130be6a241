"""The gke backend in ``multislice local up``: each Pod a process, with the environment GKE and the
JobSet give it, and JobSet's repair.

* **The Pod**: its container's first process runs the startup script as ``/bin/bash`` does in the
  JobSet's container (no systemd: :attr:`~infra.backends.spec.BackendSpec.supervisor` ``container``);
  the kubelet's SIGTERM goes to that process alone, a node's loss kills every process of the Pod.
* **Its environment** (docs/gke.md section 4): GKE's webhook's ``TPU_WORKER_ID`` and
  ``TPU_WORKER_HOSTNAMES`` (every host of the slice: this machine), and the JobSet's Pod spec's
  ``MULTISLICE_RUN_DIR`` and, with several slices, ``MEGASCALE_NUM_SLICES``,
  ``MEGASCALE_SLICE_ID`` and ``MEGASCALE_COORDINATOR_ADDRESS`` (process 0's host: this machine),
  as :func:`~infra.backends.gke.jobset.pod_env` writes them. An unmodified
  ``jax.distributed.initialize()`` finds its cluster from these, as on GKE.
* **Its metadata server** answers no attributes of the stack's (GKE's serves none); the emulated
  server stands in for the ConfigMap's mount only (the script the container runs).
* **Repair**: a failed Pod fails its Job and JobSet recreates every Job (docs/gke.md section 5), so
  after a fault every Pod starts again as a new Pod (:attr:`GkeEmulation.recreates_every_slice`): the
  struck slice's on new nodes (empty disks), the others' on their nodes, whose cache of releases and
  virtualenvs (a ``hostPath``: infra/backends/gke/jobset.py) they find again.
* **Reset** (``multislice local reset``, :func:`request_reset`): the JobSet suspended and resumed
  (:mod:`~infra.backends.gke.reset`): every Pod gets SIGTERM and its grace, then starts again as a
  new Pod on its node. With no API to send it to, the request is a file in the emulation's state
  directory that :meth:`GkeEmulation.take_reset` takes.
* **Capacity**: the node pools stay once the run is complete (deletion on completion is not built
  for this backend). A slice whose capacity is withheld (``local up --withhold``) has Pods that wait for
  nodes: JobSet has recreated every Job, so the other slices' new Pods start at once on their nodes and hold
  them without training until it is back (the summary's ``idle_capacity_slice_seconds``), then its Pods start
  and join them. With ``multislice:gke.queuedProvisioning`` (:attr:`GkeEmulation.all_slices_or_none`) no
  Pod starts before every slice has capacity: Kueue admits the JobSet's one Workload only once its one
  ProvisioningRequest, every slice's nodes, is provisioned (docs/gke.md section 3), so the other slices hold
  nothing meanwhile and every Pod starts together.
"""

from __future__ import annotations

from pathlib import Path

from infra import vm_contract as contract
from infra.backends.interface import KEPT, Emulation
from infra.config import StackConfig
from infra.emulated.kit import LocalPaths

#: Every emulated Pod's host (they all run on this machine).
EMULATED_POD_HOST = "127.0.0.1"


class GkeEmulation(Emulation):
    """The emulated JobSet's Pods (see the module docstring)."""

    def __init__(self, config: StackConfig, paths: LocalPaths) -> None:
        self.config = config
        self.paths = paths

    def start(self) -> None:
        reset_request(self.paths).unlink(missing_ok=True)  # one left by an earlier run is not this run's

    def take_reset(self) -> bool:
        try:
            reset_request(self.paths).unlink()
        except FileNotFoundError:
            return False
        return True

    @property
    def reset_line(self) -> str:
        return "reset: JobSet suspended and resumed: every Pod stopped (SIGTERM), then started again as a new Pod"

    def stop(self) -> None:
        return None

    def environment(self) -> dict[str, str]:
        """What every Pod of the JobSet has: the run directory and, with several slices, the slice
        count and the coordinator's host."""
        env = {contract.RUN_DIR_ENV: self.config.run_dir}
        if self.config.slices > 1:
            env |= {"MEGASCALE_NUM_SLICES": str(self.config.slices), "MEGASCALE_COORDINATOR_ADDRESS": EMULATED_POD_HOST}
        return env

    def pod_environment(self, slice_id: int, worker: int) -> dict[str, str] | None:
        """One Pod's own: its worker id and its slice's hosts (GKE's webhook) and, with several
        slices, its slice (the Pod's ``job-index`` label)."""
        env = {
            "TPU_WORKER_ID": str(worker),
            "TPU_WORKER_HOSTNAMES": ",".join([EMULATED_POD_HOST] * self.config.workers_per_slice),
        }
        if self.config.slices > 1:
            env["MEGASCALE_SLICE_ID"] = str(slice_id)
        return env

    @property
    def recreates_every_slice(self) -> bool:
        return True

    @property
    def all_slices_or_none(self) -> bool:
        """With ``multislice:gke.queuedProvisioning`` (module docstring, "Capacity")."""
        return self.config.gke.queued_provisioning

    @property
    def outcome(self) -> str:
        return KEPT

    def line(self) -> str:
        pools = ", ".join(self.config.node_ids)
        return (
            f"capacity: node pools {pools} kept (deletion on completion is not built for the gke backend; "
            f"{self.config.capacity} nodes are billed until `pulumi destroy`)"
        )


def reset_request(paths: LocalPaths) -> Path:
    """The file ``multislice local reset`` writes to ask the running emulation for a reset."""
    return paths.root / "reset-requested"


def request_reset(paths: LocalPaths) -> None:
    """Ask the running emulation whose state is in ``paths`` for a reset (see the module docstring)."""
    reset_request(paths).write_text("")
