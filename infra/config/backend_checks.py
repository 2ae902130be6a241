"""A stack's config against its backend (``multislice:backend``): the checks :class:`~infra.config.StackConfig`
runs through the backend's spec (:mod:`infra.backends.registry`), in this order: the generation is
offered and the backend refuses the keys it cannot honour (:func:`check_generation`), the capacity
is offered (:func:`check_capacity`), and the zone and runtime version are in the catalog for that
backend (:func:`check_catalog`; :func:`catalog_warnings` for what ``multislice:allowUnlisted`` let
through). Each error names its key (:func:`training.validation.invalid`).

``config`` is the :class:`~infra.config.StackConfig` being validated (read by attribute: this module
sits below the schema that calls it).
"""

from __future__ import annotations

from typing import Any

from infra import accelerators
from infra.backends import registry
from training.redaction import redacted
from training.validation import invalid
from training.warning_text import WarningText, no_action


def check_generation(config: Any, gen: accelerators.Generation) -> None:
    """The generation against the backend's spec, and the keys the backend refuses (its own,
    and every other backend's settings key)."""
    spec = config.backend_spec
    if not spec.offers(gen):
        offered = gen.backends[0]  # every generation is offered by at least one backend
        why = registry.spec_of(offered).sole_offer_reason
        which = (
            f"the {offered} backend only" if len(gen.backends) == 1 else f"the {' and '.join(gen.backends)} backends"
        )
        raise invalid(
            "multislice:acceleratorType",
            f"{config.accelerator_type} is offered by {which}, not by {config.backend} ({why}: "
            f"docs/compute-engine.md); set multislice:backend: {offered}",
        )
    spec.check_keys(config)
    for other in registry.SPECS.values():
        changed = other.settings_set(config) if other is not spec else []
        if changed:
            raise other.refuse_settings(changed, config.backend)


def check_capacity(config: Any) -> None:
    """``multislice:capacity`` is one the backend offers, and its settings fit (the spec's check)."""
    spec = config.backend_spec
    if config.capacity not in spec.capacities:
        offering = [other.name for other in registry.SPECS.values() if config.capacity in other.capacities]
        offered = ", ".join(spec.capacities[:-1]) + f" and {spec.capacities[-1]}"
        raise invalid(
            "multislice:capacity",
            f"{config.capacity} is offered by the {' or '.join(offering)} backend only (the {config.backend} "
            f"backend's {spec.capacity_source} has {offered}); set multislice:backend: {offering[0]}",
        )
    spec.check_capacity(config)


def check_catalog(config: Any, gen: accelerators.Generation) -> None:
    """``gcp:zone`` and the runtime version against the catalog's lists for the backend (unless
    ``multislice:allowUnlisted`` names the check)."""
    spec = config.backend_spec
    override = f"if {spec.service} offers it now, add 'multislice:allowUnlisted: [{{key}}]' to the stack"
    zones, source = spec.zones(gen)
    if config.zone not in zones and "zone" not in config.allow_unlisted:
        others = sorted(g.name for g in accelerators.GENERATIONS.values() if config.zone in spec.zones(g)[0])
        raise invalid(
            "gcp:zone",
            f"{config.zone} does not offer TPU {gen.name} ({config.accelerator_type})"
            + spec.catalog_qualifier
            + f"; zones that do: {', '.join(zones)} ({source.split(' ')[0]})"
            + (f"; {config.zone} offers {', '.join(others)}" if others else "")
            + "; "
            + override.format(key="zone"),
        )
    if not spec.has_runtime_version:
        return  # no runtime version there (the spec's check_keys refused one)
    version = config.runtime_version
    if version is not None and version not in gen.runtime_versions and "runtimeVersion" not in config.allow_unlisted:
        raise invalid(
            "multislice:runtimeVersion",
            f"{redacted(repr(version))} is not a TPU software version for {gen.name}; known: "
            f"{', '.join(gen.runtime_versions)} "
            f"(https://cloud.google.com/tpu/docs/runtimes); " + override.format(key="runtimeVersion"),
        )


def catalog_warnings(config: Any) -> list[WarningText]:
    """What ``multislice:allowUnlisted`` let through (``pulumi preview`` prints each)."""
    spec = config.backend_spec
    gen = config.accelerator.generation
    warnings: list[WarningText] = []
    zones, _ = spec.zones(gen)
    if config.zone not in zones:
        warnings.append(
            no_action(
                f"gcp:zone {config.zone} is not in the catalog's zones for TPU {gen.name}{spec.catalog_qualifier} "
                f"({', '.join(zones)})",
                "multislice:allowUnlisted lets it through",
            )
        )
    if not spec.has_runtime_version:
        return warnings  # no runtime version there
    if config.effective_runtime_version not in gen.runtime_versions:
        warnings.append(
            no_action(
                f"multislice:runtimeVersion {config.effective_runtime_version!r} is not in the catalog for TPU "
                f"{gen.name} ({', '.join(gen.runtime_versions)})",
                "multislice:allowUnlisted lets it through",
            )
        )
    return warnings
