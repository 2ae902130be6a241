"""Cloud TPU catalog: generations, accelerator types, hosts, runtime, peak FLOP/s, HBM, DCN.

An accelerator type is ``f"{type_prefix}-{N}"``. What ``N`` counts depends on the generation:

* **v4 and v5p count TensorCores.** "v4-128 specifies a configuration with v4 TPUs and 128
  TensorCores" (https://cloud.google.com/tpu/docs/types-topologies); for v5p
  "--accelerator-type is a formatted string v$VERSION_NUMBERp-$CORES_COUNT. For example,
  v5p-32 specifies a v5p TPU slice with 32 TensorCores (16 chips)"
  (https://cloud.google.com/tpu/docs/v5p). Both have 2 TensorCores per chip, so
  chips = N / 2 (v4-8 = 4 chips, v4-16 = 8 chips).
* **TPU7x (``tpu7x-N``) counts TensorCores too**, 2 per chip (tpu7x-8 = 2x2x1 = 4 chips), the
  way Google's AI-Hypercomputer/xpk ``system_characteristics.py`` names its tpu7x types; no
  Google page read names TPU7x accelerator types, since Compute Engine takes a machine type
  and a topology instead (``Generation.sources`` says so).
* **v5e (``v5litepod-N``) and v6e count chips.** "The value you specify for AcceleratorType is
  a string with the format: v$VERSION_NUMBER-$CHIP_COUNT" (https://cloud.google.com/tpu/docs/v5e);
  the v6e table lists v6e-1 for 1x1, v6e-4 for 2x2, v6e-8 for 2x4
  (https://cloud.google.com/tpu/docs/v6e). Both have 1 TensorCore per chip, so chips = N.

Hosts: every number here about "hosts" on an :class:`AcceleratorType` counts **TPU VMs**
(workers, one process each), which is what a queued resource creates and what JAX sees. The
docs' v5e/v6e "Hosts" column counts 8-chip physical machines instead (4x4 = 2 hosts but 4 VMs
in the v6e table), so it is not used for that. Chips per VM, per the docs' tables:

* v4, v5p: 4 chips per VM for every slice (v5p table: 2x2x1 = 4 chips, 1 host; 2x2x2 = 8 chips,
  2 hosts; "4-chip VM"; v4: 4 chips per host, so v4-8 = one VM and v4-16 = two, as the Cloud
  TPU Multislice overview https://cloud.google.com/tpu/docs/multislice-introduction uses them).
* v5e, v6e: slices of up to 8 chips are one VM holding all chips (v6e-1/-4/-8 are 1 VM;
  v5litepod-1/-4/-8 map to machine types ct5lp-hightpu-1t/-4t/-8t); larger (multi-host) slices
  use 4-chip VMs (v6e table: 4x4 = 16 chips on 4 VMs ... 16x16 = 256 chips on 64 VMs,
  ct6e-standard-4t). The v5e page says only "each TPU VM in a v5e TPU slice contains 1, 4 or 8
  chips"; 4-chip VMs for v5litepod-16 and larger (ct5lp-hightpu-4t) is taken from Google's
  AI-Hypercomputer/xpk ``system_characteristics.py`` and matches v6e.

Where a generation runs: ``Generation.zones`` lists the zones of the "TPU regions and zones"
page (https://cloud.google.com/tpu/docs/regions-zones) that could be read in the stored copy
of that page (its North America tables, and v6e's europe-west4-a); the other regions' tables
of that page were cut off in that copy and are *not* listed here, unverified. Cloud TPU opens
new zones over time: a stack may name an unlisted zone with ``multislice:allowUnlisted:
[zone]`` (``pulumi preview`` then warns instead of failing), and the zone belongs in this
catalog once the page lists it. ``Generation.runtime_versions`` are the TPU software versions
the "PyTorch and JAX" table of https://cloud.google.com/tpu/docs/runtimes names for the
generation (one each); ``multislice:allowUnlisted: [runtimeVersion]`` admits another one.

Topology and machine type: ``AcceleratorType.topology`` is the slice's chip arrangement as the
docs' tables write it (v4, v5p, TPU7x 3-D ``2x2x1``; v5e, v6e 2-D ``4x4``), and
``AcceleratorType.machine_type`` the Compute Engine machine type of its VMs (``ct5p-hightpu-4t``,
``ct6e-standard-1t/-4t/-8t``, ``tpu7x-standard-1t/-4t``), None where Compute Engine does not offer
the generation.

Backends (``multislice:backend``): ``Generation.backends`` says which offer the generation.
"Compute Engine supports the following TPU versions: TPU7x, TPU v6e, TPU v5p"
(https://docs.cloud.google.com/compute/docs/tpus/tpu-machines) and "The Cloud TPU API is not
supported on TPU7x and later TPU versions" (https://docs.cloud.google.com/tpu/docs/consume-reservation),
so v4 and v5e are queued-resource only, v5p and v6e both, TPU7x compute-engine only (it has no
Cloud TPU API zones and no runtime version). ``Generation.compute_engine_zones`` are the zones
docs/compute-engine.md (section 1) reads for Compute Engine.

Every number carries its source in ``Generation.sources``. Pure data and arithmetic: no I/O.
"""

from __future__ import annotations

import re

from infra.accelerators.catalog import GENERATIONS, MULTISLICE_OVERVIEW
from infra.accelerators.generation import (
    COMPUTE_ENGINE,
    GKE,
    QUEUED_RESOURCE,
    AcceleratorType,
    Generation,
    topology_chips,
)

__all__ = [
    "COMPUTE_ENGINE",
    "GKE",
    "GENERATIONS",
    "MAX_SLICES",
    "MULTISLICE_OVERVIEW",
    "QUEUED_RESOURCE",
    "SOFTWARE_CHECKED",
    "AcceleratorType",
    "Generation",
    "UnknownAcceleratorType",
    "accelerator_types",
    "parse_accelerator_type",
    "topology_chips",
]

MAX_SLICES: int = 256
"""Most slices (nodes) one Multislice queued resource may hold: up to 256 slices per queued
resource. Source: the Cloud TPU Multislice overview (:data:`MULTISLICE_OVERVIEW`)."""

SOFTWARE_CHECKED: dict[str, str] = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
"""The pins of ``uv.lock`` whose support for every generation of :data:`GENERATIONS` was checked
(docs/cloud-tpu.md, "JAX and libtpu on each generation": jax's own device table and release
CI at tag ``jax-v0.10.2``, and the libtpu pin of its ``tpu`` extra). A test fails when
``uv.lock`` pins other versions, so a bump redoes that check instead of carrying it over."""

_BY_PREFIX: dict[str, Generation] = {g.type_prefix: g for g in GENERATIONS.values()}
_NAME_RE = re.compile(r"^(?P<prefix>[a-z][a-z0-9]*)-(?P<size>[1-9][0-9]*)$")


def _allowed_all() -> str:
    return ", ".join(g.allowed_compact() for g in GENERATIONS.values())


class UnknownAcceleratorType(ValueError):
    """An accelerator-type string that is not in the catalog.

    The message names the value and lists what is allowed, per generation, e.g.
    ``v4-{8,16,32,...}``. Attributes: ``name`` (the rejected value) and ``allowed`` (the
    compact listing shown).
    """

    def __init__(self, name: object, reason: str, allowed: str) -> None:
        self.name = name
        self.allowed = allowed
        super().__init__(f"unknown accelerator type {name!r}: {reason}; allowed: {allowed}")


def _hint(name: str) -> str:
    """A short 'did you mean' for common near-misses, or ''."""
    cleaned = name.strip().lower()
    if cleaned != name and cleaned in _ALL_NAMES:
        return f" (did you mean {cleaned!r}?)"
    m = _NAME_RE.fullmatch(cleaned)
    if m and m["prefix"] == "v5e":
        return f" (v5e types are named v5litepod-N, e.g. 'v5litepod-{m['size']}')"
    return ""


def parse_accelerator_type(name: object) -> AcceleratorType:
    """Parse and validate an accelerator-type string such as "v4-16" or "v5litepod-8".

    Returns the slice's chips, TensorCores, TPU VMs (hosts) and chips per VM. Examples:
    v4-8 -> 4 chips on 1 VM; v4-16 -> 8 chips on 2 VMs; v5p-8 -> 4 chips on 1 VM;
    v5litepod-8 -> 8 chips on 1 VM; v6e-16 -> 16 chips on 4 VMs; tpu7x-8 -> 4 chips on 1 VM.

    Raises:
        UnknownAcceleratorType: the string is malformed, the generation prefix is unknown, or
            the size is not listed for the generation; the message lists the allowed values.
    """
    if not isinstance(name, str):
        raise UnknownAcceleratorType(name, "expected a string like 'v4-8'", _allowed_all())
    m = _NAME_RE.fullmatch(name)
    if m is None:
        raise UnknownAcceleratorType(name, "expected '<prefix>-<N>', e.g. 'v4-8'" + _hint(name), _allowed_all())
    gen = _BY_PREFIX.get(m["prefix"])
    if gen is None:
        known = ", ".join(repr(p) for p in _BY_PREFIX)
        raise UnknownAcceleratorType(
            name,
            f"unknown generation prefix {m['prefix']!r} (known: {known})" + _hint(name),
            _allowed_all(),
        )
    size = int(m["size"])
    if size not in gen.sizes:
        smallest = gen.sizes[0]
        counts = (
            f"TensorCores, {gen.tensorcores_per_chip} per chip: "
            f"{gen.type_name(smallest)} = {gen.chips_for_size(smallest)} chips"
            if gen.suffix_counts == "tensorcores"
            else "chips"
        )
        raise UnknownAcceleratorType(
            name,
            f"{size} is not a listed {gen.name} size (the suffix counts {counts})",
            gen.allowed_compact(),
        )
    chips = gen.chips_for_size(size)
    per_host = gen.chips_per_host(chips)
    return AcceleratorType(
        name=name,
        generation=gen,
        chips=chips,
        tensorcores=chips * gen.tensorcores_per_chip,
        hosts=chips // per_host,
        chips_per_host=per_host,
    )


def accelerator_types() -> list[str]:
    """Every valid accelerator-type name, in catalog order (generation, then size)."""
    return list(_ALL_NAMES)


_ALL_NAMES: tuple[str, ...] = tuple(g.type_name(s) for g in GENERATIONS.values() for s in g.sizes)
