"""Google Cloud credentials for the calls this program makes itself (the queued-resource
provider), taken from the same stack config keys and environment variables, in the same
order, as the gcp provider (pulumi-gcp) takes them for the same stack.

Where each setting comes from: the stack config key, else the first environment variable set
(pulumi-gcp ``provider/resources.go``, ``preConfigureCallbackWithLogger``, which reads them
with ``tfbridge.ConfigStringValue``; https://github.com/pulumi/pulumi-gcp and
https://www.pulumi.com/registry/packages/gcp/installation-configuration/)::

    gcp:accessToken                         GOOGLE_OAUTH_ACCESS_TOKEN
    gcp:credentials                         GOOGLE_CREDENTIALS, GOOGLE_CLOUD_KEYFILE_JSON, GCLOUD_KEYFILE_JSON
    gcp:impersonateServiceAccount           GOOGLE_IMPERSONATE_SERVICE_ACCOUNT
    gcp:impersonateServiceAccountDelegates  -
    gcp:billingProject                      GOOGLE_BILLING_PROJECT
    gcp:userProjectOverride                 USER_PROJECT_OVERRIDE

Which credentials are used, first match wins (terraform-provider-google, which pulumi-gcp
wraps: ``transport.Config.GetCredentials`` in google/transport/config.go of
https://github.com/hashicorp/terraform-provider-google; reference:
https://registry.terraform.io/providers/hashicorp/google/latest/docs/guides/provider_reference):

1. the access token, a file path or the token itself;
2. the credentials, a file path or the JSON itself (a service-account key, an authorized user,
   an external account of workload identity federation, an impersonated service account);
3. Application Default Credentials: ``GOOGLE_APPLICATION_CREDENTIALS``, the file of
   ``gcloud auth application-default login``, the metadata server of a Google Cloud VM
   (https://cloud.google.com/docs/authentication/application-default-credentials).

With a service account to impersonate, the credentials of 1–3 are the source and every call
is made as that account (through its delegates).

Quota project (the ``X-Goog-User-Project`` of every request: the project billed and
quota-checked, https://cloud.google.com/docs/quotas/set-quota-project): ``gcp:billingProject``
when ``gcp:userProjectOverride`` is true (as pulumi-gcp does), else the stack's
``gcp:project``. Unlike pulumi-gcp without the override, it is never the project an
``application-default login`` recorded (a personal project, or gcloud's own, where the TPU API
is typically disabled).

How the provider sees stack config: the engine sends a dynamic provider the whole stack
configuration with namespaces kept ("For dynamic providers, we always pass the full
configuration", ``GetPackageConfig`` in pkg/resource/deploy/target.go of
https://github.com/pulumi/pulumi), and the Python SDK hands it, secrets decrypted, to
``ResourceProvider.configure`` (https://github.com/pulumi/pulumi/pull/17673, Pulumi 3.139.0).
Nothing read here is written to the stack's state.

:func:`problem` checks a :class:`CredentialSettings` without network calls and without
importing a Google library (``pulumi preview`` runs it); :func:`load` builds the
``google.auth`` credentials (imported there).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.readers.credentials_file import (
    FILE_TYPES,
    check_credentials_json,
    credentials_json,
    file_text,
    path_or_contents,
)
from infra.readers.files import UnreadableFile

#: Stack config key → the environment variables pulumi-gcp falls back to, in order.
SOURCES: dict[str, tuple[str, ...]] = {
    "gcp:accessToken": ("GOOGLE_OAUTH_ACCESS_TOKEN",),
    "gcp:credentials": ("GOOGLE_CREDENTIALS", "GOOGLE_CLOUD_KEYFILE_JSON", "GCLOUD_KEYFILE_JSON"),
    "gcp:impersonateServiceAccount": ("GOOGLE_IMPERSONATE_SERVICE_ACCOUNT",),
    "gcp:impersonateServiceAccountDelegates": (),
    "gcp:billingProject": ("GOOGLE_BILLING_PROJECT",),
    "gcp:userProjectOverride": ("USER_PROJECT_OVERRIDE",),
}

#: The OAuth scope of every call (access is governed by IAM roles).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

#: What to do when there are no usable credentials (one line, every option named).
HOW_TO_SET = (
    'set gcp:credentials or gcp:accessToken (`pulumi config set --secret gcp:credentials "$(cat key.json)"`), '
    "or GOOGLE_CREDENTIALS / GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`"
)


class CredentialsError(ValueError):
    """No usable credentials; the one-line message names the key or variable to set."""


@dataclass(frozen=True)
class Setting:
    """One resolved setting: its value (never shown by ``repr``) and where it came from (a
    config key such as ``gcp:credentials`` or an environment variable name)."""

    value: str = field(repr=False)
    origin: str


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    text = str(value).strip()
    return text or None


def _pick(key: str, config: Mapping[str, Any], environ: Mapping[str, str]) -> Setting | None:
    value = _text(config.get(key))
    if value is not None:
        return Setting(value, key)
    for name in SOURCES[key]:
        value = _text(environ.get(name))
        if value is not None:
            return Setting(value, name)
    return None


def _truthy(setting: Setting | None) -> bool:
    return setting is not None and setting.value.lower() in ("1", "true", "yes", "on")


def _delegates(setting: Setting | None) -> tuple[str, ...]:
    if setting is None:
        return ()
    try:
        parsed = json.loads(setting.value)
    except (json.JSONDecodeError, RecursionError):  # a list nested past the parser's depth is no list
        parsed = setting.value.split(",")
    items = parsed if isinstance(parsed, list) else [parsed]
    return tuple(str(item).strip() for item in items if str(item).strip())


@dataclass(frozen=True)
class CredentialSettings:
    """The credential settings of one stack (see the module docstring for the order).

    Build it with :meth:`resolve`. ``repr`` never shows a token or a key.
    """

    access_token: Setting | None = None
    credentials: Setting | None = None
    impersonate_service_account: Setting | None = None
    delegates: tuple[str, ...] = ()
    billing_project: Setting | None = None
    user_project_override: bool = False

    @classmethod
    def resolve(cls, config: Mapping[str, Any], environ: Mapping[str, str]) -> CredentialSettings:
        """The settings from a stack's config map (``gcp:*`` keys; other keys are ignored)
        and, for each key absent there, its environment variables."""
        return cls(
            access_token=_pick("gcp:accessToken", config, environ),
            credentials=_pick("gcp:credentials", config, environ),
            impersonate_service_account=_pick("gcp:impersonateServiceAccount", config, environ),
            delegates=_delegates(_pick("gcp:impersonateServiceAccountDelegates", config, environ)),
            billing_project=_pick("gcp:billingProject", config, environ),
            user_project_override=_truthy(_pick("gcp:userProjectOverride", config, environ)),
        )

    @property
    def explicit(self) -> bool:
        """Whether a token or credentials are configured (else Application Default Credentials)."""
        return self.access_token is not None or self.credentials is not None

    def quota_project(self, project: str) -> str:
        """The project billed and quota-checked for calls about ``project`` (``gcp:project``)."""
        if self.user_project_override and self.billing_project is not None:
            return self.billing_project.value
        return project

    def quota_origin(self) -> str:
        """Which setting chose :meth:`quota_project` (for messages)."""
        if self.user_project_override and self.billing_project is not None:
            return self.billing_project.origin
        return "gcp:project"

    def describe(self) -> str:
        """Where the credentials come from, e.g. ``gcp:credentials (impersonating x@p.iam...)``."""
        if self.access_token is not None:
            base = f"the access token of {self.access_token.origin}"
        elif self.credentials is not None:
            base = f"the credentials of {self.credentials.origin}"
        else:
            base = "Application Default Credentials"
        if self.impersonate_service_account is not None:
            base += (
                f" impersonating {self.impersonate_service_account.value} ({self.impersonate_service_account.origin})"
            )
        return base


def _adc_file(environ: Mapping[str, str]) -> tuple[Path, str] | None:
    """The Application Default Credentials file and what named it, if one is configured or
    ``gcloud auth application-default login`` wrote one (google-auth ``_cloud_sdk``)."""
    named = environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if named:
        return Path(named).expanduser(), "GOOGLE_APPLICATION_CREDENTIALS"
    if environ.get("CLOUDSDK_CONFIG"):
        config_dir = Path(environ["CLOUDSDK_CONFIG"])
    elif os.name == "nt":
        config_dir = Path(environ.get("APPDATA", "C:\\")) / "gcloud"
    else:
        config_dir = Path(environ.get("HOME") or Path.home()) / ".config" / "gcloud"
    path = config_dir / "application_default_credentials.json"
    return (path, "gcloud auth application-default login") if path.is_file() else None


#: The file Linux fills with the SMBIOS product name ("Google Compute Engine" on Google Cloud
#: VMs, as google-auth's ``detect_gce_residency_linux`` reads it).
PRODUCT_NAME_FILE = Path("/sys/class/dmi/id/product_name")


def _metadata_server_expected(environ: Mapping[str, str]) -> bool:
    """Whether a metadata server should serve credentials: a Google Cloud VM (by its SMBIOS
    product name, :data:`PRODUCT_NAME_FILE`) or a configured metadata host
    (``GCE_METADATA_HOST`` / ``GCE_METADATA_IP``). No network call."""
    if environ.get("GCE_METADATA_HOST") or environ.get("GCE_METADATA_IP"):
        return True
    try:
        return PRODUCT_NAME_FILE.read_text().strip().startswith("Google")
    except OSError:
        return False


def problem(
    settings: CredentialSettings,
    environ: Mapping[str, str],
    *,
    require_credentials: bool = True,
) -> str | None:
    """Why ``settings`` cannot give credentials, as one line naming what to set; None when
    they look usable. No network call, no Google import: a token that was revoked or a key
    that was deleted is only found out by the API (a 401, reported by the provider).

    Args:
      require_credentials: False for a local fake of the API, which takes anonymous calls
        (configured credentials are still checked).
    """
    try:
        if settings.access_token is not None:
            token, _ = path_or_contents(settings.access_token.value)
            if not token.strip():
                return f"{settings.access_token.origin} is empty; {HOW_TO_SET}"
        elif settings.credentials is not None:
            text, _ = path_or_contents(settings.credentials.value)
            reason = check_credentials_json(text, settings.credentials.origin)
            if reason:
                return f"{reason}; {HOW_TO_SET}"
        elif require_credentials:
            adc = _adc_file(environ)
            if adc is not None:
                path, origin = adc
                if not path.is_file():
                    return f"{origin} names {str(path)!r}, which does not exist; {HOW_TO_SET}"
                reason = check_credentials_json(file_text(path), f"{origin} ({path})")
                if reason:
                    return f"{reason}; {HOW_TO_SET}"
            elif not _metadata_server_expected(environ):
                return f"no Google Cloud credentials found: {HOW_TO_SET}"
    except UnreadableFile as err:
        named = settings.access_token or settings.credentials
        where = named.origin if named is not None else "Application Default Credentials"
        return f"{where}: {err}; {HOW_TO_SET}"
    account = settings.impersonate_service_account
    if account is not None and "@" not in account.value:
        return f"{account.origin} must be a service account email; got {account.value!r}"
    return None


def _from_info(info: dict[str, Any], scopes: list[str]) -> Any:
    """google-auth credentials of a credentials JSON whose type :data:`FILE_TYPES` allows (the
    type-specific loaders google-auth recommends over its generic one).

    Raises:
      ValueError: not a JSON object of an allowed type, or google-auth cannot load it.
    """
    import warnings

    import google.auth
    from google.oauth2 import credentials as oauth2_credentials, service_account

    kind = info.get("type") if isinstance(info, dict) else None
    if kind not in FILE_TYPES:
        raise ValueError(f"credential type {kind!r}; expected one of {', '.join(FILE_TYPES)}")
    if kind == "service_account":
        return service_account.Credentials.from_service_account_info(info, scopes=scopes)
    if kind == "authorized_user":
        return oauth2_credentials.Credentials.from_authorized_user_info(info, scopes=scopes)
    with warnings.catch_warnings():  # the type was checked above, as the warning asks
        warnings.simplefilter("ignore", DeprecationWarning)
        credentials, _ = google.auth.load_credentials_from_dict(info, scopes=scopes)
    return credentials


def load(settings: CredentialSettings, *, quota_project: str | None, iam_endpoint: str | None = None) -> Any:
    """The ``google.auth.credentials.Credentials`` of ``settings`` with ``quota_project`` (None:
    none).

    Args:
      iam_endpoint: base URL of the IAM Credentials API for impersonation (default: Google's).

    Raises:
      CredentialsError: the configured credentials cannot be loaded, or there are none.
    """
    import google.auth
    from google.auth import exceptions, impersonated_credentials
    from google.oauth2 import credentials as oauth2_credentials

    scopes = [CLOUD_PLATFORM_SCOPE]
    try:
        if settings.access_token is not None:
            token, _ = path_or_contents(settings.access_token.value)

            def cannot_renew(_request: Any, scopes: Any = None) -> Any:  # called after a 401
                raise exceptions.RefreshError(
                    "the API rejected it (401) and an access token cannot be renewed: it has expired or been revoked"
                )

            base: Any = oauth2_credentials.Credentials(
                token=token.strip(), refresh_handler=cannot_renew, quota_project_id=quota_project
            )
        elif settings.credentials is not None:
            text, _ = path_or_contents(settings.credentials.value)
            base = _from_info(credentials_json(text), scopes)
        else:
            base, _ = google.auth.default(scopes=scopes)
    except (exceptions.GoogleAuthError, ValueError, UnreadableFile) as exc:
        origin = settings.access_token or settings.credentials
        where = origin.origin if origin is not None else "Application Default Credentials"
        raise CredentialsError(f"{where}: {exc}; {HOW_TO_SET}") from None
    credentials = base
    if settings.impersonate_service_account is not None:
        target = settings.impersonate_service_account.value
        override = (
            f"{iam_endpoint.rstrip('/')}/v1/projects/-/serviceAccounts/{target}:generateAccessToken"
            if iam_endpoint
            else None
        )
        credentials = impersonated_credentials.Credentials(
            source_credentials=base,
            target_principal=target,
            target_scopes=scopes,
            delegates=list(settings.delegates) or None,
            iam_endpoint_override=override,
        )
    if getattr(credentials, "quota_project_id", None) != quota_project and hasattr(credentials, "with_quota_project"):
        credentials = credentials.with_quota_project(quota_project)  # (a copy would lose the refresh handler above)
    return credentials
