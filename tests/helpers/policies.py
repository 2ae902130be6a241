"""Run one CrossGuard policy of infra/policy/policies.py on resources built by a test.

The policies run through pulumi_policy's own ``validate`` with ``ResourceValidationArgs`` /
``StackValidationArgs`` built as the package's tests and its analyzer build them (the inputs
wrapped in the analyzer's unknown-checking proxy).
"""

from __future__ import annotations

import asyncio
import copy
from inspect import isawaitable
from typing import Any

from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import unknown_checking_proxy

from infra.policy.policies import POLICIES

BY_NAME = {policy.name: policy for policy in POLICIES}


def options(protect: bool = False) -> PolicyResourceOptions:
    return PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def violations(
    name: str, typ: str, props: dict[str, Any], *, config: dict | None = None, protect: bool = False
) -> list[str]:
    """Messages ``policy.validate`` reports for one resource."""
    policy = BY_NAME[name]
    assert isinstance(policy, ResourceValidationPolicy)
    found: list[str] = []
    # wrapped as pulumi_policy's analyzer wraps the inputs it deserializes (Mapping/Sequence proxies)
    args = ResourceValidationArgs(
        typ,
        unknown_checking_proxy(props),
        f"urn:pulumi:t::multislice::{typ}::r",
        "r",
        options(protect),
        None,
        config or {},
    )
    result = policy.validate(args, lambda message, urn=None: found.append(message))
    if isawaitable(result):
        asyncio.run(result)
    return found


def changed(props: dict[str, Any], **updates: Any) -> dict[str, Any]:
    out = copy.deepcopy(props)
    out.update(updates)
    return out


def stack_violations(resources: list[tuple[str, dict]]) -> list[str]:
    policy = BY_NAME["multislice-program"]
    assert isinstance(policy, StackValidationPolicy)
    found: list[str] = []
    stack = [
        PolicyResource(t, unknown_checking_proxy(p), f"urn:{i}", f"r{i}", options(), None, None, [], {})
        for i, (t, p) in enumerate(resources)
    ]
    policy.validate(StackValidationArgs(stack), lambda message, urn=None: found.append(message))
    return found
