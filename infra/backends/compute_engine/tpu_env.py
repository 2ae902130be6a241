"""The TPU environment a compute-engine VM's trainer gets, as Google's sample for TPUs on instance
groups sets it (pure; docs/compute-engine.md, section 4b).

Google's gke-labs/tpu-operator README ("Step 4: Schedule Your Workloads") runs a 2-VM TPU7x
``2x2x2`` slice of instance-group VMs with ``TPU_TOPOLOGY=2x2x2``, ``TPU_HOST_BOUNDS=1,1,2``,
``TPU_CHIPS_PER_HOST_BOUNDS=2,2,1``, ``TPU_PROCESS_PORT=8470``,
``TPU_RUNTIME_METRICS_PORTS=8431,8432,8433,8434``, ``TPU_PROCESS_ADDRESSES=<host>:8470,…`` and
``TPU_WORKER_HOSTNAMES=<host>:8471,…`` (worker order), and passes the process id to
``jax.distributed.initialize`` itself. The values that do not depend on the VMs' addresses are
derived here from the slice's shape and go into the instance template's metadata
(``infra.vm_contract.COMPUTE_ENGINE_TPU_ENV_KEY``, as :func:`metadata_value` writes them);
``boot_identity.sh`` adds the two host lists once it knows the slice's hosts, and the trainer
passes the process id explicitly (``training.cluster.initialize``).

Derivation, for a slice of ``hosts`` VMs of ``chips_per_host`` chips with topology ``AxB[xC]``
(the catalog's, :mod:`infra.accelerators`), dims padded to three with 1:

* ``TPU_TOPOLOGY``: the topology as the catalog writes it (the sample: ``2x2x2``);
* ``TPU_CHIPS_PER_HOST_BOUNDS``: a one-VM slice holds the whole topology (v6e-8 ``2x4`` →
  ``2,4,1``); a VM of a multi-host slice holds 4 chips as a ``2,2,1`` block (the sample's, for
  TPU7x; the same block as the one-VM 4-chip slices of v5p and v6e, whose catalog topologies are
  ``2x2x1`` and ``2x2``);
* ``TPU_HOST_BOUNDS``: the topology divided by the chips-per-host bounds, dim by dim (the
  sample: ``2x2x2`` / ``2,2,1`` = ``1,1,2``); its product is the slice's VM count;
* ``TPU_PROCESS_PORT``: 8470, and the addresses' ports 8470 and 8471 (the sample's);
* ``TPU_RUNTIME_METRICS_PORTS``: one port per chip from 8431 (the sample's four for 4 chips);
* ``JAX_PLATFORMS=tpu`` on a TPU VM, as the sample sets it (:func:`on_tpu`): JAX then fails at its first use when libtpu
  cannot start instead of falling back to CPU devices and training there (JAX's
  ``jax_platforms`` option: "Comma-separated list of platform names specifying which platforms jax
  should initialize"; an explicitly named platform that fails to initialize is an error).

Not set (docs/compute-engine.md, section 4b, says why): the sample's ``TPU_ACCELERATOR_TYPE``
(``tpu7x-4``, which matches neither its 8-chip topology nor Cloud TPU's ``tpu7x-16``) and its
``VBAR_CONTROL_SERVICE_URL`` (``127.0.0.1:8353``), with which GKE's TPU device plugin points libtpu
*in a container* at the node's TPU service (``$NODE_IP:8353`` or a unix socket); the trainer here
runs on the TPU VM itself, not in a container, and libtpu's default applies (not tried on a VM).

Errors: :class:`ValueError` from :func:`chips_per_host_bounds` and :func:`host_bounds` for a shape
the derivation does not cover (a catalog test runs every compute-engine type through it).
"""

from __future__ import annotations

import math

#: The sample's ports: each VM's TPU runtime (``TPU_PROCESS_PORT`` and ``TPU_PROCESS_ADDRESSES``),
#: the one of ``TPU_WORKER_HOSTNAMES``, and the first runtime-metrics port (one per chip).
PROCESS_PORT = 8470
WORKER_HOSTNAME_PORT = 8471
FIRST_METRICS_PORT = 8431
#: The chips of one VM of a multi-host slice, as bounds (4-chip VMs: the sample's ``2,2,1``).
MULTI_HOST_VM_BOUNDS = {4: (2, 2, 1)}


def _dims(topology: str) -> tuple[int, int, int]:
    dims = [int(d) for d in topology.split("x")]
    if not 1 <= len(dims) <= 3 or min(dims) < 1:
        raise ValueError(f"topology {topology!r} is not 1 to 3 positive dims joined by x")
    padded = (*dims, *([1] * (3 - len(dims))))
    return padded[0], padded[1], padded[2]


def chips_per_host_bounds(topology: str, hosts: int, chips_per_host: int) -> tuple[int, int, int]:
    """The chips of one VM as bounds per dim (see the module docstring).

    Raises:
      ValueError: a multi-host slice of VMs whose chip count has no known block.
    """
    if hosts == 1:
        return _dims(topology)
    if chips_per_host not in MULTI_HOST_VM_BOUNDS:
        raise ValueError(f"no chips-per-host bounds for a multi-host slice of {chips_per_host}-chip VMs")
    return MULTI_HOST_VM_BOUNDS[chips_per_host]


def host_bounds(topology: str, hosts: int, chips_per_host: int) -> tuple[int, int, int]:
    """The VMs of the slice as bounds per dim: topology / chips-per-host bounds.

    Raises:
      ValueError: a dim that the block does not divide, or bounds whose product is not ``hosts``.
    """
    dims, block = _dims(topology), chips_per_host_bounds(topology, hosts, chips_per_host)
    if any(d % b for d, b in zip(dims, block, strict=True)):
        raise ValueError(f"topology {topology} does not split into {'x'.join(map(str, block))} blocks of chips")
    bounds = (dims[0] // block[0], dims[1] // block[1], dims[2] // block[2])
    if math.prod(bounds) != hosts:
        raise ValueError(f"topology {topology} in {'x'.join(map(str, block))} blocks is not {hosts} VMs")
    return bounds


def static_environment(topology: str, hosts: int, chips_per_host: int) -> dict[str, str]:
    """The TPU environment of every VM of the slice that does not depend on the VMs' addresses,
    in the sample's names (values: strings as the environment holds them).

    Raises:
      ValueError: see :func:`host_bounds`.
    """

    def joined(bounds: tuple[int, int, int]) -> str:
        return ",".join(map(str, bounds))

    return {
        "TPU_TOPOLOGY": topology,
        "TPU_HOST_BOUNDS": joined(host_bounds(topology, hosts, chips_per_host)),
        "TPU_CHIPS_PER_HOST_BOUNDS": joined(chips_per_host_bounds(topology, hosts, chips_per_host)),
        "TPU_PROCESS_PORT": str(PROCESS_PORT),
        "TPU_RUNTIME_METRICS_PORTS": ",".join(str(FIRST_METRICS_PORT + i) for i in range(chips_per_host)),
    }


def on_tpu(environment: dict[str, str]) -> dict[str, str]:
    """``environment`` with ``JAX_PLATFORMS=tpu``: what a TPU VM's trainer gets (the module
    docstring); the local emulation, whose devices are CPUs, serves the environment without it."""
    return environment | {"JAX_PLATFORMS": "tpu"}


def metadata_value(environment: dict[str, str]) -> str:
    """The metadata key ``multislice-tpu-env``'s value (``boot_identity.sh`` checks its form):
    ``NAME=value`` pairs joined by single spaces, in order."""
    return " ".join(f"{name}={value}" for name, value in environment.items())
