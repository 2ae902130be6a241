"""The gke backend's Kubernetes objects under Pulumi's mocks (infra.backends.gke.workload): the
provider's kubeconfig checked against what gcloud itself writes, the namespace, the Pods' service
account and its Google service account, the JobSet controller's manifests, and the JobSet, which a
change of its spec replaces."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from infra.backends.gke import workload
from infra.backends.gke.cluster import GkeSettings
from infra.backends.gke.jobset import jobset
from infra.backends.gke.slices import GkeSlices
from infra.backends.gke.workload import GkeWorkload, WorkloadInputs
from infra.policy.resource_types import JOBSET_TYPE, K8S_SERVICE_ACCOUNT_TYPE
from infra.review.program_mocks import World, declare, gke_dns_endpoint
from tests.helpers.gke import EMAIL, gke_inputs

PROVIDER = "pulumi:providers:kubernetes"
NAMESPACE = "kubernetes:core/v1:Namespace"
ACCOUNT = K8S_SERVICE_ACCOUNT_TYPE
CONTROLLER = "kubernetes:yaml/v2:ConfigFile"
JOBSET = JOBSET_TYPE


#: The release the Pods boot (its startup script's ConfigMap is named after it).
RELEASE = "0123456789ab" + "0" * 52
SCRIPT = "#!/bin/bash\n# the stack's startup script\n"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def the_jobset(namespace: str = "default", account: str = "multislice-dev") -> dict[str, Any]:
    slices = gke_inputs()
    return jobset(
        name="dev",
        namespace=namespace,
        shape=slices.shape,
        slices=2,
        image="python:3.11-slim",
        startup_config_map="dev-startup-0123456789ab",
        run_dir="gs://acme-ml-dev-checkpoints/runs/dev",
        env={},
        service_account=account,
        max_restarts=10,
    )


def inputs(settings: GkeSettings | None = None, **changes: Any) -> WorkloadInputs:
    settings = settings or GkeSettings()
    made = WorkloadInputs(
        project="acme-ml-dev",
        cluster_name="multislice-dev",
        location="us-east5-a",
        dns_endpoint="gke-0123456789ab.us-east5-a.gke.goog",
        settings=settings,
        kubernetes_service_account="multislice-dev",
        google_service_account_email=EMAIL,
        jobset=the_jobset(settings.namespace),
        startup_script=SCRIPT,
        release_id=RELEASE,
    )
    return dataclasses.replace(made, **changes)


def build(made: WorkloadInputs) -> World:
    return declare(lambda: GkeWorkload("workload", made))


def test_the_kubeconfig_is_the_one_gcloud_writes_for_a_dns_endpoint():
    # gcloud 528's get-credentials --dns-endpoint (googlecloudsdk/api_lib/container/kubeconfig.py):
    # the server by host name, no CA data, the exec plugin with the cluster's info.
    config = yaml.safe_load(
        workload.kubeconfig(
            project="acme-ml-dev",
            location="us-east5-a",
            cluster="multislice-dev",
            dns_endpoint="gke-x.us-east5-a.gke.goog",
        )
    )
    name = "gke_acme-ml-dev_us-east5-a_multislice-dev"
    assert config["current-context"] == name
    assert config["clusters"] == [{"name": name, "cluster": {"server": "https://gke-x.us-east5-a.gke.goog"}}]
    assert config["contexts"] == [{"name": name, "context": {"cluster": name, "user": name}}]
    (user,) = config["users"]
    assert user["name"] == name
    assert user["user"]["exec"] == {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": "gke-gcloud-auth-plugin",
        "installHint": workload.AUTH_PLUGIN_HINT,
        "provideClusterInfo": True,
    }


@pytest.mark.parametrize("endpoint", ["", "https://gke-x.gke.goog", "10.0.0.2:443"])
def test_a_cluster_without_a_dns_endpoint_is_named(endpoint):
    with pytest.raises(ValueError, match="no DNS-based endpoint.*--enable-dns-access"):
        workload.kubeconfig(project="p", location="us-east5-a", cluster="c", dns_endpoint=endpoint)


def test_the_default_namespace_the_pods_account_the_controller_and_the_jobset():
    world = build(inputs())
    provider = world.one(PROVIDER)
    assert provider.inputs["enableServerSideApply"] == "true"
    assert world.of(NAMESPACE) == []  # every cluster has "default"
    account = world.one(ACCOUNT)
    assert account.inputs["metadata"] == {
        "name": "multislice-dev",
        "namespace": "default",
        "annotations": {"iam.gke.io/gcp-service-account": EMAIL},
    }
    controller = world.one(CONTROLLER)
    assert controller.inputs["file"] == (
        "https://github.com/kubernetes-sigs/jobset/releases/download/v0.10.1/manifests.yaml"
    )
    startup = world.one(CONFIG_MAP)
    assert startup.inputs["metadata"] == {"name": "dev-startup-0123456789ab", "namespace": "default"}
    assert startup.inputs["data"] == {"startup.sh": SCRIPT}
    run = world.one(JOBSET)
    assert run.inputs["metadata"]["name"] == "dev" and run.inputs["spec"] == the_jobset()["spec"]
    # The Pods' account, their startup script and JobSet's CRD first.
    assert {account.urn, startup.urn, controller.urn} <= set(run.dependencies)
    # spec.replicatedJobs is immutable: a new spec is a new JobSet of the same name, the old one gone first.
    assert run.replace_on_changes == ["spec"] and run.delete_before_replace


def test_a_namespace_of_its_own_and_a_cluster_that_runs_jobset_already():
    settings = GkeSettings.model_validate({"namespace": "training", "installJobSet": False, "jobSetVersion": "v0.12.0"})
    world = build(inputs(settings))
    namespace = world.one(NAMESPACE)
    assert namespace.inputs["metadata"] == {"name": "training"}
    account = world.one(ACCOUNT)
    assert account.inputs["metadata"]["namespace"] == "training" and namespace.urn in account.dependencies
    assert world.of(CONTROLLER) == []
    assert world.one(JOBSET).inputs["metadata"]["namespace"] == "training"


def test_a_jobset_version_must_be_a_release_tag():
    with pytest.raises(ValueError, match="jobSetVersion"):
        GkeSettings.model_validate({"jobSetVersion": "latest"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"jobset": the_jobset(namespace="other")}, "namespace 'other' is not multislice:gke.namespace"),
        ({"jobset": the_jobset(account="default")}, "run as 'default', not 'multislice-dev'"),
        (
            {"release_id": "f" * 64},
            r"mount the ConfigMaps \['dev-startup-0123456789ab'\], not the release's 'dev-startup-ffff",
        ),
        ({"startup_script": "#" * (1024 * 1024 + 1)}, "the startup script is 1048577 bytes, over a ConfigMap's"),
    ],
)
def test_a_jobset_that_would_run_elsewhere_is_refused_before_any_resource(changes, message):
    registered: list[World] = []
    with pytest.raises(ValueError, match=message):
        registered.append(build(inputs(**changes)))
    assert registered == []


def test_the_slices_answer_each_cluster_s_dns_endpoint():
    endpoints: dict[str, str] = {}

    def both():
        new = GkeSlices("new", gke_inputs())
        existing = GkeSlices("old", gke_inputs(settings=GkeSettings(cluster="shared", clusterLocation="us-east5")))
        new.dns_endpoint.apply(lambda e: endpoints.setdefault("new", e))
        existing.dns_endpoint.apply(lambda e: endpoints.setdefault("existing", e))

    world = declare(both)
    assert endpoints == {
        "new": gke_dns_endpoint("multislice-dev", "us-east5-a"),
        "existing": gke_dns_endpoint("shared", "us-east5"),
    }
    assert "gcp:container/getCluster:getCluster" in world.calls
