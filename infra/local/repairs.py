"""Faults and repairs in ``multislice local up``, on every backend: a fault strikes a slice's workers,
the platform repairs the slice, a reset restarts every worker.

:class:`Repairs` does what Cloud TPU's auto-repair does after a maintenance event, a preemption or a
hardware fault (the Multislice overview; https://cloud.google.com/tpu/docs/failure-recovery): the failed
slice is recreated as a whole (its workers' disks wiped), every other slice is restarted (the job's
processes cannot go on without the failed slice's), and training resumes from the newest checkpoint.
The backend's :class:`~infra.backends.interface.Emulation` says where that differs:

* **queued-resource**: as above (Cloud TPU's auto-repair);
* **compute-engine**: a group that recreates its VM itself (per-VM repair), and a slice in a managed
  capacity mode, which Compute Engine recovers itself, are repaired as above; a multi-host Spot slice
  (:attr:`~infra.backends.interface.Emulation.repairs_slices` False) stays down until a VM's slice
  watch asks the emulated Compute API to recreate its VMs (:meth:`Repairs.await_recreation`;
  docs/compute-engine.md, section 5);
* **gke**: JobSet recreates every child Job, so every slice's Pods start again as new Pods
  (:attr:`~infra.backends.interface.Emulation.recreates_every_slice`; docs/gke.md section 5): the failed
  slice's on new nodes (empty disks), the others' on their nodes, whose cache of releases and
  virtualenvs they find again (a ``hostPath``: infra/backends/gke/jobset.py).

``multislice local reset`` restarts every worker (:meth:`Repairs.reset`). The faults themselves (which
slice, at which step, SIGTERM or SIGKILL) are :mod:`infra.local.faults`'s.

A slice whose capacity is withheld (``--withhold``: :mod:`infra.local.withholds`) has no VM until its
capacity is back: no repair, reset or fault boots it meanwhile (the emulator boots no worker of it:
:meth:`infra.local.emulated_stack.EmulatedStack.boot_all`), and a fault aimed at it strikes nothing; once
back it is recreated once (:meth:`Repairs.release_withheld`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from infra.backends.interface import Emulation
from infra.config import StackConfig
from infra.emulated import stop_signals, supervisor
from infra.emulated.state import say_in_logs
from infra.emulated.vm import process_groups, trainer_attempts
from infra.local.faults import Fault, FaultGates
from infra.local.idle_capacity import IdleCapacity
from infra.local.options import EmulationError, Options
from infra.local.progress import RunReporter
from infra.local.withholds import Withhold, returned
from infra.local.workers import Workers

#: The line ``local reset`` appends to each VM's log before its SIGTERM: the trainer cannot tell a
#: reset's stop notice from a preemption's (training/preemption.py); the emulator knows, and says so
#: where the trainer's own line follows (as ``local down`` does: infra/emulated/teardown.py).
RESET_LINE = (
    "local reset: a reset you asked for (multislice local reset); the trainer's stop notice below is this reset\n"
)


class Repairs:
    """The faults struck and the repairs and resets carried out in one ``local up``.

    Args:
      config: the validated stack.
      workers: the run's workers.
      capacity: the backend's side of the emulation (how it repairs: see the module docstring).
      gates: where the bundled trainer waits for a fault's step (:class:`~infra.local.faults.FaultGates`).
      reporter: what the run shows (drained before a repair's lines).
      report: ``(message) -> None`` for events.
      boot: boots every worker again (:meth:`infra.local.emulated_stack.EmulatedStack.boot_all`).
    """

    def __init__(
        self,
        config: StackConfig,
        workers: Workers,
        capacity: Emulation,
        gates: FaultGates,
        reporter: RunReporter,
        report: Callable[[str], None],
        boot: Callable[..., None],
    ) -> None:
        self.config = config
        self.workers = workers
        self.capacity = capacity
        self.gates = gates
        self.reporter = reporter
        self.report = report
        self.boot = boot
        #: Repairs carried out (one per fault).
        self.repaired = 0
        #: ResetQueuedResource requests carried out (``multislice local reset``), and when (``time.time()``).
        self.resets = 0
        self.reset_times: list[float] = []
        self.faults_fired: list[str] = []
        #: For each fault in :attr:`faults_fired`, the newest step the attempt it struck
        #: reported (read once every process of that attempt was gone): where it really fired.
        self.fault_steps: list[int] = []
        #: Slice → its withhold, while its capacity is withheld (``--withhold``).
        self.withheld: dict[int, Withhold] = {}
        #: Slice → when (``time.monotonic()``) its capacity returns, for a withhold of ``seconds``.
        self._back_at: dict[int, float] = {}
        self._withhold_left: dict[int, Withhold] | None = None
        #: Slice → (the ``until-step`` withhold's step, ``time.time()`` at its boot): recreated beside the
        #: running slices, which wait at that step until its trainers are up (:meth:`let_go_returned`).
        self.returning: dict[int, tuple[int, float]] = {}
        #: Withheld slices recreated with a restart of every other slice (a restart the emulation asked for).
        self.returned_with_restart = 0
        #: Slice-seconds the other slices held capacity without training while one was withheld.
        self.idle = IdleCapacity(config, capacity)

    def summary(self) -> dict[str, Any]:
        """The run summary's rows of this ``local up``'s repairs: ``repairs``, ``faults``, ``fault_steps``, and
        once a slice's capacity was withheld, ``idle_capacity_slice_seconds`` (:mod:`infra.local.idle_capacity`)."""
        rows: dict[str, Any] = {
            "repairs": self.repaired,
            "faults": list(self.faults_fired),
            "fault_steps": list(self.fault_steps),
        }
        if self.idle.counted:
            rows["idle_capacity_slice_seconds"] = round(self.idle.seconds, 1)
        return rows

    def inject(
        self, fault: Fault, options: Options, observed_step: int, settle: Callable[[], Any] = lambda: None
    ) -> bool:
        """Strike the fault's slice (``kill``: SIGKILL; ``preempt``: SIGTERM, then SIGKILL
        after ``preempt_grace_s``), then :meth:`repair` (``settle`` runs once every process
        of the struck attempt is gone, before the reboot; it may return the ``(events,
        metrics)`` records that attempt wrote last); ``crash`` strikes the slice's trainers
        only and repairs nothing (:meth:`_crash`). :attr:`fault_steps` gets the newest step
        the struck attempt reported: ``observed_step`` or a later one it synced meanwhile.

        Returns whether it struck: a slice whose capacity is withheld has no VM to strike, and is
        not repaired (that would boot it before its capacity is back); its step's gate opens."""
        if fault.kind == "crash":
            return self._crash(fault, observed_step)
        if fault.slice_id in self.withheld:
            self.gates.strike(fault.step)
            self.report(
                f"fault: {fault}: nothing to strike, slice {fault.slice_id} has no VMs (its capacity is withheld "
                f"{self.withheld[fault.slice_id]}: --withhold)"
            )
            return False
        # The emulator polls the metrics log, so training may already be past the fault's step
        # (a fast step, a loaded machine); the report says where training actually was.
        targets = process_groups(self.workers.of_slice(fault.slice_id))
        how = "SIGTERM, then SIGKILL after grace" if fault.kind == "preempt" else "SIGKILL"
        self.report(f"fault: {fault} ({how}; training had reported step {observed_step})")
        self.faults_fired.append(str(fault))
        if fault.kind == "preempt":
            # The trainers wait at the fault's step (training.fault_gate): the notice reaches them
            # there, then they go on to the job's agreed step and save.
            supervisor.stop_groups(targets, options.preempt_grace_s, after_signal=lambda: self.gates.strike(fault.step))
        else:
            supervisor.kill_groups(targets)
            self.gates.strike(fault.step)
        if self._withhold_left is None:
            self._withhold_left = dict(options.withhold)
        withhold = self._withhold_left.pop(fault.slice_id, None)
        if not self.capacity.repairs_slices and withhold is None:
            self.reporter.drain()
            self.await_recreation(fault.slice_id, options)
        reached = [observed_step]

        def settled() -> None:
            last = settle()
            if last:
                reached.extend(int(r["step"]) for r in last[1] if "loss" in r)

        if withhold is not None:
            self.withhold(fault.slice_id, withhold, settled)
            self._recreate_beside_withheld(fault.slice_id, options)
        else:
            self.repair(fault.slice_id, options, settled)
        self.fault_steps.append(max(reached))
        return True

    def _crash(self, fault: Fault, observed_step: int) -> bool:
        """An application failure: SIGKILL the trainer attempts of the fault's slice, not its VMs, and
        repair nothing (each trainer unit restarts its trainer; the other slices' trainers end on the
        lost peer and are restarted by theirs). Whether any attempt was struck."""
        attempts = trainer_attempts(self.workers.of_slice(fault.slice_id))
        if not attempts:
            self.gates.strike(fault.step)
            self.report(f"fault: {fault}: nothing to strike, no trainer runs on slice {fault.slice_id}'s VMs")
            return False
        self.report(
            f"fault: {fault} (SIGKILL to its trainer, pid {', '.join(map(str, attempts))}; the VMs stay up and "
            f"their units restart the trainers; training had reported step {observed_step})"
        )
        self.faults_fired.append(str(fault))
        for pid in attempts:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.gates.strike(fault.step)  # the other slices' trainers go on, to the lost peer
        self.fault_steps.append(observed_step)
        return True

    def withhold(self, slice_id: int, withhold: Withhold, settle: Callable[[], None]) -> None:
        """The struck slice gets no capacity for ``withhold.seconds`` or until the run reaches
        ``withhold.until_step`` (``--withhold``): its VMs stay down (their disks wiped) and the other slices
        are left as they are (their trainers end on the lost peer and their units restart them; an elastic
        run goes on without it: training/membership_gate.py) until :meth:`release_withheld`."""
        struck = self.workers.of_slice(slice_id)
        supervisor.kill_groups(process_groups(struck))
        self.workers.wipe(struck)
        settle()
        self.withheld[slice_id] = withhold
        self.idle.withheld(self.withheld)
        if withhold.seconds is not None:
            self._back_at[slice_id] = time.monotonic() + withhold.seconds
        self.reporter.drain()
        others = "" if self.capacity.recreates_every_slice else "; the other slices run on"  # JobSet: below
        self.report(f"capacity: none for slice {slice_id} {withhold} (--withhold){others}")

    def release_withheld(self, options: Options, step: int = 0) -> bool:
        """Recreate a slice whose withheld capacity is back (its seconds passed, or the run reported its
        ``until-step``: ``step`` is the run's newest), as the platform does: where it restarts every other
        slice (:attr:`~infra.backends.interface.Emulation.restarts_every_slice`), :meth:`repair`; else the
        slice alone boots (after a VM asked to recreate it, where the platform does not by itself), and an
        ``until-step`` withhold's gate stays shut until its trainers are up (:meth:`let_go_returned`).
        Returns whether one was recreated."""
        now = time.monotonic()
        due = [
            s
            for s, withhold in self.withheld.items()
            if (step >= withhold.until_step if withhold.until_step is not None else now >= self._back_at[s])
        ]
        if not due:
            return False
        slice_id = due[0]
        withhold = self.withheld.pop(slice_id)
        self.idle.withheld(self.withheld)
        self._back_at.pop(slice_id, None)
        reached = f" (the run reached step {withhold.until_step})" if withhold.until_step is not None else ""
        self.report(f"capacity: slice {slice_id}'s capacity is back{reached}")
        if not self.capacity.repairs_slices:
            self.await_recreation(slice_id, options)
        if self.capacity.recreates_every_slice:  # JobSet recreated every Job at the fault: its Pods start now
            self._start_returned(slice_id, options)
            return True
        if self.capacity.restarts_every_slice:
            if withhold.until_step is not None:  # every slice restarts with it: no later boot waits there
                self.gates.let_go(withhold.until_step, open_now=False)
            self.repair(slice_id, options)
            self.returned_with_restart += 1
            return True
        self.reporter.drain(repair=True)
        self.report(f"repair: recreating slice {slice_id}; the other slices go on")
        self.repaired += 1
        self.capacity.repaired(slice_id)
        booted_at = time.time()
        self.boot(options, only=self.workers.of_slice(slice_id))
        if withhold.until_step is not None:
            self.returning[slice_id] = (withhold.until_step, booted_at)
        return True

    def let_go_returned(self, run_dir: Any) -> None:
        """Let the running slices go on past the step of an ``until-step`` withhold once every trainer of its
        recreated slice heartbeats (:func:`infra.local.withholds.returned`): it stands by, and the job takes
        it in at its next checkpoint (docs/faults.md, "Elastic slices")."""
        for slice_id, (step, since) in list(self.returning.items()):
            if returned(run_dir, slice_id, self.config.accelerator.hosts, since):
                del self.returning[slice_id]
                self.gates.let_go(step)
                self.report(f"capacity: slice {slice_id}'s trainers are up; the run goes on past step {step}")

    def running(self) -> list[Any]:
        """The workers whose capacity is not withheld: those the emulation expects to be running."""
        down = self.without_capacity()
        return [vm for vm in self.workers.vms if vm.slice_id not in down]

    def without_capacity(self) -> set[int]:
        """The slices none of whose workers may run: those whose capacity is withheld and, while any is, every
        slice where the platform starts none before all have capacity
        (:attr:`~infra.backends.interface.Emulation.all_slices_or_none`: GKE's queued provisioning)."""
        if self.withheld and self.capacity.all_slices_or_none:
            return set(range(self.config.slices))
        return set(self.withheld)

    def _recreate_beside_withheld(self, slice_id: int, options: Options) -> None:
        """Where the platform recreates every slice after a failure (JobSet:
        :attr:`~infra.backends.interface.Emulation.recreates_every_slice`), the other slices' workers start
        again now as new Pods on their nodes, and the withheld slice's wait for nodes (its capacity); where no
        slice starts before every slice has capacity (GKE's queued provisioning), none starts until then."""
        if not self.capacity.recreates_every_slice:
            return
        others = [vm for vm in self.workers.vms if vm.slice_id not in self.withheld]
        supervisor.stop_groups(process_groups(others), options.reboot_grace_s)
        self.workers.new_containers(others)
        if self.capacity.all_slices_or_none:
            self.report(
                f"capacity: every slice or none (queued provisioning): no Pod starts until slice {slice_id} has "
                "capacity too; the other slices hold none meanwhile"
            )
            return
        waiting = sorted({vm.slice_id for vm in others})
        self.report(
            f"repair: JobSet recreates every Job: slice(s) {', '.join(map(str, waiting))} start again on their nodes "
            f"and hold them without training until slice {slice_id} has capacity"
        )
        self.boot(options)

    def _start_returned(self, slice_id: int, options: Options) -> None:
        """A withheld slice's capacity is back where JobSet recreated every Job at the fault
        (:meth:`_recreate_beside_withheld`): its Pods start on new nodes and join the waiting ones; with every
        slice or none (queued provisioning) every Pod starts, once no slice is withheld any more."""
        self.reporter.drain(repair=True)
        self.repaired += 1
        self.capacity.repaired(slice_id)
        if self.capacity.all_slices_or_none:
            if self.withheld:
                return  # another slice still has no capacity: still no Pod
            self.report("repair: every slice has capacity: every Pod starts (queued provisioning)")
            self.boot(options)
            return
        self.report(f"repair: slice {slice_id}'s Pods start on new nodes; the waiting slices take them in")
        self.boot(options, only=self.workers.of_slice(slice_id))

    def repair(self, failed_slice: int, options: Options, settle: Callable[[], None] = lambda: None) -> None:
        """Cloud TPU auto-repair: recreate the failed slice (its VMs stopped and their disks
        wiped), restart every other slice (SIGTERM, ``reboot_grace_s``, SIGKILL), then call
        ``settle`` (no process of the old attempt is left to write a record) and boot all, but a slice
        whose capacity is withheld (it has no VM: the line says it stays without capacity)."""
        others = [s for s in self.workers.slices_but(failed_slice) if s not in self.withheld]
        withheld = sorted(self.withheld)
        self.reporter.drain(repair=True)
        note = self.capacity.repair_note
        self.report(
            f"repair: recreating slice {failed_slice}"
            + (f", restarting slice(s) {', '.join(map(str, others))}" if others else "")
            + (f" ({note})" if note else "")
            + (f"; slice(s) {', '.join(map(str, withheld))} stay without capacity (--withhold)" if withheld else "")
        )
        failed = self.workers.of_slice(failed_slice)
        supervisor.kill_groups(process_groups(failed))
        self.workers.wipe(failed)
        restarted = [vm for vm in self.workers.others(failed_slice) if vm.slice_id not in self.withheld]
        supervisor.stop_groups(process_groups(restarted), options.reboot_grace_s)
        if self.capacity.recreates_every_slice:
            self.workers.new_containers(restarted)  # JobSet recreates every Job
        settle()
        self.repaired += 1
        self.capacity.repaired(failed_slice)
        self.boot(options)

    def reset(self, options: Options) -> None:
        """``multislice local reset`` (the capacity's :attr:`reset_line`): restart every VM (SIGTERM,
        ``reset_grace_s``, SIGKILL; a new container where the platform makes new Pods) and boot it again;
        training resumes from the newest finalized checkpoint, the one saved on the SIGTERM if any."""
        self.reporter.drain()
        self.report(self.capacity.reset_line)
        self.resets += 1
        self.reset_times.append(time.time())
        self.reporter.stopping_for = "the reset"  # its stop notice is no preemption: say so
        say_in_logs((vm.log_path for vm in self.running()), RESET_LINE)
        supervisor.stop_groups(process_groups(self.running()), options.reset_grace_s)
        if self.capacity.recreates_every_slice:
            self.workers.new_containers(self.running())  # a resumed JobSet's Pods are new Pods
        self.boot(options)  # a withheld slice's workers stay down

    def await_recreation(self, lost_slice: int, options: Options) -> None:
        """A struck slice that the platform does not recreate by itself (see the module docstring):
        mark it lost (:meth:`Emulation.lost`) and wait, polling every ``options.poll_s`` for at most
        ``options.stall_timeout_s``, until a VM asked to recreate it (:meth:`Emulation.take_recreated`).

        Raises:
          EmulationError: no VM of another slice is left to ask (a one-slice stack: the message says
            how to recreate the group on Compute Engine), or none asked in time.
          Interrupted: Ctrl-C, SIGTERM or SIGHUP meanwhile.
        """
        group = self.config.node_ids[lost_slice]
        self.capacity.lost(lost_slice)
        if self.workers.only(lost_slice):
            hosts = self.config.accelerator.hosts
            raise EmulationError(
                f"slice {lost_slice} lost its VMs, and neither its group {group} nor Compute Engine recreates a "
                "Spot slice (docs/compute-engine.md, section 5); no other slice is left whose slice watch could "
                f"recreate it. On Compute Engine: gcloud compute instance-groups managed resize {group} --size=0 "
                f"--zone={self.config.zone} --project={self.config.project}, then the same with --size={hosts}"
            )
        self.report(
            f"repair: slice {lost_slice}'s VMs are down and neither its group nor Compute Engine recreates a Spot "
            "slice; waiting for a VM's slice watch to recreate the slice's VMs"
        )
        deadline = time.monotonic() + options.stall_timeout_s
        while lost_slice not in self.capacity.take_recreated():
            stop_signals.raise_if_signalled()
            if time.monotonic() > deadline:
                raise EmulationError(
                    f"no VM asked to recreate group {group} within {options.stall_timeout_s:.0f} s "
                    "(--stall-timeout; the slice watch: slice-watch.sh)"
                )
            time.sleep(options.poll_s)
        self.report(f"repair: a VM asked to recreate group {group}'s VMs (instanceGroupManagers.resize to 0 and back)")
