"""The states of a queued resource (``tpu_v2.QueuedResourceState.State``).

https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources#state
"""

from __future__ import annotations

from typing import Any

#: The order a queued resource passes on its way to ACTIVE.
STATE_ORDER = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE")
#: States from which a queued resource never becomes ACTIVE again.
FAILED_STATES = ("FAILED", "SUSPENDING", "SUSPENDED")


def state_name(qr: Any) -> str:
    """The state of a ``tpu_v2.QueuedResource`` by name, e.g. ``"ACTIVE"``."""
    return qr.state.state.name


def reached(state: str, target: str) -> bool:
    """Whether ``state`` is ``target`` or a later state of :data:`STATE_ORDER`.

    Raises:
      ValueError: ``target`` is not in :data:`STATE_ORDER`.
    """
    return state in STATE_ORDER and STATE_ORDER.index(state) >= STATE_ORDER.index(target)
