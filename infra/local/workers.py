"""The run's workers in ``multislice local up``, on every backend: one emulated TPU VM per worker of
each slice (queued-resource, compute-engine) or one emulated GKE Pod (gke), each with its own loopback
metadata server.

:class:`Workers` makes them (:meth:`Workers.create`), gives each the metadata and environment a worker
of the stack's backend has and boots it (:meth:`Workers.boot`), strikes or restarts a slice's, wipes
their disks where the platform makes new machines, and stops them all (:meth:`Workers.stop`). What
differs by backend comes from the backend's :class:`~infra.backends.interface.Emulation`: the values
its metadata server answers besides the attributes, and a Pod's environment (a Pod boots the script
with ``/bin/bash`` as its container's first process; a VM boots it under its emulated systemd:
:mod:`infra.emulated.vm`). What a worker is told of its place in the job is :mod:`infra.local.topology`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from infra.backends.interface import Emulation
from infra.config import StackConfig
from infra.emulated import node_mounts, supervisor
from infra.emulated.metadata import MetadataServer
from infra.emulated.state import LocalPaths
from infra.emulated.vm import EmulatedVM, process_groups
from infra.local import topology
from training.warning_text import as_line, no_action


class Workers:
    """Every worker of a stack's slices, as local process groups (see the module docstring).

    Args:
      config: the validated stack (slices, workers per slice, node ids).
      paths: state directories (each worker's disk and console log).
      capacity: the backend's side of the emulation (what each worker's metadata server answers
        besides its attributes; a Pod's environment).
    """

    def __init__(self, config: StackConfig, paths: LocalPaths, capacity: Emulation) -> None:
        self.config = config
        self.paths = paths
        self.capacity = capacity
        #: One per worker, slice by slice (``slice 0 worker 0`` first).
        self.vms: list[EmulatedVM] = []
        self.servers: list[MetadataServer] = []
        #: What ``local up`` says of the Pods' node folders (None: VMs, which have none).
        self.node_line: str | None = None
        self._noexec = False

    def create(self) -> None:
        """Make every worker (not booted) with a metadata server of its own, answering what the
        backend's workers are told (:meth:`~infra.backends.interface.Emulation.metadata_values`); a
        Pod with its node's folder, non-executable as a GKE node mounts it where this machine can
        (:mod:`infra.emulated.node_mounts`; :attr:`node_line` says which)."""
        for slice_id, node in enumerate(self.config.node_ids):
            for worker in range(self.config.accelerator.hosts):
                server = MetadataServer({}, self.capacity.metadata_values(slice_id, worker))
                self.servers.append(server)
                home, log = self.paths.vm_home(slice_id, worker), self.paths.vm_log(slice_id, worker)
                pod_env = self.capacity.pod_environment(slice_id, worker)
                node_cache, noexec = None, False
                if pod_env is not None:
                    node_cache, noexec = self.paths.node_cache(slice_id, worker), self._noexec_nodes()
                self.vms.append(EmulatedVM(slice_id, worker, node, home, log, server, pod_env, node_cache, noexec))

    def _noexec_nodes(self) -> bool:
        if self.node_line is None:
            problem = node_mounts.noexec_problem()
            self.node_line = (
                "node cache: each Pod's node folder is mounted non-executable, as Container-Optimized OS mounts "
                "/var on a GKE node"
                if problem is None
                else as_line(
                    no_action(
                        f"node cache: each Pod's node folder stays executable here ({problem}); a GKE node mounts it "
                        "non-executable",
                        "the run goes on; only the check that nothing runs from that folder is not made here",
                    )
                )
            )
            self._noexec = problem is None
        return self._noexec

    def boot(
        self,
        env: dict[str, str],
        startup_script: str,
        before: Callable[[], None] = lambda: None,
        only: list[EmulatedVM] | None = None,
    ) -> None:
        """Give every worker (or ``only`` those) its metadata attributes (:func:`infra.local.topology.vm_metadata`:
        the startup script and the run directory among them), call ``before``, then boot each with ``env``."""
        booting = self.vms if only is None else only
        for vm in booting:
            vm.metadata.update(
                topology.vm_metadata(
                    self.config, vm.slice_id, vm.worker, startup_script=startup_script, run_dir=self.config.run_dir
                )
            )
        before()
        for vm in booting:
            vm.boot(env)

    def of_slice(self, slice_id: int) -> list[EmulatedVM]:
        """The workers of slice ``slice_id``."""
        return [vm for vm in self.vms if vm.slice_id == slice_id]

    def others(self, slice_id: int) -> list[EmulatedVM]:
        """The workers of every slice but ``slice_id``."""
        return [vm for vm in self.vms if vm.slice_id != slice_id]

    def slices_but(self, slice_id: int) -> list[int]:
        """The ids of every slice but ``slice_id``, ascending."""
        return sorted({vm.slice_id for vm in self.others(slice_id)})

    def only(self, slice_id: int) -> bool:
        """Whether every worker is of slice ``slice_id`` (a one-slice stack)."""
        return all(vm.slice_id == slice_id for vm in self.vms)

    @staticmethod
    def wipe(vms: Iterable[EmulatedVM]) -> None:
        """Empty the disks of ``vms`` (stopped): what recreating a VM, or a new node, starts from."""
        for vm in vms:
            vm.wipe_disk()

    @staticmethod
    def new_containers(vms: Iterable[EmulatedVM]) -> None:
        """``vms`` (stopped) start again as new Pods on their nodes (:meth:`EmulatedVM.new_container`)."""
        for vm in vms:
            vm.new_container()

    def stop(self, grace_s: float) -> None:
        """Stop every worker (SIGTERM, ``grace_s``, SIGKILL) and every metadata server."""
        supervisor.stop_groups(process_groups(self.vms), grace_s)
        for server in self.servers:
            server.stop()
        self.servers.clear()
