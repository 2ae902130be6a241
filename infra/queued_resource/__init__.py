"""Where existing stacks find the queued resource's dynamic provider: a re-export.

Pulumi pickles a dynamic provider by module reference, and every stack deployed so far holds
``infra.queued_resource.QueuedResourceProvider`` (:data:`infra.backends.queued_resource.provider.PICKLED_MODULE`).
The code lives with its backend, in :mod:`infra.backends.queued_resource.provider`; this module
keeps that name importable, and the classes name it as their module, so the provider pickles to the
same bytes as before. Never remove it or rename what it exports.
"""

from infra.backends.queued_resource.provider import (
    PROVIDER_VERSION,
    CredentialsRejected,
    QueuedResource,
    QueuedResourceError,
    QueuedResourceFailed,
    QueuedResourceInputs,
    QueuedResourceProvider,
    QuotaOrPermissionError,
)

__all__ = [
    "PROVIDER_VERSION",
    "CredentialsRejected",
    "QueuedResource",
    "QueuedResourceError",
    "QueuedResourceFailed",
    "QueuedResourceInputs",
    "QueuedResourceProvider",
    "QuotaOrPermissionError",
]
