"""Errors as Google APIs answer them over REST: a ``google.rpc.Status`` JSON body with typed
``details`` and the HTTP status of its code (https://cloud.google.com/apis/design/errors), and
the ``details`` the Cloud TPU API sends for quota, rate-limit and disabled-API errors. Shared by
the loopback fakes (:mod:`tests.fakes.tpu_api`, :mod:`tests.fakes.tpu_auth`,
:mod:`tests.fakes.tpu_faults`)."""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2, json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2

#: HTTP status for each google.rpc code used here (https://cloud.google.com/apis/design/errors).
HTTP_FOR_CODE = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
}


class ApiError(Exception):
    """Raised inside handlers; becomes a google.rpc.Status JSON error response."""

    def __init__(self, status: str, message: str, details: tuple[Message, ...] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details


def error_response(err: ApiError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body of ``err``."""
    http = HTTP_FOR_CODE.get(err.status, 500)
    status = status_pb2.Status(code=code_pb2.Code.Value(err.status), message=err.message)
    for detail in err.details:
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    body = json_format.MessageToDict(status, preserving_proto_field_name=False)
    return http, {
        "error": {"code": http, "message": err.message, "status": err.status, "details": body.get("details", [])}
    }


def quota_failure(metric: str = "TPUV4sPodPerProjectPerZoneForTPUAPI", description: str = "") -> tuple[Message, ...]:
    """``details`` of an allocation-quota error as the TPU API sends it: QuotaFailure + ErrorInfo."""
    violation = error_details_pb2.QuotaFailure.Violation(
        subject=f"quota_metric:{metric}", description=description or f"Quota limit '{metric}' has been exceeded."
    )
    info = error_details_pb2.ErrorInfo(
        reason="QUOTA_EXCEEDED", domain="tpu.googleapis.com", metadata={"quota_metric": metric}
    )
    return (error_details_pb2.QuotaFailure(violations=[violation]), info)


def rate_limited() -> tuple[Message, ...]:
    """``details`` of a request-rate 429 (retryable)."""
    return (error_details_pb2.ErrorInfo(reason="RATE_LIMIT_EXCEEDED", domain="googleapis.com"),)


def service_disabled(consumer: str) -> tuple[Message, ...]:
    """``details`` of a 403 for a disabled Cloud TPU API in project ``consumer`` (id or number),
    with the ErrorInfo metadata the service sends."""
    return (
        error_details_pb2.ErrorInfo(
            reason="SERVICE_DISABLED",
            domain="googleapis.com",
            metadata={
                "consumer": f"projects/{consumer}",
                "service": "tpu.googleapis.com",
                "serviceTitle": "Cloud TPU API",
                "containerInfo": consumer,
                "activationUrl": f"https://console.developers.google.com/apis/api/tpu.googleapis.com/overview?project={consumer}",
            },
        ),
    )
