"""A stack that changes ``multislice:backend`` after it was deployed: what it replaces, and the refusal.

Changing the backend replaces every TPU VM: the queued resource (and each slice's VMs) is deleted
and one managed instance group per slice is created, or the reverse; capacity is requested again.
Pulumi shows that as deletes and creates of unrelated resource types, easy to miss in a long
preview. So the program reads what the stack deployed last (its own outputs, through a
``StackReference`` to itself: a program may read the last update's outputs of its own stack,
https://github.com/pulumi/pulumi/issues/3722) and, before any resource is registered:

* refuses the change with one line naming ``multislice:backend`` unless the stack confirms it
  with ``multislice:allowBackendChange: true``;
* with the confirmation, warns plainly (``pulumi preview`` prints it) and marks the new slices'
  resources, so the policy ``backend-change`` of the policy pack can forbid it (mandatory on
  prod: ``stacks/policy.prod.json``).

The last deployment's backend comes from its ``backend`` output; a stack deployed before that
output existed is recognised by an output only its backend has (``BackendSpec.legacy_output``:
the queued resource's ``queuedResourceName``), and each backend's spec says what its deployment
holds. Pure functions: the program does the reading (``infra/__main__.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.backends.registry import SPECS, spec_of
from training.warning_text import WarningText, act

#: The stack output that records the backend of the last deployment.
BACKEND_OUTPUT = "backend"
#: The stack key that confirms a change of backend.
CONFIRM_KEY = "multislice:allowBackendChange"


def deployed_backend(outputs: Mapping[str, Any] | None) -> str | None:
    """The backend the stack's last deployment used, or None for a stack never deployed.

    Args:
      outputs: the stack's last outputs (None or empty: never deployed, or destroyed).
    """
    if not outputs:
        return None
    backend = outputs.get(BACKEND_OUTPUT)
    if isinstance(backend, str) and backend:
        return backend
    for spec in SPECS.values():
        if spec.legacy_output and outputs.get(spec.legacy_output):
            return spec.name
    return None


def describe_change(deployed: str, wanted: str, *, stack: str, deployed_outputs: Mapping[str, Any]) -> str:
    """One plain sentence: what changing from ``deployed`` to ``wanted`` replaces."""
    what = spec_of(deployed).describe_deployment(deployed_outputs)
    return (
        f"multislice:backend {deployed} -> {wanted} replaces every TPU VM of stack {stack}: {what} are deleted "
        f"and the slices are requested again from {wanted} (capacity is not carried over; the checkpoints in "
        "the bucket are kept, so the run resumes)"
    )


class BackendChangeRefused(ValueError):
    """The stack changes its backend without :data:`CONFIRM_KEY`; the message names the key."""


def check_backend_change(
    outputs: Mapping[str, Any] | None, *, wanted: str, stack: str, confirmed: bool
) -> WarningText | None:
    """The warning to print for a confirmed change (what it replaces; action needed: remove the
    confirmation after the update), None when the backend is unchanged.

    Raises:
      BackendChangeRefused: the last deployment used another backend and ``confirmed`` is False.
    """
    deployed = deployed_backend(outputs)
    if deployed is None or deployed == wanted:
        return None
    sentence = describe_change(deployed, wanted, stack=stack, deployed_outputs=outputs or {})
    if not confirmed:
        raise BackendChangeRefused(
            f"multislice:backend: {sentence}. If that is what you want, add '{CONFIRM_KEY}: true' to the stack "
            f"(and remove it after the update); otherwise set multislice:backend back to {deployed}"
        )
    return act(
        sentence,
        f"once pulumi up has made the change, remove {CONFIRM_KEY} from the stack (while it is set, "
        "a change of multislice:backend is not refused)",
    )
