"""The provider authenticates as the gcp provider does and bills gcp:project, against the
loopback fake's authentication model (tests/fakes/tpu_auth.py): the stack config reaches it
through ``configure``, ``check`` rejects missing credentials at preview without a call, and
401, 403 and SERVICE_DISABLED answers become one message each."""

from __future__ import annotations

import base64
import json

import dill
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pulumi.dynamic import Config, ConfigureRequest

from infra.credentials import HOW_TO_SET
from infra.queued_resource import CredentialsRejected, QueuedResourceProvider, QuotaOrPermissionError
from tests.fakes.queued_resource import (  # noqa: F401 (dev, fake, no_ambient_credentials, props: fixtures)
    SERVICE_ACCOUNT,
    dev,
    fake,
    no_ambient_credentials,
    props,
    provider_for,
    qr_name,
)
from tests.fakes.tpu_api import FakeTpuApi, service_disabled

TOKEN = "ya29.alice"


def configured(provider: QueuedResourceProvider, **config) -> QueuedResourceProvider:
    """``provider`` after the engine's ``configure`` with this stack config (``gcp:`` keys)."""
    provider.configure(
        ConfigureRequest(Config({f"gcp:{k}": v for k, v in config.items()} | {"multislice:slices": "2"}, "multislice"))
    )
    return provider


def tpu_calls(fake: FakeTpuApi):
    return [c for c in fake.calls if c.rpc != "GenerateAccessToken"]


# preview: check --------------------------------------------------------------------------------


def test_preview_without_credentials_is_one_line_naming_what_to_set_and_calls_nothing(fake, props):
    provider = QueuedResourceProvider()  # the public endpoint: credentials are required
    failures = provider.check({}, props).failures
    assert [(f.property, f.reason) for f in failures] == [("", f"no Google Cloud credentials found: {HOW_TO_SET}")]
    # Configured through the stack instead: the check passes, still without a call.
    assert configured(QueuedResourceProvider(), accessToken=TOKEN).check({}, props).failures == []
    local = provider_for(fake)
    assert local.check({}, props).failures == []  # a local fake takes anonymous calls
    assert fake.calls == []


def test_a_malformed_stack_credential_is_reported_at_preview_by_its_key(props, monkeypatch):
    monkeypatch.setenv("GOOGLE_CREDENTIALS", '{"type": "service_account"}')
    provider = configured(QueuedResourceProvider(), credentials="~/keys/missing.json")
    [failure] = provider.check({}, props).failures
    assert failure.property == "" and failure.reason.startswith(
        "gcp:credentials is neither an existing file nor credentials JSON"
    )


def test_stack_config_beats_the_environment_and_reaches_every_call(fake, props, monkeypatch):
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.from-env")
    fake.auth.require({TOKEN: "alice", "ya29.from-env": "env-user"})
    provider = configured(provider_for(fake), accessToken=TOKEN)
    outs = provider.create(props).outs
    assert outs["ready"] is True
    assert {c.headers["authorization"] for c in fake.calls} == {f"Bearer {TOKEN}"}
    # Billed to and quota-checked in gcp:project, whatever the credentials' own project is.
    assert {c.headers["x-goog-user-project"] for c in fake.calls} == {"acme-ml-dev"}
    # Nothing of the credentials is in the state (outputs) or in the pickled provider.
    assert TOKEN not in json.dumps(outs)
    from pulumi.dynamic.dynamic import serialize_provider

    assert TOKEN.encode() not in base64.b64decode(serialize_provider(provider))
    assert type(dill.loads(base64.b64decode(serialize_provider(provider)))) is QueuedResourceProvider


def test_the_user_project_override_bills_the_billing_project(fake, props):
    provider = configured(
        provider_for(fake), accessToken=TOKEN, billingProject="acme-billing", userProjectOverride="true"
    )
    provider.create(props)
    assert {c.headers["x-goog-user-project"] for c in fake.calls} == {"acme-billing"}


# refusals ------------------------------------------------------------------------------------


def test_rejected_credentials_are_one_line_naming_their_source_and_not_retried(fake, props):
    fake.auth.require({TOKEN: "alice"})
    provider = configured(provider_for(fake), accessToken="ya29.expired")
    with pytest.raises(CredentialsRejected) as err:
        provider.create(props)
    text = str(err.value)
    assert text.startswith(
        "creating queued resource 'multislice-dev': the access token of gcp:accessToken could not be used: "
        "the API rejected it (401) and an access token cannot be renewed: it has expired or been revoked"
    )
    assert text.endswith(HOW_TO_SET)
    assert "\n" not in text
    assert [(c.rpc, c.status) for c in fake.calls] == [("CreateQueuedResource", 401)]
    assert qr_name(props) not in fake.queued_resources


def test_a_denied_identity_is_told_which_roles_it_needs(fake, props):
    fake.auth.require({TOKEN: "alice"})
    fake.auth.deny("alice")
    provider = configured(provider_for(fake), accessToken=TOKEN)
    with pytest.raises(QuotaOrPermissionError) as err:
        provider.create(props)
    assert "permission denied in project acme-ml-dev" in str(err.value)
    assert "(the access token of gcp:accessToken) needs roles/tpu.admin" in str(err.value)
    assert f"roles/iam.serviceAccountUser on {SERVICE_ACCOUNT}" in str(err.value)
    assert [c.status for c in fake.calls] == [403]


def test_service_disabled_in_another_quota_project_is_reported_not_retried(fake, props):
    fake.auth.disable_api("acme-billing", number="555000111")
    provider = configured(
        provider_for(fake), accessToken=TOKEN, billingProject="acme-billing", userProjectOverride="true"
    )
    with pytest.raises(QuotaOrPermissionError) as err:
        provider.create(props)
    text = str(err.value)
    assert "the Cloud TPU API is disabled in project 555000111, which these requests are billed to " in text
    assert "(gcp:billingProject acme-billing), not in gcp:project acme-ml-dev" in text
    assert "gcloud services enable tpu.googleapis.com --project 555000111" in text
    assert [(c.rpc, c.status) for c in fake.calls] == [("CreateQueuedResource", 403)]  # no retry


def test_service_disabled_for_the_credentials_own_project_is_reported_not_retried(fake, props):
    # Anonymous calls to the fake carry no quota project: it bills gcloud's own project.
    fake.auth.disable_api(fake.auth.credential_project)
    with pytest.raises(
        QuotaOrPermissionError,
        match="disabled in project 764086051850, which these requests are billed to "
        r"\(the project of Application Default Credentials\)",
    ):
        provider_for(fake).create(props)
    assert [c.status for c in fake.calls] == [403]


def test_service_disabled_in_gcp_project_itself_is_retried_as_just_enabled(fake, props):
    # The program enables tpu.googleapis.com moments before; the API names the project by number.
    fake.fault(
        "CreateQueuedResource",
        "PERMISSION_DENIED",
        "Cloud TPU API has not been used in project 4242",
        details=service_disabled("4242"),
        times=2,
    )
    outs = configured(provider_for(fake), accessToken=TOKEN).create(props).outs
    assert outs["ready"] is True
    assert [c.status for c in fake.calls if c.rpc == "CreateQueuedResource"] == [403, 403, 200]


# other credential sources end to end ---------------------------------------------------------------


def test_a_service_account_key_signs_its_own_jwt(fake, props):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    email = "deployer@acme-ml-dev.iam.gserviceaccount.com"
    info = {
        "type": "service_account",
        "project_id": "acme-ml-dev",
        "private_key_id": "k1",
        "client_id": "1",
        "private_key": key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
        "client_email": email,
        "token_uri": f"{fake.endpoint}/token",
    }
    fake.auth.require({})
    fake.auth.trust_key(
        email,
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode(),
    )
    provider = configured(provider_for(fake), credentials=json.dumps(info))
    assert provider.check({}, props).failures == []
    assert provider.create(props).outs["ready"] is True
    assert {c.headers["x-goog-user-project"] for c in fake.calls} == {"acme-ml-dev"}
    # The same key, not trusted: 401 naming gcp:credentials.
    fake.auth.trusted_keys.clear()
    with pytest.raises(
        CredentialsRejected,
        match=r"the API rejected the credentials of gcp:credentials \(401 UNAUTHENTICATED: "
        "Request had invalid authentication credentials",
    ):
        provider.read(qr_name(props), props)


def test_impersonation_calls_as_the_impersonated_account(fake, props):
    fake.auth.require({TOKEN: "alice"})
    fake.auth.deny("alice")  # alice herself may not touch TPUs: only the account she impersonates
    provider = configured(
        provider_for(fake), accessToken=TOKEN, impersonateServiceAccount="tpu-admin@acme-ml-dev.iam.gserviceaccount.com"
    )
    assert provider.create(props).outs["ready"] is True
    generate = [c for c in fake.calls if c.rpc == "GenerateAccessToken"]
    assert generate and generate[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert generate[0].path.endswith(
        "/serviceAccounts/tpu-admin@acme-ml-dev.iam.gserviceaccount.com:generateAccessToken"
    )
    assert {c.headers["authorization"].split("-")[0] for c in tpu_calls(fake)} == {"Bearer impersonated"}
