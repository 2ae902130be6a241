"""Errors of the queued-resource provider: the exception types, which API errors are retried,
and one actionable message per failure.

HTTP 429 (request-rate limits) and 5xx are retried with exponential backoff by
``google.api_core.retry.Retry`` (the predicate is :func:`is_retryable`); allocation-quota
(429 with a ``google.rpc.QuotaFailure``), permission (403) and authentication (401) errors are
not retried and become one message saying what to fix (:func:`explain`). Error model:
https://cloud.google.com/apis/design/errors.

A 403 ``SERVICE_DISABLED`` names, in its ``google.rpc.ErrorInfo``, the project whose API is
disabled: ``metadata.consumer`` is ``projects/<id or number>``
(https://cloud.google.com/apis/design/errors#error_info). That is the quota project of the
request (see :mod:`infra.credentials`). Only when it is the stack's ``gcp:project`` (which the
program enables ``tpu.googleapis.com`` in, moments before) is the error retried as "just
enabled, still propagating"; a disabled API in any other project is reported at once, naming
that project.
"""

from __future__ import annotations

import re
from typing import Any


class QueuedResourceError(RuntimeError):
    """The queued resource could not be converged; the message says why and what to do."""


class QueuedResourceFailed(QueuedResourceError):
    """The queued resource went FAILED or SUSPENDED."""


class QuotaOrPermissionError(QueuedResourceError):
    """The API refused for quota or permission reasons (not retried)."""


class CredentialsRejected(QuotaOrPermissionError):
    """The credentials were refused (401) or could not produce a token (not retried)."""


def root_cause(exc: BaseException) -> BaseException:
    """The API error behind a ``google.api_core.exceptions.RetryError`` (else ``exc``)."""
    from google.api_core import exceptions

    if isinstance(exc, exceptions.RetryError) and exc.cause is not None:
        return exc.cause
    return exc


def _details(exc: BaseException) -> list[dict[str, Any]]:
    return [d for d in (getattr(exc, "details", None) or []) if isinstance(d, dict)]


def _has_detail(exc: BaseException, type_name: str) -> bool:
    return any(str(d.get("@type", "")).endswith(type_name) for d in _details(exc))


def is_quota_exhausted(exc: BaseException) -> bool:
    """An allocation quota is used up (429/RESOURCE_EXHAUSTED that is not a request-rate limit)."""
    from google.api_core import exceptions

    if not isinstance(exc, (exceptions.TooManyRequests, exceptions.ResourceExhausted)):
        return False
    if getattr(exc, "reason", None) == "RATE_LIMIT_EXCEEDED":
        return False
    return _has_detail(exc, "google.rpc.QuotaFailure") or "quota" in str(getattr(exc, "message", exc)).lower()


def is_service_disabled(exc: BaseException) -> bool:
    """403 because the API is not enabled (in the project :func:`disabled_in` names)."""
    from google.api_core import exceptions

    return isinstance(exc, exceptions.Forbidden) and getattr(exc, "reason", None) in (
        "SERVICE_DISABLED",
        "ACCESS_NOT_CONFIGURED",
    )


def disabled_in(exc: BaseException) -> str | None:
    """The project (id or number) a ``SERVICE_DISABLED`` error names in its ErrorInfo
    ``consumer``; ``""`` when it names none; None when ``exc`` is not such an error."""
    if not is_service_disabled(exc):
        return None
    consumer = str((getattr(exc, "metadata", None) or {}).get("consumer", ""))
    return consumer.removeprefix("projects/")


def is_disabled_in_our_project(exc: BaseException, project: str | None, quota_project: str | None) -> bool:
    """Whether a ``SERVICE_DISABLED`` error is about ``project`` (``gcp:project``): the consumer
    is its id, or a project number while the request was billed to ``project`` itself (the API
    names the quota project by number), or it names no project."""
    consumer = disabled_in(exc)
    if consumer is None:
        return False
    if not consumer or consumer == project:
        return True
    return consumer.isdigit() and project is not None and quota_project == project


def is_retryable(exc: BaseException, *, project: str | None = None, quota_project: str | None = None) -> bool:
    """Retry predicate: 429 request-rate limits, 5xx, transport errors, and a just-enabled API
    in ``project`` (:func:`is_disabled_in_our_project`; ``quota_project``: where the requests
    are billed)."""
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions
    from requests import exceptions as requests_exceptions

    if isinstance(exc, (exceptions.TooManyRequests, exceptions.ResourceExhausted)):
        return not is_quota_exhausted(exc)
    if isinstance(
        exc,
        (
            exceptions.InternalServerError,
            exceptions.BadGateway,
            exceptions.ServiceUnavailable,
            exceptions.GatewayTimeout,
        ),
    ):
        return True
    if isinstance(
        exc, (requests_exceptions.ConnectionError, requests_exceptions.Timeout, auth_exceptions.TransportError)
    ):
        return True
    return is_disabled_in_our_project(exc, project, quota_project)


def is_fatal_for_every_call(exc: BaseException) -> bool:
    """An error every other call of the same kind would get too (credentials, permission,
    quota, a disabled API): stop issuing more of them."""
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions

    exc = root_cause(exc)
    return (
        isinstance(exc, (exceptions.Unauthorized, exceptions.Forbidden, exceptions.PermissionDenied))
        or (isinstance(exc, auth_exceptions.GoogleAuthError) and not isinstance(exc, auth_exceptions.TransportError))
        or isinstance(exc, QuotaOrPermissionError)
        or is_quota_exhausted(exc)
    )


def is_new_service_account_race(exc: BaseException) -> bool:
    """400/404 naming the service account: IAM is eventually consistent, and the account was
    typically created moments before (pulumi-gcp's own TPU example waits 60 s after it)."""
    from google.api_core import exceptions

    message = str(getattr(exc, "message", exc)).lower()
    return isinstance(exc, (exceptions.BadRequest, exceptions.NotFound)) and "service account" in message


def explain(
    exc: BaseException,
    action: str,
    props: dict[str, Any],
    *,
    credentials: str = "the credentials",
    quota_project: str | None = None,
    quota_origin: str = "gcp:project",
) -> QueuedResourceError:
    """One actionable error for an API failure of ``action`` on the QR of ``props``.

    Args:
      credentials: where the credentials came from (``CredentialSettings.describe``).
      quota_project, quota_origin: the project the requests were billed to and the setting
        that chose it.

    Returns (does not raise) a :class:`CredentialsRejected` for 401s and token failures, a
    :class:`QuotaOrPermissionError` for quota, disabled-API and permission errors, else a
    :class:`QueuedResourceError`.
    """
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions

    from infra.credentials import HOW_TO_SET

    exc = root_cause(exc)
    name = props.get("queuedResourceId", "?")
    project, zone = props.get("project", "?"), props.get("zone", "?")
    message = re.sub(r"^(GET|POST|PATCH|PUT|DELETE) \S+: ", "", getattr(exc, "message", None) or str(exc))
    if isinstance(exc, QueuedResourceError):
        return exc
    if isinstance(exc, exceptions.Unauthorized):
        return CredentialsRejected(
            f"{action} queued resource {name!r}: the API rejected {credentials} (401 UNAUTHENTICATED: "
            f"{' '.join(message.split())}); {HOW_TO_SET}"
        )
    if isinstance(exc, auth_exceptions.GoogleAuthError) and not isinstance(exc, auth_exceptions.TransportError):
        return CredentialsRejected(
            f"{action} queued resource {name!r}: {credentials} could not be used: "
            f"{' '.join(message.split())}; {HOW_TO_SET}"
        )
    consumer = disabled_in(exc)
    if consumer and not is_disabled_in_our_project(exc, props.get("project"), quota_project):
        billed = f"{quota_origin} {quota_project}" if quota_project else f"the project of {credentials}"
        return QuotaOrPermissionError(
            f"{action} queued resource {name!r}: the Cloud TPU API is disabled in project {consumer}, which these "
            f"requests are billed to ({billed}), not in gcp:project {project}: enable it there "
            f"(`gcloud services enable tpu.googleapis.com --project {consumer}`) or unset {quota_origin} / "
            f"gcp:userProjectOverride so requests are billed to {project}"
        )
    if is_quota_exhausted(exc):
        return QuotaOrPermissionError(
            f"{action} queued resource {name!r}: TPU quota exhausted in {zone} of project {project}: {message}\n"
            f"Fix: request more quota for {props.get('slices')} x {props.get('acceleratorType')} "
            f"({props.get('capacity')}) at https://console.cloud.google.com/iam-admin/quotas?project={project} "
            "(filter 'tpu'), or lower multislice:slices / change multislice:acceleratorType or multislice:capacity; "
            "then run `pulumi up` again."
        )
    if is_service_disabled(exc):
        return QuotaOrPermissionError(
            f"{action} queued resource {name!r}: the Cloud TPU API is not enabled in project {project}: {message}\n"
            "Fix: this program enables tpu.googleapis.com; if it was enabled moments ago wait a few minutes and "
            "run `pulumi up` again."
        )
    if isinstance(exc, (exceptions.PermissionDenied, exceptions.Forbidden, exceptions.Unauthorized)):
        return QuotaOrPermissionError(
            f"{action} queued resource {name!r}: permission denied in project {project}: {message}\n"
            f"Fix: the identity running `pulumi up` ({credentials}) needs roles/tpu.admin on the project and "
            f"roles/iam.serviceAccountUser on {props.get('serviceAccount', 'the TPU service account')} "
            "(`gcloud auth application-default login` for local credentials)."
        )
    if isinstance(exc, exceptions.Conflict):  # 409 ALREADY_EXISTS
        return QueuedResourceError(
            f"{action} queued resource {name!r}: one with this id already exists in {zone} but not in this stack: "
            f"{message}\nFix: delete it (`gcloud compute tpus queued-resources delete {name} --zone {zone} "
            f"--project {project} --force`) or import it, then run `pulumi up` again."
        )
    if isinstance(exc, exceptions.GoogleAPICallError):
        return QueuedResourceError(f"{action} queued resource {name!r}: {type(exc).__name__}: {message}")
    return QueuedResourceError(f"{action} queued resource {name!r}: {type(exc).__name__}: {exc}")
