"""The registry of backend specs, keyed by ``multislice:backend``: :data:`SPECS`.

The config layer's half of the one registry (:mod:`infra.backends`): :mod:`infra.config` and
:mod:`infra.startup` look a stack's backend up here; :data:`infra.backends.registry.BACKENDS`
holds the same backends' operations, in the same order (tests/backends/test_seam.py). A new
backend adds its spec here (docs/development.md, "Adding a backend").
"""

from __future__ import annotations

from infra.backends.compute_engine.spec import SPEC as COMPUTE_ENGINE_SPEC
from infra.backends.gke.spec import SPEC as GKE_SPEC
from infra.backends.queued_resource.spec import SPEC as QUEUED_RESOURCE_SPEC
from infra.backends.spec import BackendSpec

#: Every backend's spec, by ``multislice:backend`` value; the first is the default.
SPECS: dict[str, BackendSpec] = {spec.name: spec for spec in (QUEUED_RESOURCE_SPEC, COMPUTE_ENGINE_SPEC, GKE_SPEC)}
#: ``multislice:backend``'s values, the default first.
NAMES: tuple[str, ...] = tuple(SPECS)
#: The backend of a stack that does not set ``multislice:backend``.
DEFAULT = NAMES[0]


def spec_of(name: str) -> BackendSpec:
    """The spec of backend ``name``.

    Raises:
      KeyError: no such backend (the stack config refuses it first, naming the key).
    """
    return SPECS[name]
