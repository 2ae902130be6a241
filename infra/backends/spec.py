"""What a backend *is*, as a stack file and a TPU VM see it: :class:`BackendSpec`.

The config layer's half of the seam (:mod:`infra.backends`): :mod:`infra.config` validates a
stack through the spec of its ``multislice:backend`` (:data:`infra.backends.registry.SPECS`), and
:mod:`infra.startup` renders the VM's boot from it. A spec answers from the catalog
(:mod:`infra.accelerators`, which keeps the facts and their sources) and from its own settings
model; it imports nothing above the catalog and never the stack config (``config`` arguments are
a :class:`~infra.config.StackConfig`, read by attribute).

Errors: the ``check_*`` methods raise what :func:`training.validation.invalid` makes, naming the
stack key, as the schema's own rules do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from importlib import resources
from typing import Any, ClassVar

from pydantic import BaseModel

from infra.accelerators import Generation

#: Where a VM's trainer finds its place in the job (the trainer unit's ``MULTISLICE_IDENTITY``,
#: written by the boot from the spec; ``training.cluster``): Cloud TPU's metadata keys
#: (``agent-worker-number``, ``worker-network-endpoints``, ``tpu-env``), or the environment the
#: boot or the platform exports (``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES``, ``MEGASCALE_*``).
IDENTITY_SOURCES = ("metadata", "environment")
#: What keeps the trainer running once the boot is done: a systemd unit the boot writes (a TPU VM:
#: ``Restart=on-failure``), or the boot's own process, the trainer in the foreground (a container:
#: its status is the container's, and the platform's restart policy decides what follows).
SUPERVISORS = ("systemd", "container")
#: The reservation paths a backend's API takes beside a name (``multislice:reservationName``;
#: :mod:`infra.config.reservations` has the sources): the Cloud TPU API's
#: ``projects/<p>/locations/<zone>/reservations/<name>`` (``tpu``), and the form of Compute Engine's
#: ``reservationAffinity``, ``projects/<p>/reservations/<name>`` (``compute``), which GKE's node pools take too.
RESERVATION_FORMS = ("tpu", "compute")


class BackendSpec(ABC):
    """One backend's static description (one instance per backend, in :data:`~infra.backends.registry.SPECS`).

    Class attributes every backend sets:

    * ``name``: its ``multislice:backend`` value; ``summary``: a few words for the key's description;
    * ``settings_key`` / ``settings_field`` / ``settings_model``: the stack key it owns (a map),
      the :class:`~infra.config.StackConfig` attribute holding it, and its pydantic model (every
      field defaulted: an absent key configures nothing);
    * ``capacities``: the ``multislice:capacity`` values it can request, and ``capacity_source``,
      what offers them (for the refusal of the others);
    * ``service``: who offers its TPUs, as messages name it; ``catalog_qualifier``: what the
      zone messages add after a generation (``" on Compute Engine"``);
    * ``sole_offer_reason``: why a generation only this backend offers is not on the others;
    * ``has_runtime_version``: whether a stack names a TPU software version (``runtimeVersion``);
    * ``capacity_noun``: what ``status`` calls the stack's capacity (``queued resource``), and
      ``capacity_plural``: whether that is a plural (``instance groups``); ``worker_noun``: what it
      calls a slice's workers (``VMs``; ``Pods`` on GKE);
    * ``apis``: the Google APIs its own resources need beside those every stack enables
      (:data:`infra.components.apis.COMMON_APIS`); the program enables them;
    * ``vm_reads_instance_groups``: whether its VMs' service account may read Compute Engine's
      instance groups and instances (how such a VM finds its place);
    * ``node_project_roles``: roles its VMs' service account needs on the project beyond every
      stack's (a GKE node's agents and image pulls);
    * ``legacy_output``: a stack output only its deployments have, for a deployment older than the
      ``backend`` output (None: none older);
    * the VM contract: ``boot_identity`` (the file of this package that ``boot.sh`` runs to learn
      the VM's worker and slice, filled with :meth:`boot_values`), ``release_watch`` (the VM
      reads the release record itself: no platform operation reboots it into a new release),
      ``identity_source`` (one of :data:`IDENTITY_SOURCES`) and ``log_resource`` (the Cloud
      Logging monitored resource type of its VMs' lines), and ``supervisor`` (one of
      :data:`SUPERVISORS`; default ``systemd``);
    * ``reservation_forms``: the reservation paths (of :data:`RESERVATION_FORMS`) a stack may give it,
      the one its API takes first (the one a refusal names), then any it also reads.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    settings_key: ClassVar[str]
    settings_field: ClassVar[str]
    settings_model: ClassVar[type[BaseModel]]
    capacities: ClassVar[tuple[str, ...]]
    capacity_source: ClassVar[str]
    service: ClassVar[str]
    catalog_qualifier: ClassVar[str] = ""
    sole_offer_reason: ClassVar[str]
    has_runtime_version: ClassVar[bool]
    capacity_noun: ClassVar[str]
    capacity_plural: ClassVar[bool] = False
    worker_noun: ClassVar[str] = "VMs"
    apis: ClassVar[tuple[str, ...]] = ()
    vm_reads_instance_groups: ClassVar[bool] = False
    node_project_roles: ClassVar[tuple[str, ...]] = ()
    legacy_output: ClassVar[str | None] = None
    boot_identity: ClassVar[str]
    release_watch: ClassVar[bool] = False
    identity_source: ClassVar[str]
    log_resource: ClassVar[str]
    supervisor: ClassVar[str] = "systemd"
    reservation_forms: ClassVar[tuple[str, ...]]

    # --- the catalog's answers ----------------------------------------------------------------

    def offers(self, gen: Generation) -> bool:
        """Whether this backend offers ``gen`` (the catalog's ``Generation.backends``)."""
        return gen.offered_by(self.name)

    @abstractmethod
    def zones(self, gen: Generation) -> tuple[tuple[str, ...], str]:
        """The zones where this backend offers ``gen``, and their source (the catalog's)."""

    # --- the stack's keys --------------------------------------------------------------------

    def settings(self, config: Any) -> BaseModel:
        """The stack's value of :attr:`settings_key` (its model; defaults when absent)."""
        return getattr(config, self.settings_field)

    def settings_set(self, config: Any) -> list[str]:
        """The keys of :attr:`settings_key` the stack sets to a value other than the default (a
        key set to its default configures nothing)."""
        defaults = self.settings_model().model_dump(by_alias=True)
        settings = self.settings(config).model_dump(by_alias=True)
        return [key for key, value in settings.items() if value != defaults[key]]

    def check_keys(self, config: Any) -> None:
        """Refuse the stack keys this backend cannot honour (after its generation was found
        offered). Default: none."""
        return None

    def check_capacity(self, config: Any) -> None:
        """Refuse a capacity setting this backend cannot honour (after the capacity was found
        offered). Default: none."""
        return None

    def capacity_plan(self, config: Any) -> str | None:
        """One line for ``multislice plan`` on how the capacity is requested and kept, when the
        backend's resources depend on it beyond the capacity's name. Default: None (no line)."""
        return None

    @abstractmethod
    def refuse_settings(self, changed: list[str], backend: str) -> Exception:
        """The error for a stack of ``backend`` that sets this backend's key (``changed``: the
        keys set), naming :attr:`settings_key`."""

    @abstractmethod
    def describe_deployment(self, outputs: Mapping[str, Any]) -> str:
        """What a deployment of this backend holds, from its stack ``outputs`` (what a change of
        backend deletes: ``the queued resource <name> and its slices' TPU VMs``)."""

    def delete_on_complete(self, config: Any) -> bool:
        """Whether worker 0 of slice 0 deletes the stack's slices once its run is complete.
        Default: not built (False)."""
        return False

    # --- the VM contract ---------------------------------------------------------------------

    def boot_values(self) -> dict[str, str]:
        """The placeholders of :attr:`boot_identity` and their values. Default: none."""
        return {}

    def slice_watch(self, config: Any) -> str | None:
        """The file of this package the stack's release carries as ``slice-watch.sh``, which the
        release watch runs once per poll to recreate a slice whose VMs were lost (filled with the
        contract's endpoint defaults, as :attr:`boot_identity`); None when the platform repairs
        the slices itself. Default: None."""
        return None

    def slice_watch_recreates(self, config: Any) -> bool:
        """Whether :meth:`slice_watch` recreates a lost slice (its VMs then need the permission to;
        elsewhere it only reports). Default: False."""
        return False

    def slice_watch_values(self, config: Any) -> dict[str, str]:
        """The placeholders of :meth:`slice_watch`'s file besides the endpoint defaults, and their
        values for ``config``. Default: none."""
        return {}

    def package_text(self, file: str) -> str:
        """The text of ``file``, package data of the backend's package."""
        package = type(self).__module__.rpartition(".")[0]
        return resources.files(package).joinpath(file).read_text(encoding="utf-8")

    def boot_identity_template(self) -> str:
        """The text of :attr:`boot_identity` (package data of the backend's package)."""
        return self.package_text(self.boot_identity)
