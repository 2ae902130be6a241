"""The gke backend (``multislice:backend: gke``), built from the facts of docs/gke.md: a GKE cluster
with one TPU node pool per slice, and the run as one JobSet whose Pods boot the stack's release.

* :mod:`~infra.backends.gke.spec` and ``boot_identity.sh``: ``multislice:gke``, the keys the backend
  refuses, and what a Pod's boot is (its place from its environment, the trainer in the foreground),
  rendered by :func:`infra.startup.render`;
* :mod:`~infra.backends.gke.node_pools`: one TPU node pool per slice: its machine type, the
  node labels the Pods select, its topology and node count, and its ``node_config`` per capacity mode;
* :mod:`~infra.backends.gke.jobset`: the workload as one JobSet whose Pods find their place as
  GKE and JobSet give it, and boot the stack's startup script from the release's ConfigMap;
* :mod:`~infra.backends.gke.slices`, :mod:`~infra.backends.gke.workload` and
  :mod:`~infra.backends.gke.program`: the Pulumi resources; :mod:`~infra.backends.gke.names`, the
  names they get;
* :mod:`~infra.backends.gke.backend`: the operations (status, logs, exec through kubectl:
  :mod:`~infra.backends.gke.kubectl`, :mod:`~infra.backends.gke.capacity`,
  :mod:`~infra.backends.gke.logs`), and :mod:`~infra.backends.gke.emulation`, its ``local up``.
"""
