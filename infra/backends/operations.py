"""Each registered backend's operations, keyed by ``multislice:backend``: :data:`BACKENDS`, and
:func:`backend_of` a stack.

The backends are those of :data:`infra.backends.registry.SPECS`, the one list; each one's
operations are the ``BACKEND`` of its package's ``backend.py`` (a :class:`~infra.backends.interface.Backend`
carrying the registered spec), loaded here by that convention when this module is first imported.
The program, ``status``, ``logs``, ``exec``, ``reset`` and the local emulation (the layers above the
config) ask here; the config layer reads the specs (:mod:`infra.backends.registry`) and never loads
what a backend does.
"""

from __future__ import annotations

import importlib
from typing import Any

from infra.backends.interface import Backend
from infra.backends.registry import SPECS
from infra.backends.spec import BackendSpec


def operations_of(spec: BackendSpec) -> Backend:
    """The operations of the backend of ``spec``: ``BACKEND`` of ``backend.py`` beside its ``spec.py``.

    Raises:
      RuntimeError: that module has no ``BACKEND``, or it is not a :class:`Backend` carrying ``spec``
        (a package that breaks the convention: docs/development.md, "Adding a backend").
    """
    module = f"{type(spec).__module__.rpartition('.')[0]}.backend"
    found = getattr(importlib.import_module(module), "BACKEND", None)
    if not isinstance(found, Backend) or found.spec is not spec:
        raise RuntimeError(
            f"{module}.BACKEND must be the Backend of the registered spec {spec.name!r} "
            f"(infra/backends/registry.py); found {found!r}"
        )
    return found


#: Every backend's operations, by ``multislice:backend`` value, in :data:`~infra.backends.registry.SPECS`' order.
BACKENDS: dict[str, Backend] = {name: operations_of(spec) for name, spec in SPECS.items()}


def backend(name: str) -> Backend:
    """The backend named ``name`` (a ``multislice:backend`` value).

    Raises:
      KeyError: no such backend (a stack's config refuses it first, naming the key).
    """
    return BACKENDS[name]


def backend_of(config: Any) -> Backend:
    """The backend of a :class:`~infra.config.StackConfig` (its ``multislice:backend``)."""
    return BACKENDS[config.backend]
