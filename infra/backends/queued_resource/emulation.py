"""The queued-resource backend in ``multislice local up``: what each emulated VM is told, and the
emulated Cloud TPU API.

A TPU VM of a queued resource learns its place from GCE metadata; the emulator serves the same keys
(``infra.emulated.metadata``), with the values a real TPU VM of the stack would get
(:func:`vm_metadata`):

* ``agent-worker-number``: the worker index inside the slice;
* ``worker-network-endpoints``: ``<node>-w-<i>:<i>:<ip>`` for each worker of the slice
  (every worker is 127.0.0.1 here);
* ``tpu-env``: ``ACCELERATOR_TYPE``, ``WORKER_ID``, ``NODE_ID`` and, for more than one
  slice, the ``MEGASCALE_*`` values of a multislice queued resource;
* ``accelerator-type``, ``startup-script``, and this project's ``multislice-run-dir``: the
  stack's ``gs://<bucket>/runs/<run>``, as ``pulumi up`` sets it;
* with ``multislice:queuedResource.deleteOnComplete``, ``multislice-delete-queued-resource``:
  the queued resource's name, from the same function as ``pulumi up``
  (:func:`infra.vm_contract.delete_on_complete_metadata`); worker 0 of slice 0 deletes it
  through the emulated TPU API once the run is complete (:mod:`~infra.backends.queued_resource.emulated_api`).

The node (slice) names are the stack's real ones, :attr:`infra.config.StackConfig.node_ids`,
the ids the queued resource's nodes get on Cloud TPU. :class:`QueuedResourceEmulation` serves
the emulated TPU API (deleteOnComplete, and ``multislice local reset``'s ResetQueuedResource).
"""

from __future__ import annotations

from infra import vm_contract as contract
from infra.backends.interface import Emulation
from infra.backends.queued_resource.emulated_api import DeleteOnComplete
from infra.config import StackConfig

#: Port part of ``MEGASCALE_COORDINATOR_ADDRESS`` as a queued resource sets it (JAX replaces it).
MEGASCALE_PORT = 8080


def vm_metadata(
    config: StackConfig, slice_id: int, worker: int, *, startup_script: str, run_dir: str
) -> dict[str, str]:
    """The metadata attributes of worker ``worker`` of slice ``slice_id`` of a queued resource (keys
    as on GCE; see the module docstring)."""
    acc = config.accelerator
    node = config.node_ids[slice_id]
    endpoints = ",".join(f"{node}-w-{i}:{i}:127.0.0.1" for i in range(acc.hosts))
    tpu_env = [
        f"ACCELERATOR_TYPE: '{acc.name}'",
        f"WORKER_ID: '{worker}'",
        f"NODE_ID: '{node}'",
    ]
    if config.slices > 1:
        tpu_env += [
            f"MEGASCALE_COORDINATOR_ADDRESS: '127.0.0.1:{MEGASCALE_PORT}'",
            f"MEGASCALE_NUM_SLICES: '{config.slices}'",
            f"MEGASCALE_SLICE_ID: '{slice_id}'",
            f"MEGASCALE_PORT: '{MEGASCALE_PORT}'",
        ]
    return {
        contract.WORKER_NUMBER_KEY: str(worker),
        contract.WORKER_ENDPOINTS_KEY: endpoints,
        contract.TPU_ENV_KEY: "\n".join(tpu_env) + "\n",
        contract.ACCELERATOR_TYPE_KEY: acc.name,
        **contract.node_metadata(
            startup_script=startup_script,
            run_dir=run_dir,
            queued_resource_name=config.queued_resource_name,
            delete_on_complete=config.delete_on_complete,
        ),
    }


class QueuedResourceEmulation(DeleteOnComplete, Emulation):
    """The emulated queued resource: its Cloud TPU API (:class:`DeleteOnComplete`: the delete the
    VMs send once the run is complete, and ``multislice local reset``)."""

    @property
    def api_url(self) -> str | None:
        return self.api.endpoint if self.api is not None else None
