"""Evaluate the Pulumi program (infra/__main__.py) under ``pulumi.runtime.set_mocks``: offline.

The tests, ``multislice check`` (the policy pack over what a stack declares) and ``multislice
diff`` evaluate the program this way: no Pulumi CLI, no engine, no cloud credentials
(https://www.pulumi.com/docs/iac/guides/testing/unit/).

The config reaches the program the way the engine hands it over (``namespace:key`` →
string, objects as JSON text) and the program parses it itself (``load_config``). A
recording monitor keeps every registration: type, name, inputs and options (protect,
retainOnDelete, import id, hideDiffs, dependencies, parent); exports are the resolved values ``define`` exported. The
mocks answer like the cloud would: resource paths as ids, service-account emails, a QR that
is ACTIVE (or still queued, on request).
"""

from __future__ import annotations

import hashlib
import json
import runpy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import mocks as pulumi_mocks, rpc, settings

import infra.__main__ as program
from infra.config import pulumi_config_of_file, stack_file
from infra.config.structured import STRUCTURED_KEYS
from infra.review import event_loop
from infra.review.program_warnings import PROGRAM_LOG

QR_TYPE = "pulumi-python:dynamic/tpu:QueuedResource"
#: The program reads its own stack's last outputs through one (infra/__main__.py, backend_gate).
STACK_REFERENCE = "pulumi:pulumi:StackReference"
TEMPLATE_TYPE = "gcp:compute/instanceTemplate:InstanceTemplate"
GROUP_TYPE = "gcp:compute/instanceGroupManager:InstanceGroupManager"
RESIZE_REQUEST_TYPE = "gcp:compute/resizeRequest:ResizeRequest"
JOBSET_TYPE = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"
WORKLOAD_POLICY_TYPE = "gcp:compute/resourcePolicy:ResourcePolicy"
FIREWALL = "gcp:compute/firewall:Firewall"
#: ipCidrRange the getSubnetwork lookup answers for a reused subnetwork.
LOOKED_UP_CIDR = "10.20.0.0/16"


@dataclass
class Registration:
    typ: str
    name: str
    urn: str
    inputs: dict[str, Any]
    protect: bool
    hide_diffs: list[str]
    dependencies: list[str]
    parent: str
    #: Former identities the program declared (``aliases``), each as its non-empty alias spec
    #: fields (``type``, ``name``, ``parentUrn``, …) or ``{"urn": ...}``.
    aliases: list[dict[str, Any]] = field(default_factory=list)
    #: ``retainOnDelete``: ``pulumi destroy`` leaves the cloud resource and drops it from the stack.
    retain_on_delete: bool = False
    #: The ``import`` option's id ("" when the resource is created, not imported).
    import_id: str = ""
    #: ``deleteBeforeReplace``: a replacement deletes this one first (else the new one comes first).
    delete_before_replace: bool = False
    #: ``replaceOnChanges``: input keys whose change replaces the resource whatever its provider says.
    replace_on_changes: list[str] = field(default_factory=list)
    #: ``ignoreChanges``: input keys whose change (or drift) the deployment leaves as it is.
    ignore_changes: list[str] = field(default_factory=list)


@dataclass
class World:
    """What one program evaluation registered."""

    registrations: list[Registration] = field(default_factory=list)
    exports: dict[str, Any] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    #: Resources the program read rather than declared (``Resource.get``): (type, id), in order.
    reads: list[tuple[str, str]] = field(default_factory=list)

    def of(self, typ: str) -> list[Registration]:
        return [r for r in self.registrations if r.typ == typ]

    def one(self, typ: str) -> Registration:
        found = self.of(typ)
        assert len(found) == 1, f"{typ}: {len(found)} registrations"
        return found[0]


GKE_CLUSTER_TYPE = "gcp:container/cluster:Cluster"
DEPLOYMENT_TYPE = "kubernetes:apps/v1:Deployment"
#: The JobSet controller's image an existing cluster runs, unless a test says otherwise.
JOBSET_IMAGE = "registry.k8s.io/jobset/jobset:v0.10.1"
#: Kueue's image an existing cluster runs (a read of ``kueue-system/kueue-controller-manager``).
KUEUE_IMAGE = "registry.k8s.io/kueue/kueue:v0.17.1"


def gke_dns_endpoint(cluster: str, location: str) -> str:
    """The DNS-based endpoint the mocks answer for a GKE cluster (GKE's form: ``gke-HASH.LOCATION.gke.goog``)."""
    return f"gke-{unique_id(cluster)[:12]}.{location}.gke.goog"


class Mocks(pulumi.runtime.Mocks):
    """Cloud-like outputs: ids/paths, service account emails, and a ready QR.

    ``subnet_network``: the ``network`` URL getSubnetwork answers for a reused subnetwork (the
    Compute API's ``https://www.googleapis.com/compute/v1/projects/<p>/global/networks/<n>``);
    None answers without one. ``stack_outputs``: the outputs of the stack's last deployment, as a
    ``StackReference`` to the stack reads them (None: never deployed). ``existing_cluster``: what
    getCluster answers of an existing GKE cluster beside its DNS-based endpoint (None: a cluster the
    stack can use: Workload Identity with the project's pool, a CPU pool, GKE 1.35). ``jobset_image``:
    the JobSet controller's image a read of its Deployment answers (:data:`JOBSET_IMAGE`).
    """

    def __init__(
        self,
        world: World,
        *,
        qr_ready: bool = True,
        subnet_network: str | None = None,
        stack_outputs: dict[str, Any] | None = None,
        existing_cluster: dict[str, Any] | None = None,
        jobset_image: str = JOBSET_IMAGE,
    ):
        self.world = world
        self.jobset_image = jobset_image
        self.qr_ready = qr_ready
        self.subnet_network = subnet_network
        self.stack_outputs = stack_outputs
        self.existing_cluster = existing_cluster

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        inputs = dict(args.inputs)
        outs = dict(inputs)
        project = inputs.get("project", "p")
        typ = args.typ
        if typ == "gcp:compute/network:Network":
            id_ = f"projects/{project}/global/networks/{inputs['name']}"
        elif typ == "gcp:compute/subnetwork:Subnetwork":
            id_ = f"projects/{project}/regions/{inputs['region']}/subnetworks/{inputs['name']}"
        elif typ == "gcp:serviceaccount/account:Account":
            email = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
            id_ = f"projects/{project}/serviceAccounts/{email}"
            outs.update(email=email, member=f"serviceAccount:{email}", uniqueId=unique_id(email))
        elif typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
            id_ = f"projects/{project}/roles/{inputs['roleId']}"
            outs["name"] = id_
        elif typ == "gcp:storage/bucket:Bucket":
            id_ = inputs["name"]
            outs["url"] = f"gs://{inputs['name']}"
        elif typ == QR_TYPE:
            id_ = f"projects/{project}/locations/{inputs['zone']}/queuedResources/{inputs['queuedResourceId']}"
            prefix = inputs.get("nodeIdPrefix")
            names = [f"{prefix}-{i}" for i in range(int(inputs["slices"]))] if prefix else [inputs["nodeId"]]
            state = "ACTIVE" if self.qr_ready else "WAITING_FOR_RESOURCES"
            outs.update(
                queuedResourceName=id_,
                state=state,
                ready=self.qr_ready,
                statusMessage="ACTIVE"
                if self.qr_ready
                else "queued resource 'x' is still WAITING_FOR_RESOURCES; recorded in the stack",
                nodeNames=names,
                nodes=[],
            )
        elif typ == STACK_REFERENCE:
            id_ = inputs["name"]
            outs.update(outputs=dict(self.stack_outputs or {}), secretOutputNames=[])
        elif typ == TEMPLATE_TYPE:
            id_ = f"projects/{project}/global/instanceTemplates/{inputs['namePrefix']}{args.name}"
            outs.update(selfLink=id_, selfLinkUnique=f"{id_}?uniqueId={unique_id(json.dumps(inputs, sort_keys=True))}")
        elif typ == WORKLOAD_POLICY_TYPE:
            # Pulumi auto-names it (a random suffix), and a changed policy is a new one: a new name.
            suffix = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:7]
            id_ = f"projects/{project}/regions/{inputs['region']}/resourcePolicies/{args.name}-{suffix}"
            outs["selfLink"] = id_
        elif typ == GKE_CLUSTER_TYPE:  # GKE answers the DNS-based endpoint it made (gke-HASH.LOCATION.gke.goog)
            id_ = f"projects/{project}/locations/{inputs['location']}/clusters/{inputs['name']}"
            dns = dict((inputs.get("controlPlaneEndpointsConfig") or {}).get("dnsEndpointConfig") or {})
            if dns:
                dns["endpoint"] = gke_dns_endpoint(inputs["name"], inputs["location"])
                outs["controlPlaneEndpointsConfig"] = {"dnsEndpointConfig": dns}
        elif typ == DEPLOYMENT_TYPE and args.resource_id:  # a read: the JobSet controller (or Kueue) of a cluster
            id_ = args.resource_id
            image = KUEUE_IMAGE if id_.startswith("kueue-system/") else self.jobset_image
            container = {"name": "manager", "image": image}
            outs = {
                "metadata": {"name": id_.split("/")[-1]},
                "spec": {"template": {"spec": {"containers": [container]}}},
            }
        elif typ == GROUP_TYPE:
            id_ = f"projects/{project}/zones/{inputs['zone']}/instanceGroupManagers/{inputs['name']}"
            outs["selfLink"] = id_
        else:
            id_ = f"{args.name}-id"
        return id_, outs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list[tuple[str, str]] | None]:
        self.world.calls.append(args.token)
        if args.token == "gcp:compute/getSubnetwork:getSubnetwork":
            answer = {
                "ipCidrRange": LOOKED_UP_CIDR,
                "name": args.args.get("name"),
                "region": args.args.get("region"),
                "project": args.args.get("project"),
            }
            return answer | ({"network": self.subnet_network} if self.subnet_network else {}), []
        if args.token == "gcp:container/getCluster:getCluster":  # an existing cluster, with a DNS-based endpoint
            endpoint = gke_dns_endpoint(str(args.args.get("name")), str(args.args.get("location")))
            usable = {
                "workloadIdentityConfigs": [{"workloadPool": f"{args.args.get('project')}.svc.id.goog"}],
                "nodePools": [{"name": "default-pool", "nodeConfigs": [{"machineType": "e2-standard-4"}]}],
                "masterVersion": "1.35.1-gke.1396000",
            }
            answer = usable if self.existing_cluster is None else self.existing_cluster
            return {"controlPlaneEndpointsConfigs": [{"dnsEndpointConfigs": [{"endpoint": endpoint}]}], **answer}, []
        return {}, []  # (no check failures: pulumi's MockMonitor iterates them, though typed Optional)


class RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: Mocks):
        super().__init__(mocks)
        self.world = mocks.world

    def ReadResource(self, request):
        self.world.reads.append((request.type, request.id))
        return super().ReadResource(request)

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            # A remote component (a provider's own component, e.g. kubernetes:yaml/v2:ConfigFile) has inputs too.
            inputs = rpc.deserialize_properties(request.object) if request.custom or request.remote else {}
            self.world.registrations.append(
                Registration(
                    typ=request.type,
                    name=request.name,
                    urn=response.urn,
                    inputs=_plain(inputs),
                    protect=bool(request.protect),
                    hide_diffs=list(request.hideDiffs),
                    dependencies=list(request.dependencies),
                    parent=request.parent,
                    aliases=[_alias(alias) for alias in request.aliases],
                    retain_on_delete=bool(request.retainOnDelete),
                    import_id=request.importId,
                    delete_before_replace=bool(request.deleteBeforeReplace),
                    replace_on_changes=list(request.replaceOnChanges),
                    ignore_changes=list(request.ignoreChanges),
                )
            )
        return response


def unique_id(email: str) -> str:
    """The mocks' ``uniqueId`` of a service account: 21 digits, as IAM's are, derived from
    ``email`` (IAM assigns a new one to every account it creates)."""
    return str(int(hashlib.sha256(email.encode()).hexdigest(), 16))[:21]


def _alias(alias: Any) -> dict[str, Any]:
    if alias.WhichOneof("alias") == "urn":
        return {"urn": alias.urn}
    # An empty parentUrn means "the current parent" (pulumi.runtime.resource.create_alias_spec).
    return {descriptor.name: value for descriptor, value in alias.spec.ListFields() if value not in ("", False)}


def _plain(value: Any) -> Any:
    """``value`` as JSON: a file asset as the engine's wire form (its signature and ``path``, which
    ``pulumi_policy`` turns back into a ``FileAsset``), anything else unknown as its ``str``."""
    return json.loads(json.dumps(value, default=_wire))


def _wire(value: Any) -> Any:
    if isinstance(value, pulumi.FileAsset):
        from pulumi.runtime import rpc

        return {rpc._special_sig_key: rpc._special_asset_sig, "path": value.path}  # noqa: SLF001 (the wire keys)
    return str(value)


def engine_config(stack_config: dict[str, Any]) -> dict[str, str]:
    """A stack file's ``config:`` as the engine hands it to a program (strings, JSON objects)."""
    out = {}
    for key, value in stack_config.items():
        if isinstance(value, (dict, list)):
            out[key] = json.dumps(value)
        elif isinstance(value, bool):
            out[key] = "true" if value else "false"
        else:
            out[key] = str(value)
    return out


def stack_map(stack: str) -> dict[str, Any]:
    """The config map ``pulumi up`` hands the program for ``stack``'s file (:func:`infra.config.pulumi_config_of_file`),
    a map or a list decoded from its JSON text (:func:`engine_config` writes it back as the engine did), so
    that a caller can change a value of it.

    Raises:
      StackConfigError: the file cannot be read as the engine reads it.
    """
    return decoded(pulumi_config_of_file(stack_file(stack), stack))


def decoded(engine: dict[str, Any]) -> dict[str, Any]:
    """The engine's config map ``engine`` with its values decoded where they are JSON: a map or a list (of a
    key that takes one), a number, a boolean; :func:`engine_config` writes them back as the engine did."""
    out = {}
    for key, value in engine.items():
        try:
            parsed = json.loads(value) if isinstance(value, str) and value.strip() else value
        except ValueError:
            parsed = value  # text, or broken JSON the config check names
        structured = key in STRUCTURED_KEYS and isinstance(parsed, (dict, list))
        out[key] = parsed if structured or isinstance(parsed, (bool, int, float)) else value
    return out


def program_directory() -> Path:
    """The directory the Pulumi CLI runs as the program: Pulumi.yaml's ``main`` (a directory,
    relative to the project), else the project's own (``getPwdMain`` in pulumi/pulumi's
    ``pkg/engine/project.go``; docs/deploying.md, "How the Pulumi CLI starts the provider")."""
    project = Path(program.__file__).resolve().parents[1]
    main = yaml.safe_load((project / "Pulumi.yaml").read_text()).get("main")
    return (project / main).resolve() if main else project


def evaluate(
    stack: str,
    config_map: dict[str, Any] | None = None,
    *,
    qr_ready: bool = True,
    preview: bool = False,
    as_main: bool = False,
    script: Any = None,
    subnet_network: str | None = None,
    stack_outputs: dict[str, Any] | None = None,
    existing_cluster: dict[str, Any] | None = None,
    jobset_image: str = JOBSET_IMAGE,
) -> World:
    """Run the program for ``stack`` under mocks (an update, or a preview); return what it
    registered and exported (``as_main``: run the project's program directory with runpy as
    the language host does, see :func:`program_directory`; exports are then not captured;
    ``script``: an ``infra.startup.RenderedScript`` to declare instead of rendering one from
    this checkout, e.g. one rendered from another revision's trainer; ``subnet_network``,
    ``stack_outputs``, ``existing_cluster``, ``jobset_image``: see :class:`Mocks`)."""
    config = engine_config(config_map if config_map is not None else stack_map(stack))
    world = _start(stack, config, qr_ready, preview, subnet_network, stack_outputs, existing_cluster, jobset_image)

    @pulumi.runtime.test
    def run():
        env = program.define(program.load_config(), script)
        return pulumi.Output.all(**env.exports).apply(lambda values: world.exports.update(_plain(values)))

    @pulumi.runtime.test
    def run_as_pulumi_does():
        # The Python language host runs the program directory with runpy (first on sys.path).
        runpy.run_path(str(program_directory()), run_name="__main__")

    event_loop.tracebacks_parse_nothing()
    try:
        (run_as_pulumi_does if as_main else run)()
    except BaseException:
        event_loop.cancel_leftovers()
        raise
    return world


def _start(
    stack: str,
    config: dict[str, str],
    qr_ready: bool,
    preview: bool,
    subnet_network: str | None = None,
    stack_outputs: dict[str, Any] | None = None,
    existing_cluster: dict[str, Any] | None = None,
    jobset_image: str = JOBSET_IMAGE,
) -> World:
    world = World()
    mocks = Mocks(
        world,
        qr_ready=qr_ready,
        subnet_network=subnet_network,
        stack_outputs=stack_outputs,
        existing_cluster=existing_cluster,
        jobset_image=jobset_image,
    )
    settings.ROOT.set(None)  # a fresh root Stack resource per evaluation
    event_loop.ensure_event_loop()
    pulumi.runtime.set_mocks(
        mocks,
        project="multislice",
        stack=stack,
        preview=preview,
        logger=PROGRAM_LOG,  # the program's warnings: infra.review.program_warnings
        monitor=RecordingMonitor(mocks),
    )
    pulumi.runtime.set_all_config(config)
    return world


def declare(build: Callable[[], Any], stack: str = "t") -> World:
    """Run ``build`` (which declares resources, e.g. one component from its own args) under
    the same mocks, with an empty config map; return what it registered."""
    world = _start(stack, {}, qr_ready=True, preview=False)

    @pulumi.runtime.test
    def run():
        build()

    run()
    return world
