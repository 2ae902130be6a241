"""The one list of backends, keyed by ``multislice:backend``: :data:`SPECS`.

A backend is one package of :mod:`infra.backends` and is registered here by one line: its
``spec.py``'s ``SPEC`` (:class:`~infra.backends.spec.BackendSpec`), what the backend *is* for the
stack file and a TPU VM. Its operations are found from the spec, by the package's convention: the
``BACKEND`` of its ``backend.py`` (:class:`~infra.backends.interface.Backend`, which carries the spec;
:mod:`infra.backends.operations` loads them), so nothing else lists the backends.

This module sits at the config layer: :mod:`infra.config` validates a stack through its backend's
spec and :mod:`infra.startup` renders the VM's boot from it, so it imports the specs only, never the
operations (Pulumi, gcloud and the emulation live above the config).
docs/development.md, "Adding a backend", lists every place a new backend touches.
"""

from __future__ import annotations

from collections.abc import Iterable

from infra.accelerators import GENERATIONS, Generation
from infra.backends.compute_engine.spec import SPEC as COMPUTE_ENGINE
from infra.backends.gke.spec import SPEC as GKE
from infra.backends.queued_resource.spec import SPEC as QUEUED_RESOURCE
from infra.backends.spec import BackendSpec

#: Every backend's spec, by ``multislice:backend`` value; the first is the default. The one list.
SPECS: dict[str, BackendSpec] = {spec.name: spec for spec in (QUEUED_RESOURCE, COMPUTE_ENGINE, GKE)}
#: ``multislice:backend``'s values, the default first.
NAMES: tuple[str, ...] = tuple(SPECS)
#: The backend of a stack that does not set ``multislice:backend``.
DEFAULT = NAMES[0]


def check_catalog(generations: Iterable[Generation], names: Iterable[str] = NAMES) -> None:
    """Refuse a catalog record that says a backend offers its generation when no backend of that
    name is registered (a misspelled or removed backend).

    Raises:
      RuntimeError: naming the generation and the unknown backend.
    """
    for gen in generations:
        unknown = sorted(set(gen.backends) - set(names))
        if unknown:
            raise RuntimeError(
                f"infra/accelerators/catalog.py: {gen.name} names backends {unknown} that infra/backends/registry.py "
                f"does not list ({', '.join(names)})"
            )


check_catalog(GENERATIONS.values())


def spec_of(name: str) -> BackendSpec:
    """The spec of backend ``name``.

    Raises:
      KeyError: no such backend (the stack config refuses it first, naming the key).
    """
    return SPECS[name]
