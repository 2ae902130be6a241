"""The gke backend's Kubernetes objects: :class:`GkeWorkload`, the run's JobSet and what it needs.

In the cluster of :class:`~infra.backends.gke.slices.GkeSlices`, through a Kubernetes provider
that reaches the control plane's DNS-based endpoint (the only one an operator outside the VPC can
reach: a new cluster's IP endpoint is private, :func:`~infra.backends.gke.cluster_declaration.cluster_args`):

* the namespace ``multislice:gke.namespace`` (unless ``default``, which every cluster has);
* the Pods' Kubernetes service account, annotated with the stack's Google service account, which
  the Workload Identity binding of :class:`~infra.backends.gke.slices.GkeSlices` lets it act as
  ([Google] "Authenticate to Google Cloud APIs from GKE workloads": the annotation
  ``iam.gke.io/gcp-service-account``);
* the JobSet controller, the documented way: the release's ``manifests.yaml``, applied server-side
  (docs/gke.md section 5; ``multislice:gke.installJobSet: false`` when the cluster already runs it);
* with ``multislice:gke.queuedProvisioning``, Kueue (installed from its release manifests in a cluster the
  stack makes, read and checked in an existing one) and the stack's queues (:mod:`~infra.backends.gke.kueue`);
* the ConfigMap of the release's startup script, named after the release
  (:func:`~infra.backends.gke.jobset.startup_config_map_name`), which the Pods boot;
* the JobSet of :func:`~infra.backends.gke.jobset.jobset`. Its ``spec.replicatedJobs`` is immutable
  (docs/gke.md section 5, "Updates"), so any change of its spec replaces it, the old one deleted
  first (same name): every Pod of the run restarts, and the trainer resumes from the newest
  checkpoint.

**Reaching the cluster** ([Google] gcloud 528's ``googlecloudsdk/api_lib/container/kubeconfig.py``
and ``util.py``, what ``gcloud container clusters get-credentials --dns-endpoint`` writes):
server ``https://`` + the DNS endpoint, no certificate authority data (the endpoint presents a
publicly trusted certificate), and credentials from the exec plugin ``gke-gcloud-auth-plugin``
(``client.authentication.k8s.io/v1beta1``, ``provideClusterInfo: true``); the context is named
``gke_<project>_<location>_<cluster>`` as gcloud names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pulumi
import yaml

from infra.backends.gke import kueue, kueue_controller
from infra.backends.gke.cluster import GSA_ANNOTATION, JOBSET_VERSION, GkeSettings
from infra.backends.gke.jobset import STARTUP_KEY, startup_config_map_name
from infra.backends.gke.names import context_name
from training.warning_text import act, emit

#: The exec credential plugin gcloud's kubeconfig names, and its install hint (gcloud 528).
AUTH_PLUGIN = "gke-gcloud-auth-plugin"
AUTH_PLUGIN_API = "client.authentication.k8s.io/v1beta1"
AUTH_PLUGIN_HINT = (
    "Install gke-gcloud-auth-plugin for use with kubectl by following "
    "https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-access-for-kubectl#install_plugin"
)
#: The most a ConfigMap holds: "The data stored in a ConfigMap cannot exceed 1 MiB" (Kubernetes'
#: ConfigMaps page, https://kubernetes.io/docs/concepts/configuration/configmap/).
CONFIG_MAP_LIMIT_BYTES = 1024 * 1024
#: The JobSet controller's release manifests (docs/gke.md section 5, "Install").
MANIFESTS_URL = "https://github.com/kubernetes-sigs/jobset/releases/download/{version}/manifests.yaml"
#: Where those manifests put the controller (namespace/name): kubernetes-sigs/jobset's
#: ``config/default/kustomization.yaml`` (namespace ``jobset-system``, name prefix ``jobset-``) over
#: ``config/components/manager/manager.yaml`` (the Deployment ``controller-manager``, container ``manager``).
JOBSET_CONTROLLER = "jobset-system/jobset-controller-manager"
#: A release image's tag (``registry.k8s.io/jobset/jobset:v0.10.1``).
RELEASE_TAG = re.compile(r":v([0-9]+)\.([0-9]+)\.([0-9]+)$")


class JobSetControllerError(pulumi.RunError):
    """The existing cluster's JobSet controller is older than the stack's JobSet needs; one line naming
    ``multislice:gke.cluster`` and the version found (a :class:`pulumi.RunError`: no traceback)."""


def check_jobset_controller(spec: Any, cluster: str) -> None:
    """Refuse an existing cluster whose JobSet controller (the Deployment :data:`JOBSET_CONTROLLER`'s
    ``spec``, as the Kubernetes provider reads it) runs a release below :data:`JOBSET_VERSION`, the
    oldest the stack's JobSet is written for (docs/gke.md section 5). A controller image without a
    release tag (a build of one's own) is taken as it is, with a warning.

    Raises:
      JobSetControllerError: naming ``multislice:gke.cluster`` and the version found.
    """
    containers = (((spec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    images = [str(c.get("image") or "") for c in containers if isinstance(c, dict)]
    tags = [match for match in map(RELEASE_TAG.search, images) if match]
    if not tags:
        warning = act(
            f"multislice:gke.cluster: the JobSet controller of {cluster} runs {', '.join(images) or 'no image'}, "
            f"not a release, so its version is not checked; the stack's JobSet is written for {JOBSET_VERSION} "
            "or later",
            "upgrade it there (its release manifests, kubectl apply --server-side), or leave multislice:gke.cluster "
            "unset and the stack makes a cluster with it",
            when=f"that build predates {JOBSET_VERSION}",
        )
        emit(warning, pulumi.log.warn)
        return
    found = tuple(int(part) for part in tags[0].groups())
    needed = tuple(int(part) for part in JOBSET_VERSION.lstrip("v").split("."))
    if found < needed:
        version = "v" + ".".join(map(str, found))
        raise JobSetControllerError(
            f"multislice:gke.cluster: cluster {cluster} runs JobSet {version} ({JOBSET_CONTROLLER}), below "
            f"{JOBSET_VERSION}, which the stack's JobSet needs: upgrade it there (its release manifests, "
            "kubectl apply --server-side), or leave multislice:gke.cluster unset and the stack makes a cluster with it"
        )


def kubeconfig(*, project: str, location: str, cluster: str, dns_endpoint: str) -> str:
    """The kubeconfig (YAML) that reaches ``cluster``'s control plane at its DNS-based endpoint
    ``dns_endpoint`` (a host name) with ``gke-gcloud-auth-plugin``'s credentials.

    Raises:
      ValueError: ``dns_endpoint`` is empty or not a bare host name (a cluster without a DNS-based
        endpoint answers none).
    """
    if not dns_endpoint or "/" in dns_endpoint or ":" in dns_endpoint:
        raise ValueError(
            f"cluster {cluster!r} answered no DNS-based endpoint ({dns_endpoint!r}): the stack reaches the control "
            "plane only there; enable it (gcloud container clusters update --enable-dns-access)"
        )
    name = context_name(project, location, cluster)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": f"https://{dns_endpoint}"}}],
        "users": [
            {
                "name": name,
                "user": {
                    "exec": {
                        "apiVersion": AUTH_PLUGIN_API,
                        "command": AUTH_PLUGIN,
                        "installHint": AUTH_PLUGIN_HINT,
                        "provideClusterInfo": True,
                    }
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    return yaml.safe_dump(config, sort_keys=False)


def manifests_url(version: str) -> str:
    """The release asset the JobSet controller is installed from."""
    return MANIFESTS_URL.format(version=version)


@dataclass(frozen=True)
class WorkloadInputs:
    """What the workload's Kubernetes objects are made from.

    Attributes:
      project: ``gcp:project``.
      cluster_name, location: the cluster (a ``pulumi.Input`` for a new one) and its zone or region.
      dns_endpoint: its control plane's DNS-based endpoint (a host name; ``pulumi.Input``).
      settings: ``multislice:gke``.
      kubernetes_service_account: the Pods' Kubernetes service account.
      google_service_account_email: the stack's Google service account (``pulumi.Input``).
      jobset: the JobSet (:func:`~infra.backends.gke.jobset.jobset`), whose namespace and service
        account must be the two above, and whose Pods mount the startup script's ConfigMap.
      startup_script: the stack's startup script (``RenderedScript.text``), and release_id, its release.
      queues: the stack's Kueue objects (``multislice:gke.queuedProvisioning``: :mod:`~infra.backends.gke.kueue`),
        the JobSet's LocalQueue among them; none without.
    """

    project: str
    cluster_name: Any
    location: str
    dns_endpoint: Any
    settings: GkeSettings
    kubernetes_service_account: str
    google_service_account_email: Any
    jobset: dict[str, Any]
    startup_script: str
    release_id: str
    queues: tuple[dict[str, Any], ...] = ()


def check(inputs: WorkloadInputs) -> None:
    """Refuse a JobSet that would not run where its namespace and service account are made.

    Raises:
      ValueError: the JobSet's namespace or Pods' service account differs from the inputs', its Pods
        mount another ConfigMap than the release's, its queue is not the stack's
        (:func:`~infra.backends.gke.kueue.check_queues`), or the script is over a ConfigMap's 1 MiB.
    """
    namespace = inputs.jobset["metadata"]["namespace"]
    if namespace != inputs.settings.namespace:
        raise ValueError(f"the JobSet's namespace {namespace!r} is not multislice:gke.namespace")
    for replicated in inputs.jobset["spec"]["replicatedJobs"]:
        account = replicated["template"]["spec"]["template"]["spec"]["serviceAccountName"]
        if account != inputs.kubernetes_service_account:
            raise ValueError(f"the Pods run as {account!r}, not {inputs.kubernetes_service_account!r}")
        volumes = replicated["template"]["spec"]["template"]["spec"].get("volumes", [])
        mounted = [volume["configMap"]["name"] for volume in volumes if "configMap" in volume]
        expected = startup_config_map_name(inputs.jobset["metadata"]["name"], inputs.release_id)
        if mounted != [expected]:
            raise ValueError(f"the Pods mount the ConfigMaps {mounted}, not the release's {expected!r}")
    kueue.check_queues(inputs.jobset, inputs.queues)
    size = len(inputs.startup_script.encode("utf-8"))
    if size > CONFIG_MAP_LIMIT_BYTES:
        raise ValueError(
            f"the startup script is {size} bytes, over a ConfigMap's {CONFIG_MAP_LIMIT_BYTES} (1 MiB): "
            "shrink training/ or the workload"
        )


class GkeWorkload(pulumi.ComponentResource):
    """The provider for the cluster, the namespace, the Pods' service account, the JobSet
    controller and the JobSet (see the module docstring).

    Outputs: ``jobset_name``, ``namespace``.

    Raises:
      ValueError: what :func:`check` refuses, before any resource is registered.
    """

    def __init__(self, name: str, inputs: WorkloadInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        check(inputs)
        super().__init__("multislice:gke:Workload", name, None, opts)
        import pulumi_kubernetes as k8s

        settings = inputs.settings
        config = pulumi.Output.all(inputs.cluster_name, inputs.dns_endpoint).apply(
            lambda values: kubeconfig(
                project=inputs.project, location=inputs.location, cluster=values[0], dns_endpoint=values[1]
            )
        )
        provider = k8s.Provider(
            "cluster",
            kubeconfig=pulumi.Output.secret(config),
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        in_cluster = pulumi.ResourceOptions(parent=self, provider=provider)
        before_pods: list[pulumi.Resource] = []
        if settings.namespace != "default" and settings.cluster is None:  # an existing cluster's is not ours
            before_pods.append(
                k8s.core.v1.Namespace("namespace", metadata={"name": settings.namespace}, opts=in_cluster)
            )
        namespace = list(before_pods)  # what the namespaced objects wait for
        before_pods.append(
            k8s.core.v1.ConfigMap(
                "startup",
                metadata={
                    "name": startup_config_map_name(inputs.jobset["metadata"]["name"], inputs.release_id),
                    "namespace": settings.namespace,
                },
                data={STARTUP_KEY: inputs.startup_script},
                opts=pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(depends_on=list(before_pods))),
            )
        )
        before_pods.append(
            k8s.core.v1.ServiceAccount(
                "pods",
                metadata={
                    "name": inputs.kubernetes_service_account,
                    "namespace": settings.namespace,
                    "annotations": {GSA_ANNOTATION: inputs.google_service_account_email},
                },
                opts=pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(depends_on=list(before_pods))),
            )
        )
        spec = inputs.jobset
        metadata: pulumi.Input[Any] = spec["metadata"]
        cluster = settings.cluster or "the cluster"
        jobset_controller: list[pulumi.Resource] = []
        if settings.installs_jobset:
            jobset_controller.append(
                k8s.yaml.v2.ConfigFile(
                    "jobset-controller", file=manifests_url(settings.jobset_version), opts=in_cluster
                )
            )
            before_pods += jobset_controller
        else:  # a cluster the stack does not own: read its controller, never declare it
            controller = k8s.apps.v1.Deployment.get("jobset-controller", JOBSET_CONTROLLER, opts=in_cluster)
            # The JobSet is declared only once the controller's version passed (a refusal stops the update first).
            metadata = controller.spec.apply(lambda found: check_jobset_controller(found, cluster) or spec["metadata"])
        if inputs.queues:  # Kueue (installed or checked) and the stack's queues, before the JobSet
            queued, kueue_checked = kueue_controller.declare(
                inputs.queues,
                installs=settings.cluster is None,
                cluster=cluster,
                in_cluster=in_cluster,
                after=[*namespace, *jobset_controller],
            )
            before_pods += queued
            if kueue_checked is not None:
                metadata = pulumi.Output.all(metadata, kueue_checked).apply(lambda values: values[0])
        run = k8s.apiextensions.CustomResource(
            "jobset",
            api_version=spec["apiVersion"],
            kind=spec["kind"],
            metadata=metadata,
            spec=spec["spec"],
            opts=pulumi.ResourceOptions.merge(
                in_cluster,
                pulumi.ResourceOptions(depends_on=before_pods, replace_on_changes=["spec"], delete_before_replace=True),
            ),
        )
        self.jobset_name = pulumi.Output.from_input(spec["metadata"]["name"])
        self.namespace = pulumi.Output.from_input(settings.namespace)
        self.register_outputs({"jobset_name": self.jobset_name, "namespace": self.namespace, "run": run.id})
