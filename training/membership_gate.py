"""Where one start of an elastic run joins: the membership it trains in, and who it is there.

Every process of an elastic run (``min_slices`` below the slice count of ``parallelism.dcn``)
passes through :func:`join` before ``jax.distributed`` starts:

1. It reads the newest membership record (:mod:`training.membership`; epoch 0, every slice, is
   created by whoever comes first) and the heartbeats (:mod:`training.heartbeats`).
2. It applies the rule (:func:`training.elastic.decide`): a member slice whose heartbeats have been
   stale for ``shrink_after_s`` is dropped (any process may propose it); a slice that is back joins
   once ``grow_after_s`` has passed since the last change (proposed only by a process that has not
   yet said it is ready for the current epoch). A proposal is the next epoch, created only if no
   other writer created it first: every process then reads the same winner.
3. A slice that is not a member waits (**standby**), its heartbeats saying it is up, until an
   epoch includes it.
4. A member says it is ready for the epoch (its heartbeat's ``ready``) and waits until every
   worker of every member slice is ready for the same epoch and that epoch is still the newest:
   then every process of the job leaves together, with the same view.

It leaves with its identity renumbered for the job of the members (:func:`renumbered`): the slice
id is its rank among the members, the slice count theirs, the coordinator worker 0 of the first
member (from that worker's heartbeat); ``MEGASCALE_NUM_SLICES``, ``MEGASCALE_SLICE_ID`` and
``MEGASCALE_COORDINATOR_ADDRESS`` are set in this process's environment to match before any JAX
backend starts (JAX reads them there before the VM's ``tpu-env``: jax
``_src/clusters/cloud_tpu_cluster.py``). While the job trains, its process 0 asks :func:`grow_to`
at every checkpoint (``training.train``): a returned slice is taken in by saving and restarting.

The waits log a line every :data:`REPORT_S` and end only when the run does: a stack that is not
elastic waits for its lost slice the same way (the platform repairs it), and a standby slice is
capacity that is there to be used. At every look the gate reads the completion marker: once the run
is complete, a waiting process leaves with :class:`RunComplete` (its trainer exits 0), and once the
final step's checkpoint is saved no change is proposed (the run completes in the epoch it has).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from typing import Any

from training import elastic, heartbeats, membership
from training.checkpoint import completion
from training.cluster import (
    MEGASCALE_COORDINATOR_ENV,
    MEGASCALE_NUM_SLICES_ENV,
    MEGASCALE_SLICE_ID_ENV,
    ClusterIdentity,
)
from training.config import TrainConfig
from training.run_dir import RunDir
from training.warning_text import emit, no_action

log = logging.getLogger("training")

#: Seconds between two looks at the records while waiting.
POLL_S = 1.0
#: Seconds between two log lines of one wait.
REPORT_S = 30.0
#: At the run's first start (epoch 0, no checkpoint yet) a slice never seen is waited for this long, or
#: ``shrinkAfter`` if longer, before the run starts without it: capacity arrives slice by slice
#: (flex-start above all), and a slice late by minutes is no lost slice. One that is still late is
#: taken in at the run's first checkpoint, without waiting ``growAfter``.
FIRST_START_WAIT_S = 600.0
#: Once every member is ready, the gate waits this long before it leaves and reads the newest epoch
#: again (the last call): a returned slice whose proposal lands in that window (a grow decided as the
#: members became ready) is joined in the same start instead of one more restart at the next checkpoint.
LAST_CALL_S = 2.0
_STEP = re.compile(r"^checkpoints/(\d+)$")


def is_elastic(config: TrainConfig, identity: ClusterIdentity) -> bool:
    """Whether this start goes through :func:`join`: ``min_slices`` below the slice count, and a
    job of more than one slice (a single process or slice has nothing to shrink)."""
    full = config.parallelism.dcn.product
    return config.min_slices is not None and config.min_slices < full and identity.num_slices > 1


def counts(config: TrainConfig) -> list[int]:
    """The slice counts ``config`` may train on, most first (those :func:`training.elastic.for_slices`
    accepts, from ``parallelism.dcn``'s down to ``min_slices``)."""
    full = config.parallelism.dcn.product
    allowed = []
    for n in range(full, (config.min_slices or full) - 1, -1):
        try:
            elastic.for_slices(config, n)
        except ValueError:
            continue
        allowed.append(n)
    return allowed


def newest_checkpoint_step(run_dir: RunDir) -> int | None:
    """The newest step with a checkpoint directory (a finalized one: Orbax writes under a temporary
    name first), or None: what a change's record says the job resumes from."""
    steps = [int(m[1]) for name in run_dir.list("checkpoints/*") if (m := _STEP.fullmatch(name))]
    return max(steps, default=None)


def renumbered(identity: ClusterIdentity, record: membership.Membership, coordinator_host: str) -> ClusterIdentity:
    """``identity`` in the job of ``record``'s slices (see the module docstring); the port of the
    coordinator address is kept."""
    port = identity.coordinator_address.rsplit(":", 1)[1] if ":" in identity.coordinator_address else ""
    # A worker whose host is not known (an identity built by hand) leaves the one the VM was given.
    coordinator_host = coordinator_host or identity.coordinator_address.rsplit(":", 1)[0]
    return dataclasses.replace(
        identity,
        slice_id=record.slices.index(identity.slice_id),
        num_slices=len(record.slices),
        coordinator_address=f"{coordinator_host}:{port}" if port else coordinator_host,
    )


def set_megascale_environment(job: ClusterIdentity, original_address: str | None) -> None:
    """``MEGASCALE_*`` for ``job``: the slice count and id, and the coordinator's host with the
    port of the address the VM was given (a queued resource's ``host:8080``) if it had one."""
    host = job.coordinator_address.rsplit(":", 1)[0]
    port = original_address.rsplit(":", 1)[1] if original_address and ":" in original_address else None
    os.environ[MEGASCALE_NUM_SLICES_ENV] = str(job.num_slices)
    os.environ[MEGASCALE_SLICE_ID_ENV] = str(job.slice_id)
    os.environ[MEGASCALE_COORDINATOR_ENV] = f"{host}:{port}" if port else host


class RunComplete(Exception):  # noqa: N818 (not an error: the run ended while this process waited)
    """The run completed while this process waited in :func:`join` (a standby slice, or one whose peers
    finished without it): ``record`` is the completion marker (``step``, ``loss``); the process exits 0."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(f"the run is complete (step {record.get('step')})")
        self.record = record


@dataclasses.dataclass
class _Wait:
    """One wait's log lines: at most one per :data:`REPORT_S` for the same state."""

    said: str = ""
    at: float = 0.0

    def say(self, line: str) -> None:
        now = time.monotonic()
        if line != self.said or now - self.at >= REPORT_S:
            log.info("%s", line)
            self.said, self.at = line, now


def join(
    config: TrainConfig,
    run_dir: RunDir,
    identity: ClusterIdentity,
    beat: heartbeats.Heartbeat,
    *,
    shrink_after_s: float,
    grow_after_s: float,
    poll_s: float = POLL_S,
) -> tuple[ClusterIdentity, membership.Membership]:
    """Wait until this process's slice is a member of the newest epoch and every member is ready
    (see the module docstring); return its identity in that job and the epoch.

    Args:
      config: the trainer's config (its ``parallelism.dcn`` is the full slice count).
      run_dir: the run directory.
      identity: this process's place as its VM was allocated (every slice of the stack).
      beat: this process's heartbeat, already started.
      shrink_after_s, grow_after_s: the stack's ``multislice:elastic`` timings.
      poll_s: seconds between two looks.

    Raises:
      RunComplete: the run completed meanwhile (its marker, read at every look): nothing is left to join.
      membership.MembershipError: a record does not parse.
      OSError: the run directory cannot be read or written.
    """
    full = tuple(range(identity.num_slices))
    allowed = counts(config)
    entered = time.time()
    wait = _Wait()
    all_ready: tuple[int, float] | None = None  # (epoch, when every member was first seen ready)
    while True:
        done = completion.is_complete(run_dir, config.steps)
        if done is not None:
            log.info(
                "elastic: the run is complete (step %s): slice %d leaves the gate", done["step"], identity.slice_id
            )
            raise RunComplete(done)
        now = time.time()
        record = membership.current(run_dir, identity.num_slices)
        if record is None:
            record, _ = membership.propose(run_dir, None, full, step=None, reason="the run's start", now=now)
        beats = heartbeats.read_all(run_dir, identity.num_slices, identity.workers_per_slice, now)
        up = heartbeats.healthy(beats, now)
        seen = heartbeats.last_seen(beats)
        # Lost since its last heartbeat, but never before the epoch began: a member restarting for
        # a change (its heartbeat stale for a moment) is not taken for lost.
        lost_since = {s: max(seen.get(s, entered), record.time) for s in record.slices if s not in up}
        if record.epoch == 0 and record.step is None:  # the first start: a slice never seen may be late
            late = record.time + max(0.0, FIRST_START_WAIT_S - shrink_after_s)
            lost_since |= {s: max(since, late) for s, since in lost_since.items() if s not in seen}
        choice = elastic.decide(
            counts=allowed,
            members=record.slices,
            healthy=set(up),
            lost_since=lost_since,
            last_change=record.time,
            now=now,
            shrink_after_s=shrink_after_s,
            grow_after_s=_grow_after(record, grow_after_s),
        )
        growing = choice is not None and len(choice[0]) > len(record.slices)
        step = newest_checkpoint_step(run_dir) if choice is not None else None
        if step is not None and step >= config.steps:
            choice = None  # the final checkpoint is saved: the run completes as it is, no change after it
        if choice is not None and not (growing and beat.ready == record.epoch):
            slices, reason = choice
            after, mine = membership.propose(run_dir, record, slices, step=step, reason=reason, now=now)
            if mine:
                what = (
                    f"elastic: slices {len(record.slices)} → {len(after.slices)} ({reason}); epoch {after.epoch}: "
                    f"slices {', '.join(map(str, after.slices))}"
                )
                emit(no_action(what, "the job changes its slices by itself at a checkpoint"), log.warning)
            continue
        if identity.slice_id not in record.slices:
            beat.ready = None
            wait.say(
                f"elastic: standby: slice {identity.slice_id} is not in epoch {record.epoch} (slices "
                f"{', '.join(map(str, record.slices))}); waiting for the job to take it in"
            )
            time.sleep(poll_s)
            continue
        missing = [s for s in record.slices if s not in up]
        if missing:
            wait.say(
                f"elastic: waiting for slice(s) {', '.join(map(str, missing))} of epoch {record.epoch} "
                f"(shrinkAfter {shrink_after_s:g} s, minimum {min(allowed)} slice(s))"
            )
            time.sleep(poll_s)
            continue
        if beat.ready != record.epoch:
            beat.ready = record.epoch
            beat.beat()
            continue
        if all(b.ready == record.epoch for s in record.slices for b in up[s]):
            if all_ready is None or all_ready[0] != record.epoch:
                all_ready = (record.epoch, time.monotonic())
            if time.monotonic() - all_ready[1] < LAST_CALL_S:  # the last call: a proposal may still land
                time.sleep(min(poll_s, LAST_CALL_S))
                continue
            newest = membership.current(run_dir, identity.num_slices)
            if newest is not None and newest.epoch == record.epoch:
                job = renumbered(identity, record, up[record.slices[0]][0].host)
                log.info(
                    "elastic: epoch %d: training as slice %d of %d (slices %s), coordinator %s",
                    record.epoch,
                    job.slice_id,
                    job.num_slices,
                    ", ".join(map(str, record.slices)),
                    job.coordinator_address,
                )
                return job, record
            continue
        wait.say(f"elastic: epoch {record.epoch}: waiting for every member's workers to be ready")
        time.sleep(poll_s)


def grow_to(
    config: TrainConfig,
    run_dir: RunDir,
    record: membership.Membership,
    *,
    step: int,
    shrink_after_s: float,
    grow_after_s: float,
) -> membership.Membership | None:
    """At a checkpoint of a job of ``record``'s slices: the next epoch (proposed here, or another
    writer's) when a slice is back and ``grow_after_s`` has passed since the last change, or any
    newer epoch already there; None to go on. The caller saves ``step`` and restarts.

    Raises:
      membership.MembershipError: a record does not parse.
      OSError: the run directory cannot be read or written.
    """
    if step >= config.steps:
        return None  # the final checkpoint: the run completes in this epoch
    slices = config.parallelism.dcn.product
    newest = membership.current(run_dir, slices)
    if newest is not None and newest.epoch != record.epoch:
        return newest
    now = time.time()
    grow_after_s = _grow_after(record, grow_after_s)
    if now - record.time < grow_after_s:
        return None
    up = heartbeats.healthy(heartbeats.read_all(run_dir, slices, now=now), now)
    choice = elastic.decide(
        counts=counts(config),
        members=record.slices,
        healthy=set(up),
        lost_since={},
        last_change=record.time,
        now=now,
        shrink_after_s=shrink_after_s,
        grow_after_s=grow_after_s,
    )
    if choice is None or len(choice[0]) <= len(record.slices):
        return None
    after, _ = membership.propose(run_dir, record, choice[0], step=step, reason=choice[1], now=now)
    return after


def _grow_after(record: membership.Membership, grow_after_s: float) -> float:
    """``growAfter`` for a job of ``record``'s slices: none when it left slices out before the run's
    first checkpoint (late at the first start: :data:`FIRST_START_WAIT_S`), else ``grow_after_s``."""
    return 0.0 if record.step is None and record.epoch > 0 else grow_after_s


def enter(
    config: TrainConfig, run_dir: RunDir, identity: ClusterIdentity
) -> tuple[heartbeats.Heartbeat, ClusterIdentity, Resizer]:
    """Start this process's heartbeat, :func:`join`, set ``MEGASCALE_*`` for the job: ``(the
    heartbeat, to stop when the process ends; the identity in the job; its Resizer)``.

    Raises:
      RunComplete, membership.MembershipError, OSError: as :func:`join` (the heartbeat stopped).
    """
    beat = heartbeats.Heartbeat(run_dir, identity.slice_id, identity.worker, identity.workers_per_slice, identity.host)
    beat.start()
    original_address = os.environ.get(MEGASCALE_COORDINATOR_ENV)
    try:
        job, record = join(
            config, run_dir, identity, beat, shrink_after_s=config.shrink_after_s, grow_after_s=config.grow_after_s
        )
    except BaseException:
        beat.stop()
        raise
    set_megascale_environment(job, original_address)
    return beat, job, Resizer(config, run_dir, record)


class Resizer:
    """A running elastic job's side of a change: :meth:`at_checkpoint` on every process at every
    checkpoint step (the same steps everywhere: the checkpoint policy), after the save.

    Args:
      config: the trainer's config (``shrink_after_s``, ``grow_after_s``).
      run_dir: the run directory.
      record: the epoch this job trains in.
    """

    def __init__(self, config: TrainConfig, run_dir: RunDir, record: membership.Membership) -> None:
        self.config, self.run_dir, self.record = config, run_dir, record

    def at_checkpoint(self, step: int, is_coordinator: bool) -> membership.Membership | None:
        """The epoch the job restarts into after this checkpoint, or None to go on: process 0 asks
        :func:`grow_to` and every process learns its answer through the coordination service
        (:func:`training.agreement.all_gather`), so all stop at the same step.

        Raises:
          agreement.AgreementError: a peer did not answer in time.
        """
        from training import agreement

        epoch = ""
        if is_coordinator:
            try:
                after = grow_to(
                    self.config,
                    self.run_dir,
                    self.record,
                    step=step,
                    shrink_after_s=self.config.shrink_after_s,
                    grow_after_s=self.config.grow_after_s,
                )
            except (OSError, membership.MembershipError) as err:  # no reason to stop training
                what = f"elastic: the membership could not be read at step {step} ({err}); going on"
                emit(no_action(what, "training goes on with its slices"), log.warning)
                after = None
            epoch = "" if after is None else str(after.epoch)
        answers = [a for a in agreement.all_gather(f"elastic/{step}", epoch) if a]
        if not answers:
            return None
        return membership.read(self.run_dir, int(answers[0]), self.config.parallelism.dcn.product)
