"""The gke backend's parts, built from the facts of docs/gke.md (not yet a registered backend:
:mod:`infra.backends.registry` does not list it, so no stack can name it).

* :mod:`~infra.backends.gke.node_pools`: one TPU node pool per slice: its machine type, the
  node labels the Pods select, its topology and node count, and its ``node_config`` per capacity mode;
* :mod:`~infra.backends.gke.jobset`: the workload as one JobSet whose Pods find their place as
  GKE and JobSet give it.
"""
