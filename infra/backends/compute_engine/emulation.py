"""The compute-engine backend in ``multislice local up``: what each emulated VM is told, and the
emulated Compute API.

A compute-engine stack's VMs get none of Cloud TPU's identity keys; they get what ``pulumi up``
puts in its instance template and its groups (docs/compute-engine.md,
:func:`compute_engine_metadata`), and the metadata server's own values (:func:`compute_engine_values`:
the VM's name, zone and project), and find their place themselves through the emulated Compute
API (:mod:`~infra.backends.compute_engine.emulated_api`, served by :class:`ComputeEngineEmulation`),
as ``boot_identity.sh`` does on Compute Engine. deleteOnComplete is not built for this backend,
so its VMs never get ``multislice-delete-queued-resource`` and the capacity is always kept.
"""

from __future__ import annotations

import random

from infra import vm_contract as contract
from infra.backends.compute_engine import provisioning, tpu_env
from infra.backends.compute_engine.emulated_api import ComputeApi, instance_name
from infra.backends.interface import KEPT, Emulation
from infra.config import StackConfig

#: The project number in an emulated VM's ``instance/zone`` (``projects/<number>/zones/<zone>``,
#: https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys): a placeholder.
EMULATED_PROJECT_NUMBER = "123456789012"
#: Every emulated VM's internal IP (they all run on this machine).
EMULATED_VM_IP = "127.0.0.1"
#: Seconds an emulated Spot slice must have been seen lost before a VM's slice watch recreates it (a
#: TPU VM's default is ``infra.backends.compute_engine.spec.SLICE_WATCH_GRACE_S``).
SLICE_WATCH_GRACE_S = 2
#: Seconds between two reads of the release record by an emulated VM's release watch (a TPU VM's
#: default is ``infra.startup.boot.RELEASE_POLL_S``): a release written to the emulated bucket
#: mid-run is booted within about this long.
RELEASE_POLL_S = 2


def compute_engine_metadata(config: StackConfig, slice_id: int, *, startup_script: str, run_dir: str) -> dict[str, str]:
    """A compute-engine backend VM's metadata attributes: the instance template's (the startup
    script, the run directory, the backend, the groups in slice order, the VMs per slice, the
    accelerator type, the TPU environment) and its group's (the slice index)."""
    return {
        **contract.node_metadata(
            startup_script=startup_script,
            run_dir=run_dir,
            queued_resource_name=config.queued_resource_name,
            delete_on_complete=False,
        ),
        contract.BACKEND_KEY: contract.COMPUTE_ENGINE_BACKEND,
        contract.INSTANCE_GROUPS_KEY: ",".join(config.node_ids),
        contract.WORKERS_PER_SLICE_KEY: str(config.accelerator.hosts),
        contract.COMPUTE_ENGINE_ACCELERATOR_KEY: config.accelerator.name,
        contract.COMPUTE_ENGINE_TPU_ENV_KEY: tpu_env.metadata_value(
            tpu_env.static_environment(  # without JAX_PLATFORMS=tpu: the emulated VMs have CPU devices
                config.accelerator.topology, config.accelerator.hosts, config.accelerator.chips_per_host
            )
        ),
        contract.SLICE_ID_KEY: str(slice_id),
    }


def compute_engine_values(config: StackConfig, name: str) -> dict[str, str]:
    """The other metadata a compute-engine backend VM's ``boot.sh`` reads (paths under
    ``/computeMetadata/v1/``): its name, zone and project."""
    return {
        "instance/name": name,
        "instance/zone": f"projects/{EMULATED_PROJECT_NUMBER}/zones/{config.zone}",
        "project/project-id": config.project,
    }


def compute_engine_names(config: StackConfig, rng: random.Random | None = None) -> list[list[str]]:
    """For each slice, its group's VM names as a managed instance group makes them
    (``<group>-<4 of [a-z0-9]>``), sorted: worker ``i`` is the ``i``-th, as ``boot.sh`` counts."""
    rng = rng or random.Random()
    slices = []
    for group in config.node_ids:
        names: set[str] = set()
        while len(names) < config.accelerator.hosts:
            names.add(instance_name(group, rng))
        slices.append(sorted(names))
    return slices


class ComputeEngineEmulation(Emulation):
    """The emulated slices' managed instance groups: the Compute API lists each group's VMs (named as
    a group names them, all at :data:`EMULATED_VM_IP`), and each VM's metadata server answers its
    name, zone and project. A repaired slice keeps its VMs' names (a group recreates a VM under
    its name)."""

    def __init__(self, config: StackConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self.names = compute_engine_names(config, rng)
        self.api: ComputeApi | None = None

    def start(self) -> None:
        self.stop()
        self.api = ComputeApi(self.config.project, self.config.zone)
        for group, vms in zip(self.config.node_ids, self.names, strict=True):
            self.api.add_group(group)
            for name in vms:
                self.api.add_vm(group, name, EMULATED_VM_IP)

    def stop(self) -> None:
        if self.api is not None:
            self.api.stop()

    @property
    def repairs_slices(self) -> bool:
        """Whether the slice comes back without a VM asking: a group of one VM with per-VM repair on
        recreates it, and Compute Engine recovers a slice in a managed capacity mode itself
        (:func:`~infra.backends.compute_engine.provisioning.recovered_by_compute_engine`). Only a
        multi-host Spot slice waits for a VM's slice watch (``slice-watch.sh``) to ask the emulated API
        (:func:`~infra.backends.compute_engine.provisioning.watch_recreates`)."""
        return not provisioning.watch_recreates(self.config.capacity, self.config.accelerator.hosts)

    @property
    def restarts_every_slice(self) -> bool:
        return False  # a group recreates its own VMs; nothing restarts the other groups'

    @property
    def repair_note(self) -> str:
        """Who recreates the slice (the repair line names it)."""
        config = self.config
        if provisioning.repairs_vms(config.capacity, config.accelerator.hosts):
            return "its group recreates its VM (per-VM repair)"
        if provisioning.recovered_by_compute_engine(config.capacity):
            return f"Compute Engine recovers a slice of {config.capacity} VMs itself (managed capacity mode)"
        return "the slice watch resized its group to 0 and back"

    def lost(self, slice_id: int) -> None:
        """The slice's VMs are listed TERMINATED with no action, as a preempted Spot VM of a group
        without per-VM repair stays."""
        assert self.api is not None, "ComputeEngineEmulation.start() first"
        for name in self.names[slice_id]:
            self.api.set_vm(name, ip=EMULATED_VM_IP, status="TERMINATED")

    def take_recreated(self) -> list[int]:
        assert self.api is not None, "ComputeEngineEmulation.start() first"
        groups = list(self.config.node_ids)
        return sorted({groups.index(group) for group, _ in self.api.take_recreations() if group in groups})

    def repaired(self, slice_id: int) -> None:
        """The recreated VMs run again under their names, with no action on them."""
        if self.api is not None:
            for name in self.names[slice_id]:
                self.api.set_vm(name, ip=EMULATED_VM_IP)

    def metadata_values(self, slice_id: int, worker: int) -> dict[str, str] | None:
        return compute_engine_values(self.config, self.names[slice_id][worker])

    def environment(self) -> dict[str, str]:
        """The Compute API's endpoint, the release watch's poll (:data:`RELEASE_POLL_S`) and the slice
        watch's grace (:data:`SLICE_WATCH_GRACE_S`)."""
        assert self.api is not None, "ComputeEngineEmulation.start() first"
        return {
            contract.COMPUTE_API_ENDPOINT_ENV: self.api.endpoint,
            contract.RELEASE_POLL_ENV: str(RELEASE_POLL_S),
            contract.SLICE_WATCH_GRACE_ENV: str(SLICE_WATCH_GRACE_S),
        }

    @property
    def outcome(self) -> str:
        return KEPT

    def line(self) -> str:
        """What becomes of the VMs, naming the capacity mode: billed until ``pulumi destroy`` (a
        reservation: paid for either way), except flex-start VMs, which Compute Engine deletes when
        their run duration ends (docs/compute-engine.md, section 3b)."""
        limit = self.config.compute_engine.max_run_duration
        if self.config.capacity == "flex-start" and limit is not None:
            return (
                "capacity: kept: deleteOnComplete is not built for the compute-engine backend; the flex-start VMs "
                f"run at most {limit // 3600} h {limit % 3600 // 60} min (multislice:computeEngine.maxRunDuration), "
                "then Compute Engine deletes them; until then they are billed"
            )
        if self.config.capacity == "reserved":
            cost = "the reservation is paid for either way"
        else:
            cost = "billed until pulumi destroy"
        return (
            "capacity: kept: deleteOnComplete is not built for the compute-engine backend; "
            f"the instance groups' {self.config.capacity} VMs: {cost}"
        )
