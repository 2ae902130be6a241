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
