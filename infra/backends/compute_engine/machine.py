"""A TPU VM's boot disk type and size and network interface type on the compute-engine backend,
per generation (the boot image is :mod:`~infra.backends.compute_engine.images`).

* **Boot disk** ``hyperdisk-balanced`` for TPU7x: Google's gke-labs/tpu-operator
  (``internal/controllers/tpunodegroup/testdata/test_nodegroup_multi_host.yaml`` at 5c36b36:
  ``diskType: hyperdisk-balanced`` with
  ``machineType: tpu7x-standard-4t``) and the third-party vllm-project/ci-infra TPU7x module
  (``disk_type = "hyperdisk-balanced"``) agree. ``hyperdisk-balanced`` for v6e too: Google's Cluster
  Toolkit creates ``ct6e-standard-4t`` VMs (GKE nodes) with it in its v6e blueprints
  (``examples/gke-consumption-options/dws-flex-start/gke-tpu-v6e/gke-tpu-v6e.yaml`` at 1047080,
  ``disk_type: hyperdisk-balanced``). v5p keeps the template's default type: no source read here
  names the disk types ``ct5p-hightpu-4t`` takes, and the plan says so (:func:`boot_disk_note`): if
  the machine type refused the default, ``pulumi up`` would succeed and the groups stay empty
  (docs/compute-engine.md, open question 8).
* **NIC** ``GVNIC`` for TPU7x: the third-party vllm-project/ci-infra module
  (``nic_type = "GVNIC"``) only; no Google page read requires it, and tpu-operator sets none. v5p
  and v6e keep the default.
* **Boot disk size** (:func:`boot_disk_size_gb`; ``multislice:computeEngine.bootDiskSizeGb``
  changes it): 100 GB for every generation, the smallest of the references (Google's
  tpu-operator README: ``bootDiskSizeGB: 100`` for TPU7x; its e2e test 250 GB; the vllm module
  1,024 GB). Without one the disk is the image's size (the Compute API's
  ``AttachedDiskInitializeParams.diskSizeGb``: "If you specify a sourceImage … the default size
  is the size of the sourceImage"), which the VM's releases and virtualenvs may fill.
  Bounds: at least :data:`MIN_BOOT_DISK_SIZE_GB`, at most :data:`MAX_BOOT_DISK_SIZE_GB`.

docs/compute-engine.md, section 2, lists these with their sources.
"""

from __future__ import annotations

HYPERDISK_BALANCED = "hyperdisk-balanced"
GVNIC = "GVNIC"

#: Boot disk size per generation, GB (the module docstring).
BOOT_DISK_SIZE_GB: dict[str, int] = {"v5p": 100, "v6e": 100, "tpu7x": 100}
#: The smallest boot disk a stack may ask for, GB. What the boot writes to the disk is a few GB
#: (two releases' virtualenvs side by side while the release watch switches, 1.4 GB each in
#: docs/goodput.md's measurement, and uv's cache of the same wheels), but the image's own size
#: is not known here (docs/compute-engine.md, open question 8) and a disk smaller than the image
#: fails only when the group creates a VM. Half the default leaves room for both; the floor is
#: this project's judgement, not a Google figure.
MIN_BOOT_DISK_SIZE_GB = 50
#: The largest, GB: 64 TiB, the largest Hyperdisk Balanced and Persistent Disk volume (Compute
#: Engine's "Hyperdisk" and "Persistent Disk" pages; not checked against a live ``diskTypes.get``
#: ``validDiskSize``).
MAX_BOOT_DISK_SIZE_GB = 65536

#: Boot disk type per generation (None: the template's default).
BOOT_DISK_TYPES: dict[str, str] = {"tpu7x": HYPERDISK_BALANCED, "v6e": HYPERDISK_BALANCED}
#: Network interface type per generation (None: the default).
NIC_TYPES: dict[str, str] = {"tpu7x": GVNIC}


def boot_disk_type(generation: str) -> str | None:
    """The boot disk's ``disk_type`` for ``generation``, or None for the default."""
    return BOOT_DISK_TYPES.get(generation)


def boot_disk_note(generation: str, machine_type: str) -> str | None:
    """What the plan says of a generation whose boot disk type no source decides (None: one does)."""
    if generation in BOOT_DISK_TYPES:
        return None
    return (
        f"boot disk: the template's default type (no Google source read names the disk types {machine_type} "
        "takes; if it refuses it, the groups stay empty: gcloud compute instance-groups managed list-errors)"
    )


def boot_disk_size_gb(generation: str, requested: int | None = None) -> int:
    """The boot disk's ``disk_size_gb``: ``requested`` (the stack's key, bounds checked by the
    config) or the generation's default.

    Raises:
      KeyError: a generation Compute Engine does not offer here (the config refuses it first).
    """
    return requested if requested is not None else BOOT_DISK_SIZE_GB[generation]


def nic_type(generation: str) -> str | None:
    """The network interface's ``nic_type`` for ``generation``, or None for the default."""
    return NIC_TYPES.get(generation)
