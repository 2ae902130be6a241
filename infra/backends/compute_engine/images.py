"""The boot image of the TPU VMs on the compute-engine backend: one image family per generation.

Google names the image *project*, ``ubuntu-os-accelerator-images``, in "Consume a reservation
(Compute Engine)" (https://docs.cloud.google.com/tpu/docs/consume-reservation-compute), but no
Google page read for docs/compute-engine.md names the *families* of that project for each TPU
generation (its open question 8). The families below come from third-party material only:
SkyPilot's GCP catalog (https://github.com/skypilot-org/skypilot, ``sky/catalog/gcp_catalog.py``,
``_DEFAULT_TPU7X_IMAGE_ID`` and the v5e/v5p/v6e default image id beside it; its unit test
``test_gcp_compute_tpu_uses_accelerator_image_by_default`` pairs ``ct6e-standard-4t`` with the
first and ``tpu7x-standard-4t`` with the second). They are constants here, not stack keys, and
must be checked on a real project (``gcloud compute images describe-from-family FAMILY
--project=ubuntu-os-accelerator-images``) before a production run.

A family, not a dated image, is named: an instance template resolves a family to its newest
image when a VM is created (``source_image`` of pulumi-gcp's ``InstanceTemplateDiskArgs``
takes ``projects/{project}/global/images/family/{family}``), so a repaired or recreated VM may
boot a newer image than its peers. The trainer's own environment comes from the release record
(docs/vm-boot.md), not from the image.
"""

from __future__ import annotations

#: The image project of Compute Engine's TPU images (docs/compute-engine.md, section 2, step 2).
IMAGE_PROJECT = "ubuntu-os-accelerator-images"

#: Image family per TPU generation (third-party source: see the module docstring). v4 and v5e
#: are absent: Compute Engine lists TPU7x, v6e and v5p only (docs/compute-engine.md, section 1).
IMAGE_FAMILIES: dict[str, str] = {
    "v5p": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
    "v6e": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
    "tpu7x": "ubuntu-accel-2404-amd64-tpu-tpu7x",
}


class NoImageFamily(ValueError):
    """A generation this module names no Compute Engine image family for."""


def image_family(generation: str) -> str:
    """The image family of ``generation`` ("v5p", "v6e", "tpu7x").

    Raises:
      NoImageFamily: Compute Engine offers no TPU image of that generation here.
    """
    try:
        return IMAGE_FAMILIES[generation]
    except KeyError:
        raise NoImageFamily(
            f"no Compute Engine image family for TPU {generation}; known: {', '.join(IMAGE_FAMILIES)}"
        ) from None


def source_image(generation: str) -> str:
    """The boot disk's ``source_image``: ``projects/<IMAGE_PROJECT>/global/images/family/<family>``."""
    return f"projects/{IMAGE_PROJECT}/global/images/family/{image_family(generation)}"
