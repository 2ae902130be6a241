"""Update in place: bring a live queued resource's nodes from the recorded inputs to new ones,
within one deadline, and record exactly what is left when that cannot finish.

``UpdateNode`` on every node that differs (merged metadata and labels, tags;
:mod:`~infra.backends.queued_resource.provider.nodes`, concurrently), then, when the metadata of the inputs
changed (a new release, run directory, ...) and a node's metadata was updated for it,
``ResetQueuedResource`` so every VM re-runs its startup script
(https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/reset)
and a wait until it is ACTIVE again. No capacity is given up.

A node whose metadata is stale while the inputs' metadata is unchanged (a slice Cloud TPU
recreated from the QR's creation-time spec, a key edited by hand) gets its ``UpdateNode`` and
no reset: its VMs already run what the stack records, since every boot runs the release and
run directory of the release record (docs/vm-boot.md), and a reset would restart every slice.

Stopping part-way (a node's retries exhausted, the deadline, the reset refused) is not an
exception: the outputs record the *old* metadata, labels and tags (so the next diff still
sees the change), ``pendingNodeSync``, the ``pendingNodes`` not yet done, whether a reset is
still due (``pendingReset``), ``ready: false`` and a message; the program then fails the
``pulumi up`` with that message (``infra/__main__.py``), and the next ``pulumi up`` compares
every live node with the new inputs again, updates what is left and resets.
"""

from __future__ import annotations

from typing import Any

from infra.backends.queued_resource.provider.api import REQUEST_TIMEOUT_SECONDS, TpuApi
from infra.backends.queued_resource.provider.errors import QueuedResourceError, is_fatal_for_every_call
from infra.backends.queued_resource.provider.inputs import Kind, content_view, differs, keys_of, node_ids, outputs_for
from infra.backends.queued_resource.provider.nodes import NodeSync, update_nodes
from infra.backends.queued_resource.provider.polling import Deadline, duration_text
from infra.backends.queued_resource.provider.states import FAILED_STATES, state_name

#: What a part-way update keeps from the recorded state: the node-facing inputs and their descriptions.
KEPT_WHEN_UNFINISHED = keys_of(Kind.UPDATE_IN_PLACE, Kind.DESCRIPTIVE)


def update_node(api: TpuApi, patch: Any, mask: list[str], deadline: Deadline) -> None:
    """One ``UpdateNode`` and the wait for its operation (both retried, both within ``deadline``)."""
    from google.cloud import tpu_v2
    from google.protobuf import field_mask_pb2

    operation = api.client.update_node(
        request=tpu_v2.UpdateNodeRequest(node=patch, update_mask=field_mask_pb2.FieldMask(paths=mask)),
        retry=api.retry(deadline=deadline),
        timeout=REQUEST_TIMEOUT_SECONDS,
    )
    operation.result(retry=api.retry(deadline=deadline), polling=api.operation_polling(deadline.remaining()))


def unfinished(
    olds: dict[str, Any], news: dict[str, Any], qr: Any, *, message: str, pending: list[str], reset_due: bool
) -> dict[str, Any]:
    """Outputs of an update that stopped part-way (see the module docstring)."""
    recorded = {**news, **{k: olds[k] for k in KEPT_WHEN_UNFINISHED if k in olds}}
    return outputs_for(
        recorded,
        qr,
        None,
        ready=False,
        message=message,
        pending_node_sync=True,
        pending_nodes=pending,
        pending_reset=reset_due,
    )


def converge(api: TpuApi, id_: str, olds: dict[str, Any], news: dict[str, Any], deadline: Deadline) -> dict[str, Any]:
    """Update the QR ``id_`` in place from ``olds`` (recorded outputs; ``{}`` when adopting a
    QR) to ``news``; returns the outputs.

    Raises:
      QueuedResourceError: the QR no longer exists, or is FAILED/SUSPENDED (then it is
        described; the next ``pulumi up`` refreshes and replaces it), or went so while waiting
        (then it is deleted: :meth:`TpuApi.delete_failed`).
    """
    label = news["queuedResourceId"]
    qr = api.get_queued_resource(id_, deadline)
    if qr is None:
        raise QueuedResourceError(
            f"queued resource {label!r} no longer exists (deleted outside Pulumi or by the service): run `pulumi up` "
            "again to create it (it refreshes first: Pulumi.yaml options.refresh; with --refresh=false, run "
            "`pulumi refresh` first)"
        )
    if state_name(qr) in FAILED_STATES:
        raise QueuedResourceError(
            api.describe_failure(qr, news)
            + "\nRun `pulumi up` again: its refresh (or `pulumi refresh`) records the failure and the update replaces "
            "the queued resource."
        )
    old_content, new_content = content_view(olds), content_view(news)
    node_change = any(differs(old_content.get(k), new_content.get(k)) for k in keys_of(Kind.UPDATE_IN_PLACE)) or bool(
        olds.get("pendingNodeSync")
    )
    target = news.get("waitFor") or "ACTIVE"
    wait = api.wait_for_state(news, target, deadline)
    if wait.failed:
        if wait.qr is None:
            raise QueuedResourceError(f"updating queued resource {label!r}: {wait.error or 'it disappeared'}")
        raise api.delete_failed(wait.qr, news)
    if not wait.reached or wait.state != "ACTIVE":
        # Nodes do not exist yet: they are created from the QR's spec (the old metadata), so
        # the sync stays pending until a later `pulumi up` finds them ACTIVE.
        message = (
            f"queued resource {label!r} is {wait.state}"
            + (
                f" after {duration_text(wait.elapsed)}; run `pulumi up` again to keep waiting"
                if not wait.reached
                else ""
            )
            + ("; node metadata/labels/tags will be applied once it is ACTIVE" if node_change else "")
        )
        return outputs_for(news, wait.qr, None, ready=wait.reached, message=message, pending_node_sync=node_change)

    ids = node_ids(news)
    if olds.get("pendingNodes"):
        api.say(
            f"{label}: resuming the update the last run left part-way ({len(olds['pendingNodes'])} node(s) were left)"
        )
    sync: NodeSync = update_nodes(
        api.list_nodes(news, deadline),
        ids,
        olds,
        news,
        update=lambda patch, mask: update_node(api, patch, mask, deadline),
        concurrency=api.concurrency,
        remaining=deadline.remaining,
        is_fatal=is_fatal_for_every_call,
        describe=lambda exc: str(api.explain(exc, "updating a node of", news)),
        say=lambda line: api.say(f"{label}: {line}"),
    )
    if sync.missing:
        raise QueuedResourceError(
            f"queued resource {label!r} is ACTIVE but node(s) {', '.join(sync.missing[:8])} do not exist (preempted or "
            "deleted): run `pulumi up` again; its refresh records the loss and the update replaces the queued resource"
        )
    # Reset for a change of the inputs' metadata only (olds is {} when adopting: a change).
    inputs_changed = differs(old_content.get("metadata"), new_content.get("metadata"))
    reset_due = (sync.metadata_changed and inputs_changed) or bool(olds.get("pendingReset"))
    if sync.metadata_changed and not reset_due:
        api.say(
            f"{label}: node metadata brought up to date without a reset (the stack's release is unchanged; the "
            "release record already makes every boot run it)"
        )
    if not sync.complete:
        first = next(iter(sync.failed.values()))
        message = (
            f"queued resource {label!r}: updated {len(sync.updated)} of {len(sync.updated) + len(sync.failed)} node(s) "
            f"that differ; {len(sync.failed)} not updated (first: {first}). Run `pulumi up` again to finish "
            "(nodes already updated are skipped" + ("; the VMs are reset after the last node)" if reset_due else ")")
        )
        api.say(message)
        return unfinished(olds, news, wait.qr, message=message, pending=sync.pending, reset_due=reset_due)
    if reset_due:
        api.say(f"{label}: resetting every VM so the new startup script runs (1–2 min)")
        try:
            operation = api.client.reset_queued_resource(
                name=id_, retry=api.retry(deadline=deadline), timeout=REQUEST_TIMEOUT_SECONDS
            )
            operation.result(retry=api.retry(deadline=deadline), polling=api.operation_polling(deadline.remaining()))
        except Exception as exc:
            message = (
                f"queued resource {label!r}: every node carries the new metadata but the reset did not finish "
                f"({api.explain(exc, 'resetting', news)}). Run `pulumi up` again to reset it."
            )
            api.say(message)
            return unfinished(olds, news, wait.qr, message=message, pending=[], reset_due=True)
        wait = api.wait_for_state(news, "ACTIVE", deadline)
        if wait.failed:
            raise api.delete_failed(wait.qr, news) if wait.qr is not None else QueuedResourceError(wait.error)
    nodes = api.node_views(news, qr=wait.qr)
    if not wait.reached:
        message = (
            f"queued resource {label!r} is {wait.state} after {duration_text(wait.elapsed)} (every VM was reset); "
            "run `pulumi up` again to keep waiting"
        )
    elif reset_due:
        message = f"{wait.state}; metadata updated and every VM reset"
    else:
        message = f"{wait.state}; nodes in sync"
    return outputs_for(news, wait.qr, nodes, ready=wait.reached, message=message)
