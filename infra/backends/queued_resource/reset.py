"""``multislice reset``: ResetQueuedResource on a deployed stack's queued resource, waited for.

``ResetQueuedResource`` (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/reset;
google-cloud-tpu's ``TpuClient.reset_queued_resource``) reboots every VM of the queued resource:
the VMs are not re-provisioned, their startup scripts run again, and a workload that
checkpoints resumes from its newest checkpoint (the Multislice overview recommends it when
training hangs: https://cloud.google.com/tpu/docs/multislice-introduction). :func:`reset`

1. reads the queued resource: a missing one (never deployed, or deleted once its run completed
   by ``deleteOnComplete``) or one that is not ``ACTIVE`` is refused with nothing sent;
2. asks ``confirm`` (the CLI's prompt, or ``--yes``);
3. sends the reset and polls its long-running operation, then the queued resource and its
   nodes (``ListNodes``), saying each node state that changes (``RESTARTING``, ``READY``, …),
   until the operation is done, the queued resource ``ACTIVE`` and every node ``READY``, or
   ``timeout_s`` passes (the reset itself goes on; ``multislice status`` follows it).

The client is the one the queued-resource provider uses (``TpuApi.client_for``: Google's
endpoint, or ``$MULTISLICE_TPU_API_ENDPOINT``, which may only be a loopback fake over http),
with the credentials ``multislice status`` takes (:mod:`infra.credentials`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra import invocation
from infra.remote.selection import RemoteError

#: Seconds between polls of the operation and the nodes: the first, doubled per poll up to the last.
FIRST_POLL_S, POLL_S = 1.0, 5.0


@dataclass(frozen=True)
class ResetResult:
    """A finished reset: seconds from the request to every node READY, and each node's state."""

    seconds: float
    nodes: dict[str, str]


def client_for_stack(config) -> Any:
    """A REST ``tpu_v2.TpuClient`` for the stack (credentials checked first).

    Raises:
      RemoteError: missing or unusable credentials, or a non-loopback http endpoint (exit 2).
    """
    from infra import credentials as gcp
    from infra.backends.queued_resource import capacity
    from infra.backends.queued_resource.provider.api import TpuApi
    from infra.backends.queued_resource.provider.errors import QueuedResourceError

    settings = gcp.CredentialSettings.resolve({}, os.environ)
    url = capacity.endpoint()
    local = capacity.is_local_endpoint(url)
    problem = gcp.problem(settings, os.environ, require_credentials=not local)
    if problem:
        raise RemoteError(problem)
    credentials = None
    if not local or settings.explicit:
        try:
            credentials = gcp.load(settings, quota_project=settings.quota_project(config.project))
        except gcp.CredentialsError as err:
            raise RemoteError(str(err)) from None
    try:
        return TpuApi.client_for(url, credentials)
    except QueuedResourceError as err:
        raise RemoteError(str(err)) from None


def not_found_message(config) -> str:
    """Why there is nothing to reset when the stack's queued resource does not exist."""
    where = f"projects/{config.project}/locations/{config.zone}"
    head = f"stack {config.stack}: queued resource {config.queued_resource_id} not found in {where}, nothing to reset"
    if config.delete_on_complete:
        return (
            f"{head}: with multislice:queuedResource.deleteOnComplete worker 0 of slice 0 deletes it once the run "
            "completes (or it was never deployed); `pulumi up` creates it again for more training.steps or a new "
            "runName"
        )
    return f"{head}: it was never deployed or was deleted; run `pulumi up --stack {config.stack}` first"


def reset(
    config,
    client: Any,
    *,
    confirm: Callable[[str], bool],
    say: Callable[[str], None],
    timeout_s: float,
    poll_s: float = POLL_S,
) -> ResetResult:
    """Reset the stack's queued resource and wait (see the module docstring).

    Raises:
      RemoteError: missing or not ACTIVE (exit 2, nothing sent); not confirmed (exit 1,
        nothing sent); the API refused or failed, or ``timeout_s`` passed (exit 1).
    """
    from google.api_core import exceptions

    name, qr_id = config.queued_resource_name, config.queued_resource_id
    try:
        qr = client.get_queued_resource(name=name, timeout=60.0)
    except exceptions.NotFound:
        raise RemoteError(not_found_message(config)) from None
    except exceptions.GoogleAPICallError as err:
        raise RemoteError(f"cannot read queued resource {qr_id}: {_api_error(err)}", 1) from None
    state = qr.state.state.name
    if state != "ACTIVE":
        raise RemoteError(
            f"stack {config.stack}'s queued resource {qr_id} is {state}: only an ACTIVE queued resource has VMs to "
            f"reset; see `{invocation.command('status', config.stack)}`"
        )
    vms = config.slices * config.workers_per_slice
    if not confirm(
        f"Reset queued resource {qr_id} of stack {config.stack}: reboot its {vms} VM(s) "
        f"({config.slices} slice(s) × {config.workers_per_slice} worker(s)), stopping what they run?"
    ):
        raise RemoteError("not confirmed: nothing was reset", 1)
    start = time.monotonic()
    deadline = start + timeout_s
    try:
        operation = client.reset_queued_resource(name=name, timeout=60.0)
    except exceptions.GoogleAPICallError as err:
        raise RemoteError(f"the Cloud TPU API refused the reset of {qr_id}: {_api_error(err)}", 1) from None
    say(f"reset of {qr_id} accepted ({operation.operation.name}); waiting for every VM (usually 1-2 min)")
    nodes: dict[str, str] = {}
    done = False
    delay = min(FIRST_POLL_S, poll_s)
    while True:
        try:
            done = done or operation.done()
            active = client.get_queued_resource(name=name, timeout=60.0).state.state.name
            current = _node_states(client, config)
        except exceptions.GoogleAPICallError as err:
            raise RemoteError(f"cannot follow the reset of {qr_id}: {_api_error(err)}", 1) from None
        for node, node_state in current.items():
            if nodes.get(node) != node_state:
                say(f"{node}: {node_state}")
        nodes = current
        if done and operation.exception() is not None:
            raise RemoteError(f"the reset of {qr_id} failed: {operation.exception()}", 1)
        if done and active == "ACTIVE" and all(s == "READY" for s in nodes.values()):
            return ResetResult(round(time.monotonic() - start, 1), nodes)
        if time.monotonic() >= deadline:
            states = ", ".join(f"{n} {s}" for n, s in nodes.items())
            raise RemoteError(
                f"the reset of {qr_id} has not finished after {timeout_s:.0f} s (queued resource {active}; {states}; "
                f"operation {'done' if done else 'running'}); Cloud TPU goes on with it: "
                f"see `{invocation.command('status', config.stack)}`",
                1,
            )
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, poll_s)


def _node_states(client: Any, config) -> dict[str, str]:
    """Node id → state of the stack's nodes (``MISSING`` for one that does not exist)."""
    parent = f"projects/{config.project}/locations/{config.zone}"
    wanted = config.node_ids
    found = {
        node.name.rsplit("/", 1)[-1]: node.state.name
        for node in client.list_nodes(parent=parent, timeout=60.0)
        if node.name.rsplit("/", 1)[-1] in wanted
    }
    return {node: found.get(node, "MISSING") for node in wanted}


def _api_error(err: Any) -> str:
    return f"{type(err).__name__}: {getattr(err, 'message', None) or err}"
