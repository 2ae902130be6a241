"""``multislice reset`` on a gke stack: suspend the run's JobSet, then resume it, so every Pod
starts again and the trainer resumes from its newest checkpoint.

JobSet documents no restart verb (docs/gke.md, question 8). It documents ``spec.suspend``
(JobSet's API: suspending a JobSet suspends its child Jobs, and resuming resumes them), and
Kubernetes deletes the running Pods of a suspended Job and creates them again when it resumes
(Kubernetes' "Job suspension"). A deleted Pod's containers get SIGTERM and the Pod's termination
grace, as on a node's preemption, so every trainer saves the step its processes agree on before it
ends (docs/gke.md sections 5 and 6). :func:`reset`

1. lists the run's Pods: none, or all completed, is one line and exit 2, nothing sent (never
   deployed, deleted, its JobSet already suspended, or its run complete);
2. asks ``confirm`` (the CLI's prompt, or ``--yes``);
3. patches ``spec.suspend: true`` (:func:`~infra.backends.gke.operate.suspend_command`) and waits
   until the JobSet has no Pod left, saying the count as it changes;
4. patches ``spec.suspend: false`` and waits until every slice is ``READY`` (one Running Pod per VM:
   :func:`infra.backends.gke.capacity.slice_state`), saying each slice's state as it changes.

Within ``timeout_s`` in all; polls every :data:`POLL_S`. A wait in step 3 that runs out, is
interrupted or fails leaves the JobSet suspended, and the error names the command that resumes it;
a wait in step 4 that runs out leaves the Pods to start (``multislice status`` follows them).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

from infra import invocation
from infra.backends.gke import capacity, kubectl, names, operate
from infra.remote.selection import RemoteError

#: Seconds between two listings of the Pods while waiting.
POLL_S = 2.0


def suspend_argv(config, suspend: bool) -> list[str]:
    """kubectl's patch of the stack's JobSet to ``spec.suspend: suspend``."""
    return operate.suspend_command(
        context=names.kube_context(config),
        namespace=config.gke.namespace,
        jobset=names.jobset_name(config),
        suspend=suspend,
    )


def _places(config) -> list[operate.PodPlace]:
    jobset = names.jobset_name(config)
    try:
        return [pod for pod in operate.pods_of(kubectl.list_pods(config), jobset) if pod.slice_id < config.slices]
    except operate.PodListingError as err:
        raise RemoteError(str(err), 1) from None


def _kubectl(config, argv: list[str]) -> None:
    try:
        kubectl.run(config, argv)
    except kubectl.KubectlError as err:
        raise RemoteError(str(err), err.exit_code) from None


def reset(
    config,
    *,
    confirm: Callable[[str], bool],
    say: Callable[[str], None],
    timeout_s: float,
    poll_s: float | None = None,
) -> float:
    """Restart every Pod of the stack's JobSet (see the module docstring); the seconds it took.

    Raises:
      RemoteError: no Pod or every Pod completed, kubectl missing or without the stack's context
        (exit 2, nothing sent);
        not confirmed (exit 1, nothing sent); kubectl failed, or ``timeout_s`` passed (exit 1).
    """
    jobset, poll_s = names.jobset_name(config), POLL_S if poll_s is None else poll_s
    try:
        pods = _places(config)
    except kubectl.KubectlError as err:
        raise RemoteError(str(err), err.exit_code) from None
    if not pods:
        raise RemoteError(
            f"stack {config.stack}: JobSet {jobset} has no Pods in namespace {config.gke.namespace} of cluster "
            f"{names.cluster_name(config)}, nothing to reset: it was never deployed, was deleted, or is suspended "
            f"(see `{invocation.command('status', config.stack)}`)"
        )
    if all(pod.phase == "Succeeded" for pod in pods):
        raise RemoteError(
            f"stack {config.stack}: every Pod of JobSet {jobset} has completed, nothing to reset: a resumed JobSet "
            "would not run its completed Jobs again (`pulumi up` with more training.steps or a new runName starts one)"
        )
    if not confirm(
        f"Reset JobSet {jobset} of stack {config.stack}: suspend it (its {len(pods)} Pod(s) get SIGTERM and are "
        "deleted) and resume it, so every Pod starts again?"
    ):
        raise RemoteError("not confirmed: nothing was reset", 1)
    start = time.monotonic()
    deadline = start + timeout_s
    resume = shlex.join(suspend_argv(config, False))
    _kubectl(config, suspend_argv(config, True))
    say(f"reset: JobSet {jobset} suspended; waiting for its {len(pods)} Pod(s) to save and end")
    try:
        left = len(pods)
        while left:
            if time.monotonic() >= deadline:
                raise RemoteError(f"{left} Pod(s) of JobSet {jobset} still there after {timeout_s:.0f} s", 1)
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            now = len(_places(config))
            if now != left:
                say(f"reset: {now} Pod(s) left")
            left = now
    except (RemoteError, kubectl.KubectlError, KeyboardInterrupt) as err:
        interrupted = isinstance(err, KeyboardInterrupt)
        raise RemoteError(
            f"the reset stopped with JobSet {jobset} suspended ({'interrupted' if interrupted else err}); "
            f"resume it with `{resume}`",
            130 if interrupted else getattr(err, "exit_code", 1),
        ) from None
    _kubectl(config, suspend_argv(config, False))
    say(f"reset: JobSet {jobset} resumed; waiting for every Pod to run")
    states: list[str] = []
    while True:
        try:
            pods = _places(config)
        except kubectl.KubectlError as err:
            raise RemoteError(str(err), err.exit_code) from None
        now = [
            capacity.slice_state([p for p in pods if p.slice_id == s], config.workers_per_slice)
            for s in range(config.slices)
        ]
        for index, (pool, state) in enumerate(zip(config.node_ids, now, strict=True)):
            if states[index : index + 1] != [state]:
                say(f"slice {index} ({pool}): {state}")
        states = now
        if all(state == capacity.READY for state in states):
            return round(time.monotonic() - start, 1)
        if time.monotonic() >= deadline:
            raise RemoteError(
                f"JobSet {jobset} was resumed, but its Pods are not all running after {timeout_s:.0f} s; they are "
                f"starting: see `{invocation.command('status', config.stack)}`",
                1,
            )
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
