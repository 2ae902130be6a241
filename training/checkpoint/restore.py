"""Restore agreement: every process of the job restores the same checkpoint, the newest that
every process can read and that passes the check it is given, or all of them fail
(:func:`restore`); afterwards every process's manager lists the same steps
(:func:`agree_on_steps`), so all make the same save decisions. Used through
training.checkpoint.manager, which keeps these names; the reasons and measurements:
docs/jax-on-cpu.md, "Failures" (restore agreement) and "Checkpoints (Orbax)".
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from etils import epath

from training import agreement
from training.checkpoint.messages import describe, error_text, step_path
from training.checkpoint.orbax_import import ocp
from training.warning_text import emit, no_action

#: One logger for every message about checkpoints (training.checkpoint.manager's).
log = logging.getLogger("training.checkpoint.manager")


def agree_on_steps(manager: ocp.CheckpointManager, attempts: int = 3) -> list[int]:
    """The checkpoint steps ``manager`` lists, once every process's manager lists the same.

    Orbax's ``should_save(step)`` refuses a step at or below the newest one its manager
    lists, so a process whose listing differs makes a different save decision and the
    processes wait for each other (one inside Orbax's save, the other in the next step's
    collective). Each process shares its listing (:func:`training.agreement.all_gather`);
    while they differ, every process lists anew (``reload``, from a fresh listing:
    ``training.checkpoint.manager.CheckpointManager.reload``), 1 s apart.

    Raises:
      training.agreement.AgreementError: the listings still differ after ``attempts`` rounds
        (restarting the job lists anew), or a peer did not report in time.
    """
    text = ""
    for attempt in range(attempts):
        listings = agreement.all_gather(f"checkpoint-steps-{attempt}", json.dumps(sorted(manager.all_steps())))
        if len(set(listings)) == 1:
            return json.loads(listings[0])
        text = "; ".join(f"process {p}: {steps}" for p, steps in enumerate(listings))
        what = f"the processes list different checkpoints in {manager.directory} ({text}); listing again"
        why = f"every process lists anew, {attempts} times at most, before the job stops with an error saying so"
        emit(no_action(what, why), log.warning)
        time.sleep(1.0)
        manager.reload()
    raise agreement.AgreementError(
        f"the processes list different checkpoints in {manager.directory} after {attempts} listings: {text}"
    )


class CheckpointRestoreError(RuntimeError):
    """No checkpoint of the run can be restored; restarting will not help."""


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A checkpoint the job skipped on restore: ``tried`` (its step) at ``path``, why
    (``reason``: one line per process that could not read it), and the ``used`` step."""

    tried: int
    path: str
    reason: str
    used: int


def restore(
    manager: ocp.CheckpointManager,
    abstract_state: Any,
    *,
    is_writer: bool,
    attempts: int = 2,
    on_fallback: Callable[[Fallback], None] | None = None,
    check: Callable[[int, Any], str] | None = None,
) -> tuple[int, Any] | None:
    """Restore the newest finalized checkpoint every process can read, onto
    ``abstract_state``'s shardings; all processes restore the same step.

    The processes try the steps in lockstep, newest first (process 0's listing): each
    process reads the step on its own (``manager.restore``; :class:`CheckpointManager` has no
    barrier there), then they share the outcome (:func:`training.agreement.all_gather`), so a
    process that read the step waits for the others' outcomes, never for a collective that a
    process whose read failed does not join. A step that fails ``attempts`` times on any
    process is skipped by all; a peer that does not report its outcome within
    ``MULTISLICE_AGREEMENT_TIMEOUT_S`` of this process's own read ends the restore with
    AgreementError. A step every process read is then checked (``check(step, state)``:
    ``""``, or why the state must not be trusted; once, a collective on every process, whose
    verdicts are shared) and skipped by all when any process's check fails. Skipped steps are
    renamed ``<step>.unreadable`` by process 0 and reported to ``on_fallback``. Messages name
    checkpoints by :func:`describe` and quote :func:`error_text`. Before it returns, every
    process's manager lists the same steps (:func:`agree_on_steps`), so all make the same save decisions from here on.

    Returns:
      ``(step, state)``, or None when the run has no finalized checkpoint.

    Raises:
      CheckpointRestoreError: no step can be restored by every process (on every process).
      training.agreement.AgreementError: a peer did not report within the timeout, or the
        processes' listings still differ.
    """
    steps = json.loads(agreement.all_gather("restore-steps", json.dumps(sorted(manager.all_steps(), reverse=True)))[0])
    failures: list[tuple[int, str]] = []
    for step in steps:
        where = describe(step, step_path(manager, step))
        error = ""  # (attempts=0 tries nothing: the step fails without an error text)
        for attempt in range(attempts):
            state, error = None, ""
            try:
                state = manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
            except Exception as err:  # orbax/tensorstore raise many types for damaged data
                error = error_text(err)
                log.error("restoring checkpoint %s failed (attempt %d/%d): %s", where, attempt + 1, attempts, error)
            errors = agreement.all_gather(f"restore-{step}-{attempt}", error)
            if not any(errors):
                break
            error = "; ".join(e if len(errors) == 1 else f"process {p}: {e}" for p, e in enumerate(errors) if e)
            if error and attempt + 1 < attempts:
                time.sleep(1.0)
        else:
            failures.append((step, error))
            continue
        problem = _checked(check, step, state)
        if problem:
            failures.append((step, problem))
            state = None
            continue
        if failures:
            newer = ", ".join(describe(s, step_path(manager, s)) for s, _ in failures)
            what = f"fell back to checkpoint {where}: the newer {newer} could not be restored ("
            what += "; ".join(f"step {s}: {e}" for s, e in failures) + ")"
            why = "training goes on from it; the newer ones are set aside as <step>.unreadable"
            emit(no_action(what, why), log.warning)
            set_aside([s for s, _ in failures], manager, is_writer)
            for failed, reason in failures:
                if on_fallback is not None:
                    on_fallback(Fallback(tried=failed, path=step_path(manager, failed), reason=reason, used=step))
        agree_on_steps(manager)
        return step, state
    if failures:
        raise CheckpointRestoreError(
            f"no checkpoint in {manager.directory} can be restored: "
            + "; ".join(f"{describe(s, step_path(manager, s))}: {e}" for s, e in failures)
            + ". If the model changed, start a new run (multislice:runName or --fresh); if the files are "
            "damaged, move the bad step directories away"
        )
    agree_on_steps(manager)
    return None


def _checked(check: Callable[[int, Any], str] | None, step: int, state: Any) -> str:
    """Why the restored ``state`` of ``step`` must not be trusted (every process's verdict of
    ``check``, shared; one line), or ``""``."""
    if check is None:
        return ""
    try:
        mine = check(step, state)
    except Exception as err:  # e.g. the step's metadata unreadable from this process
        mine = f"checking it failed: {error_text(err)}"
    verdicts = agreement.all_gather(f"restore-{step}-check", mine)
    if len(set(verdicts)) == 1:
        return verdicts[0]
    return "; ".join(f"process {p}: {v}" for p, v in enumerate(verdicts) if v)


def set_aside_steps(manager: ocp.CheckpointManager, suffix: str) -> list[int]:
    """The steps of the checkpoints set aside as ``<step>.<suffix>``, oldest first (a fresh
    listing: ``glob`` asks the storage; training.run_dir.RunDir.list)."""
    return sorted(
        int(p.name.split(".")[0])
        for p in epath.Path(manager.directory).glob(f"*.{suffix}")
        if p.name.split(".")[0].isdigit()
    )


def set_aside(steps: list[int], manager: ocp.CheckpointManager, is_writer: bool, suffix: str = "unreadable") -> None:
    """Rename checkpoints ``steps`` to ``<step>.<suffix>`` (process 0; kept for inspection,
    invisible to Orbax, whose step directories are numbers), then every process lists anew."""
    if is_writer:
        for step in steps:
            source = epath.Path(manager.directory) / str(step)
            target = epath.Path(manager.directory) / f"{step}.{suffix}"
            if source.exists():
                what = f"moving {suffix} checkpoint {describe(step, str(source))} to {target}"
                emit(no_action(what, "kept there for inspection, out of the run's way"), log.warning)
                source.rename(target)
    agreement.barrier(f"checkpoints-set-aside-{suffix}")
    manager.reload()
