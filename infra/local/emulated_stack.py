"""The local emulation of a stack, on every backend: ``multislice local up``'s engine.

``EmulatedStack(config, paths, script).up(...)`` runs, on this machine, what the stack runs in the
cloud, whatever its ``multislice:backend``:

* its workers (:mod:`infra.local.workers`): one process group per TPU VM, or per GKE Pod on a gke
  stack (slices × workers per slice), each booting the stack's startup script exactly as rendered for
  the cloud (infra.startup), with its own loopback metadata server answering what a worker of the stack
  is told (``infra.local.topology``);
* the backend's side (:meth:`infra.backends.interface.Backend.emulation`): the emulated cloud API its
  workers talk to and how its platform repairs a slice. How ``local up`` runs a gke stack: this class
  with :class:`infra.backends.gke.emulation.GkeEmulation` (Pods as processes, JobSet's restart of every
  Job); a compute-engine stack: :mod:`infra.backends.compute_engine.emulation` (the emulated Compute
  API); a queued resource: :mod:`infra.backends.queued_resource.emulation` (the loopback Cloud TPU API);
* ``chips per host`` CPU devices per worker (``JAX_NUM_CPU_DEVICES``), ``JAX_PLATFORMS=cpu``; only the
  venv step differs: ``MULTISLICE_PYTHON`` points the script at this machine's virtualenv;
* the checkpoint bucket is the stack's, ``StackConfig.bucket_name``, served by a loopback Cloud Storage
  (``infra.emulated.gcs``, one per stack, persistent under the stack's state directory); every worker gets
  the run directory ``pulumi up`` gives it, ``gs://<bucket>/runs/<run name>``, and the environment that
  points the trainer's storage clients at the server, as the emulator reads the run.

It injects faults (infra.local.faults) when training reports the given step, and repairs the struck
slice as the backend's platform does (:mod:`infra.local.repairs`); training resumes. ``multislice local
reset`` restarts every worker; where the backend deletes its capacity on completion, the emulated API
records it and the emulator stops the workers still running.

Nothing is left behind: Ctrl-C / SIGTERM / errors stop every VM (SIGTERM, grace, SIGKILL:
``infra.emulated.supervisor``), every metadata server and the storage server. If the emulator
itself dies (SIGKILL included), every VM and the storage server stop by themselves within
``lifeline.ORPHAN_STOP_S`` (``infra.emulated.lifeline``); ``emulator.json`` in the stack's state
directory records them so ``multislice local down`` can stop anything left. If the storage
server stops during a run, every VM is stopped and the run can be resumed by running
``multislice local up`` again. A VM whose trainer has not started ``boot_timeout_s`` after its
boot is named (``infra.local.boot_watch``).
"""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from infra import invocation
from infra.backends.operations import backend_of
from infra.config import StackConfig
from infra.emulated import state as state_lib, stop_signals, supervisor
from infra.emulated.gcs import GcsServer, GcsServerError, bucket_name_error
from infra.emulated.gcs_clients import point_clients_at
from infra.emulated.ports import free_port
from infra.emulated.state import EMULATION_ID_ENV, LocalPaths
from infra.emulated.supervisor import GroupFailed
from infra.emulated.vm import EmulatedVM, process_groups
from infra.local import topology
from infra.local.boot_watch import BootWatch
from infra.local.faults import FaultGates, FaultSchedule
from infra.local.options import EmulationError, Interrupted, Options
from infra.local.progress import BootLines, MembershipChanges, ProgressSample, ProgressTail, RunReporter
from infra.local.repairs import Repairs
from infra.local.tails import MetricsTail, RecordTail, indented_tail
from infra.local.workers import Workers
from training.run_dir import RunDir
from training.warning_text import act, as_line

#: Seconds :meth:`EmulatedStack.shutdown` gives the VMs between SIGTERM and SIGKILL.
SHUTDOWN_GRACE_S = 5.0


class EmulatedStack:
    """Run a stack's slices, on any backend, as local processes (see the module docstring).

    Args:
      config: the validated stack.
      paths: state directories.
      startup_script: the rendered startup script text.
      report: ``(message) -> None`` for progress and events.
      gcs_port: a fixed port for the storage server (None: a free one).
      progress: ``(ProgressSample) -> None``, called at each new training step or restart seen (None: a
        ``report`` line at each tenth of the run).
      emulation_id: the id its processes carry (``state.EMULATION_ID_ENV``; None: a new one).
      uploads: bucket objects ``pulumi up`` writes that the VMs read (name → bytes; a command's
        source too large for the startup script), written to the emulated bucket when it serves.
    """

    def __init__(
        self,
        config: StackConfig,
        paths: LocalPaths,
        startup_script: str,
        report: Callable[[str], None] = print,
        gcs_port: int | None = None,
        progress: Callable[[ProgressSample], None] | None = None,
        emulation_id: str | None = None,
        uploads: dict[str, bytes] | None = None,
    ) -> None:
        self.config = config
        self.uploads = dict(uploads or {})
        self.paths = paths
        self.startup_script = startup_script
        self.report = report
        #: What the run shows while it goes on: events, the first VM's boot lines, progress.
        self.reporter = RunReporter(report, progress)
        self.emulation_id = emulation_id or uuid.uuid4().hex
        self.boot_watch = BootWatch()
        #: Every boot holds its trainers at the steps of the faults still to strike, until struck.
        self.gates = FaultGates(
            paths.root / "fault-gate", holds_dir=paths.holds_dir, bundled_trainer=config.workload is None
        )
        self.storage = GcsServer(
            paths.gcs_root, paths.gcs_log, port=gcs_port, env={EMULATION_ID_ENV: self.emulation_id}
        )
        self._restore_env: Callable[[], None] = lambda: None
        self._port = 0  # the coordinator port of the last boot
        #: The backend's side: its emulated API (on the queued resource, the TPU API that serves
        #: deleteOnComplete and reset), what each VM's metadata server answers, the capacity's fate.
        self.capacity = backend_of(config).emulation(config, paths)
        #: The run's VMs (Pods on gke), with their metadata servers.
        self.workers = Workers(config, paths, self.capacity)
        #: The faults struck, the repairs and resets carried out.
        self.repairs = Repairs(config, self.workers, self.capacity, self.gates, self.reporter, report, self.boot_all)
        #: The run directory, read by this process through :attr:`storage`.
        self.run_dir = RunDir(config.run_dir)

    @property
    def vms(self) -> list[EmulatedVM]:
        """Every worker's VM (or Pod), slice by slice."""
        return self.workers.vms

    # Lifecycle ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def running(self) -> Iterator[EmulatedStack]:
        """Serve the stack's bucket (:meth:`open_storage`) for the block; on leaving it, however
        it is left, stop every VM and server (:meth:`shutdown`). Ctrl-C, SIGTERM and SIGHUP
        raise :class:`Interrupted` inside the block.

        Raises:
          GcsServerError: the storage server cannot start (nothing else was started).
        """
        with stop_signals.signals_raise(Interrupted, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
            try:
                self.open_storage()
                yield self
            finally:
                with stop_signals.signals_deferred():  # a second Ctrl-C does not cut it short
                    self.shutdown()

    def open_storage(self) -> None:
        """Start the storage server, create the stack's bucket (if new), point this process's
        storage clients at the server until :meth:`shutdown`, and record the state.

        Raises:
          GcsServerError: the bucket name would be refused by Cloud Storage, or the server
            cannot start.
        """
        bucket = self.config.bucket_name
        problem = bucket_name_error(bucket)
        if problem:
            raise GcsServerError(
                f"the stack's bucket name {bucket!r} (multislice:bucket.name, default <gcp:project>-<stack>-ckpt) "
                f"would be refused by Cloud Storage: {problem}"
            )
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.storage.start()
        self._restore_env = point_clients_at(self.storage.url)
        self._record_state()
        self.storage.create_bucket(bucket)
        for name, data in sorted(self.uploads.items()):
            self.storage.upload(bucket, name, data)

    def _record_state(self) -> None:
        state_lib.write_state(
            self.paths,
            stack=self.config.stack,
            emulation_id=self.emulation_id,
            vms=[{"slice": vm.slice_id, "worker": vm.worker, "node": vm.node, "pgid": vm.pgid} for vm in self.vms],
            storage_url=self.storage.url if self.storage.alive() else None,
            tpu_api_url=self.capacity.api_url,
        )

    def create(self) -> None:
        """Create the slices (the backend's emulated API: :meth:`infra.backends.interface.Emulation.start`)
        and their workers (:meth:`Workers.create`)."""
        self.capacity.start()
        self.workers.create()

    def boot_all(self, options: Options, only: list[EmulatedVM] | None = None) -> None:
        """Give every worker its metadata and environment (a fresh coordinator port unless fixed),
        boot it, and record the process groups in the state file. With ``only``, boot those workers
        alone, with the coordinator port of the running ones (a slice recreated beside them). A worker
        of a slice whose capacity is withheld (``--withhold``: :attr:`Repairs.withheld`) is never booted:
        whatever boots (a repair, a reset), that slice stays down until its capacity is back."""
        port = self._port if only is not None and self._port else (options.coordinator_port or free_port())
        self._port = port
        env = (
            topology.vm_environment(
                self.config,
                emulation_id=self.emulation_id,
                coordinator_port=port,
                heartbeat_timeout_s=options.heartbeat_timeout_s,
                init_timeout_s=options.init_timeout_s,
                storage_env=self.storage.client_env(),
                paths=self.paths,
            )
            | self.capacity.environment()
        )
        env.update(self.gates.boot() if only is None else self.gates.beside())
        # The boot watch first: a VM may show its trainer's start before the last VM boots.
        down = self.repairs.without_capacity()
        booting = [vm for vm in (self.vms if only is None else only) if vm.slice_id not in down]
        self.workers.boot(env, self.startup_script, before=lambda: self.boot_watch.booted(booting), only=booting)
        self._record_state()

    def stop_vms(self) -> None:
        """Stop every VM (SIGTERM, short grace, SIGKILL), metadata server and the TPU API."""
        self.workers.stop(SHUTDOWN_GRACE_S)
        self.capacity.stop()

    def shutdown(self) -> None:
        """Stop every VM and metadata server, then the storage server; forget the state file."""
        self.stop_vms()
        self.storage.stop()
        self._restore_env()
        state_lib.forget_state(self.paths)

    def storage_stopped(self) -> EmulationError:
        """The error for a storage server that stopped during the run."""
        return EmulationError(
            f"the emulated Cloud Storage (fake-gcs-server on {self.storage.url}) "
            f"stopped ({self.storage.exit_description()}); "
            f"every emulated VM was stopped; its log: {self.storage.log_path}; "
            f"run `{invocation.command('local up', self.config.stack)}` again to resume from the last checkpoint"
        )

    # Main loop ------------------------------------------------------------------------------

    def up(self, options: Options) -> dict[str, Any]:
        """Boot every VM, supervise until the run completes, return the run summary. Call it
        inside :meth:`running` (the storage server must be up).

        Raises:
          EmulationError: a VM gave up, the storage server stopped, no progress for
            ``stall_timeout_s``, or the run exceeded ``timeout_s``; every VM is stopped first.
          Interrupted: Ctrl-C / SIGTERM; every VM is stopped first.
        """
        start = time.monotonic()
        started_at = time.time()  # restarts of this `local up`: those whose start event is later
        tail = ProgressTail(self.run_dir, warn=self.report)
        tail.poll()
        events = self.reporter.events = RecordTail(self.run_dir, "events", warn=self.report)
        # The run's earlier starts (earlier `local up`s): restarts count from its first start.
        self.reporter.starts = sum(e.get("event") == "start" for e in events.poll())
        total = self.config.total_steps
        schedule = FaultSchedule(options.faults, run_step=tail.last_step)
        pending = {fault.slice_id for fault in schedule.pending}  # a withhold whose fault is skipped never holds
        waits = [w.until_step for s, w in options.withhold.items() if w.until_step is not None and s in pending]
        self.gates.follow(schedule, options.holds, waits)
        for fault in schedule.skipped:
            self.report(f"note: {fault} will not fire: the run is already at step {tail.last_step}")
        try:
            self.create()
            self.report(
                f"booting {len(self.vms)} VM(s): {self.config.slices} slice(s) × {self.config.accelerator.hosts} "
                f"worker(s) of {self.config.accelerator_type}, "
                f"{self.config.accelerator.chips_per_host} CPU devices each"
            )
            if self.workers.node_line is not None:
                self.report(self.workers.node_line)
            every_vm = invocation.command("local logs", self.config.stack)
            self.reporter.boot_lines = BootLines(self.vms[0].name, self.vms[0].log_path, every_vm)
            self.boot_all(options)
            self._supervise(options, schedule, tail, events, start)
        finally:
            self.stop_vms()
        self.report(self.capacity.line())
        from infra.local import summary as summary_lib  # reads checkpoints: jax, orbax

        result = summary_lib.summarize(self.run_dir, total, self.config.training.eval_every_steps)
        summary_lib.name_own_resume(result, self.run_dir, since=started_at)  # the user's own stop
        summary_lib.name_resets(result, self.run_dir, self.repairs.reset_times)  # and resets
        unplanned = summary_lib.unplanned_restarts(
            self.run_dir,
            since=started_at,
            planned=len(self.repairs.faults_fired) + self.repairs.resets + self.repairs.returned_with_restart,
        )
        if unplanned:
            warning = act(
                f"{len(unplanned)} restart(s) that no fault or reset asked for ({'; '.join(unplanned)})",
                f"find their cause in the VMs' logs: {self.paths.logs_dir}",
            )
            self.report(as_line(warning))
        result.update(
            {
                "unplanned_restarts": unplanned,
                "wall_seconds": round(time.monotonic() - start, 3),
                **self.repairs.summary(),
                "capacity": self.capacity.outcome,
                "logs_dir": str(self.paths.logs_dir),
            }
        )
        return result

    def _supervise(
        self, options: Options, schedule: FaultSchedule, tail: MetricsTail, events: RecordTail, start: float
    ) -> None:
        """Follow the run until every VM's startup script exited 0 (see :meth:`up`)."""
        last_report_step, last_report_restarts = tail.last_step, self.reporter.restarts
        changes = MembershipChanges(self.run_dir, self.report)  # fed the events read() reads

        def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            """New (events, metrics) records, reported. Events first: an attempt writes its
            ``start`` before its first step, so its steps never arrive ahead of it."""
            nonlocal last_report_step, last_report_restarts
            try:
                new_events = events.poll()
                for event in new_events:  # before the metrics: a new attempt's steps are its own
                    if event.get("event") == "start" and isinstance(event.get("step"), int):
                        when = event.get("time")
                        tail.resumed(event["step"], float(when) if isinstance(when, (int, float)) else None)
                new_metrics = tail.poll()
            except Exception:  # gcsfs raises aiohttp's and its own errors when the server is gone
                if not self.storage.alive():
                    raise self.storage_stopped() from None
                raise
            for event in new_events:
                changes.event(event)
                if event.get("event") == "start":
                    self.boot_watch.trainer_started()
                self.reporter.event(event)
            self.reporter.boot()
            # A new step, or a restart that resumed where training already was (a fault that found
            # the run past its step): the restarts shown agree with the summary's.
            if (tail.last_step, self.reporter.restarts) != (last_report_step, last_report_restarts):
                self.reporter.progress(tail, last_report_step, self.config.total_steps, self.reporter.restarts)
                last_report_step, last_report_restarts = tail.last_step, self.reporter.restarts
            return new_events, new_metrics

        def settle() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            """Read the struck attempt's last records: reported, never fed to the schedule."""
            return read()

        while True:
            time.sleep(options.poll_s)
            stop_signals.raise_if_signalled()
            changes.poll()
            if not self.storage.alive():
                raise self.storage_stopped()
            schedule.observe(*read())
            reached = schedule.attempt_step or 0
            fault = schedule.due() if not self.capacity.deleted else None  # a deleted QR is not repaired
            if fault is not None:
                if self.repairs.inject(fault, options, reached, settle):
                    tail.last_change = time.monotonic()
                else:
                    schedule.struck_nothing(reached)  # its slice's capacity is withheld: the attempt goes on
                continue
            self.gates.open_up_to(schedule.attempt_step)  # no fault strikes there: training goes on
            if self.repairs.release_withheld(options, tail.last_step):
                tail.last_change = time.monotonic()
                continue
            self.repairs.let_go_returned(self.run_dir)
            if self.capacity.take_reset():
                self.repairs.reset(options)
                tail.last_change = time.monotonic()
                continue
            try:
                running = self.repairs.running()  # none while no slice may run: not a completed run
                if running and supervisor.check_groups(process_groups(running)):
                    read()  # the last window the VMs wrote before they exited: its step is shown too
                    return
                if self.capacity.delete_nodes(self.vms, options.node_delete_delay_s, self.report):
                    return
            except GroupFailed as failed:
                raise EmulationError(
                    f"{failed.group.name} stopped with exit status {failed.code}; its log: {failed.group.log_path}\n"
                    + indented_tail(failed.group.log_path)
                ) from None
            if missing := self.boot_watch.not_booted(options.boot_timeout_s):
                raise EmulationError(
                    f"{', '.join(missing)}: not booting (no trainer {options.boot_timeout_s:.0f} s after its boot; "
                    f"--boot-timeout); logs: {self.paths.logs_dir}; the end of {missing[0]}'s log:\n"
                    + indented_tail(next(vm.log_path for vm in self.vms if vm.name == missing[0]))
                )
            now = time.monotonic()
            if now - start > options.timeout_s:
                raise EmulationError(
                    f"the run exceeded --timeout {options.timeout_s:.0f} s; logs: {self.paths.logs_dir}"
                )
            if now - tail.last_change > options.stall_timeout_s:
                first = self.vms[0]
                raise EmulationError(
                    f"no training progress for {options.stall_timeout_s:.0f} s (last step {tail.last_step}); "
                    f"logs: {self.paths.logs_dir}; the end of {first.name}'s log:\n" + indented_tail(first.log_path)
                )
