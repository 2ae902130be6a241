"""The gke backend's JobSet (infra.backends.gke.jobset): its Job and Pod specs read back whole
by the Kubernetes Python client's models (a key the API does not have is dropped there, and the
round trip then differs), the JobSet fields of JobSet's v1alpha2 API, and the environment a Pod
gets: MEGASCALE_* for several slices, and a workload env that would hide GKE's refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import ApiClient

from infra.accelerators import parse_accelerator_type
from infra.backends.gke.jobset import (
    coordinator_host,
    jobset,
    refuse_injected,
    startup_config_map_name,
)
from infra.backends.gke.node_pools import slice_node_pool
from infra.backends.gke.spec import GKE_INJECTED_ENV

SHAPE = slice_node_pool(parse_accelerator_type("v6e-16"))  # 4 VMs × 4 chips a slice


def read_back(body: dict[str, Any], model: str) -> dict[str, Any]:
    """``body`` read into the client's ``model`` and written out again."""
    client = ApiClient()
    written = client.sanitize_for_serialization(client.deserialize(json.dumps(body), model, "application/json"))
    assert isinstance(written, dict)
    return written


def make(slices: int = 2, env: dict[str, str] | None = None) -> dict[str, Any]:
    return jobset(
        name="run",
        namespace="training",
        shape=SHAPE,
        slices=slices,
        image="us-docker.pkg.dev/p/r/trainer:1",
        startup_config_map="dev-startup-0123456789ab",
        run_dir="gs://acme-ml-dev-checkpoints/runs/dev",
        env=env or {"XLA_FLAGS": "--xla_dump_to=/tmp/d"},
        service_account="multislice-run",
        max_restarts=5,
    )


def test_the_job_and_pod_specs_are_kubernetes_own():
    (replicated,) = make()["spec"]["replicatedJobs"]
    job_spec = replicated["template"]["spec"]
    assert read_back(job_spec, "V1JobSpec") == job_spec  # nothing dropped, nothing retyped
    pod_spec = job_spec["template"]["spec"]
    assert read_back(pod_spec, "V1PodSpec") == pod_spec


def test_a_misspelt_key_would_be_caught():
    # The check above can fail: the client drops a key its model lacks.
    pod_spec = make()["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert read_back({**pod_spec, "nodeSelectors": {}}, "V1PodSpec") != {**pod_spec, "nodeSelectors": {}}


def test_one_child_job_per_slice_one_pod_per_vm_on_a_pool_of_its_own():
    made = make(slices=3)
    assert (made["apiVersion"], made["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert made["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
    }
    # xpk's rule: a Job its podFailurePolicy failed fails the JobSet; other failures restart it (bounded).
    assert made["spec"]["failurePolicy"] == {
        "maxRestarts": 5,
        "rules": [{"name": "noRetryMends", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}],
    }
    (replicated,) = made["spec"]["replicatedJobs"]
    assert replicated["replicas"] == 3
    job = replicated["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 4 and job["backoffLimit"] == 0
    assert job["completionMode"] == "Indexed"  # what GKE's webhook needs to inject TPU_WORKER_ID
    # Exit 65 (a release the boot cannot verify) and 78 (a configuration that cannot work) fail the Job
    # at once (EX_DATAERR and EX_CONFIG of sysexits.h); any other exit is a failure to restart.
    assert job["podFailurePolicy"] == {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [65, 78]}}
        ]
    }
    pod = job["template"]["spec"]
    # Cluster Toolkit taints TPU pools google.com/tpu=present:NoSchedule; the run's Pods tolerate it.
    assert pod["tolerations"] == [
        {"key": "google.com/tpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
    ]
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "multislice-run"
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == container["resources"]["requests"] == {"google.com/tpu": "4"}


def env_of(made: dict[str, Any]) -> dict[str, Any]:
    (container,) = made["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_several_slices_find_each_other_through_megascale_variables():
    env = env_of(make(slices=2))
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/d"
    assert env["MEGASCALE_NUM_SLICES"] == "2"
    assert env["MEGASCALE_SLICE_ID"] == {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}}
    # Job 0's Pod 0 in the JobSet's subdomain: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<jobset>.
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == coordinator_host("run") == "run-slice-0-0.run"


def test_one_slice_sets_no_megascale_variable():
    assert not [name for name in env_of(make(slices=1)) if name.startswith("MEGASCALE_")]


@pytest.mark.parametrize(
    "name",
    sorted(GKE_INJECTED_ENV) + ["MEGASCALE_SLICE_ID", "MULTISLICE_RUN_DIR", "MULTISLICE_NODE_CACHE", "MULTISLICE_HOME"],
)
def test_a_workload_env_that_hides_what_gke_or_the_pod_sets_is_refused_naming_the_key(name):
    with pytest.raises(ValueError, match=rf"^multislice:workload\.env\.{name}: "):
        make(env={name: "1"})


def test_other_names_pass():
    refuse_injected({"XLA_FLAGS": "x", "TPU_STDERR_LOG_LEVEL": "0"})


def test_the_container_boots_the_startup_script_of_the_releases_config_map():
    pod = make()["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # The script is the container's first process (the one the kubelet signals), as the Pod's
    # boot test runs it (tests/startup/test_gke_boot.py).
    assert container["command"] == ["/bin/bash", "/etc/multislice/startup.sh"]
    mount, cache_mount = container["volumeMounts"]
    volume, cache = pod["volumes"]
    assert mount == {"name": volume["name"], "mountPath": "/etc/multislice", "readOnly": True}
    assert volume["configMap"] == {"name": "dev-startup-0123456789ab"}
    # The node keeps a folder per JobSet (under /var: non-executable on Container-Optimized OS), mounted
    # away from the boot's MULTISLICE_HOME (the container's own /var/lib/multislice, executable): the
    # boot keeps only its virtualenvs' archives there (tests/startup/test_gke_boot.py).
    assert cache_mount == {"name": cache["name"], "mountPath": "/mnt/multislice-node-cache"}
    assert cache["hostPath"] == {"path": "/var/lib/multislice/run", "type": "DirectoryOrCreate"}
    assert env_of(make())["MULTISLICE_NODE_CACHE"] == "/mnt/multislice-node-cache"
    assert "MULTISLICE_HOME" not in env_of(make())
    assert env_of(make())["MULTISLICE_RUN_DIR"] == "gs://acme-ml-dev-checkpoints/runs/dev"


def test_a_new_release_names_a_new_config_map():
    first = "0123456789ab" + "c" * 52
    assert startup_config_map_name("dev", first) == "dev-startup-0123456789ab"
    assert startup_config_map_name("dev", "f" * 64) != startup_config_map_name("dev", first)
    for bad in ("", "0123456789ab", "G" * 64):
        with pytest.raises(ValueError, match="is not a sha256 in hex"):
            startup_config_map_name("dev", bad)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="slices must be ≥ 1"):
        make(slices=0)


@pytest.mark.parametrize(("accelerator", "host_network"), [("tpu7x-16", True), ("v6e-16", False), ("v5p-16", False)])
def test_tpu7x_pods_run_on_the_node_network_as_google_s_sample_runs_them(accelerator, host_network):
    # kubernetes-engine-samples ai-ml/gke-tpu-dynamic-slicing/tpu-multislice-jax.yaml (tpu7x): hostNetwork with
    # ClusterFirstWithHostNet, so the Pod still resolves the JobSet's cluster DNS names; the v6e sample sets neither.
    made = jobset(
        name="run",
        namespace="training",
        shape=slice_node_pool(parse_accelerator_type(accelerator)),
        slices=2,
        image="python:3.12-bookworm",
        startup_config_map="dev-startup-0123456789ab",
        run_dir="gs://b/runs/dev",
        env={},
        service_account="multislice-run",
        max_restarts=5,
    )
    pod_spec = made["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert read_back(pod_spec, "V1PodSpec") == pod_spec
    if host_network:
        assert (pod_spec["hostNetwork"], pod_spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    else:
        assert "hostNetwork" not in pod_spec and "dnsPolicy" not in pod_spec
