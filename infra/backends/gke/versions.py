"""GKE versions: the floor every gke stack needs (:data:`MULTISLICE_FLOOR`) and those a TPU generation or
capacity mode adds (:data:`GENERATION_FLOORS`, :data:`CAPACITY_FLOORS`), a stack's pinned
``multislice:gke.version`` read (:func:`parse`) and held against them (:func:`check_version`).

Facts ([Google], docs/gke.md sections 1 and 3):

* Multislice: "Standard supports Multislice in version 1.27.4-gke.900 and later" ("Deploy TPU Multislices
  in GKE", https://cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice). Every gke stack's slices
  are multi-host TPU slice node pools of a Standard cluster under one JobSet (the backend refuses a
  one-VM slice), so the floor applies to each, one slice or several;
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
#: The floor of every gke stack (module docstring): (its floor, the page that says so).
MULTISLICE_FLOOR: tuple[str, str] = (
    "1.27.4-gke.900",
    "https://cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice",
)
#: (its floor, the page that says so), per generation and per capacity mode.
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


def _floors(generation: str, capacity: str) -> list[tuple[str, str, str]]:
    """(what needs it, its floor, its source) of every floor that applies."""
    found: list[tuple[str, str, str]] = [("Multislice", *MULTISLICE_FLOOR)]
    if generation in GENERATION_FLOORS:
        found.append(("TPU7x", *GENERATION_FLOORS[generation]))
    if capacity in CAPACITY_FLOORS:
        found.append((capacity, *CAPACITY_FLOORS[capacity]))
    return found


def floor(generation: str, capacity: str) -> tuple[str, str]:
    """The highest floor the stack needs (Multislice's, or the generation's or the capacity mode's when
    higher), with its source."""
    _, version, source = max(_floors(generation, capacity), key=lambda f: parse(f[1]))
    return version, source


def check_version(version: str | None, generation: str, capacity: str) -> None:
    """Refuse a pinned ``version`` below what every gke stack, ``generation`` and ``capacity`` need (None:
    the release channel's default version, which the program cannot read before GKE answers). A prefix
    (``1.27``) is held to its lowest version (:func:`parse`): GKE may pick any version it names.

    Raises:
      ValueError: naming ``multislice:gke.version``, the floor, what needs it and its source.
    """
    if version is None:
        return
    needed = floor(generation, capacity)
    if parse(version) >= parse(needed[0]):
        return
    below = [name for name, floor_version, _ in _floors(generation, capacity) if parse(version) < parse(floor_version)]
    what = " and ".join([", ".join(below[:-1]), below[-1]] if len(below) > 1 else below)
    raise ValueError(
        f"multislice:gke.version: {version} is below {needed[0]}, the GKE version {what} node pools need "
        f"({needed[1]}): pin {needed[0]} or later, or leave it unset for the release channel's"
    )
