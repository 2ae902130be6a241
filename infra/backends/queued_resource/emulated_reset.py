"""``multislice local reset``: ResetQueuedResource on the emulated queued resource of a running
``local up``.

The request goes where a deployed stack's goes, through google-cloud-tpu's
``TpuClient.reset_queued_resource``, here to the emulation's loopback Cloud TPU API
(``infra.backends.queued_resource.emulated_api``, its URL in the emulator's state file) with the emulated VMs' token.
The emulator then restarts every VM (``Repairs.reset`` of :mod:`infra.local.repairs`: SIGTERM, the trainer
unit's stop timeout, SIGKILL, boot again; the startup script runs again and training resumes from
its newest finalized checkpoint). :func:`reset` waits until every VM runs a new boot
(:func:`infra.remote.emulated.await_reboots`), saying each as it comes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from infra.emulated.kit import LocalPaths
from infra.remote.emulated import await_reboots, booted_groups, running_state
from infra.remote.selection import RemoteError


def reset(
    config,
    paths: LocalPaths,
    *,
    confirm: Callable[[str], bool],
    say: Callable[[str], None],
    timeout_s: float,
    poll_s: float = 0.2,
) -> float:
    """Reset the emulated queued resource and wait until every VM booted again; the seconds
    that took.

    Raises:
      RemoteError: no local run or its queued resource deleted (exit 2, nothing sent); not
        confirmed (exit 1); the emulated API refused; the emulator ended, or ``timeout_s``
        passed, before every VM was back (exit 1).
    """
    from google.api_core import exceptions
    from google.oauth2.credentials import Credentials

    from infra.backends.queued_resource.provider.api import TpuApi
    from infra.emulated.kit import EMULATED_TOKEN

    state = running_state(config, paths)
    url = state.get("tpu_api_url")
    if not url:
        raise RemoteError(
            f"stack {config.stack}'s local run serves no TPU API yet (still starting); try again in a moment", 1
        )
    before = booted_groups(state)
    vms = config.slices * config.workers_per_slice
    if not confirm(
        f"Reset stack {config.stack}'s emulated queued resource: restart its {vms} VM(s), stopping what they run?"
    ):
        raise RemoteError("not confirmed: nothing was reset", 1)
    start = time.monotonic()
    client = TpuApi.client_for(url, Credentials(token=EMULATED_TOKEN))
    try:
        client.reset_queued_resource(name=config.queued_resource_name, timeout=30.0).result(timeout=30.0)
    except exceptions.NotFound:
        raise RemoteError(
            f"stack {config.stack}'s emulated queued resource {config.queued_resource_id} is deleted (its run "
            "completed): nothing to reset"
        ) from None
    except exceptions.GoogleAPICallError as err:
        raise RemoteError(f"the emulated TPU API refused the reset: {err}", 1) from None
    say(f"reset of {config.queued_resource_id} accepted; the emulator restarts every VM")
    await_reboots(config, paths, before, say=say, deadline=start + timeout_s, poll_s=poll_s)
    return round(time.monotonic() - start, 1)
