"""Run at the start of every Python of an emulated TPU VM's command (``site`` imports
``sitecustomize`` from ``sys.path``: https://docs.python.org/3/library/site.html; the emulation
puts this directory on the VM's ``PYTHONPATH``): makes ``jax.distributed.initialize()`` with no
arguments join the emulated job as it joins the real one on a TPU VM.

On a Cloud TPU VM JAX finds its cluster through ``GceTpuCluster``
(``jax/_src/clusters/cloud_tpu_cluster.py``): the process id, process count and coordinator
come from the GCE metadata server (``agent-worker-number``, ``worker-network-endpoints``,
``tpu-env`` with the ``MEGASCALE_*`` values), at ``$GCE_METADATA_IP`` when set. Every emulated VM
has such a server, answering the values its real counterpart would (``infra.local.topology``).
But ``GceTpuCluster.is_env_present`` also requires ``running_in_cloud_tpu_vm`` (libtpu and TPU
chips found) and no ``TPU_SKIP_MDS_QUERY``, which JAX sets itself when it finds no TPU chip: on
CPU it never applies. So once ``jax._src.clusters.cloud_tpu_cluster`` is imported (JAX imports
it with ``jax.distributed``), this hook defines ``EmulatedTpuCluster``, a ``GceTpuCluster`` whose
``is_env_present`` asks only the metadata server, as ``GceTpuCluster`` does after its TPU check.
``ClusterEnv`` registers every subclass when it is defined (``__init_subclass__``), and
``jax.distributed.initialize()`` then reads the coordinator, the process count and the process
id through ``GceTpuCluster``'s own code, from the emulated metadata. The coordinator's port is
``$JAX_COORDINATOR_PORT`` (JAX reads it for every detected cluster; the emulation sets a free
port per boot, a TPU VM uses JAX's 8482).

Nothing is imported before the program imports JAX itself, and nothing happens unless
``MULTISLICE_EMULATED_TPU`` is set (the emulated VMs' environment).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

#: Set in every emulated VM's environment (``infra.local.topology.vm_environment``).
EMULATED_TPU_ENV = "MULTISLICE_EMULATED_TPU"
#: The module that defines ``GceTpuCluster``.
TARGET = "jax._src.clusters.cloud_tpu_cluster"


def register(module: ModuleType) -> None:
    """Define ``EmulatedTpuCluster`` on top of ``module.GceTpuCluster`` (see the module docstring)."""

    class EmulatedTpuCluster(module.GceTpuCluster):
        name = "emulatedtpu"

        @classmethod
        def is_env_present(cls) -> bool:
            if not os.environ.get(EMULATED_TPU_ENV):
                return False
            try:
                return module.get_metadata("agent-worker-number")[1] == module.metadata_response_code_success
            except Exception:  # no metadata server: not an emulated TPU VM
                return False

    module.EmulatedTpuCluster = EmulatedTpuCluster  # pyright: ignore[reportAttributeAccessIssue]  a new attribute of jax's module


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        register(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of :data:`TARGET` so that :func:`register` runs right after it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if os.environ.get(EMULATED_TPU_ENV):
    sys.meta_path.insert(0, _Finder())
