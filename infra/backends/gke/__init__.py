"""The gke backend's parts, built from the facts of docs/gke.md (not yet a registered backend:
:mod:`infra.backends.registry` does not list it, so no stack can name it).

* :mod:`~infra.backends.gke.node_pools`: one TPU node pool per slice: its machine type, the
  node labels the Pods select, its topology and node count, and its ``node_config`` per capacity mode;
* :mod:`~infra.backends.gke.jobset`: the workload as one JobSet whose Pods find their place as
  GKE and JobSet give it, and boot the stack's startup script from the release's ConfigMap;
* :mod:`~infra.backends.gke.spec` and ``boot_identity.sh``: what a Pod's boot is (its place from its
  environment, the trainer in the foreground), rendered by :func:`infra.startup.render`.
"""
