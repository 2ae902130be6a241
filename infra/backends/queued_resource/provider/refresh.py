"""Read (refresh): the live state of a recorded queued resource, as the provider's outputs.

The QR state, each node's state and health (one ``ListNodes`` per page), whether the nodes
carry the recorded metadata/labels/tags (a node that Cloud TPU recreated from the QR's
creation-time spec does: the release record makes it boot the recorded release and run
directory; :func:`~infra.backends.queued_resource.provider.nodes.node_in_sync`), and the nodes of
an ACTIVE QR that are gone
(``lostNodes``: the next diff replaces it). A QR that no longer exists reads as gone, unless
its run completed (:mod:`~infra.backends.queued_resource.provider.completion`); so does a DELETING one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infra.backends.queued_resource.provider.api import REQUEST_TIMEOUT_SECONDS, TpuApi
from infra.backends.queued_resource.provider.errors import root_cause
from infra.backends.queued_resource.provider.inputs import outputs_for
from infra.backends.queued_resource.provider.nodes import lost_nodes
from infra.backends.queued_resource.provider.states import FAILED_STATES, reached, state_name

#: ``(live QR or None when gone) -> outputs`` of a QR gone because its run completed, or None.
CompletedRead = Callable[[Any | None], dict[str, Any] | None]


def read(api: TpuApi, id_: str, props: dict[str, Any], completed: CompletedRead) -> tuple[str, dict[str, Any]]:
    """``(id, outputs)`` of the live QR ``id_`` recorded with ``props``; ``("", {})`` when it is
    gone and its run did not complete (the next ``pulumi up`` creates it again).

    Args:
      completed: the outputs of a QR gone (or DELETING) after its run completed, or None
        (:func:`~infra.backends.queued_resource.provider.completion.deleted_on_complete_outputs`).

    Raises:
      QueuedResourceError: the API refused the read (one message saying what to fix).
    """
    from google.api_core import exceptions

    try:
        qr = api.client.get_queued_resource(name=id_, retry=api.retry(), timeout=REQUEST_TIMEOUT_SECONDS)
    except Exception as exc:
        if isinstance(root_cause(exc), exceptions.NotFound):
            # Gone. After its run completed (deleteOnComplete): deleted on complete, converged.
            # Otherwise the next `pulumi up` creates it again.
            outs = completed(None)
            return (id_, outs) if outs is not None else ("", {})
        raise api.explain(exc, "reading", props) from None
    state = state_name(qr)
    if state == "DELETING":  # e.g. deleted by worker 0 a moment ago
        outs = completed(qr)
        if outs is not None:
            return id_, outs
    nodes = api.node_views(props, qr=qr) if state in ("ACTIVE", *FAILED_STATES) else []
    lost = lost_nodes(nodes) if state == "ACTIVE" else []
    ready = reached(state, props.get("waitFor") or "ACTIVE") and not lost
    message = f"{state}; node(s) gone: {', '.join(lost[:8])}" + (" ..." if len(lost) > 8 else "") if lost else state
    return id_, outputs_for(
        props,
        qr,
        nodes,
        ready=ready,
        message=message,
        pending_node_sync=bool(props.get("pendingNodeSync")),
        pending_nodes=props.get("pendingNodes"),
        pending_reset=bool(props.get("pendingReset")),
        lost_nodes=lost,
    )
