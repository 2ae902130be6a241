"""The backends: where a stack's TPU slices come from (``multislice:backend``), behind one seam.

Each backend is one package (``queued_resource/``: a multislice queued resource of the Cloud TPU
API; ``compute_engine/``: one managed instance group of TPU VMs per slice; ``gke/``: a JobSet on one
GKE TPU node pool per slice), listed once, in :data:`infra.backends.registry.SPECS`, and supplies
the same names, in two halves:

* :class:`~infra.backends.spec.BackendSpec` (``<package>/spec.py``, its ``SPEC``): what the backend
  *is*, as the stack file and a TPU VM see it: the generations and capacity modes it offers
  (answered from the catalog, :mod:`infra.accelerators`), the config keys it owns and refuses, its
  settings model, and what the VM's boot and trainer learn from it (the boot's identity phase,
  where the VM's identity is, where its log lines go). It sits at the config layer:
  :mod:`infra.config` reads it, so it imports nothing above the catalog.
* :class:`~infra.backends.interface.Backend` (``<package>/backend.py``, its ``BACKEND``, which
  carries the ``SPEC``): what the backend *does*: the Pulumi resources it declares, the operator
  operations (``status`` capacity, the log filter, the ``exec`` transport, ``reset`` or its
  refusal, deletion on completion) and, for ``multislice local up``, how an emulated VM gets its
  identity and what repair does. :mod:`infra.backends.operations` finds it beside each registered
  spec (:data:`infra.backends.operations.BACKENDS`).

Outside this package no code compares a backend name (tests/backends/test_seam.py): code asks for
the stack's backend and calls it. docs/development.md, "Adding a backend", is the recipe. This
``__init__`` imports nothing, so that the queued resource's dynamic provider (which the Pulumi CLI
imports by module path, ``infra.queued_resource``) loads no more than it needs.
"""
