"""GKE versions: the floor a TPU generation or capacity mode needs (:data:`FLOORS`), a stack's pinned
``multislice:gke.version`` read (:func:`parse`) and held against them (:func:`check_version`).

Facts ([Google], docs/gke.md sections 1 and 3):

* TPU7x: "Ironwood in GKE" (https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood) needs
  Standard **1.34.0-gke.2201000** or later;
* flex-start TPUs: "To run TPUs, use GKE version 1.33.0-gke.1712000 or later", and "TPU v3 and v4 are not
  supported" (flex-start provisioning mode,
  https://cloud.google.com/kubernetes-engine/docs/concepts/provisioning-model);
* a version is ``1.<minor>.<patch>-gke.<build>``; a cluster created with a version "is enrolled in the most
  mature release channel where the version is available", and ``min_master_version`` takes a prefix too
  (Container API v1 ``Cluster.releaseChannel``; Cluster Toolkit's ``version_prefix``: "Terraform will only
  return versions that match the string prefix").
"""

from __future__ import annotations

import re

#: ``1.34``, ``1.34.0`` or ``1.34.0-gke.2201000``: what ``multislice:gke.version`` takes.
VERSION = re.compile(r"1\.([0-9]{1,3})(?:\.([0-9]{1,3})(?:-gke\.([0-9]{1,12}))?)?")
#: (what needs it, its floor, the page that says so), per generation and per capacity mode.
GENERATION_FLOORS: dict[str, tuple[str, str]] = {
    "tpu7x": ("1.34.0-gke.2201000", "https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood"),
}
CAPACITY_FLOORS: dict[str, tuple[str, str]] = {
    "flex-start": ("1.33.0-gke.1712000", "https://cloud.google.com/kubernetes-engine/docs/concepts/provisioning-model"),
}
#: The generations GKE's flex-start takes no TPU of ("TPU v3 and v4 are not supported": the page above).
NO_FLEX_START = frozenset({"v4"})


def parse(version: str) -> tuple[int, int, int, int]:
    """``1.34.0-gke.2201000`` as ``(1, 34, 0, 2201000)``; a prefix's missing parts are 0 (its lowest
    version).

    Raises:
      ValueError: not a GKE version or prefix (:data:`VERSION`).
    """
    match = VERSION.fullmatch(version)
    if match is None:
        raise ValueError(f"{version!r} is not a GKE version: 1.<minor>, 1.<minor>.<patch> or 1.<minor>.<patch>-gke.<n>")
    return (1, *(int(part or 0) for part in match.groups()))  # type: ignore[return-value]


def floor(generation: str, capacity: str) -> tuple[str, str] | None:
    """The highest floor the generation and the capacity mode need, with its source; None: none."""
    floors = [f for f in (GENERATION_FLOORS.get(generation), CAPACITY_FLOORS.get(capacity)) if f is not None]
    return max(floors, key=lambda f: parse(f[0]), default=None)


def check_version(version: str | None, generation: str, capacity: str) -> None:
    """Refuse a pinned ``version`` below what ``generation`` and ``capacity`` need (None: the release
    channel's default version, which the program cannot read before GKE answers).

    Raises:
      ValueError: naming ``multislice:gke.version``, the floor and its source.
    """
    needed = floor(generation, capacity)
    if version is None or needed is None or parse(version) >= parse(needed[0]):
        return
    what = " and ".join(
        w
        for w, table, key in (("TPU7x", GENERATION_FLOORS, generation), ("flex-start", CAPACITY_FLOORS, capacity))
        if key in table
    )
    raise ValueError(
        f"multislice:gke.version: {version} is below {needed[0]}, the GKE version {what} node pools need "
        f"({needed[1]}): pin {needed[0]} or later, or leave it unset for the release channel's"
    )
