"""The registry of backends, keyed by ``multislice:backend``: :data:`BACKENDS`, and
:func:`backend_of` a stack.

The operations' half of the one registry (:mod:`infra.backends`); it holds the same backends, in
the same order, as :data:`infra.backends.specs.SPECS` (each :class:`~infra.backends.interface.Backend`
carries its spec). A new backend adds its ``BACKEND`` here (docs/development.md, "Adding a backend").
"""

from __future__ import annotations

from typing import Any

from infra.backends.compute_engine.backend import BACKEND as COMPUTE_ENGINE
from infra.backends.gke.backend import BACKEND as GKE
from infra.backends.interface import Backend
from infra.backends.queued_resource.backend import BACKEND as QUEUED_RESOURCE
from infra.backends.specs import SPECS

#: Every backend, by ``multislice:backend`` value, in :data:`~infra.backends.specs.SPECS`' order.
BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (QUEUED_RESOURCE, COMPUTE_ENGINE, GKE)}
if list(BACKENDS) != list(SPECS) or any(BACKENDS[name].spec is not SPECS[name] for name in SPECS):
    raise RuntimeError(f"infra/backends: the registries disagree: {list(BACKENDS)} and {list(SPECS)}")


def backend(name: str) -> Backend:
    """The backend named ``name`` (a ``multislice:backend`` value).

    Raises:
      KeyError: no such backend (a stack's config refuses it first, naming the key).
    """
    return BACKENDS[name]


def backend_of(config: Any) -> Backend:
    """The backend of a :class:`~infra.config.StackConfig` (its ``multislice:backend``)."""
    return BACKENDS[config.backend]
