"""The queued resource's properties: one dataclass, each field with its engine name and kind.

The engine sees the properties under camelCase names (``queuedResourceId``); each field of
:class:`QueuedResourceInputs` carries that name and its :class:`Kind` in its metadata, and the
key tuples the provider uses (:data:`REPLACE_KEYS`, :data:`UPDATE_IN_PLACE_KEYS`,
:data:`INPUT_KEYS`, :data:`OUTPUT_KEYS`; :func:`keys_of` for any kind) are derived from it, so
a key's lifecycle is stated once.

Which kind a key has follows from the Cloud TPU API
(https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources):
a queued resource cannot be changed once created, and ``projects.locations.nodes.patch``
(``UpdateNode``) changes only ``description``, ``tags``, ``labels``, ``metadata`` and
``network_config.enable_external_ips`` of a node
(https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/patch).
"""

from __future__ import annotations

import enum
import json
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import pulumi
from pulumi.dynamic import CheckFailure
from pulumi.runtime.rpc import UNKNOWN

from infra.backends.queued_resource.provider.states import STATE_ORDER, state_name
from infra.vm_contract import RUN_DIR_KEY, STARTUP_SCRIPT_KEY

if TYPE_CHECKING:  # pragma: no cover
    from google.cloud import tpu_v2

#: Bump when create/diff/update/delete semantics change (an input: shows in previews).
#: 2: credentials as pulumi-gcp takes them; lost nodes replace; update resumes part-way.
#: 3: releaseOnComplete (now deleteOnComplete): a QR gone after its run completed is converged
#:    (the output ``released``, now ``deletedOnComplete``: :data:`FORMER_OUTPUT_KEYS`).
PROVIDER_VERSION = "3"

#: The capacity a queued resource can be requested with (:func:`build_queued_resource`): Spot,
#: on-demand, or a reservation (``multislice:capacity``; ``infra.config.CAPACITY_TYPES`` is the
#: same tuple, tests/backends/queued_resource/test_inputs.py checks it).
CAPACITY_TYPES = ("spot", "on-demand", "reserved")

#: OAuth scope of the VMs: access is governed by the service account's IAM roles
#: (https://cloud.google.com/compute/docs/access/service-accounts#accesscopesiam).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


class Kind(enum.Enum):
    """What a change of a property means."""

    #: Delete + create: the queued resource is immutable, and the node fields outside
    #: UpdateNode's mask cannot change in place.
    REPLACE = "replace"
    #: UpdateNode changes it on every node; no capacity is given up.
    UPDATE_IN_PLACE = "update_in_place"
    #: Describes the metadata for readable diffs (the script's own diff is hidden); it
    #: changes with the metadata and causes no API call of its own.
    DESCRIPTIVE = "descriptive"
    #: Steers the provider only (waits, deadlines, version): recorded, no API call.
    PROVIDER_ONLY = "provider_only"
    #: Reported by the provider; declared as ``None`` when the resource is registered.
    OUTPUT = "output"


def _prop(key: str, kind: Kind, default: Any = MISSING) -> Any:
    return field(default=default, metadata={"key": key, "kind": kind})


@dataclass(frozen=True, kw_only=True)
class QueuedResourceInputs:
    """The properties of a ``pulumi-python:dynamic/tpu:QueuedResource``.

    Values of ``network``, ``subnetwork``, ``service_account`` and ``tags`` may be Pulumi
    Outputs. Optional fields left ``None`` are absent from :meth:`to_props` (the engine stores
    no nulls). Timeouts are seconds.
    """

    # Kind.REPLACE ---------------------------------------------------------------------------
    project: str = _prop("project", Kind.REPLACE)
    zone: str = _prop("zone", Kind.REPLACE)
    queued_resource_id: str = _prop("queuedResourceId", Kind.REPLACE)
    #: The node id of a one-slice QR; ``node_id_prefix`` (``<prefix>-<i>``) for slices > 1.
    node_id: str | None = _prop("nodeId", Kind.REPLACE, None)
    node_id_prefix: str | None = _prop("nodeIdPrefix", Kind.REPLACE, None)
    accelerator_type: str = _prop("acceleratorType", Kind.REPLACE)
    runtime_version: str = _prop("runtimeVersion", Kind.REPLACE)
    slices: int = _prop("slices", Kind.REPLACE)
    capacity: str = _prop("capacity", Kind.REPLACE)
    #: ``projects/<p>/locations/<zone>/reservations/<name>`` with ``capacity: reserved``.
    reservation_name: str | None = _prop("reservationName", Kind.REPLACE, None)
    network: pulumi.Input[str] = _prop("network", Kind.REPLACE)
    subnetwork: pulumi.Input[str] = _prop("subnetwork", Kind.REPLACE)
    service_account: pulumi.Input[str] = _prop("serviceAccount", Kind.REPLACE)
    # Kind.UPDATE_IN_PLACE --------------------------------------------------------------------
    metadata: dict[str, str] = _prop("metadata", Kind.UPDATE_IN_PLACE)
    labels: dict[str, str] = _prop("labels", Kind.UPDATE_IN_PLACE)
    tags: pulumi.Input[list[str]] = _prop("tags", Kind.UPDATE_IN_PLACE)
    # Kind.DESCRIPTIVE ------------------------------------------------------------------------
    trainer: dict[str, Any] = _prop("trainer", Kind.DESCRIPTIVE)
    run_dir: str = _prop("runDir", Kind.DESCRIPTIVE)
    bundle_sha256: str = _prop("bundleSha256", Kind.DESCRIPTIVE)
    startup_script_sha256: str = _prop("startupScriptSha256", Kind.DESCRIPTIVE)
    requirements_sha256: str = _prop("requirementsSha256", Kind.DESCRIPTIVE)
    startup_script_bytes: int = _prop("startupScriptBytes", Kind.DESCRIPTIVE)
    #: Path → short sha256 of every file in the release (``RenderedScript.files``): a preview
    #: of a trainer change lists the files that changed. Absent in stacks created before it;
    #: its first appearance is a descriptive-only update (no API call).
    release_files: dict[str, str] | None = _prop("releaseFiles", Kind.DESCRIPTIVE, None)
    # Kind.PROVIDER_ONLY ----------------------------------------------------------------------
    wait_for: str = _prop("waitFor", Kind.PROVIDER_ONLY)
    create_timeout_seconds: float = _prop("createTimeoutSeconds", Kind.PROVIDER_ONLY)
    delete_timeout_seconds: float = _prop("deleteTimeoutSeconds", Kind.PROVIDER_ONLY)
    #: The queueing deadline only matters while a QR waits in the queue: a change is recorded
    #: and used by the next create, never a reason to give up capacity.
    valid_until_seconds: float | None = _prop("validUntilSeconds", Kind.PROVIDER_ONLY, None)
    version: str = _prop("version", Kind.PROVIDER_ONLY, PROVIDER_VERSION)
    # Kind.OUTPUT -----------------------------------------------------------------------------
    queued_resource_name: str | None = _prop("queuedResourceName", Kind.OUTPUT, None)
    state: str | None = _prop("state", Kind.OUTPUT, None)
    ready: bool | None = _prop("ready", Kind.OUTPUT, None)
    status_message: str | None = _prop("statusMessage", Kind.OUTPUT, None)
    node_names: list[str] | None = _prop("nodeNames", Kind.OUTPUT, None)
    nodes: list[dict[str, Any]] | None = _prop("nodes", Kind.OUTPUT, None)
    #: ``None`` while there are no nodes to compare.
    nodes_in_sync: bool | None = _prop("nodesInSync", Kind.OUTPUT, None)
    pending_node_sync: bool | None = _prop("pendingNodeSync", Kind.OUTPUT, None)
    #: Nodes an update did not finish (it stopped part-way); the next ``pulumi up`` does them.
    pending_nodes: list[str] | None = _prop("pendingNodes", Kind.OUTPUT, None)
    #: Node metadata changed but the VMs were not reset yet.
    pending_reset: bool | None = _prop("pendingReset", Kind.OUTPUT, None)
    #: Nodes of an ACTIVE queued resource that are gone (deleted, preempted): it is replaced.
    lost_nodes: list[str] | None = _prop("lostNodes", Kind.OUTPUT, None)
    #: The QR is gone because its run completed (``COMPLETE`` in the run directory for
    #: ``trainer.steps``): converged, not recreated (:mod:`~infra.backends.queued_resource.provider.completion`).
    deleted_on_complete: bool | None = _prop("deletedOnComplete", Kind.OUTPUT, None)
    #: The step of that completion record.
    completed_step: int | None = _prop("completedStep", Kind.OUTPUT, None)

    def to_props(self) -> dict[str, Any]:
        """The inputs under their engine names; ``None`` values and outputs are left out."""
        return {
            f.metadata["key"]: getattr(self, f.name)
            for f in fields(self)
            if f.metadata["kind"] is not Kind.OUTPUT and getattr(self, f.name) is not None
        }


#: Output keys an earlier provider wrote → their current name (same meaning). A stack whose
#: state was written before the rename carries ``released``; :func:`with_current_keys` reads it
#: as ``deletedOnComplete`` (no ``version`` bump: the semantics did not change).
FORMER_OUTPUT_KEYS = {"released": "deletedOnComplete"}


def with_current_keys(props: dict[str, Any]) -> dict[str, Any]:
    """``props`` (recorded inputs and outputs) with every :data:`FORMER_OUTPUT_KEYS` key under
    its current name; a current key already present wins."""
    current = {k: v for k, v in props.items() if k not in FORMER_OUTPUT_KEYS}
    for former, key in FORMER_OUTPUT_KEYS.items():
        if former in props and key not in current:
            current[key] = props[former]
    return current


def keys_of(*kinds: Kind) -> tuple[str, ...]:
    """Engine names of the properties of ``kinds``, in declaration order."""
    return tuple(f.metadata["key"] for f in fields(QueuedResourceInputs) if f.metadata["kind"] in kinds)


REPLACE_KEYS = keys_of(Kind.REPLACE)
UPDATE_IN_PLACE_KEYS = keys_of(Kind.UPDATE_IN_PLACE)
INPUT_KEYS = keys_of(Kind.REPLACE, Kind.UPDATE_IN_PLACE, Kind.DESCRIPTIVE, Kind.PROVIDER_ONLY)
OUTPUT_KEYS = keys_of(Kind.OUTPUT)


#: Descriptive keys that hash or measure the compressed script: they depend on the operator's
#: compressor (liblzma build, preset), so :func:`content_view` leaves them out once the script
#: names its release (the sha256 of the uncompressed release, :mod:`infra.startup.bundle`).
COMPRESSED_FORM_KEYS = ("startupScriptSha256", "startupScriptBytes")


def metadata_content(key: str, value: Any) -> Any:
    """What a node metadata value means: for the startup script, ``release:<release id>``
    when it names one (two renderings of one release by different compressors are equal);
    any other value as it is."""
    if key == STARTUP_SCRIPT_KEY and isinstance(value, str):
        from infra.startup.bundle import release_id_of  # stdlib only; kept out of the import path

        release = release_id_of(value)
        if release is not None:
            return f"release:{release}"
    return value


def content_view(props: dict[str, Any]) -> dict[str, Any]:
    """``props`` as diff compares them: the startup script by its release id
    (:func:`metadata_content`) and, when it has one, without :data:`COMPRESSED_FORM_KEYS`.
    A no-op ``pulumi up`` by an operator whose compressor differs is then a no-op."""
    view = dict(props)
    metadata = props.get("metadata")
    if isinstance(metadata, dict):
        view["metadata"] = {k: metadata_content(k, v) for k, v in metadata.items()}
        if str(view["metadata"].get(STARTUP_SCRIPT_KEY, "")).startswith("release:"):
            for key in COMPRESSED_FORM_KEYS:
                view.pop(key, None)
    return view


def differs(old: Any, new: Any) -> bool:
    """Whether a property changed; a value not yet known (``pulumi preview``) counts as changed."""
    if old == UNKNOWN or new == UNKNOWN:
        return True
    return json.dumps(old, sort_keys=True, default=str) != json.dumps(new, sort_keys=True, default=str)


#: Input keys ``check`` requires (Pulumi reports each missing one by name).
REQUIRED_KEYS = (
    "project",
    "zone",
    "queuedResourceId",
    "acceleratorType",
    "runtimeVersion",
    "slices",
    "capacity",
    "serviceAccount",
    "metadata",
)


def check_failures(news: dict[str, Any]) -> list[CheckFailure]:
    """What ``check`` rejects in the new properties ``news``, one failure per property (a value
    not known yet, in ``pulumi preview``, is not checked). No network call."""
    failures: list[CheckFailure] = []

    def known(key: str) -> bool:
        return key in news and news[key] != UNKNOWN

    for key in REQUIRED_KEYS:
        if key not in news or news[key] in (None, ""):
            failures.append(CheckFailure(key, "required"))
    if known("slices") and not (isinstance(news["slices"], (int, float)) and 1 <= int(news["slices"]) <= 256):
        failures.append(CheckFailure("slices", f"must be 1..256; got {news['slices']!r}"))
    if known("slices") and int(news.get("slices") or 0) > 1 and not news.get("nodeIdPrefix"):
        failures.append(CheckFailure("nodeIdPrefix", "required when slices > 1"))
    if known("capacity") and news["capacity"] not in CAPACITY_TYPES:
        failures.append(
            CheckFailure("capacity", f"must be one of {', '.join(CAPACITY_TYPES)}; got {news['capacity']!r}")
        )
    if known("capacity") and news["capacity"] == "reserved" and not news.get("reservationName"):
        failures.append(CheckFailure("reservationName", "required with capacity 'reserved'"))
    if known("waitFor") and news["waitFor"] not in STATE_ORDER[1:]:
        failures.append(
            CheckFailure("waitFor", f"must be one of {', '.join(STATE_ORDER[1:])}; got {news['waitFor']!r}")
        )
    if known("metadata") and isinstance(news["metadata"], dict):
        for key in (STARTUP_SCRIPT_KEY, RUN_DIR_KEY):
            if not news["metadata"].get(key):
                failures.append(CheckFailure(f"metadata.{key}", "required"))
    return failures


# Derived from the props --------------------------------------------------------------------


def node_ids(props: dict[str, Any]) -> list[str]:
    """Node ids the QR of ``props`` creates: ``<prefix>-0…`` (slices > 1) or ``nodeId``."""
    if props.get("nodeIdPrefix"):
        return [f"{props['nodeIdPrefix']}-{i}" for i in range(int(props["slices"]))]
    return [props.get("nodeId") or props["queuedResourceId"]]


def parent_of(props: dict[str, Any]) -> str:
    """``projects/<project>/locations/<zone>``: the parent of the QR and its nodes."""
    return f"projects/{props['project']}/locations/{props['zone']}"


def qr_name_of(props: dict[str, Any]) -> str:
    """The QR's resource name, ``projects/<p>/locations/<zone>/queuedResources/<id>``."""
    return f"{parent_of(props)}/queuedResources/{props['queuedResourceId']}"


def outputs_for(
    props: dict[str, Any],
    qr: Any | None,
    nodes: list[dict[str, Any]] | None,
    *,
    ready: bool,
    message: str = "",
    pending_node_sync: bool = False,
    pending_nodes: list[str] | None = None,
    pending_reset: bool = False,
    lost_nodes: list[str] | None = None,
    completed_step: int | None = None,
) -> dict[str, Any]:
    """The resource's outputs: the inputs of ``props`` plus every :data:`OUTPUT_KEYS` value.

    Args:
      qr: the live ``tpu_v2.QueuedResource`` (None: state ``UNKNOWN``).
      nodes: per-node views (``TpuApi.node_views``); None or empty while there are none.
      pending_node_sync, pending_nodes, pending_reset: what an update left to do.
      lost_nodes: nodes of an ACTIVE QR that are gone.
      completed_step: the run's completion step when the QR is gone because the run completed
        (``deletedOnComplete`` is then true).
    """
    outs = {k: v for k, v in props.items() if k in INPUT_KEYS}
    outs.update(
        queuedResourceName=qr_name_of(props),
        state=state_name(qr) if qr is not None else "UNKNOWN",
        ready=ready,
        statusMessage=message,
        nodeNames=node_ids(props),
        nodes=nodes or [],
        # None (not False) while there are no nodes to compare: nothing to converge yet.
        nodesInSync=all(n.get("inSync") for n in nodes) if nodes else None,
        pendingNodeSync=pending_node_sync,
        pendingNodes=list(pending_nodes or []),
        pendingReset=pending_reset,
        lostNodes=list(lost_nodes or []),
        deletedOnComplete=completed_step is not None,
        completedStep=completed_step,
    )
    return outs


def build_queued_resource(props: dict[str, Any]) -> tpu_v2.QueuedResource:
    """The ``tpu_v2.QueuedResource`` message for ``props`` (:meth:`QueuedResourceInputs.to_props`)."""
    from google.cloud import tpu_v2
    from google.protobuf import duration_pb2

    node = tpu_v2.Node(
        accelerator_type=props["acceleratorType"],
        runtime_version=props["runtimeVersion"],
        network_config=tpu_v2.NetworkConfig(
            network=props["network"], subnetwork=props["subnetwork"], enable_external_ips=False
        ),
        service_account=tpu_v2.ServiceAccount(email=props["serviceAccount"], scope=[CLOUD_PLATFORM_SCOPE]),
        metadata=dict(props.get("metadata") or {}),
        labels=dict(props.get("labels") or {}),
        tags=list(props.get("tags") or []),
        description=f"multislice {props['queuedResourceId']} ({int(props['slices'])} x {props['acceleratorType']})",
    )
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent_of(props), node=node)
    if props.get("nodeIdPrefix"):
        spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_count=int(props["slices"]), node_id_prefix=props["nodeIdPrefix"]
        )
    else:
        spec.node_id = props.get("nodeId") or props["queuedResourceId"]
    qr = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
    capacity = props["capacity"]
    if capacity == "spot":
        qr.spot = tpu_v2.QueuedResource.Spot()
    elif capacity == "reserved":
        qr.reservation_name = props["reservationName"]
    if props.get("validUntilSeconds"):
        qr.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=int(props["validUntilSeconds"]))
        )
    return qr
