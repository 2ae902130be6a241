"""``multislice local reset`` on a gke stack's running ``local up``: what ``multislice reset`` does
to the JobSet (:mod:`~infra.backends.gke.reset`: suspended, then resumed), done to the emulated
Pods. The request is a file the emulator takes (:func:`~infra.backends.gke.emulation.request_reset`);
the emulator stops every Pod (SIGTERM, the trainers save the step they agree on, SIGKILL after the
grace) and starts each again as a new Pod on its node (its node cache kept), and the run resumes
from its newest finalized checkpoint. :func:`reset` waits until every Pod runs again
(:func:`infra.remote.emulated.await_reboots`), saying each as it comes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from infra.backends.gke.emulation import request_reset
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
    """Reset the emulated JobSet and wait until every Pod runs again; the seconds that took.

    Raises:
      RemoteError: no local run (exit 2, nothing sent); not confirmed (exit 1); the emulator
        ended, or ``timeout_s`` passed, before every Pod was back (exit 1).
    """
    before = booted_groups(running_state(config, paths))
    pods = config.slices * config.workers_per_slice
    if not confirm(
        f"Reset stack {config.stack}'s emulated JobSet: suspend and resume it, so its {pods} Pod(s) stop "
        "(SIGTERM) and start again as new Pods?"
    ):
        raise RemoteError("not confirmed: nothing was reset", 1)
    start = time.monotonic()
    request_reset(paths)
    say("reset requested; the emulator suspends the JobSet and resumes it")
    await_reboots(config, paths, before, say=say, deadline=start + timeout_s, poll_s=poll_s)
    return round(time.monotonic() - start, 1)
