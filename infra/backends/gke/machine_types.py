"""The machine type of a new cluster's system pool (``multislice:gke.systemPool.machineType``): a Compute
Engine machine type, and not a TPU one (:func:`check_system_machine_type`, pure).

The pool runs the JobSet controller, kube-dns and GKE's own Pods, never TPU work: TPU nodes carry
``google.com/tpu=present:NoSchedule``, which those Pods do not tolerate (:mod:`~infra.backends.gke.cluster`).

Facts ([Google]):

* A predefined machine type is named after its series: "within the N2 machine series … you can select
  the n2-standard-4 machine type" ("Machine families resource and comparison guide",
  https://cloud.google.com/compute/docs/machine-resource): ``<series>-<type>-<vCPUs>``, with a unit letter
  on accelerator types (``a3-highgpu-8g``), none on shared-core ones (``e2-medium``, ``f1-micro``), and a
  suffix on some (``c3-standard-4-lssd``, ``c3-highcpu-192-metal``; pulumi-gcp's AlloyDB ``machineType``:
  "c4a-highmem-4-lssd").
* A custom machine type is ``custom-<vCPUs>-<MB>`` on N1 and ``<series>-custom-<vCPUs>-<MB>`` on the other
  series that take one, ``-ext`` for extended memory, and E2's shared-core ones ``e2-custom-micro|small|medium-<MB>``
  ("Create a VM with a custom machine type",
  https://cloud.google.com/compute/docs/instances/creating-instance-with-custom-machine-type; Google's sample
  ``compute-custom-machine-type-helper-class``: ``custom``, ``n2-custom``, ``e2-custom-micro``; pulumi-gcp's
  ``compute.Instance.machineType``: "custom-6-20480", "custom-2-15360-ext").
* TPU machine types are the ``ct*`` series and ``tpu7x``, their last part a chip count in ``t``
  (``ct4p-hightpu-4t``, ``ct5lp-hightpu-4t``, ``ct5p-hightpu-4t``, ``ct6e-standard-4t``, ``tpu7x-standard-4t``:
  "About TPUs in GKE", https://cloud.google.com/kubernetes-engine/docs/concepts/tpus; the catalog's
  ``compute_engine_machine_types``, :mod:`infra.accelerators`).

The shape is checked, not the catalog of each zone (which Compute Engine answers only when the pool is made).
"""

from __future__ import annotations

import re

from training.validation import shorten

#: A Compute Engine machine type (module docstring): predefined, or custom (E2's shared-core ones included).
MACHINE_TYPE = re.compile(
    r"[a-z]+[0-9]+[a-z]*-[a-z]+(?:-[0-9]+[a-z]?)?(?:-[a-z]+)?"
    r"|(?:[a-z]+[0-9]+[a-z]*-)?custom-(?:[0-9]+|micro|small|medium)-[0-9]+(?:-ext)?"
)
#: A TPU machine type: the ``ct*`` and ``tpu*`` series (module docstring).
TPU_MACHINE_TYPE = re.compile(r"(?:ct|tpu)[0-9]+[a-z]*-.*")


def check_system_machine_type(value: str, example: str) -> str:
    """``value`` if it is a Compute Engine machine type and not a TPU one; ``example`` is named instead.

    Raises:
      ValueError: a TPU machine type, or a name of no machine type's shape (the value shortened).
    """
    if TPU_MACHINE_TYPE.fullmatch(value):
        raise ValueError(
            f"{value!r} is a TPU machine type; the system pool runs the JobSet controller and the cluster's "
            f"services, which TPU nodes' taint keeps off: use a CPU machine type, e.g. {example}"
        )
    if not MACHINE_TYPE.fullmatch(value):
        raise ValueError(
            f"{shorten(value, 80)} is not a Compute Engine machine type: <series>-<type>-<vCPUs> such as "
            "e2-standard-4 or n2-highmem-8, or a custom type such as n2-custom-4-16384 "
            "(https://cloud.google.com/compute/docs/machine-resource)"
        )
    return value
