"""The gke backend's operations (:class:`GkeBackend`): a cluster with one TPU node pool per slice and
the run's JobSet (:mod:`~infra.backends.gke.program`), read and reached with kubectl through the
kubeconfig context gcloud writes (:mod:`~infra.backends.gke.kubectl`): ``status`` lists the run's
Pods, ``exec`` is ``kubectl exec`` in each Pod, ``logs`` reads the Pods' ``k8s_container`` entries
(:mod:`~infra.backends.gke.logs`), ``reset`` suspends the JobSet and resumes it
(:mod:`~infra.backends.gke.reset`); deletion on completion is not built; emulated with Pods as
processes (:mod:`~infra.backends.gke.emulation`), reset the same way.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from infra import invocation, vm_contract as contract
from infra.backends.gke import logs, names, operate
from infra.backends.gke.jobset import CONTAINER, JOB_INDEX_LABEL
from infra.backends.gke.spec import SPEC
from infra.backends.interface import Backend, CapacitySource, Emulation, ExecPlan

if TYPE_CHECKING:
    import pulumi

    from infra.backends.capacity import CapacityStatus
    from infra.config import StackConfig
    from infra.emulated.kit import LocalPaths
    from infra.remote.selection import Worker
    from infra.startup import RenderedScript


class GkeBackend(Backend):
    """``multislice:backend: gke`` (see the module docstring)."""

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
        from infra.backends.gke import program

        return program.declare(config, script, network=network, service_account=service_account, opts=opts)

    def ssh_command(self, config: StackConfig) -> str:
        """gcloud's credentials for the cluster, then ``kubectl logs --follow`` of slice 0's worker 0
        (its Pod found by JobSet's ``job-index`` label and the Indexed Job's completion index): the
        container's output is its boot's, as a VM's journal is."""
        selector = ",".join(
            (
                f"{operate.JOBSET_NAME_LABEL}={names.jobset_name(config)}",
                f"{JOB_INDEX_LABEL}=0",
                f"{operate.COMPLETION_INDEX_LABEL}=0",
            )
        )
        follow = operate.kubectl(
            names.kube_context(config),
            config.gke.namespace,
            "logs",
            "--follow",
            "--container",
            CONTAINER,
            "--selector",
            selector,
        )
        credentials = operate.credentials_command(
            project=config.project, location=names.cluster_location(config), cluster=names.cluster_name(config)
        )
        return f"{shlex.join(credentials)} && {shlex.join(follow)}"

    def trainer_filter(self, config: StackConfig, **narrowing: Any) -> str:
        return logs.trainer_filter(config, **narrowing)

    def logging_filter(self, config: StackConfig) -> str:
        return logs.gke_filter(config)

    def log_source(self, config: StackConfig) -> str:
        return (
            f"trainer lines of run {config.effective_run_name} in project {config.project} (container "
            f"{CONTAINER} of JobSet {names.jobset_name(config)}'s Pods in cluster {names.cluster_name(config)})"
        )

    def capacity_source(self, config: StackConfig, credential_settings: Any, emulated_storage: bool) -> CapacitySource:
        """The run's Pods through kubectl (:mod:`~infra.backends.gke.capacity`); credentials for the
        bucket unless Cloud Storage is a loopback fake."""

        from infra.backends.capacity import CapacityError, status_credentials
        from infra.backends.gke import capacity
        from infra.backends.gke.kubectl import KubectlError, kubectl_executable, list_pods
        from infra.backends.gke.operate import PodListingError

        try:
            kubectl_executable()
        except KubectlError as err:
            raise CapacityError(str(err), err.exit_code) from None

        def read() -> CapacityStatus:
            try:
                return capacity.read(config, lambda: list_pods(config))
            except KubectlError as err:
                raise CapacityError(str(err), err.exit_code) from None
            except PodListingError as err:
                raise CapacityError(str(err)) from None

        credentials = status_credentials(credential_settings, config.project, needed=not emulated_storage)
        return CapacitySource(read, credentials)

    def gone_after_completion(self, config: StackConfig, completed_step: int | None) -> CapacityStatus:
        from infra.backends.capacity import deleted

        cap = deleted(
            names.jobset_name(config),
            f"the JobSet's Pods are gone after the run completed at step {completed_step} (deleted by hand); "
            "its node pools stay until `pulumi destroy`",
        )
        cap.backend = self.name
        return cap

    def headline(self, stack: str, capacity: CapacityStatus) -> str:
        pools = ", ".join(item.node for item in capacity.slices) or "(none listed)"
        return f"stack {stack}: JobSet {capacity.id} on node pools {pools} is {capacity.state}"

    def deleted_name(self, capacity: CapacityStatus) -> str:
        return f"JobSet {capacity.id}"

    @property
    def exec_needs_ssh(self) -> bool:
        """``kubectl exec`` needs neither SSH, IAP nor gcloud's key pair."""
        return False

    def exec_plan(self, gcloud: str, config: StackConfig, workers: Sequence[Worker], line: str) -> ExecPlan:
        """Every selected worker's Pod must be Running; then one ``kubectl exec`` per Pod, all at once."""
        from infra.backends.gke.kubectl import KubectlError, kubectl_executable, list_pods
        from infra.remote.command import run_id, run_once
        from infra.remote.fanout import Target
        from infra.remote.selection import RemoteError

        try:
            kubectl = kubectl_executable()
            pods = {
                (pod.slice_id, pod.worker): pod for pod in operate.pods_of(list_pods(config), names.jobset_name(config))
            }
        except KubectlError as err:
            raise RemoteError(str(err), err.exit_code) from None
        except operate.PodListingError as err:
            raise RemoteError(str(err), 1) from None
        missing = [w.name for w in workers if pods.get((w.slice_id, w.worker), None) is None]
        idle = [
            f"{w.name} ({pods[(w.slice_id, w.worker)].phase})"
            for w in workers
            if (w.slice_id, w.worker) in pods and pods[(w.slice_id, w.worker)].phase != "Running"
        ]
        if missing or idle:
            raise RemoteError(
                f"stack {config.stack}'s run is not up: "
                + "; ".join(filter(None, (f"no Pod for {', '.join(missing)}" if missing else "", ", ".join(idle))))
                + f"; nothing was run (`{invocation.command('status', config.stack)}` shows the Pods)"
            )
        run = run_id()
        context, namespace = names.kube_context(config), config.gke.namespace

        def targets() -> list[Target]:
            result = []
            for w in workers:
                guarded = run_once(line, f"{run}-slice-{w.slice_id}-worker-{w.worker}")
                argv = operate.exec_command(
                    context=context,
                    namespace=namespace,
                    pod=pods[(w.slice_id, w.worker)].name,
                    command=["/bin/bash", "-c", guarded],
                )
                result.append(Target(w.slice_id, w.worker, [kubectl, *argv[1:]]))
            return result

        return ExecPlan(targets, "kubectl exec does not use it")

    def reset_refusal(self, config: StackConfig) -> str | None:
        return None

    def reset(
        self, config: StackConfig, *, confirm: Callable[[str], bool], say: Callable[[str], None], timeout_s: float
    ) -> str:
        """The JobSet suspended and resumed (:mod:`~infra.backends.gke.reset`)."""
        from infra.backends.gke import reset as resetting

        seconds = resetting.reset(config, confirm=confirm, say=say, timeout_s=timeout_s)
        return (
            f"reset: every Pod of JobSet {names.jobset_name(config)} started again in {seconds:.0f} s; "
            "training resumes from its newest checkpoint"
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
        """The emulated JobSet suspended and resumed (:mod:`~infra.backends.gke.emulated_reset`)."""
        from infra.backends.gke import emulated_reset

        return emulated_reset.reset(config, paths, confirm=confirm, say=say, timeout_s=timeout_s)

    def vm_metadata(
        self, config: StackConfig, slice_id: int, worker: int, *, startup_script: str, run_dir: str
    ) -> dict[str, str]:
        """What a Pod carries of the program's: the startup script (its ConfigMap's file, which the
        container runs) and the run directory (its ``MULTISLICE_RUN_DIR``), under the keys a VM's
        metadata gives them."""
        return {contract.STARTUP_SCRIPT_KEY: startup_script, contract.RUN_DIR_KEY: run_dir}

    def emulation(self, config: StackConfig, paths: LocalPaths) -> Emulation:
        from infra.backends.gke.emulation import GkeEmulation

        return GkeEmulation(config, paths)


BACKEND = GkeBackend()
