"""Authentication and project checks of the loopback TPU API fake, answered as the real
service answers them (https://cloud.google.com/apis/design/errors):

* ``require(tokens)``: only ``Authorization: Bearer <token>`` of ``tokens`` (token → identity)
  or a JWT signed by a key of ``trust_key(email, public_pem)`` (a self-signed service-account
  JWT, https://google.aip.dev/auth/4111) is accepted; anything else is 401 UNAUTHENTICATED.
  Until ``require`` is called, anonymous calls are accepted.
* ``deny(identity)``: that identity gets 403 PERMISSION_DENIED (IAM_PERMISSION_DENIED).
* ``disable_api(project, number=)``: requests billed to ``project`` (their
  ``X-Goog-User-Project``; without one, to ``credential_project``, gcloud's own OAuth client
  project for user credentials) get 403 SERVICE_DISABLED whose ErrorInfo ``consumer`` names the
  project by number, as the service does.
* ``generate_access_token(email)``: the IAM Credentials API's ``generateAccessToken``
  (impersonation) gives an accepted caller a token of identity ``impersonated:<email>``.
"""

from __future__ import annotations

import itertools
from typing import Any

from google.rpc import error_details_pb2

from tests.fakes.rpc_errors import ApiError, service_disabled

MISSING = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential."
)
INVALID = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid "
    "authentication credential."
)


class FakeAuth:
    """The fake's callers and projects (not thread-safe: the fake calls it under its lock)."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] | None = None
        self.trusted_keys: dict[str, str] = {}
        self.denied: set[str] = set()
        self.disabled: dict[str, str] = {}
        self.credential_project = "764086051850"
        self._ids = itertools.count(1)

    def require(self, tokens: dict[str, str]) -> None:
        self.tokens = dict(tokens)

    def trust_key(self, email: str, public_pem: str) -> None:
        self.trusted_keys[email] = public_pem

    def deny(self, identity: str) -> None:
        self.denied.add(identity)

    def disable_api(self, project: str, *, number: str | None = None) -> None:
        self.disabled[project] = number or project

    def authenticate(self, headers: dict[str, str]) -> str | None:
        """The caller's identity (None: anonymous, accepted until :meth:`require`)."""
        if self.tokens is None:
            return None
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            raise ApiError("UNAUTHENTICATED", MISSING)
        token = auth.removeprefix("Bearer ")
        identity = self.tokens.get(token) or self._verify_jwt(token)
        if identity is None:
            raise ApiError("UNAUTHENTICATED", INVALID)
        return identity

    def _verify_jwt(self, token: str) -> str | None:
        from google.auth import jwt

        try:
            claims = jwt.decode(token, verify=False)
            pem = self.trusted_keys.get(claims.get("iss"))
            if pem is None:
                return None
            jwt.decode(token, certs=pem, verify=True, audience=claims.get("aud"))
        except ValueError:
            return None
        return claims["iss"]

    def authorize(self, rpc: str, identity: str | None, headers: dict[str, str]) -> None:
        """403 for a denied identity, or for a request billed to a project whose API is disabled."""
        if identity is not None and identity in self.denied:
            raise ApiError(
                "PERMISSION_DENIED",
                f"Permission denied for {identity} on {rpc} (or it may not exist).",
                (error_details_pb2.ErrorInfo(reason="IAM_PERMISSION_DENIED", domain="tpu.googleapis.com"),),
            )
        billed = headers.get("x-goog-user-project") or self.credential_project
        if billed in self.disabled:
            consumer = self.disabled[billed]
            raise ApiError(
                "PERMISSION_DENIED",
                f"Cloud TPU API has not been used in project {consumer} before or it is disabled. "
                "Enable it by visiting "
                f"https://console.developers.google.com/apis/api/tpu.googleapis.com/overview?project={consumer} "
                "then retry.",
                service_disabled(consumer),
            )

    def generate_access_token(self, email: str) -> dict[str, Any]:
        """The body of ``generateAccessToken`` for service account ``email``."""
        if self.tokens is None:
            self.tokens = {}
        token = f"impersonated-{email}-{next(self._ids)}"
        self.tokens[token] = f"impersonated:{email}"
        return {"accessToken": token, "expireTime": "2099-01-01T00:00:00Z"}
