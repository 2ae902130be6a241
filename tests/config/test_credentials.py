"""Credentials as the gcp provider takes them (infra/credentials.py): which setting wins, what
is checked offline, and what google-auth credentials come out (no network: tokens are static,
keys are generated here, and nothing is refreshed)."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from infra import credentials
from infra.credentials import HOW_TO_SET, CredentialsError, CredentialSettings, load, problem
from infra.readers.credentials_file import path_or_contents
from tests.fakes.queued_resource import no_ambient_credentials  # noqa: F401 (autouse fixture)

SA_EMAIL = "deployer@acme-ml-dev.iam.gserviceaccount.com"


@pytest.fixture(scope="module")
def key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def sa_key(pem: str, **overrides) -> dict:
    return {
        "type": "service_account",
        "project_id": "acme-ml-dev",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": SA_EMAIL,
        "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
        **overrides,
    }


def resolve(config=None, **environ) -> CredentialSettings:
    return CredentialSettings.resolve(config or {}, environ)


# which setting wins ---------------------------------------------------------------------------


def test_a_config_key_wins_over_its_environment_variables_which_go_in_pulumi_gcps_order():
    env = {"GOOGLE_CREDENTIALS": "a", "GOOGLE_CLOUD_KEYFILE_JSON": "b", "GCLOUD_KEYFILE_JSON": "c"}
    assert resolve({"gcp:credentials": "cfg"}, **env).credentials.origin == "gcp:credentials"
    assert resolve(**env).credentials.origin == "GOOGLE_CREDENTIALS"
    assert (
        resolve(GOOGLE_CLOUD_KEYFILE_JSON="b", GCLOUD_KEYFILE_JSON="c").credentials.origin
        == "GOOGLE_CLOUD_KEYFILE_JSON"
    )
    assert resolve(GCLOUD_KEYFILE_JSON="c").credentials.origin == "GCLOUD_KEYFILE_JSON"
    assert resolve(GOOGLE_OAUTH_ACCESS_TOKEN="t").access_token.origin == "GOOGLE_OAUTH_ACCESS_TOKEN"
    assert resolve(GOOGLE_IMPERSONATE_SERVICE_ACCOUNT=SA_EMAIL).impersonate_service_account.value == SA_EMAIL
    # Empty values count as unset, as in pulumi-gcp; other namespaces' keys are ignored.
    assert resolve(
        {"gcp:credentials": "", "multislice:credentials": "x"}, GOOGLE_CREDENTIALS="a"
    ).credentials.origin == ("GOOGLE_CREDENTIALS")


def test_delegates_and_user_project_override_parse_as_pulumi_config_gives_them():
    listed = resolve(
        {"gcp:impersonateServiceAccountDelegates": '["a@p.iam.gserviceaccount.com", "b@p.iam.gserviceaccount.com"]'}
    )
    assert listed.delegates == ("a@p.iam.gserviceaccount.com", "b@p.iam.gserviceaccount.com")
    assert resolve({"gcp:impersonateServiceAccountDelegates": ["x@p"]}).delegates == ("x@p",)
    assert resolve({"gcp:userProjectOverride": True}).user_project_override
    assert resolve(USER_PROJECT_OVERRIDE="true").user_project_override
    assert not resolve({"gcp:userProjectOverride": "false"}).user_project_override
    # Nested past the JSON parser's depth: no list of accounts, read as the text it is, not a traceback.
    deep = resolve({"gcp:impersonateServiceAccountDelegates": "[" * 100_000})
    assert deep.delegates == ("[" * 100_000,)


def test_requests_are_billed_to_gcp_project_unless_the_user_project_override_names_another():
    assert resolve().quota_project("acme-ml-dev") == "acme-ml-dev"
    # A billing project alone changes nothing (pulumi-gcp uses it only with the override).
    assert resolve({"gcp:billingProject": "acme-billing"}).quota_project("acme-ml-dev") == "acme-ml-dev"
    override = resolve({"gcp:billingProject": "acme-billing", "gcp:userProjectOverride": "true"})
    assert override.quota_project("acme-ml-dev") == "acme-billing" and override.quota_origin() == "gcp:billingProject"
    env = resolve(GOOGLE_BILLING_PROJECT="acme-billing", USER_PROJECT_OVERRIDE="1")
    assert env.quota_project("acme-ml-dev") == "acme-billing" and env.quota_origin() == "GOOGLE_BILLING_PROJECT"


def test_repr_and_describe_never_show_a_token_or_key(key_pem):
    settings = resolve({"gcp:accessToken": "ya29.SECRET", "gcp:credentials": json.dumps(sa_key(key_pem))})
    assert "SECRET" not in repr(settings) and "PRIVATE KEY" not in repr(settings)
    assert settings.describe() == "the access token of gcp:accessToken"
    impersonating = resolve({"gcp:impersonateServiceAccount": SA_EMAIL})
    assert (
        impersonating.describe()
        == f"Application Default Credentials impersonating {SA_EMAIL} (gcp:impersonateServiceAccount)"
    )


def test_a_value_naming_an_existing_file_is_read_from_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "token.txt").write_text("ya29.from-file\n")
    assert path_or_contents("~/token.txt") == ("ya29.from-file\n", True)
    assert path_or_contents("ya29.inline") == ("ya29.inline", False)
    assert path_or_contents('{"type": "service_account"}') == ('{"type": "service_account"}', False)
    assert path_or_contents("x" * 5000) == ("x" * 5000, False)  # too long for a path: contents


# offline checks (what `pulumi preview` reports) -----------------------------------------------


@pytest.mark.parametrize(
    "config, environ, expected",
    [
        ({}, {}, "no Google Cloud credentials found: set gcp:credentials or gcp:accessToken"),
        (
            {"gcp:credentials": "/nonexistent/key.json"},
            {},
            "gcp:credentials is neither an existing file nor credentials JSON",
        ),
        (
            {},
            {"GOOGLE_CREDENTIALS": '{"type": "service_account", "client_email": "a@b"}'},
            "GOOGLE_CREDENTIALS (service_account) lacks private_key, token_uri",
        ),
        (
            {"gcp:credentials": '{"type": "api_key"}'},
            {},
            "gcp:credentials has credential type 'api_key'; expected one of",
        ),
        ({"gcp:credentials": "[1, 2]"}, {}, "gcp:credentials is not a credentials JSON object"),
        (
            {},
            {"GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/adc.json"},
            "GOOGLE_APPLICATION_CREDENTIALS names '/nonexistent/adc.json', which does not exist",
        ),
        (
            {"gcp:accessToken": "t", "gcp:impersonateServiceAccount": "deployer"},
            {},
            "gcp:impersonateServiceAccount must be a service account email; got 'deployer'",
        ),
    ],
)
def test_missing_or_malformed_credentials_are_one_line_naming_what_to_set(config, environ, expected):
    message = problem(CredentialSettings.resolve(config, environ), environ)
    assert message is not None and message.startswith(expected)
    assert "\n" not in message
    if "impersonate" not in expected:
        assert message.endswith(HOW_TO_SET)


def test_credentials_past_their_bounds_are_one_line_not_a_traceback(tmp_path):
    from infra.readers.credentials_file import MAX_CREDENTIALS_BYTES

    big = tmp_path / "key.json"
    big.write_bytes(b" " * (MAX_CREDENTIALS_BYTES + 1))  # a regular file, too long to be a key: refused unread
    nested = "[" * 100_000  # nested past the parser: a RecursionError escapes `except ValueError`, were it raised
    cases = [
        (
            resolve(GOOGLE_CREDENTIALS=str(big)),
            f"GOOGLE_CREDENTIALS: {big} cannot be read (1,048,577 bytes, over the 1,048,576 read); ",
        ),
        (
            resolve(GOOGLE_OAUTH_ACCESS_TOKEN=str(big)),
            f"GOOGLE_OAUTH_ACCESS_TOKEN: {big} cannot be read (1,048,577 bytes, over the 1,048,576 read); ",
        ),
        (
            resolve({"gcp:credentials": nested}),
            "gcp:credentials is not credentials JSON (JSON nested deeper than this reader takes); ",
        ),
    ]
    for settings, expected in cases:
        assert problem(settings, {}) == expected + HOW_TO_SET
    adc = tmp_path / "adc.json"
    adc.write_text("[" * 100_000)
    environ = {"GOOGLE_APPLICATION_CREDENTIALS": str(adc)}
    assert problem(resolve(), environ) == (
        f"GOOGLE_APPLICATION_CREDENTIALS ({adc}) is not credentials JSON (JSON nested deeper than this reader "
        f"takes); {HOW_TO_SET}"
    )
    with pytest.raises(CredentialsError, match=r"^gcp:credentials: JSON nested deeper than this reader takes; set "):
        load(resolve({"gcp:credentials": nested}), quota_project="p")
    with pytest.raises(CredentialsError, match=r"^GOOGLE_CREDENTIALS: .* cannot be read \(1,048,577 bytes, over"):
        load(resolve(GOOGLE_CREDENTIALS=str(big)), quota_project="p")


def test_an_empty_token_file_is_reported(tmp_path):
    empty = tmp_path / "token"
    empty.write_text("\n")
    message = problem(resolve(GOOGLE_OAUTH_ACCESS_TOKEN=str(empty)), {})
    assert message == f"GOOGLE_OAUTH_ACCESS_TOKEN is empty; {HOW_TO_SET}"


def test_usable_sources_pass_the_offline_check(tmp_path, key_pem, monkeypatch):
    assert problem(resolve(GOOGLE_OAUTH_ACCESS_TOKEN="ya29.t"), {}) is None
    assert problem(resolve({"gcp:credentials": json.dumps(sa_key(key_pem))}), {}) is None
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(sa_key(key_pem)))
    assert problem(resolve(GOOGLE_CREDENTIALS=str(key_file)), {}) is None
    # Application Default Credentials: a file gcloud wrote, or a Google Cloud VM's metadata server.
    gcloud = tmp_path / "gcloud"
    gcloud.mkdir()
    (gcloud / "application_default_credentials.json").write_text(
        json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"})
    )
    assert problem(resolve(), {"CLOUDSDK_CONFIG": str(gcloud)}) is None
    assert problem(resolve(), {"GCE_METADATA_HOST": "metadata.google.internal"}) is None
    product = tmp_path / "product_name"
    product.write_text("Google Compute Engine\n")
    monkeypatch.setattr(credentials, "PRODUCT_NAME_FILE", product)
    assert problem(resolve(), {}) is None
    # A local fake of the API takes anonymous calls: no credentials needed, configured ones still checked.
    monkeypatch.setattr(credentials, "PRODUCT_NAME_FILE", tmp_path / "absent")
    assert problem(resolve(), {}, require_credentials=False) is None
    assert problem(resolve({"gcp:credentials": "{"}), {}, require_credentials=False) is not None


# what google-auth gets ---------------------------------------------------------------------------


def test_the_access_token_wins_and_carries_the_quota_project():
    from google.oauth2 import credentials as oauth2

    creds = load(resolve({"gcp:accessToken": "ya29.cfg", "gcp:credentials": "{}"}), quota_project="acme-ml-dev")
    assert isinstance(creds, oauth2.Credentials) and creds.token == "ya29.cfg"
    headers: dict[str, str] = {}
    creds.apply(headers)
    assert headers == {"authorization": "Bearer ya29.cfg", "x-goog-user-project": "acme-ml-dev"}


def test_a_service_account_key_loads_from_json_with_the_quota_project(key_pem):
    from google.oauth2 import service_account

    creds = load(resolve(GOOGLE_CREDENTIALS=json.dumps(sa_key(key_pem))), quota_project="acme-ml-dev")
    assert isinstance(creds, service_account.Credentials)
    assert creds.service_account_email == SA_EMAIL and creds.quota_project_id == "acme-ml-dev"


def test_impersonation_wraps_the_source_credentials(key_pem):
    from google.auth import impersonated_credentials
    from google.oauth2 import service_account

    settings = resolve(
        {
            "gcp:credentials": json.dumps(sa_key(key_pem)),
            "gcp:impersonateServiceAccount": "tpu-admin@acme-ml-dev.iam.gserviceaccount.com",
            "gcp:impersonateServiceAccountDelegates": '["hop@acme-ml-dev.iam.gserviceaccount.com"]',
        }
    )
    creds = load(settings, quota_project="acme-ml-dev", iam_endpoint="http://127.0.0.1:9")
    assert isinstance(creds, impersonated_credentials.Credentials)
    assert creds.service_account_email == "tpu-admin@acme-ml-dev.iam.gserviceaccount.com"
    assert creds._delegates == ["hop@acme-ml-dev.iam.gserviceaccount.com"]
    assert isinstance(creds._source_credentials, service_account.Credentials)
    assert creds._iam_endpoint_override.startswith("http://127.0.0.1:9/v1/projects/-/serviceAccounts/tpu-admin@")
    assert creds.quota_project_id == "acme-ml-dev"


def test_adc_is_billed_to_gcp_project_not_the_quota_project_the_login_recorded(tmp_path, monkeypatch):
    from google.oauth2 import credentials as oauth2

    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "c",
                "client_secret": "s",
                "refresh_token": "r",
                "quota_project_id": "my-personal-project",
            }
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("GOOGLE_CLOUD_QUOTA_PROJECT", "another-project")
    creds = load(resolve(), quota_project="acme-ml-dev")
    assert isinstance(creds, oauth2.Credentials) and creds.refresh_token == "r"
    assert creds.quota_project_id == "acme-ml-dev"


def test_unloadable_credentials_and_no_adc_raise_one_line(monkeypatch):
    with pytest.raises(CredentialsError, match=r"^gcp:credentials: .*; set gcp:credentials or gcp:accessToken"):
        load(
            resolve(
                {
                    "gcp:credentials": json.dumps(
                        {"type": "service_account", "client_email": "a@b", "token_uri": "x", "private_key": "not a key"}
                    )
                }
            ),
            quota_project="p",
        )
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no metadata-server probe from a test
    with pytest.raises(
        CredentialsError, match=r"^Application Default Credentials: .*gcloud auth application-default login"
    ):
        load(resolve(), quota_project="p")
