"""The gke backend's spec (infra.backends.gke.spec): the stack keys it refuses before anything is
declared, each naming the key, and what it tells the boot (a container, the Pod's environment)."""

from __future__ import annotations

import pytest
from pydantic_core import PydanticCustomError

from infra.backends.gke.spec import SPEC as GKE
from infra.config import validate_stack
from tests.helpers.compute_engine import ce_map


def config_of(accelerator: str):
    """A valid stack of ``accelerator`` (as a compute-engine stack, so that GkeSpec's checks are the
    ones under test)."""
    return validate_stack("dev", ce_map(accelerator), "tests")


def refusal(config) -> tuple[str, str]:
    with pytest.raises(PydanticCustomError) as caught:
        GKE.check_keys(config)
    context = caught.value.context or {}
    return context["path"], context["message"]


def test_a_multi_host_slice_passes():
    GKE.check_keys(config_of("v5p-16"))
    GKE.check_keys(config_of("v6e-16"))


def test_one_vm_per_slice_is_refused_naming_the_key_and_the_smallest_multi_host_type():
    path, message = refusal(config_of("v6e-8"))
    assert path == "multislice:acceleratorType"
    assert message.startswith("v6e-8 is one VM per slice, and Multislice on GKE takes multi-host slice node pools")
    assert "the smallest multi-host v6e slice is v6e-16" in message


def test_a_multi_host_tpu7x_slice_passes():
    GKE.check_keys(config_of("tpu7x-16"))  # placed by a workload policy (tests/backends/gke/test_slices.py)


def test_a_runtime_version_is_refused():
    config = config_of("v5p-16").model_copy(update={"runtime_version": "v2-alpha-tpuv5"})
    assert refusal(config)[0] == "multislice:runtimeVersion"


def test_the_pods_boot_as_containers_that_read_their_place_from_the_environment():
    assert (GKE.supervisor, GKE.identity_source, GKE.log_resource) == ("container", "environment", "k8s_container")
    assert not GKE.release_watch  # a new release replaces the JobSet
    identity = GKE.boot_identity_template()
    assert "TPU_WORKER_ID" in identity and "MULTISLICE_RUN_DIR" in identity


def test_a_workload_env_that_gke_sets_is_refused_naming_the_key_before_any_resource(tmp_path):
    """As a gke stack's validation: ``multislice:workload.env.TPU_TOPOLOGY`` (the TPU device plugin's)."""
    from infra.config import StackConfigError

    (tmp_path / "train.py").write_text("print('hi')\n")
    values = ce_map("v5p-16") | {
        "multislice:backend": "gke",
        "multislice:workload": {"command": ["python3", "train.py"], "steps": 10, "source": str(tmp_path)},
    }
    values.pop("multislice:training", None)
    validate_stack("dev", values, "tests")  # without the env: valid
    values["multislice:workload"]["env"] = {"TPU_TOPOLOGY": "2x2x2"}
    with pytest.raises(StackConfigError) as err:
        validate_stack("dev", values, "tests")
    (line,) = err.value.lines
    assert line.startswith("multislice:workload.env.TPU_TOPOLOGY: GKE sets it in every TPU Pod"), line


def stack(accelerator: str, capacity: str = "spot", **gke) -> dict:
    values = ce_map(accelerator, capacity=capacity) | {"multislice:backend": "gke"}
    if capacity == "flex-start":
        gke.setdefault("maxRunDuration", "3d")
    return values | ({"multislice:gke": gke} if gke else {})


@pytest.mark.parametrize(
    ("accelerator", "capacity", "version", "floor"),
    [
        # "Ironwood in GKE": Standard 1.34.0-gke.2201000 or later.
        ("tpu7x-16", "spot", "1.34.0-gke.2200999", "1.34.0-gke.2201000"),
        ("tpu7x-16", "spot", "1.33", "1.34.0-gke.2201000"),
        # GKE's flex-start page: "To run TPUs, use GKE version 1.33.0-gke.1712000 or later".
        ("v5p-16", "flex-start", "1.33.0-gke.1711999", "1.33.0-gke.1712000"),
        ("tpu7x-16", "flex-start", "1.33.5", "1.34.0-gke.2201000"),  # the higher of the two floors
    ],
)
def test_a_pinned_version_below_the_floor_is_refused_naming_the_key(accelerator, capacity, version, floor):
    from infra.config import StackConfigError

    with pytest.raises(StackConfigError) as caught:
        validate_stack("dev", stack(accelerator, capacity, version=version), "test")
    assert f"multislice:gke.version: {version} is below {floor}" in str(caught.value)


@pytest.mark.parametrize(
    ("accelerator", "capacity", "version"),
    [("tpu7x-16", "spot", "1.34.0-gke.2201000"), ("tpu7x-16", "spot", "1.35"), ("v5p-16", "flex-start", "1.34")],
)
def test_a_version_at_or_above_the_floor_passes(accelerator, capacity, version):
    assert validate_stack("dev", stack(accelerator, capacity, version=version), "test").gke.version == version


def test_only_the_multislice_floor_applies_to_another_generation_and_none_to_an_unpinned_version():
    validate_stack("dev", stack("v5p-16", "spot", version="1.28"), "test")  # Multislice's 1.27.4-gke.900 only
    validate_stack("dev", stack("tpu7x-16"), "test")  # the REGULAR channel's version


@pytest.mark.parametrize("version", ["1", "1.35.", "2.0", "1.35.0-gke", "v1.35", "1.35.0-gke.1\n", " 1.35"])
def test_a_version_that_is_no_gke_version_is_refused(version):
    from infra.config import StackConfigError

    with pytest.raises(StackConfigError, match=r"multislice:gke.version: .* is not a GKE version"):
        validate_stack("dev", stack("v5p-16", version=version), "test")


def test_flex_start_of_tpu_v4_is_refused_naming_the_capacity():
    from infra.config import StackConfigError
    from tests.helpers.gke import gke_map

    values = gke_map(2, "flex-start", **{"multislice:gke": {"maxRunDuration": "3d"}})
    with pytest.raises(StackConfigError) as caught:
        validate_stack("dev", values, "test")
    assert "multislice:capacity: flex-start on GKE takes no TPU v4" in str(caught.value)


@pytest.mark.parametrize(
    ("system_pool", "message"),
    [
        ({"minNodes": 0}, "multislice:gke.systemPool.minNodes"),
        ({"maxNodes": 0}, "multislice:gke.systemPool.maxNodes"),
        ({"minNodes": 3, "maxNodes": 2}, "maxNodes 2 is below minNodes 3"),
        ({"machineType": "E2 standard"}, "multislice:gke.systemPool.machineType"),
    ],
)
def test_a_system_pool_of_no_nodes_is_refused(system_pool, message):
    from infra.config import StackConfigError

    with pytest.raises(StackConfigError) as caught:
        validate_stack("dev", stack("v5p-16", systemPool=system_pool), "test")
    assert message in str(caught.value)


def test_plan_prints_how_the_pools_get_their_nodes_and_the_cluster_around_them():
    flex = validate_stack("dev", stack("v5p-16", "flex-start"), "test")
    line = GKE.capacity_plan(flex)
    assert line.startswith("capacity: flex-start node pools in a new zonal cluster (REGULAR channel")
    assert "each pool autoscales from 0 to its 2 VMs when the JobSet's Pods ask, for at most 3d" in line
    assert (
        "a system pool of 1-3 e2-standard-4; Pods and Services in ranges GKE adds to the subnetwork; "
        "deletion protection off"
    ) in line
    protected = validate_stack("dev", stack("v5p-16", deletionProtection=True), "test")
    assert "deletion protection on: pulumi destroy fails until it is off" in GKE.capacity_plan(protected)
    regional = validate_stack("dev", stack("v5p-16", regional=True), "test")
    assert "in a new regional cluster (control plane in us-east5; REGULAR channel" in GKE.capacity_plan(regional)
    shared = validate_stack("dev", stack("v5p-16", cluster="shared", clusterLocation="us-east5"), "test")
    assert GKE.capacity_plan(shared).startswith("capacity: spot node pools in the existing cluster shared: ")
