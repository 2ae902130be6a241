"""Run the policy pack's policies without the Pulumi CLI: ``multislice check``.

The program is evaluated under mocks (:mod:`infra.review.program_mocks`, the tests' path: no engine,
no credentials); every registered resource becomes the ``ResourceValidationArgs`` /
``PolicyResource`` the CLI's analyzer would build from the same inputs (wrapped in the same
unknown-checking proxy), and each policy of
:data:`infra.policy.policies.POLICIES` runs on them through its own ``validate``. The verdict
is the one ``pulumi preview --policy-pack infra/policy`` gives for the stack: mandatory
violations fail, advisory ones warn.

Policy configuration has the shape of ``pulumi preview --policy-pack-config FILE``
(https://www.pulumi.com/docs/iac/using-pulumi/crossguard/configuration/): per policy name
either an enforcement level (``"advisory"``) or an object with ``enforcementLevel`` and the
policy's own properties (``{"tpu-no-external-ips": {"allowExternalIps": true}}``); ``"all"``
sets every policy's level.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from inspect import isawaitable
from pathlib import Path
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError, unknown_checking_proxy

from infra.policy.policies import POLICIES
from infra.policy.value_secrets import stack_file_credentials
from infra.readers.files import UnreadableFile, read_bounded
from training.run_objects import json_record

#: The policy the stack file's plain-text credentials are reported under (:mod:`infra.policy.value_secrets`).
VALUES_POLICY = "values-carry-no-credentials"

__all__ = ["PolicyConfigError", "Violation", "check_stack", "check_world", "load_policy_config", "parse_policy_config"]

#: The most bytes of a ``--policy-pack-config`` file read: a level or a few properties for each of the
#: pack's policies is a few KB; a larger file is not one (a device or a log named by mistake).
MAX_POLICY_CONFIG_BYTES = 1 << 20

#: Inputs the engine adds to a dynamic resource (the pickled provider): not the resource's own.
_ENGINE_INPUTS = ("__provider",)


class PolicyConfigError(ValueError):
    """A policy configuration that names no policy of the pack or has a bad value."""


@dataclass(frozen=True)
class Violation:
    """One policy violation: the policy, its enforcement level, the resource (None: the stack)."""

    policy: str
    level: EnforcementLevel
    resource: str | None
    message: str

    @property
    def mandatory(self) -> bool:
        return self.level is EnforcementLevel.MANDATORY


@dataclass(frozen=True)
class _Settings:
    level: EnforcementLevel
    properties: dict[str, Any]


def _level(value: Any, where: str) -> EnforcementLevel:
    try:
        return EnforcementLevel(value)
    except ValueError:
        allowed = ", ".join(level.value for level in EnforcementLevel)
        raise PolicyConfigError(f"{where}: enforcement level {value!r}; allowed: {allowed}") from None


def parse_policy_config(raw: Mapping[str, Any], policies: Sequence[Policy] = POLICIES) -> dict[str, _Settings]:
    """Each policy's enforcement level and properties under ``raw`` (the pack config's shape).

    Raises:
      PolicyConfigError: a key that is no policy of the pack, a property the policy does not
        declare, or an unknown enforcement level.
    """
    by_name = {policy.name: policy for policy in policies}
    unknown = sorted(set(raw) - set(by_name) - {"all"})
    if unknown:
        raise PolicyConfigError(f"policy config: unknown policy {unknown[0]!r}; policies: {', '.join(by_name)}")
    default_level = _level(raw["all"], "policy config 'all'") if "all" in raw else None
    settings = {}
    for name, policy in by_name.items():
        schema = policy.config_schema.properties if policy.config_schema else {}
        level = default_level or policy.enforcement_level or EnforcementLevel.ADVISORY
        properties = {key: spec.get("default") for key, spec in schema.items()}
        entry = raw.get(name)
        if isinstance(entry, str):
            level = _level(entry, f"policy config {name!r}")
        elif isinstance(entry, Mapping):
            for key, value in entry.items():
                if key == "enforcementLevel":
                    level = _level(value, f"policy config {name}.enforcementLevel")
                elif key not in schema:
                    allowed = ", ".join(["enforcementLevel", *schema])
                    raise PolicyConfigError(f"policy config {name}.{key}: unknown property; allowed: {allowed}")
                else:
                    properties[key] = value
        elif entry is not None:
            raise PolicyConfigError(f"policy config {name!r}: expected an enforcement level or an object")
        settings[name] = _Settings(level, properties)
    return settings


def load_policy_config(path: Path) -> dict[str, Any]:
    """Read a ``--policy-pack-config`` JSON file: a regular file of at most
    :data:`MAX_POLICY_CONFIG_BYTES` (``read_bounded``), decoded by ``json_record`` (nesting bounded).

    Raises:
      PolicyConfigError: the file is missing, special (a FIFO, a device), too long, or not a JSON object.
    """
    try:
        raw = json_record(read_bounded(path, MAX_POLICY_CONFIG_BYTES))
    except UnreadableFile as err:
        raise PolicyConfigError(f"policy config {path}: {err.why}") from None
    except OSError as err:
        raise PolicyConfigError(f"policy config {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise PolicyConfigError(f"policy config {path}: not JSON ({err.msg}, line {err.lineno})") from None
    except ValueError as err:  # not UTF-8, nested past the parser, an integer past 4,300 digits
        raise PolicyConfigError(f"policy config {path}: not JSON ({err})") from None
    if not isinstance(raw, dict):
        raise PolicyConfigError(f"policy config {path}: expected a JSON object of policy names")
    return raw


def _options(protect: bool, parent: str | None) -> PolicyResourceOptions:
    return PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], parent or None)


def _run(
    policy: ResourceValidationPolicy | StackValidationPolicy,
    args: Any,
    sink: list[tuple[str, str | None, bool]],
    urn: str | None,
) -> None:
    """Run one validation; entries are (message, urn, unknown). A value not known until the
    update (``UnknownValueError``) is reported the way the CLI's analyzer reports it: an
    advisory "can't run during preview", whatever the policy's level."""

    def report(message: str, violation_urn: str | None = None) -> None:
        sink.append((message, violation_urn or urn, False))

    try:
        result = policy.validate(args, report)
        if isawaitable(result):
            asyncio.run(_await(result))
    except UnknownValueError as err:
        sink.append((f"can't run policy {policy.name!r} during preview: {err.message}", urn, True))


async def _await(awaitable: Any) -> None:
    await awaitable


def check_world(
    world: Any, raw_config: Mapping[str, Any] | None = None, policies: Sequence[Policy] = POLICIES
) -> list[Violation]:
    """Run ``policies`` over what one program evaluation registered.

    Args:
      world: an :class:`infra.review.program_mocks.World` (registrations with type, name, urn, inputs,
        protect, parent).
      raw_config: policy configuration in the pack config's shape (see the module docstring).

    Returns:
      The violations, in policy order; disabled policies are skipped.

    Raises:
      PolicyConfigError: a bad ``raw_config``.
    """
    settings = parse_policy_config(raw_config or {}, policies)
    resources = [
        (r, unknown_checking_proxy({k: v for k, v in r.inputs.items() if k not in _ENGINE_INPUTS}))
        for r in world.registrations
    ]
    violations = []
    for policy in policies:
        setting = settings[policy.name]
        if setting.level is EnforcementLevel.DISABLED:
            continue
        found: list[tuple[str, str | None, bool]] = []
        if isinstance(policy, ResourceValidationPolicy):
            for reg, props in resources:
                args = ResourceValidationArgs(
                    reg.typ, props, reg.urn, reg.name, _options(reg.protect, reg.parent), None, setting.properties
                )
                _run(policy, args, found, reg.urn)
        elif isinstance(policy, StackValidationPolicy):
            stack = [
                PolicyResource(reg.typ, props, reg.urn, reg.name, _options(reg.protect, reg.parent), None, None, [], {})
                for reg, props in resources
            ]
            _run(policy, StackValidationArgs(stack, setting.properties), found, None)
        violations += [
            Violation(policy.name, EnforcementLevel.ADVISORY if unknown else setting.level, urn, message)
            for message, urn, unknown in found
        ]
    return violations


def check_stack(
    stack: str,
    config_map: Mapping[str, Any] | None = None,
    raw_config: Mapping[str, Any] | None = None,
    script: Any = None,
) -> list[Violation]:
    """Evaluate the program for ``stack`` under mocks (its stack file's config, or
    ``config_map``) and run every policy over the resources it declares (``script``: the stack's
    ``RenderedScript`` when the caller rendered it already, else the program renders it); with
    ``config_map``, also the credentials its stack file holds in plain text
    (:func:`~infra.policy.value_secrets.stack_file_credentials`, as ``values-carry-no-credentials``).

    Raises:
      infra.config.StackConfigError: the stack's config is invalid (before any policy runs).
      PolicyConfigError: a bad ``raw_config``.
    """
    from infra.review import program_mocks

    settings = parse_policy_config(raw_config or {})  # a bad policy config fails before the evaluation
    config = dict(config_map) if config_map is not None else None
    world = program_mocks.evaluate(stack, config, preview=True, script=script)
    violations = check_world(world, raw_config)
    level = settings[VALUES_POLICY].level
    if config is not None and level is not EnforcementLevel.DISABLED:
        violations += [Violation(VALUES_POLICY, level, None, message) for message in stack_file_credentials(config)]
    return violations
