"""Create: one ``CreateQueuedResource``, then a bounded wait for the requested state.

A queued resource with this id that carries the stack's labels and shape (left by an
interrupted earlier ``pulumi up``) is adopted and converged instead of failing on the
conflict. FAILED / SUSPENDING / SUSPENDED: the QR is force-deleted (it holds QR quota, and a
FAILED QR can hold ACTIVE slices) and the error describes its nodes and the API's reason. The
deadline passes (typically WAITING_FOR_RESOURCES): create *succeeds* with ``ready: false`` so
the QR is recorded (never an orphan), and the next ``pulumi up`` resumes waiting.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from infra.backends.queued_resource.provider.api import REQUEST_TIMEOUT_SECONDS, TpuApi, is_ours
from infra.backends.queued_resource.provider.converge import converge
from infra.backends.queued_resource.provider.errors import QueuedResourceError, is_new_service_account_race
from infra.backends.queued_resource.provider.inputs import build_queued_resource, outputs_for, parent_of, qr_name_of
from infra.backends.queued_resource.provider.polling import Deadline, duration_text
from infra.backends.queued_resource.provider.states import state_name


def create(api: TpuApi, props: dict[str, Any], say: Callable[[str], None]) -> tuple[str, dict[str, Any]]:
    """Create the queued resource of ``props`` within ``createTimeoutSeconds``.

    Returns:
      ``(resource name, outputs)``; ``ready`` is false when the deadline passed first.

    Raises:
      QueuedResourceError: the API refused the request (one message saying what to fix), the
        QR reached a failed state (it was deleted), or it disappeared while waiting.
    """
    from google.api_core import exceptions
    from google.cloud import tpu_v2

    name, label = qr_name_of(props), props["queuedResourceId"]
    request = tpu_v2.CreateQueuedResourceRequest(
        parent=parent_of(props),
        queued_resource_id=label,
        queued_resource=build_queued_resource(props),
        request_id=str(uuid.uuid4()),  # the same id on every retry: creates at most once
    )
    say(
        f"{label}: creating ({int(props['slices'])} x {props['acceleratorType']}, {props['capacity']}) "
        f"in {props['zone']}"
    )
    deadline = Deadline(float(props.get("createTimeoutSeconds") or 1800))
    try:
        operation = api.client.create_queued_resource(
            request=request,
            retry=api.retry(lambda e: api.retryable(e) or is_new_service_account_race(e), deadline),
            timeout=REQUEST_TIMEOUT_SECONDS,
        )
    except exceptions.Conflict as exc:
        # Ours from an interrupted earlier `pulumi up` (same stack label, same shape)? Adopt
        # it rather than leave it orphaned; anything else is not ours to touch.
        existing = api.get_queued_resource(name, deadline)
        if existing is None or not is_ours(existing, props):
            raise api.explain(exc, "creating", props) from None
        say(f"{label}: adopting the queued resource an interrupted earlier run created ({state_name(existing)})")
        operation = None
    except Exception as exc:
        raise api.explain(exc, "creating", props) from None
    if operation is not None:
        try:
            operation.result(retry=api.retry(deadline=deadline), polling=api.operation_polling(deadline.remaining()))
        except exceptions.GoogleAPICallError as exc:  # the operation itself failed
            qr = api.get_queued_resource(name)
            if qr is not None:
                raise api.delete_failed(qr, props) from None
            raise api.explain(exc, "creating", props) from None
        except Exception:  # operation polling used up its time: the state wait below decides
            pass
    wait = api.wait_for_state(props, props.get("waitFor") or "ACTIVE", deadline)
    if wait.failed:
        if wait.qr is None:
            raise QueuedResourceError(f"creating queued resource {label!r}: {wait.error or 'it disappeared'}")
        raise api.delete_failed(wait.qr, props)
    if not wait.reached:
        message = (
            f"queued resource {label!r} is still {wait.state} after {duration_text(wait.elapsed)} "
            f"(waiting for {props.get('waitFor') or 'ACTIVE'}; multislice:queuedResource.createTimeout is "
            f"{duration_text(deadline.seconds)}). It is recorded in the stack and stays queued: "
            "run `pulumi up` again "
            "to keep waiting, or `pulumi destroy` to give up."
        )
        if wait.error:
            message += f" Last error: {wait.error}"
        say(message)
        return name, outputs_for(props, wait.qr, None, ready=False, message=message)
    nodes = api.node_views(props) if wait.state == "ACTIVE" else []
    if operation is None and nodes and not all(n["inSync"] for n in nodes):
        # Adopted with an older spec: converge its nodes now, as an update would.
        return name, converge(api, name, {}, props, deadline)
    return name, outputs_for(
        props, wait.qr, nodes, ready=True, message=f"{wait.state} after {duration_text(wait.elapsed)}"
    )
