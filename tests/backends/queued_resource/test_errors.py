"""Error classification and messages (infra/backends/queued_resource/provider/errors.py).

Each error is what the real ``tpu_v2.TpuClient`` (REST transport) raises for a
``google.rpc.Status`` answer of the loopback fake (tests/fakes/tpu_api.py), so the
classification is checked on the exception types, reasons and details a real service produces.
"""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2
from google.rpc import error_details_pb2

from infra.backends.queued_resource.provider.errors import (
    CredentialsRejected,
    QueuedResourceError,
    QuotaOrPermissionError,
    disabled_in,
    explain,
    is_disabled_in_our_project,
    is_fatal_for_every_call,
    is_new_service_account_race,
    is_quota_exhausted,
    is_retryable,
    is_service_disabled,
    root_cause,
)
from tests.fakes import discovery
from tests.fakes.queued_resource import (  # noqa: F401 (dev, fake, no_ambient_credentials, props: fixtures)
    SERVICE_ACCOUNT,
    dev,
    fake,
    no_ambient_credentials,
    props,
    provider_for,
    qr_name,
)
from tests.fakes.tpu_api import FakeTpuApi, quota_failure, rate_limited, service_disabled

SERVICE_DISABLED = (error_details_pb2.ErrorInfo(reason="SERVICE_DISABLED", domain="googleapis.com"),)

#: For a test whose faults end and whose create then succeeds: the retries' deadline, which only a
#: lasting fault reaches, long enough that a busy machine's slow retry never meets it (the default of
#: tests/fakes/queued_resource.provider_for, 1 s, is for the tests that wait it out).
RETRIES_MAY_TAKE_TIME = {"retry_deadline_seconds": 120.0}


def api_error(fake: FakeTpuApi, status: str, message: str, details=()) -> exceptions.GoogleAPICallError:
    """The exception the real client raises when GetQueuedResource answers with this status."""
    fake.fault("GetQueuedResource", status, message, details=details)
    client = tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=fake.endpoint)
    )
    with pytest.raises(exceptions.GoogleAPICallError) as err:
        client.get_queued_resource(name="projects/p/locations/z/queuedResources/q", retry=None)
    return err.value


# classification --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "status, message, details, quota, disabled, retryable",
    [
        (
            "RESOURCE_EXHAUSTED",
            "Quota limit 'TPUV4sPodPerProjectPerZoneForTPUAPI' has been exceeded.",
            quota_failure(),
            True,
            False,
            False,
        ),
        ("RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Requests'", rate_limited(), False, False, True),
        ("UNAVAILABLE", "backend unavailable", (), False, False, True),
        ("INTERNAL", "internal error", (), False, False, True),
        ("PERMISSION_DENIED", "Cloud TPU API has not been used", SERVICE_DISABLED, False, True, True),
        ("PERMISSION_DENIED", "Permission 'tpu.queuedResources.get' denied", (), False, False, False),
        ("INVALID_ARGUMENT", "runtime version 'nope' is not supported", (), False, False, False),
        ("NOT_FOUND", "not found", (), False, False, False),
        ("ALREADY_EXISTS", "exists", (), False, False, False),
    ],
)
def test_api_errors_are_classified_by_type_reason_and_details(
    fake, status, message, details, quota, disabled, retryable
):
    exc = api_error(fake, status, message, details)
    assert (is_quota_exhausted(exc), is_service_disabled(exc), is_retryable(exc)) == (quota, disabled, retryable)


@pytest.mark.parametrize(
    "consumer, quota_project, ours",
    [
        ("acme-ml-dev", None, True),  # named by id: the stack's project
        ("acme-billing", "acme-billing", False),  # another project by id
        ("4242", "acme-ml-dev", True),  # by number, and the requests were billed to gcp:project
        ("4242", "acme-billing", False),  # by number, billed to another project
        ("764086051850", None, False),  # by number, no quota project sent: the credentials' own
    ],
)
def test_service_disabled_is_ours_only_when_it_names_gcp_project(fake, consumer, quota_project, ours):
    exc = api_error(
        fake, "PERMISSION_DENIED", f"Cloud TPU API has not been used in project {consumer}", service_disabled(consumer)
    )
    assert disabled_in(exc) == consumer
    assert is_disabled_in_our_project(exc, "acme-ml-dev", quota_project) is ours
    assert is_retryable(exc, project="acme-ml-dev", quota_project=quota_project) is ours
    assert disabled_in(api_error(fake, "PERMISSION_DENIED", "denied")) is None


def test_errors_every_call_would_get_stop_a_fan_out(fake):
    assert is_fatal_for_every_call(api_error(fake, "PERMISSION_DENIED", "denied"))
    assert is_fatal_for_every_call(api_error(fake, "RESOURCE_EXHAUSTED", "Quota limit exceeded.", quota_failure()))
    assert is_fatal_for_every_call(exceptions.RetryError("gave up", api_error(fake, "PERMISSION_DENIED", "denied")))
    assert not is_fatal_for_every_call(api_error(fake, "UNAVAILABLE", "try again"))
    assert not is_fatal_for_every_call(api_error(fake, "INTERNAL", "one node's backend"))


def test_a_401_names_the_credentials_and_what_to_set(props):
    from google.auth import exceptions as auth_exceptions

    unauthorized = exceptions.Unauthorized(
        "GET http://127.0.0.1:1/v2/projects/p/locations/z/queuedResources/q: "
        "Request is missing required authentication "
        "credential. Expected OAuth 2 access token,\n login cookie or other valid authentication credential."
    )
    explained = explain(unauthorized, "reading", props, credentials="the credentials of GOOGLE_CREDENTIALS")
    assert type(explained) is CredentialsRejected
    assert str(explained).startswith(
        "reading queued resource 'multislice-dev': the API rejected the credentials of GOOGLE_CREDENTIALS "
        "(401 UNAUTHENTICATED: Request is missing required authentication credential. "
        "Expected OAuth 2 access token, login"
    )
    assert "GET http" not in str(explained) and "\n" not in str(explained)
    refresh = explain(
        auth_exceptions.RefreshError("invalid_grant: Token has been expired or revoked."),
        "creating",
        props,
        credentials="Application Default Credentials",
    )
    assert type(
        refresh
    ) is CredentialsRejected and "Application Default Credentials could not be used: invalid_grant" in str(refresh)
    # A network failure reaching the token endpoint is not a credentials problem (it is retried).
    assert type(explain(auth_exceptions.TransportError("connection reset"), "creating", props)) is QueuedResourceError


def test_transport_errors_are_retried():
    assert is_retryable(requests.exceptions.ConnectionError("connection refused"))
    assert is_retryable(requests.exceptions.Timeout("read timed out"))
    assert not is_retryable(ValueError("a bug, not the network"))


def test_only_a_bad_request_naming_the_service_account_is_the_new_account_race(fake):
    race = api_error(fake, "INVALID_ARGUMENT", f"Service account {SERVICE_ACCOUNT} does not exist.")
    other = api_error(fake, "INVALID_ARGUMENT", "runtime version 'nope' is not supported")
    denied = api_error(fake, "PERMISSION_DENIED", "service account user role missing")
    assert is_new_service_account_race(race)
    assert not is_new_service_account_race(other) and not is_new_service_account_race(denied)


def test_explain_names_the_cause_behind_exhausted_retries(fake, props):
    cause = api_error(fake, "UNAVAILABLE", "backend unavailable")
    wrapped = exceptions.RetryError("Timeout of 300.0s exceeded", cause)
    assert root_cause(wrapped) is cause and root_cause(cause) is cause
    err = explain(wrapped, "waiting for", props)
    assert type(err) is QueuedResourceError
    text = str(err)
    assert text.startswith("waiting for queued resource 'multislice-dev': ServiceUnavailable: ")
    assert text.endswith("backend unavailable") and "RetryError" not in text


def test_explain_says_what_to_fix_for_each_refusal(fake, props):
    quota = explain(api_error(fake, "RESOURCE_EXHAUSTED", "Quota limit exceeded.", quota_failure()), "creating", props)
    disabled = explain(api_error(fake, "PERMISSION_DENIED", "API not used", SERVICE_DISABLED), "creating", props)
    denied = explain(api_error(fake, "PERMISSION_DENIED", "denied"), "creating", props)
    conflict = explain(api_error(fake, "ALREADY_EXISTS", "exists"), "creating", props)
    assert all(isinstance(e, QuotaOrPermissionError) for e in (quota, disabled, denied))
    assert "TPU quota exhausted in us-central2-b" in str(quota) and "2 x v4-8 (spot)" in str(quota)
    assert "Cloud TPU API is not enabled in project acme-ml-dev" in str(disabled)
    assert "roles/tpu.admin" in str(denied) and SERVICE_ACCOUNT in str(denied)
    assert type(conflict) is QueuedResourceError and "--force" in str(conflict)


# through the provider --------------------------------------------------------------------------


def test_quota_error_is_one_clear_message_and_not_retried(fake, props):
    fake.fault(
        "CreateQueuedResource",
        "RESOURCE_EXHAUSTED",
        "Quota limit 'TPUV4sPodPerProjectPerZoneForTPUAPI' has been exceeded.",
        details=quota_failure(),
    )
    with pytest.raises(QuotaOrPermissionError) as err:
        provider_for(fake).create(props)
    text = str(err.value)
    assert "TPU quota exhausted in us-central2-b of project acme-ml-dev" in text
    assert "TPUV4sPodPerProjectPerZoneForTPUAPI" in text
    assert "iam-admin/quotas?project=acme-ml-dev" in text and "multislice:slices" in text
    assert fake.rpcs() == ["CreateQueuedResource"]


def test_permission_error_says_which_roles_are_missing(fake, props):
    fake.fault("CreateQueuedResource", "PERMISSION_DENIED", "Permission 'tpu.queuedResources.create' denied")
    with pytest.raises(QuotaOrPermissionError) as err:
        provider_for(fake).create(props)
    text = str(err.value)
    assert "permission denied" in text and "roles/tpu.admin" in text
    assert f"roles/iam.serviceAccountUser on {SERVICE_ACCOUNT}" in text
    assert fake.rpcs() == ["CreateQueuedResource"]


def test_rate_limit_429_then_success_is_retried_with_one_request_id(fake, props):
    fake.fault(
        "CreateQueuedResource",
        "RESOURCE_EXHAUSTED",
        "Quota exceeded for quota metric 'Requests'",
        details=rate_limited(),
        times=2,
    )
    lines: list[str] = []
    result = provider_for(fake, lines, **RETRIES_MAY_TAKE_TIME).create(props)
    assert result.outs["ready"] is True
    creates = [c for c in fake.calls if c.rpc == "CreateQueuedResource"]
    assert [c.status for c in creates] == [429, 429, 200]
    assert len({c.query["requestId"][0] for c in creates}) == 1  # idempotent retries
    assert sum("retrying with backoff" in line for line in lines) == 2


def test_503_and_500_on_reads_are_retried(fake, props):
    fake.fault("GetQueuedResource", "UNAVAILABLE", times=2)
    fake.fault("GetNode", "INTERNAL", times=1)
    result = provider_for(fake, **RETRIES_MAY_TAKE_TIME).create(props)
    assert result.outs["ready"] is True
    statuses = [c.status for c in fake.calls if c.rpc == "GetQueuedResource"]
    assert statuses[:3] == [503, 503, 200]


def test_just_enabled_api_403_service_disabled_is_retried(fake, props):
    from google.rpc import error_details_pb2

    info = error_details_pb2.ErrorInfo(reason="SERVICE_DISABLED", domain="googleapis.com")
    fake.fault("CreateQueuedResource", "PERMISSION_DENIED", "Cloud TPU API has not been used", details=(info,))
    assert provider_for(fake, **RETRIES_MAY_TAKE_TIME).create(props).outs["ready"] is True


def test_a_just_created_service_account_not_yet_visible_is_retried(fake, props):
    fake.fault("CreateQueuedResource", "INVALID_ARGUMENT", f"Service account {SERVICE_ACCOUNT} does not exist.")
    assert provider_for(fake, **RETRIES_MAY_TAKE_TIME).create(props).outs["ready"] is True
    assert [c.status for c in fake.calls if c.rpc == "CreateQueuedResource"] == [400, 200]


def test_other_invalid_arguments_are_not_retried(fake, props):
    fake.fault("CreateQueuedResource", "INVALID_ARGUMENT", "runtime version 'nope' is not supported")
    with pytest.raises(QueuedResourceError, match="runtime version 'nope' is not supported"):
        provider_for(fake).create(props)
    assert fake.rpcs() == ["CreateQueuedResource"]


def test_persistent_5xx_while_waiting_keeps_the_qr_recorded(fake, props):
    fake.progression = ["CREATING", "WAITING_FOR_RESOURCES"]
    fake.fault("GetQueuedResource", "UNAVAILABLE", times=10_000)
    result = provider_for(fake, retry_deadline_seconds=0.2).create(props)
    assert result.outs["ready"] is False
    assert "ServiceUnavailable" in result.outs["statusMessage"] or "UNAVAILABLE" in result.outs["statusMessage"].upper()
    assert qr_name(props) in fake.queued_resources


@pytest.mark.schema_refusals
def test_a_refused_create_names_the_queued_resource_and_leaves_none(monkeypatch, fake, props):
    """The TPU API refuses the create (its document without ``QueuedResource.tpu``, as if Google had
    renamed it): one line naming the queued resource, and none exists."""

    def rename_tpu(data: dict) -> None:
        del data["schemas"]["QueuedResource"]["properties"]["tpu"]

    discovery.refuse_with(monkeypatch, "tpu.v2", rename_tpu)
    with pytest.raises(QueuedResourceError) as raised:
        provider_for(fake).create(props)
    message = str(raised.value)
    assert "\n" not in message and props["queuedResourceId"] in message and "unknown field 'tpu'" in message
    assert fake.rpcs() == ["CreateQueuedResource"] and fake.queued_resources == {}
