"""What a backend *does*: :class:`Backend`, the one interface every backend package implements,
and :class:`Emulation`, its part of ``multislice local up``.

The operations half of the seam (:mod:`infra.backends`; the spec half is
:class:`~infra.backends.spec.BackendSpec`). The program, ``status``, ``logs``, ``exec``, ``reset``
and the local emulation ask :func:`infra.backends.operations.backend_of` for the stack's backend and
call these names; none of them tells the backends apart otherwise. SkyPilot's
``sky/provision/__init__.py`` has the same shape: one interface module, one package per provider
implementing the same names.

Every method takes the stack's :class:`~infra.config.StackConfig` (``config``) where it needs it.
Heavy imports (pulumi-gcp, google-cloud-tpu) happen inside the implementations, so that looking a
backend up costs nothing (``multislice status`` answers in about a second).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from infra.backends.spec import BackendSpec

if TYPE_CHECKING:
    import pulumi

    from infra.backends.capacity import CapacityStatus
    from infra.components.network import Network
    from infra.config import StackConfig
    from infra.emulated.kit import EmulatedVM, LocalPaths
    from infra.remote.fanout import Target
    from infra.remote.selection import Worker
    from infra.startup import RenderedScript


#: ``summary["capacity"]`` of ``multislice local up`` (:attr:`Emulation.outcome`): the run's VMs
#: deleted their capacity once it was complete, or it is kept.
DELETED, KEPT = "deleted", "kept"


@dataclass(frozen=True)
class ExecPlan:
    """How ``multislice exec`` reaches a deployed stack's workers, once the stack was checked.

    Attributes:
      targets: makes one :class:`~infra.remote.fanout.Target` per worker (called after gcloud's
        key pair exists: :func:`infra.remote.gcloud.ensure_ssh_key`).
      key_note: what the command says about a key pair it just made (who uses it first).
    """

    targets: Callable[[], list[Target]]
    key_note: str


@dataclass(frozen=True)
class CapacitySource:
    """Where ``multislice status`` reads a deployed stack's capacity.

    Attributes:
      read: returns a fresh :class:`~infra.backends.capacity.CapacityStatus`; raises
        :class:`~infra.backends.capacity.QueuedResourceNotFound` when nothing of the stack's capacity
        exists, :class:`~infra.backends.capacity.CapacityError` (with its exit status) otherwise.
      credentials: the credentials the run's bucket is read with (None: anonymous, for an emulated
        Cloud Storage).
    """

    read: Callable[[], CapacityStatus]
    credentials: Any


class Emulation(ABC):
    """The backend's side of ``multislice local up`` (:class:`infra.local.emulated_stack.EmulatedStack`
    drives it): the emulated cloud API its VMs talk to, what each emulated VM's metadata server
    answers besides its attributes (:meth:`Backend.vm_metadata`), and what becomes of the capacity.

    Lifecycle: :meth:`start` when the slices are created (before the VMs' metadata servers),
    :meth:`stop` with the VMs. Repair is the emulator's, the same on every backend: the failed
    slice's VMs are recreated with empty disks and every other slice is restarted (Cloud TPU's
    auto-repair; docs/faults.md); :meth:`repaired` tells the backend, whose VMs keep their names.
    Where the platform does not recreate a slice by itself (:attr:`repairs_slices` False: a
    compute-engine group without per-VM repair), the repair waits until a VM asks for it through
    the emulated API (:meth:`lost`, :meth:`take_recreated`).
    """

    @abstractmethod
    def start(self) -> None:
        """Create the slices' emulated API and records (the capacity is created again)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop serving the emulated API (what was recorded stays)."""

    def metadata_values(self, slice_id: int, worker: int) -> dict[str, str] | None:
        """The metadata server's non-attribute values of that VM (paths under
        ``/computeMetadata/v1/``), or None for the server's defaults."""
        return None

    @abstractmethod
    def environment(self) -> dict[str, str]:
        """What every VM's environment needs to reach the emulated API (:meth:`start` first)."""

    @property
    def api_url(self) -> str | None:
        """The emulated Cloud TPU API's URL, recorded in the emulation's state (``multislice
        local reset`` sends its request there); None when there is none."""
        return None

    def take_reset(self) -> bool:
        """Whether a reset was accepted since the last call (``multislice local reset``)."""
        return False

    @property
    def reset_line(self) -> str:
        """What the emulator says as it carries out a reset."""
        return "reset: restarting every VM of the queued resource (ResetQueuedResource)"

    @property
    def deleted(self) -> bool:
        """Whether the VMs deleted the capacity in this run (it is then not repaired)."""
        return False

    def delete_nodes(self, vms: list[EmulatedVM], delay_s: float, report: Callable[[str], None]) -> bool:
        """Once the capacity was deleted ``delay_s`` ago, stop the VMs still running and return
        True; else False."""
        return False

    def repaired(self, slice_id: int) -> None:
        """Slice ``slice_id`` was recreated (see the class docstring). Default: nothing changes."""
        return None

    @property
    def repairs_slices(self) -> bool:
        """Whether the platform recreates a failed slice by itself (Cloud TPU's auto-repair; a
        group's per-VM repair of its one VM). When False, a struck slice is :meth:`lost` and is
        recreated only once a VM asks for it (:meth:`take_recreated`). Default: True."""
        return True

    @property
    def repair_note(self) -> str:
        """Who recreates a failed slice, for the repair line ("" says nothing more). Default: ""."""
        return ""

    def pod_environment(self, slice_id: int, worker: int) -> dict[str, str] | None:
        """The environment the platform gives that VM's container, whose first process runs the
        startup script (a Pod: :attr:`~infra.backends.spec.BackendSpec.supervisor` ``container``);
        None for a VM whose systemd runs it. Default: None."""
        return None

    @property
    def restarts_every_slice(self) -> bool:
        """Whether the platform restarts every other slice once it has recreated a failed one (Cloud
        TPU's auto-repair: the Multislice overview; JobSet's failure policy recreates every Job). False
        where nothing outside the VMs restarts them (a Compute Engine group recreates its own VMs
        only): after a slice whose capacity was withheld comes back (``local up --withhold``), only it
        boots, and the running slices take it in at their next checkpoint (elastic slices). Default: True."""
        return True

    @property
    def recreates_every_slice(self) -> bool:
        """Whether a repair (and a reset) starts every slice's workers as new containers, not only the
        failed slice's (JobSet recreates every Job, so every Pod is new): each loses its container's
        own files and keeps what its node keeps (:meth:`infra.emulated.vm.EmulatedVM.new_container`); the
        failed slice's start on new nodes. Default: False."""
        return False

    @property
    def all_slices_or_none(self) -> bool:
        """Whether the platform starts no slice's workers before every slice has capacity (GKE's queued
        provisioning: Kueue admits the JobSet's one Workload once its one ProvisioningRequest, every slice's
        nodes, is provisioned): while a slice's capacity is withheld (``local up --withhold``), no worker of
        any slice runs, and none holds capacity. Default: False (a slice that has capacity starts)."""
        return False

    def lost(self, slice_id: int) -> None:
        """Slice ``slice_id``'s VMs were struck and stay down (only when not :attr:`repairs_slices`)."""
        return None

    def take_recreated(self) -> list[int]:
        """The slices a VM asked to recreate since the last call. Default: none."""
        return []

    @property
    @abstractmethod
    def outcome(self) -> str:
        """``summary["capacity"]``: :data:`DELETED` or :data:`KEPT`."""

    @abstractmethod
    def line(self) -> str:
        """What ``local up`` reports about the capacity once the VMs are gone."""


class Backend(ABC):
    """One backend's operations (one instance per backend, in :data:`~infra.backends.operations.BACKENDS`)."""

    spec: ClassVar[BackendSpec]

    @property
    def name(self) -> str:
        """Its ``multislice:backend`` value."""
        return self.spec.name

    # --- the program (pulumi up) --------------------------------------------------------------

    @abstractmethod
    def declare(
        self,
        config: StackConfig,
        script: RenderedScript,
        *,
        network: Network,
        service_account: pulumi.Input[str],
        deployed: pulumi.Output[str | None],
        opts: pulumi.ResourceOptions,
    ) -> dict[str, Any]:
        """Declare the stack's slices (after every other component: ``opts``) from their typed
        inputs; ``deployed`` is the backend of the stack's last deployment (None: never
        deployed). Returns the stack outputs only this backend has."""

    @abstractmethod
    def ssh_command(self, config: StackConfig) -> str:
        """The command that follows worker 0 of slice 0's boot over SSH through IAP (the
        program's ``sshHint``)."""

    # --- logs --------------------------------------------------------------------------------

    @abstractmethod
    def trainer_filter(
        self,
        config: StackConfig,
        *,
        slice_id: int | None = None,
        worker: int | None = None,
        since: datetime | None = None,
        run: str | None = None,
    ) -> str:
        """The Cloud Logging filter of the trainer's lines of run ``run`` (default: the stack's),
        of one slice and/or worker, at or after ``since``.

        Raises:
          IndexError: ``slice_id`` is not a slice of the stack.
        """

    @abstractmethod
    def logging_filter(self, config: StackConfig) -> str:
        """The filter of every line of the stack's VMs (the program's ``loggingFilter``)."""

    @abstractmethod
    def log_source(self, config: StackConfig) -> str:
        """What ``multislice logs`` found none of, for its message (``log entries in project …``)."""

    # --- status ------------------------------------------------------------------------------

    @abstractmethod
    def capacity_source(self, config: StackConfig, credential_settings: Any, emulated_storage: bool) -> CapacitySource:
        """How ``multislice status`` reads the deployed stack's capacity (credentials checked first;
        ``credential_settings``: :class:`infra.credentials.CredentialSettings`).

        Raises:
          infra.backends.capacity.CapacityError: no usable credentials or tool (exit status 2).
        """

    @abstractmethod
    def gone_after_completion(self, config: StackConfig, completed_step: int | None) -> CapacityStatus:
        """The capacity of a stack whose capacity is gone while its run is complete."""

    @abstractmethod
    def headline(self, stack: str, capacity: CapacityStatus) -> str:
        """``status``'s first line for a deployed stack's capacity."""

    @abstractmethod
    def deleted_name(self, capacity: CapacityStatus) -> str:
        """What was deleted, for an emulated stack whose capacity the run deleted."""

    # --- exec and reset ----------------------------------------------------------------------

    @property
    def exec_needs_ssh(self) -> bool:
        """Whether ``multislice exec`` reaches the workers over SSH (IAP admitted, ssh tools and
        gcloud's key pair). Default: True."""
        return True

    @abstractmethod
    def exec_plan(self, gcloud: str, config: StackConfig, workers: Sequence[Worker], line: str) -> ExecPlan:
        """Check the deployed stack and plan ``line`` on ``workers`` (see :class:`ExecPlan`).

        Raises:
          infra.remote.selection.RemoteError: not deployed, not ready, or gcloud cannot be used.
        """

    @abstractmethod
    def reset_refusal(self, config: StackConfig) -> str | None:
        """Why ``multislice reset`` sends nothing on this backend, with what to do instead (None:
        it resets)."""

    def reset(
        self, config: StackConfig, *, confirm: Callable[[str], bool], say: Callable[[str], None], timeout_s: float
    ) -> str:
        """Restart every VM of the deployed stack (asked with ``confirm``, followed with ``say``);
        returns the closing line.

        Raises:
          infra.remote.selection.RemoteError: refused, not confirmed or not finished in time.
        """
        raise NotImplementedError(self.reset_refusal(config) or f"{self.name} has no reset")

    @abstractmethod
    def local_reset_refusal(self, config: StackConfig) -> str | None:
        """Why ``multislice local reset`` sends nothing on this backend's emulation (None: it resets)."""

    def local_reset(
        self,
        config: StackConfig,
        paths: LocalPaths,
        *,
        confirm: Callable[[str], bool],
        say: Callable[[str], None],
        timeout_s: float,
    ) -> float:
        """Restart every emulated VM of the running ``local up`` whose state is in ``paths``, as the
        backend's reset does; returns the seconds until every VM was back.

        Raises:
          infra.remote.selection.RemoteError: no such run, refused, not confirmed or not in time.
        """
        raise NotImplementedError(self.local_reset_refusal(config) or f"{self.name} has no reset")

    # --- a VM's identity, and the emulation ----------------------------------------------------

    @abstractmethod
    def vm_metadata(
        self, config: StackConfig, slice_id: int, worker: int, *, startup_script: str, run_dir: str
    ) -> dict[str, str]:
        """The metadata attributes of worker ``worker`` of slice ``slice_id``, as the backend's VM
        carries them (what ``pulumi up`` sets and what the platform sets), with ``startup_script``
        and ``run_dir``; the local emulation serves them to its VMs."""

    @abstractmethod
    def emulation(self, config: StackConfig, paths: LocalPaths) -> Emulation:
        """The backend's side of ``multislice local up`` for the stack (state in ``paths``)."""
