"""``multislice local reset``: ResetQueuedResource on the emulated queued resource of a running
``local up``.

The request goes where a deployed stack's goes, through google-cloud-tpu's
``TpuClient.reset_queued_resource``, here to the emulation's loopback Cloud TPU API
(``infra.backends.queued_resource.emulated_api``, its URL in the emulator's state file) with the emulated VMs' token.
The emulator then restarts every VM (``LocalQueuedResource.reset_vms``: SIGTERM, a short
grace, SIGKILL, boot again; the startup script runs again and training resumes from its newest
finalized checkpoint). :func:`reset` waits until every VM runs a new boot (a new process
group recorded in the state file and alive), saying each as it comes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from infra.config.stack_naming import stack_args
from infra.local import state as local_state
from infra.local.state import LocalPaths
from infra.remote.emulated import running_state
from infra.remote.selection import RemoteError


def _booted(state: dict) -> dict[tuple[int, int], int]:
    return {(int(vm["slice"]), int(vm["worker"])): int(vm["pgid"]) for vm in state.get("vms") or [] if vm.get("pgid")}


def _alive(pgid: int) -> bool:
    import psutil

    return psutil.pid_exists(pgid)


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
    from infra.local.metadata import EMULATED_TOKEN

    state = running_state(config, paths)
    url = state.get("tpu_api_url")
    if not url:
        raise RemoteError(
            f"stack {config.stack}'s local run serves no TPU API yet (still starting); try again in a moment", 1
        )
    before = _booted(state)
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
    back: set[tuple[int, int]] = set()
    deadline = start + timeout_s
    while True:
        current = local_state.read_state(paths)
        if current is None or not local_state.emulator_alive(current):
            raise RemoteError(f"stack {config.stack}'s local run ended before every VM was back", 1)
        for key, pgid in sorted(_booted(current).items()):
            if key not in back and pgid != before.get(key) and _alive(pgid):
                back.add(key)
                say(f"slice {key[0]} worker {key[1]}: booted again")
        if len(back) == vms:
            return round(time.monotonic() - start, 1)
        if time.monotonic() >= deadline:
            raise RemoteError(
                f"{vms - len(back)} of {vms} VM(s) not booted again after {timeout_s:.0f} s; "
                f"see `multislice local status {stack_args(config.stack)}` and the VMs' logs in {paths.logs_dir}",
                1,
            )
        time.sleep(poll_s)
