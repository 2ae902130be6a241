"""The local emulation of a stack's multislice queued resource.

``LocalQueuedResource(config, paths, script).up(...)`` runs, on this machine, what the stack
runs on Cloud TPU:

* one process group per TPU VM (slices × workers per slice, ``infra.local.vm``), each
  booting the stack's startup script exactly as rendered for GCP (infra.startup), with its
  own loopback metadata server (infra.local.metadata) answering the keys a real TPU VM of
  the stack has (``infra.local.topology``);
* ``chips per host`` CPU devices per VM (``JAX_NUM_CPU_DEVICES``), ``JAX_PLATFORMS=cpu``; only the venv
  step differs: ``MULTISLICE_PYTHON`` points the script at this machine's virtualenv;
* the checkpoint bucket is the stack's, ``StackConfig.bucket_name``, served by a loopback Cloud Storage
  (``infra.local.gcs``, one per stack, persistent under the stack's state directory); every VM gets the
  run directory ``pulumi up`` puts in the metadata, ``gs://<bucket>/runs/<run name>``, and the
  environment that points the trainer's storage clients at the server, as the emulator reads the run.

With ``multislice:queuedResource.deleteOnComplete`` worker 0 of slice 0 deletes the queued resource once the
run is complete, through a loopback Cloud TPU API (``infra.backends.queued_resource.emulated_api``): the emulator
records it and stops the VMs still running. ``multislice local reset`` restarts every VM (:meth:`reset_vms`).

It injects faults (infra.local.faults) when training reports the given step, then repairs like Cloud TPU
auto-repair (elsewhere once a VM asked: infra.local.recreation): the failed slice is recreated (fresh
disks), every other slice restarted (on gke, recreated too); training resumes.

Nothing is left behind: Ctrl-C / SIGTERM / errors stop every VM (SIGTERM, grace, SIGKILL:
``infra.local.supervisor``), every metadata server and the storage server. If the emulator
itself dies (SIGKILL included), every VM and the storage server stop by themselves within
``lifeline.ORPHAN_STOP_S`` (``infra.local.lifeline``); ``emulator.json`` in the stack's state
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

from infra.backends.registry import backend_of
from infra.config import StackConfig, stack_args
from infra.local import state as state_lib, stop_signals, supervisor, topology
from infra.local.boot_watch import BootWatch
from infra.local.faults import Fault, FaultGates, FaultSchedule
from infra.local.gcs import GcsServer, GcsServerError, bucket_name_error, point_clients_at
from infra.local.metadata import MetadataServer
from infra.local.options import EmulationError, Interrupted, Options
from infra.local.ports import free_port
from infra.local.progress import BootLines, ProgressSample, ProgressTail, RunReporter
from infra.local.recreation import await_recreation
from infra.local.state import EMULATION_ID_ENV, LocalPaths
from infra.local.supervisor import GroupFailed
from infra.local.tails import MetricsTail, RecordTail, indented_tail
from infra.local.vm import EmulatedVM, process_groups
from training.run_dir import RunDir

#: Seconds :meth:`LocalQueuedResource.shutdown` gives the VMs between SIGTERM and SIGKILL.
SHUTDOWN_GRACE_S = 5.0


class LocalQueuedResource:
    """Run a stack's queued resource as local processes (see module docstring).

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
        self.vms: list[EmulatedVM] = []
        self.servers: list[MetadataServer] = []
        self.repairs = 0
        self.boot_watch = BootWatch()
        #: Every boot holds its trainers at the steps of the faults still to strike, until struck.
        self.gates = FaultGates(
            paths.root / "fault-gate", holds_dir=paths.holds_dir, bundled_trainer=config.workload is None
        )
        self.faults_fired: list[str] = []
        #: For each fault in :attr:`faults_fired`, the newest step the attempt it struck
        #: reported (read once every process of that attempt was gone): where it really fired.
        self.fault_steps: list[int] = []
        #: ResetQueuedResource requests carried out (``multislice local reset``).
        self.resets = 0
        self.storage = GcsServer(
            paths.gcs_root, paths.gcs_log, port=gcs_port, env={EMULATION_ID_ENV: self.emulation_id}
        )
        self._restore_env: Callable[[], None] = lambda: None
        #: The backend's side: its emulated API (on the queued resource, the TPU API that serves
        #: deleteOnComplete and reset), what each VM's metadata server answers, the capacity's fate.
        self.capacity = backend_of(config).emulation(config, paths)
        #: The run directory, read by this process through :attr:`storage`.
        self.run_dir = RunDir(config.run_dir)

    # Lifecycle ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def running(self) -> Iterator[LocalQueuedResource]:
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
        and their VMs (one metadata server each, answering what the backend's VMs are told)."""
        self.capacity.start()
        for slice_id, node in enumerate(self.config.node_ids):
            for worker in range(self.config.accelerator.hosts):
                server = MetadataServer({}, self.capacity.metadata_values(slice_id, worker))
                self.servers.append(server)
                home, log = self.paths.vm_home(slice_id, worker), self.paths.vm_log(slice_id, worker)
                pod_env = self.capacity.pod_environment(slice_id, worker)
                self.vms.append(EmulatedVM(slice_id, worker, node, home, log, server, pod_env))

    def boot_all(self, options: Options) -> None:
        """Give every VM its metadata (a fresh coordinator port unless fixed), boot it, and
        record the process groups in the state file."""
        port = options.coordinator_port or free_port()
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
        env.update(self.gates.boot())
        for vm in self.vms:
            vm.metadata.update(
                topology.vm_metadata(
                    self.config, vm.slice_id, vm.worker, startup_script=self.startup_script, run_dir=self.config.run_dir
                )
            )
        self.boot_watch.booted(self.vms)  # first: a VM may show its trainer's start before the last VM boots
        for vm in self.vms:
            vm.boot(env)
        self._record_state()

    def inject(
        self, fault: Fault, options: Options, observed_step: int, settle: Callable[[], Any] = lambda: None
    ) -> None:
        """Strike the fault's slice (``kill``: SIGKILL; ``preempt``: SIGTERM, then SIGKILL
        after ``preempt_grace_s``), then :meth:`repair` (``settle`` runs once every process
        of the struck attempt is gone, before the reboot; it may return the ``(events,
        metrics)`` records that attempt wrote last). :attr:`fault_steps` gets the newest step
        the struck attempt reported: ``observed_step`` or a later one it synced meanwhile."""
        # The emulator polls the metrics log, so training may already be past the fault's step
        # (a fast step, a loaded machine); the report says where training actually was.
        targets = process_groups(vm for vm in self.vms if vm.slice_id == fault.slice_id)
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
        if not self.capacity.repairs_slices:
            self.reporter.drain()
            await_recreation(self.capacity, self.config, fault.slice_id, self.vms, options, self.report)
        reached = [observed_step]

        def settled() -> None:
            last = settle()
            if last:
                reached.extend(int(r["step"]) for r in last[1] if "loss" in r)

        self.repair(fault.slice_id, options, settled)
        self.fault_steps.append(max(reached))

    def repair(self, failed_slice: int, options: Options, settle: Callable[[], None] = lambda: None) -> None:
        """Cloud TPU auto-repair: recreate the failed slice (its VMs stopped and their disks
        wiped), restart every other slice (SIGTERM, ``reboot_grace_s``, SIGKILL), then call
        ``settle`` (no process of the old attempt is left to write a record) and boot all."""
        others = sorted({vm.slice_id for vm in self.vms if vm.slice_id != failed_slice})
        self.reporter.drain(repair=True)
        self.report(
            f"repair: recreating slice {failed_slice}"
            + (f", restarting slice(s) {', '.join(map(str, others))}" if others else "")
        )
        failed = [vm for vm in self.vms if vm.slice_id == failed_slice]
        supervisor.kill_groups(process_groups(failed))
        for vm in failed:
            vm.wipe_disk()
        supervisor.stop_groups(
            process_groups(vm for vm in self.vms if vm.slice_id != failed_slice), options.reboot_grace_s
        )
        for vm in self.vms if self.capacity.recreates_every_slice else ():
            vm.wipe_disk()  # JobSet recreates every Job: new Pods
        settle()
        self.repairs += 1
        self.capacity.repaired(failed_slice)
        self.boot_all(options)

    def reset_vms(self, options: Options) -> None:
        """``multislice local reset`` (the capacity's :attr:`reset_line`): restart every VM (SIGTERM,
        ``reset_grace_s``, SIGKILL; an empty disk where the platform makes new VMs) and boot it again;
        training resumes from the newest finalized checkpoint, the one saved on the SIGTERM if any."""
        self.reporter.drain()
        self.report(self.capacity.reset_line)
        self.resets += 1
        supervisor.stop_groups(process_groups(self.vms), options.reset_grace_s)
        for vm in self.vms if self.capacity.recreates_every_slice else ():
            vm.wipe_disk()  # a resumed JobSet's Pods are new Pods
        self.boot_all(options)

    def stop_vms(self) -> None:
        """Stop every VM (SIGTERM, short grace, SIGKILL), metadata server and the TPU API."""
        supervisor.stop_groups(process_groups(self.vms), SHUTDOWN_GRACE_S)
        for server in self.servers:
            server.stop()
        self.servers.clear()
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
            "run `multislice local up` again to resume "
            "from the last checkpoint"
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
        self.gates.follow(schedule, options.holds)
        for fault in schedule.skipped:
            self.report(f"note: {fault} will not fire: the run is already at step {tail.last_step}")
        try:
            self.create()
            self.report(
                f"booting {len(self.vms)} VM(s): {self.config.slices} slice(s) × {self.config.accelerator.hosts} "
                f"worker(s) of {self.config.accelerator_type}, "
                f"{self.config.accelerator.chips_per_host} CPU devices each"
            )
            every_vm = f"multislice local logs {stack_args(self.config.stack)}"
            self.reporter.boot_lines = BootLines(self.vms[0].name, self.vms[0].log_path, every_vm)
            self.boot_all(options)
            self._supervise(options, schedule, tail, events, start)
        finally:
            self.stop_vms()
        self.report(self.capacity.line())
        from infra.local import summary as summary_lib  # reads checkpoints: jax, orbax

        result = summary_lib.summarize(self.run_dir, total)
        summary_lib.name_own_resume(result, self.run_dir, since=started_at)  # the user's own stop
        unplanned = summary_lib.unplanned_restarts(
            self.run_dir, since=started_at, planned=len(self.faults_fired) + self.resets
        )
        if unplanned:
            self.report(
                f"warning: {len(unplanned)} restart(s) that no fault or reset asked for ({'; '.join(unplanned)}); "
                f"the VMs' logs: {self.paths.logs_dir}"
            )
        result.update(
            {
                "unplanned_restarts": unplanned,
                "wall_seconds": round(time.monotonic() - start, 3),
                "repairs": self.repairs,
                "faults": self.faults_fired,
                "fault_steps": self.fault_steps,
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

        def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            """New (events, metrics) records, reported. Events first: an attempt writes its
            ``start`` before its first step, so its steps never arrive ahead of it."""
            nonlocal last_report_step, last_report_restarts
            try:
                new_events = events.poll()
                new_metrics = tail.poll()
            except Exception:  # gcsfs raises aiohttp's and its own errors when the server is gone
                if not self.storage.alive():
                    raise self.storage_stopped() from None
                raise
            for event in new_events:
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
            if not self.storage.alive():
                raise self.storage_stopped()
            schedule.observe(*read())
            reached = schedule.attempt_step or 0
            fault = schedule.due() if not self.capacity.deleted else None  # a deleted QR is not repaired
            if fault is not None:
                self.inject(fault, options, reached, settle)
                tail.last_change = time.monotonic()
                continue
            self.gates.open_up_to(schedule.attempt_step)  # no fault strikes there: training goes on
            if self.capacity.take_reset():
                self.reset_vms(options)
                tail.last_change = time.monotonic()
                continue
            try:
                if supervisor.check_groups(process_groups(self.vms)):
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
