"""A TPU VM's boot disk type and network interface type on the compute-engine backend, per
generation (the boot image is :mod:`~infra.backends.compute_engine.images`).

* **Boot disk** ``hyperdisk-balanced`` for TPU7x: Google's gke-labs/tpu-operator
  (``internal/controllers/tpunodegroup/testdata/test_nodegroup_multi_host.yaml`` at 5c36b36:
  ``diskType: hyperdisk-balanced`` with
  ``machineType: tpu7x-standard-4t``) and the third-party vllm-project/ci-infra TPU7x module
  (``disk_type = "hyperdisk-balanced"``) agree. v5p and v6e keep the template's default type: no
  page read here names the disk types their machine types take (docs/compute-engine.md, open
  question 8).
* **NIC** ``GVNIC`` for TPU7x: the third-party vllm-project/ci-infra module
  (``nic_type = "GVNIC"``) only; no Google page read requires it, and tpu-operator sets none. v5p
  and v6e keep the default.

docs/compute-engine.md, section 2, lists these with their sources.
"""

from __future__ import annotations

HYPERDISK_BALANCED = "hyperdisk-balanced"
GVNIC = "GVNIC"

#: Boot disk type per generation (None: the template's default).
BOOT_DISK_TYPES: dict[str, str] = {"tpu7x": HYPERDISK_BALANCED}
#: Network interface type per generation (None: the default).
NIC_TYPES: dict[str, str] = {"tpu7x": GVNIC}


def boot_disk_type(generation: str) -> str | None:
    """The boot disk's ``disk_type`` for ``generation``, or None for the default."""
    return BOOT_DISK_TYPES.get(generation)


def nic_type(generation: str) -> str | None:
    """The network interface's ``nic_type`` for ``generation``, or None for the default."""
    return NIC_TYPES.get(generation)
