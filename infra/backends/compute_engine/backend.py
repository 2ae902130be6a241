"""The compute-engine backend's operations (:class:`ComputeEngineBackend`): one managed instance group
of TPU VMs per slice (:mod:`~infra.backends.compute_engine.slices`), read and reached with gcloud
(``instance-groups managed list-instances``: :mod:`~infra.backends.compute_engine.instance_groups`;
``compute ssh``: :mod:`~infra.backends.compute_engine.ssh`), with no reset and no deletion on
completion (docs/compute-engine.md, section 5), and emulated with the template's metadata and a
loopback Compute API (:mod:`~infra.backends.compute_engine.emulation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from infra import invocation
from infra.backends.compute_engine import logs
from infra.backends.compute_engine.spec import SPEC
from infra.backends.interface import Backend, CapacitySource, Emulation, ExecPlan
from infra.backends.queued_resource.spec import SPEC as QUEUED_RESOURCE

if TYPE_CHECKING:
    import pulumi

    from infra.backends.capacity import CapacityStatus
    from infra.config import StackConfig
    from infra.emulated.kit import LocalPaths
    from infra.remote.selection import Worker
    from infra.startup import RenderedScript


class ComputeEngineBackend(Backend):
    """``multislice:backend: compute-engine`` (see the module docstring)."""

    spec = SPEC

    def declare(
        self,
        config: StackConfig,
        script: RenderedScript,
        *,
        network: Any,
        service_account: pulumi.Input[str],
        deployed: pulumi.Output[str | None],
        opts: pulumi.ResourceOptions,
    ) -> dict[str, Any]:
        """The slices; their groups say so in their description when they replace the stack's
        queued resource (``deployed``: the last deployment used the queued-resource backend)."""
        from infra.backends.compute_engine import program

        return program.declare(
            config,
            script,
            network=network,
            service_account=service_account,
            replaces_queued_resource=deployed.apply(lambda found: found == QUEUED_RESOURCE.name),
            opts=opts,
        )

    def ssh_command(self, config: StackConfig) -> str:
        """Worker 0 is the first VM, by name, of slice 0's group (the order the boot gives the
        workers): ``gcloud compute instance-groups managed list-instances`` names it (its ``name``
        field, the command's default table's first column), and GA ``gcloud compute ssh`` has
        ``--tunnel-through-iap`` (``iap_tunnel.AddSshTunnelArgs`` in the installed SDK's
        ``lib/surface/compute/ssh.py``)."""
        where = f"--zone={config.zone} --project={config.project}"
        first = (
            f"$(gcloud compute instance-groups managed list-instances {config.node_ids[0]} {where} "
            "--format='value(name)' --sort-by=name --limit=1)"
        )
        journal = "--command='sudo journalctl -u google-startup-scripts.service -f'"
        return f"gcloud compute ssh {first} {where} --tunnel-through-iap {journal}"

    def trainer_filter(self, config: StackConfig, **narrowing: Any) -> str:
        return logs.trainer_filter(config, **narrowing)

    def logging_filter(self, config: StackConfig) -> str:
        return logs.compute_engine_filter(config)

    def log_source(self, config: StackConfig) -> str:
        return (
            f"trainer lines of run {config.effective_run_name} in project {config.project} (Compute Engine "
            f"VMs in {config.zone})"
        )

    def capacity_source(self, config: StackConfig, credential_settings: Any, emulated_storage: bool) -> CapacitySource:
        """Each slice's group through gcloud (:func:`~infra.backends.compute_engine.instance_groups.list_group`;
        the Cloud TPU API knows nothing of Compute Engine TPU VMs); credentials for the bucket
        unless Cloud Storage is a loopback fake."""
        from infra.backends.capacity import CapacityError, status_credentials
        from infra.backends.compute_engine import capacity
        from infra.backends.compute_engine.instance_groups import list_group
        from infra.remote.gcloud import gcloud_executable
        from infra.remote.selection import RemoteError

        try:
            gcloud = gcloud_executable()
        except RemoteError as err:
            raise CapacityError(str(err), 2) from None

        def listed(group: str):
            try:
                return list_group(gcloud, config, group)
            except RemoteError as err:
                raise CapacityError(str(err).replace("; nothing was run", ""), err.exit_code) from None

        credentials = status_credentials(credential_settings, config.project, needed=not emulated_storage)
        return CapacitySource(lambda: capacity.read(config, listed), credentials)

    def gone_after_completion(self, config: StackConfig, completed_step: int | None) -> CapacityStatus:
        from infra.backends.capacity import deleted

        cap = deleted(
            config.resource_prefix,
            f"instance groups gone after the run completed at step {completed_step} (deleted by hand)",
        )
        cap.backend = self.name
        return cap

    def headline(self, stack: str, capacity: CapacityStatus) -> str:
        groups = ", ".join(item.node for item in capacity.slices) or f"{capacity.id}-*"
        return f"stack {stack}: instance groups {groups} are {capacity.state}"

    def deleted_name(self, capacity: CapacityStatus) -> str:
        return "instance groups"

    def exec_plan(self, gcloud: str, config: StackConfig, workers: Sequence[Worker], line: str) -> ExecPlan:
        """Each selected slice's group must list all its VMs up; then one ``compute ssh`` per
        worker, the first worker of the whole stack first (its key goes into the project's metadata)."""
        from infra.backends.compute_engine import instance_groups, ssh

        slices = sorted({w.slice_id for w in workers})
        instances = {
            s: instance_groups.workers_of(config, s, instance_groups.list_group(gcloud, config, config.node_ids[s]))
            for s in slices
        }
        return ExecPlan(
            lambda: ssh.targets(gcloud, config, workers, instances, line),
            "the first worker connects (its key in the project's metadata) before the others start",
        )

    def reset_refusal(self, config: StackConfig) -> str | None:
        from infra.backends.compute_engine.ssh import reset_refusal

        return reset_refusal(config.stack)

    def local_reset_refusal(self, config: StackConfig) -> str | None:
        return (
            f"stack {config.stack} uses multislice:backend: compute-engine, which has no reset "
            "(docs/compute-engine.md, section 5), so its emulation has none either; nothing was sent. "
            f"To start every emulated VM again, `{invocation.command('local down', config.stack)}` then "
            f"`{invocation.command('local up', config.stack)}`"
        )

    def vm_metadata(
        self, config: StackConfig, slice_id: int, worker: int, *, startup_script: str, run_dir: str
    ) -> dict[str, str]:
        from infra.backends.compute_engine.emulation import compute_engine_metadata

        return compute_engine_metadata(config, slice_id, startup_script=startup_script, run_dir=run_dir)

    def emulation(self, config: StackConfig, paths: LocalPaths) -> Emulation:
        from infra.backends.compute_engine.emulation import ComputeEngineEmulation

        return ComputeEngineEmulation(config)


BACKEND = ComputeEngineBackend()
