"""The queued-resource backend's operations (:class:`QueuedResourceBackend`): the Multislice queued
resource of the Cloud TPU API, declared by a dynamic provider (:mod:`~infra.backends.queued_resource.provider`),
read through the TPU API (:mod:`~infra.backends.queued_resource.capacity`), reached with
``gcloud alpha compute tpus tpu-vm ssh`` (:mod:`~infra.backends.queued_resource.ssh`), reset with
``ResetQueuedResource`` (:mod:`~infra.backends.queued_resource.reset`), deleted on completion by
worker 0 of slice 0 (``deleteOnComplete``), and emulated with Cloud TPU's metadata keys and a
loopback TPU API (:mod:`~infra.backends.queued_resource.emulation`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from infra.backends.interface import Backend, CapacitySource, Emulation, ExecPlan
from infra.backends.queued_resource import logs
from infra.backends.queued_resource.spec import SPEC

if TYPE_CHECKING:
    import pulumi

    from infra.backends.capacity import CapacityStatus
    from infra.config import StackConfig
    from infra.emulated.kit import LocalPaths
    from infra.remote.selection import Worker
    from infra.startup import RenderedScript


class QueuedResourceBackend(Backend):
    """``multislice:backend: queued-resource`` (see the module docstring)."""

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
        from infra.backends.queued_resource import program

        return program.declare(config, script, network=network, service_account=service_account, opts=opts)

    def ssh_command(self, config: StackConfig) -> str:
        """``tpu-vm ssh`` of the alpha track (GA has no ``--tunnel-through-iap``:
        https://cloud.google.com/sdk/gcloud/reference/alpha/compute/tpus/tpu-vm/ssh; docs/exec-and-reset.md)."""
        return (
            f"gcloud alpha compute tpus tpu-vm ssh {config.node_ids[0]} --worker=0 --zone={config.zone} "
            f"--project={config.project} --tunnel-through-iap "
            "--command='sudo journalctl -u google-startup-scripts.service -f'"
        )

    def trainer_filter(self, config: StackConfig, **narrowing: Any) -> str:
        return logs.trainer_filter(config, **narrowing)

    def logging_filter(self, config: StackConfig) -> str:
        return logs.resource_filter(config.project, config.zone, config.node_ids)

    def log_source(self, config: StackConfig) -> str:
        return f"log entries in project {config.project} (nodes {', '.join(config.node_ids)} in {config.zone})"

    def capacity_source(self, config: StackConfig, credential_settings: Any, emulated_storage: bool) -> CapacitySource:
        """The TPU API at ``MULTISLICE_TPU_API_ENDPOINT`` or Google's; credentials are needed unless
        both the TPU API and Cloud Storage are loopback fakes."""
        from infra.backends.capacity import CapacityError, status_credentials
        from infra.backends.queued_resource import capacity as tpu

        settings = credential_settings
        url = tpu.endpoint()
        needed = not (tpu.is_local_endpoint(url) and emulated_storage)
        credentials = status_credentials(settings, config.project, needed=needed)
        try:
            base, session = tpu.tpu_session(
                url, None if tpu.is_local_endpoint(url) and not settings.explicit else credentials
            )
        except CapacityError as err:
            raise CapacityError(str(err), 2) from None

        def read() -> CapacityStatus:
            return tpu.read_cloud(
                session, base, config.project, config.zone, config.queued_resource_id, config.node_ids
            )

        return CapacitySource(read, credentials)

    def gone_after_completion(self, config: StackConfig, completed_step: int | None) -> CapacityStatus:
        from infra.backends.capacity import deleted

        return deleted(
            config.queued_resource_id,
            f"gone after its run completed at step {completed_step} "
            "(deleteOnComplete, or deleted by hand); pulumi up does not create it again",
        )

    def headline(self, stack: str, capacity: CapacityStatus) -> str:
        return f"stack {stack}: queued resource {capacity.id} is {capacity.state}"

    def deleted_name(self, capacity: CapacityStatus) -> str:
        return f"queued resource {capacity.id}"

    def exec_plan(self, gcloud: str, config: StackConfig, workers: Sequence[Worker], line: str) -> ExecPlan:
        """The queued resource must be ACTIVE (``queued-resources describe``); then one ``tpu-vm ssh``
        per worker, the first worker of each node first."""
        from infra.backends.queued_resource import ssh

        ssh.check_deployed(gcloud, config)
        return ExecPlan(
            lambda: ssh.targets(gcloud, config, workers, line),
            "the first worker of each node puts it on the node before the others start",
        )

    def reset_refusal(self, config: StackConfig) -> str | None:
        return None

    def reset(
        self, config: StackConfig, *, confirm: Callable[[str], bool], say: Callable[[str], None], timeout_s: float
    ) -> str:
        from infra.backends.queued_resource import reset as resetting

        client = resetting.client_for_stack(config)
        result = resetting.reset(config, client, confirm=confirm, say=say, timeout_s=timeout_s)
        return (
            f"reset: every VM of {config.queued_resource_id} rebooted in {result.seconds:.0f} s "
            f"({', '.join(f'{n} {s}' for n, s in result.nodes.items())}); each runs its startup script again"
        )

    def local_reset_refusal(self, config: StackConfig) -> str | None:
        return None

    def local_reset(
        self,
        config: StackConfig,
        paths: LocalPaths,
        *,
        confirm: Callable[[str], bool],
        say: Callable[[str], None],
        timeout_s: float,
    ) -> float:
        """ResetQueuedResource sent to the emulation's loopback TPU API
        (:mod:`~infra.backends.queued_resource.emulated_reset`)."""
        from infra.backends.queued_resource import emulated_reset

        return emulated_reset.reset(config, paths, confirm=confirm, say=say, timeout_s=timeout_s)

    def vm_metadata(
        self, config: StackConfig, slice_id: int, worker: int, *, startup_script: str, run_dir: str
    ) -> dict[str, str]:
        from infra.backends.queued_resource.emulation import vm_metadata

        return vm_metadata(config, slice_id, worker, startup_script=startup_script, run_dir=run_dir)

    def emulation(self, config: StackConfig, paths: LocalPaths) -> Emulation:
        from infra.backends.queued_resource.emulation import QueuedResourceEmulation

        return QueuedResourceEmulation(config, paths)


BACKEND = QueuedResourceBackend()
