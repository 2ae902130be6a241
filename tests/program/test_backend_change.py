"""A change of multislice:backend on a deployed stack: refused unless confirmed (infra.backends.change)."""

from __future__ import annotations

import pytest

from infra.backends.change import BackendChangeRefused, check_backend_change, deployed_backend

QR_OUTPUTS = {
    "queuedResourceName": "projects/p/locations/us-east5-a/queuedResources/multislice-prod",
    "bucketUrl": "gs://b",
}


@pytest.mark.parametrize(
    ("outputs", "expected"),
    [
        (None, None),
        ({}, None),
        ({"bucketUrl": "gs://b"}, None),  # a stack whose last update declared no TPU resource
        (QR_OUTPUTS, "queued-resource"),  # deployed before the backend output existed
        ({"backend": "compute-engine", "instanceGroupNames": ["multislice-prod-0"]}, "compute-engine"),
        ({"backend": "queued-resource", **QR_OUTPUTS}, "queued-resource"),
    ],
)
def test_the_deployed_backend_comes_from_the_last_outputs(outputs, expected):
    assert deployed_backend(outputs) == expected


def test_an_unconfirmed_change_is_refused_naming_the_key_and_what_it_replaces():
    with pytest.raises(BackendChangeRefused) as err:
        check_backend_change(QR_OUTPUTS, wanted="compute-engine", stack="prod", confirmed=False)
    message = str(err.value)
    assert message.startswith("multislice:backend: multislice:backend queued-resource -> compute-engine replaces every")
    assert "queuedResources/multislice-prod" in message
    assert "multislice:allowBackendChange: true" in message
    assert message.endswith("set multislice:backend back to queued-resource")


def test_a_confirmed_change_is_a_plain_warning():
    warning = check_backend_change(QR_OUTPUTS, wanted="compute-engine", stack="prod", confirmed=True)
    assert warning is not None and "replaces every TPU VM of stack prod" in warning


def test_the_reverse_change_names_the_groups():
    outputs = {"backend": "compute-engine", "instanceGroupNames": ["multislice-s-0", "multislice-s-1"]}
    with pytest.raises(BackendChangeRefused, match="multislice-s-0, multislice-s-1"):
        check_backend_change(outputs, wanted="queued-resource", stack="s", confirmed=False)


@pytest.mark.parametrize("outputs", [None, {}, QR_OUTPUTS])
def test_no_change_and_a_new_stack_pass_silently(outputs):
    assert check_backend_change(outputs, wanted="queued-resource", stack="s", confirmed=False) is None


def test_a_change_to_and_from_gke_is_refused_naming_what_it_replaces():
    with pytest.raises(BackendChangeRefused, match="multislice:allowBackendChange: true"):
        check_backend_change(QR_OUTPUTS, wanted="gke", stack="prod", confirmed=False)
    outputs = {"backend": "gke", "nodePoolNames": ["multislice-s-0", "multislice-s-1"], "jobSetName": "multislice-s"}
    with pytest.raises(BackendChangeRefused) as err:
        check_backend_change(outputs, wanted="compute-engine", stack="s", confirmed=False)
    assert "the node pools multislice-s-0, multislice-s-1, their TPU VMs and the run's JobSet are deleted" in str(
        err.value
    )
