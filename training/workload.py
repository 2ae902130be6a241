"""``python -m training.workload``: start a stack's own command, and mark its run complete.

A stack with ``multislice:workload`` runs the user's command instead of the trainer, in the
same systemd unit (``trainer.sh command``, docs/vm-boot.md). This module is the step between
the unit and the command, shipped with the release like the trainer:

* ``run --spec workload.json --run-dir RUN_DIR [--bin DIR]``: reads this VM's place in the job
  from the metadata server, or on a Compute Engine TPU VM from the environment ``boot.sh``
  gave the unit (:func:`training.cluster.current_identity`, the trainer's own reader),
  writes a ``start`` event in the run directory (process 0), builds the command's
  environment (:func:`command_environment`, the contract of docs/workloads.md)
  and runs the command in the shipped source directory (:func:`supervise`: the exit status is
  the command's own, except that exit 0 after SIGTERM is 75, preempted);
* ``complete --spec workload.json --run-dir RUN_DIR``: after the command exited 0 on worker 0
  of slice 0 (``trainer.sh stopped``), writes the completion marker ``COMPLETE``
  (``{"step": steps, "loss": the last metrics record's loss or null}``) unless one for the
  run's steps exists: ``status``, ``local up`` and the queued-resource provider read it;
* ``preempted --spec workload.json --run-dir RUN_DIR``: after the command exited 75 on worker 0
  of slice 0, appends the ``preempted`` event the trainer writes itself (:func:`record_preempted`).

``workload.json`` (written by ``infra/startup/script.py``): ``{"command": [...], "env": {...},
"steps": N}``. Exit statuses before the command starts: 1 (metadata unreadable: restarted),
78 (the spec or the command cannot work here: never restarted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from training import cluster
from training.redaction import redacted
from training.run_objects import json_record

#: Exit statuses of this launcher (those of ``training.train``: 1 restarted, 78 never restarted).
EXIT_FAILED = 1
EXIT_PREEMPTED = 75
EXIT_CONFIG = 78
#: The command's working directory inside the release (the shipped ``multislice:workload.source``).
SOURCE_DIR = "workload"
#: The run directory's folders the contract names (``training.run_dir``'s layout).
CHECKPOINTS = "checkpoints"
METRICS = "metrics"
EVENTS = "events"
#: The completion marker (``training.checkpoint.completion.COMPLETE_MARKER``).
COMPLETE_MARKER = "COMPLETE"


def command_environment(
    base: dict[str, str],
    identity: cluster.ClusterIdentity,
    tpu_env: dict[str, str],
    *,
    run_dir: str,
    steps: int,
    release: str,
    user_env: dict[str, str],
    bin_dir: str | None = None,
) -> dict[str, str]:
    """The command's environment: ``base`` (the unit's) with the release directory taken out
    of ``PYTHONPATH`` (it holds this bundle's ``training`` package, which must not shadow the
    command's modules), ``bin_dir`` first on ``PATH``, the contract's variables and ``user_env``.

    The contract (docs/workloads.md): ``MULTISLICE_RUN_DIR``, ``MULTISLICE_CHECKPOINT_DIR``,
    ``MULTISLICE_METRICS_DIR``, ``MULTISLICE_EVENTS_DIR``, ``MULTISLICE_STEPS``,
    ``MULTISLICE_SLICE``, ``MULTISLICE_WORKER``, ``MULTISLICE_NUM_SLICES``,
    ``MULTISLICE_WORKERS_PER_SLICE``, ``MULTISLICE_PROCESS_ID``, ``MULTISLICE_NUM_PROCESSES``,
    ``MULTISLICE_COORDINATOR_ADDRESS`` (``host:port`` of process 0, as JAX's Cloud TPU cluster
    detection computes it), ``MULTISLICE_ACCELERATOR_TYPE`` and the ``MEGASCALE_*`` lines of the
    ``tpu-env`` metadata exactly as Cloud TPU set them (only a multislice queued resource has
    them; on a multislice Compute Engine backend, the unit's environment holds them instead:
    :func:`megascale_values`). ``user_env`` cannot hold any of these names (``infra.config.workload`` refuses them).
    """
    env = dict(base)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != release]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    if bin_dir:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["VIRTUAL_ENV"] = str(Path(bin_dir).parent)
    root = run_dir.rstrip("/")
    env.update(
        {
            "MULTISLICE_RUN_DIR": root,
            "MULTISLICE_CHECKPOINT_DIR": f"{root}/{CHECKPOINTS}",
            "MULTISLICE_METRICS_DIR": f"{root}/{METRICS}",
            "MULTISLICE_EVENTS_DIR": f"{root}/{EVENTS}",
            "MULTISLICE_STEPS": str(steps),
            "MULTISLICE_SLICE": str(identity.slice_id),
            "MULTISLICE_WORKER": str(identity.worker),
            "MULTISLICE_NUM_SLICES": str(identity.num_slices),
            "MULTISLICE_WORKERS_PER_SLICE": str(identity.workers_per_slice),
            "MULTISLICE_PROCESS_ID": str(identity.process_id),
            "MULTISLICE_NUM_PROCESSES": str(identity.num_processes),
            "MULTISLICE_COORDINATOR_ADDRESS": identity.coordinator_address,
            "MULTISLICE_ACCELERATOR_TYPE": identity.accelerator_type or "",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update({k: v for k, v in tpu_env.items() if k.startswith("MEGASCALE_")})
    env.update(user_env)
    return env


def megascale_values() -> dict[str, str]:
    """This VM's ``MEGASCALE_*`` values: on a Compute Engine TPU VM the environment's
    (``boot.sh`` writes them into the unit, :mod:`training.cluster`; they reach the command
    with the rest of the environment), else the ``tpu-env`` metadata's lines.

    Raises:
      cluster.MetadataError: the metadata server is unreachable.
    """
    if cluster.identity_in_environment():
        return {k: v for k, v in os.environ.items() if k.startswith("MEGASCALE_")}
    return cluster.parse_tpu_env(cluster.get_metadata("tpu-env", required=False) or "")


def read_spec(path: Path) -> dict[str, Any]:
    """``workload.json``: ``{"command": [str, ...], "env": {str: str}, "steps": int}``.

    Raises:
      ValueError: the file is missing or malformed (names what is wrong).
    """
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"workload spec {path}: {err}") from None
    command, env, steps = spec.get("command"), spec.get("env", {}), spec.get("steps")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        shown = redacted(repr(command))[:200]  # an argument may carry a token
        raise ValueError(f"workload spec {path}: command {shown} is not a non-empty list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        # the values are not shown: under a name such as DB_PASSWORD any value is a secret
        raise ValueError(f"workload spec {path}: env is not a mapping of strings to strings")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"workload spec {path}: steps {steps!r} is not a positive integer")
    return spec


def newest_checkpoint_step(run_dir: Any) -> int:
    """The highest step of ``<run>/checkpoints/<step>`` whose name is a number (Orbax's layout;
    an unfinished save is ``<step>.orbax-checkpoint-tmp…`` and does not count); 0 when none."""
    steps = [int(Path(name).name) for name in run_dir.list(f"{CHECKPOINTS}/*") if Path(name).name.isdigit()]
    return max(steps, default=0)


def record_start(run_dir_text: str, processes: int) -> None:
    """Process 0: append a ``start`` event (``step``: the newest checkpoint's, ``restored``,
    ``processes``, ``time``, ``workload: "command"``) as a new ``events`` object, the record ``status`` counts
    restarts by and ``local up`` arms its faults with (``training.metrics.run_log``)."""
    from training.metrics.run_log import RecordLog
    from training.run_dir import RunDir

    run_dir = RunDir(run_dir_text)
    step = newest_checkpoint_step(run_dir)
    events = RecordLog(run_dir, EVENTS)
    events.append(
        {
            "event": "start",
            "step": step,
            "restored": step > 0,
            "processes": processes,
            "time": round(time.time(), 3),
            "workload": "command",
        }
    )
    events.sync()


def run(spec_path: Path, run_dir: str, bin_dir: str | None) -> int:
    """Become the command (see the module docstring); returns only when it cannot start."""
    try:
        spec = read_spec(spec_path)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    release = str(spec_path.resolve().parent)
    try:
        identity = cluster.current_identity()
        tpu_env = megascale_values()
    except cluster.MetadataError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_FAILED
    if identity.process_id == 0:
        record_start(run_dir, identity.num_processes)
    env = command_environment(
        dict(os.environ),
        identity,
        tpu_env,
        run_dir=run_dir,
        steps=spec["steps"],
        release=release,
        user_env=spec.get("env", {}),
        bin_dir=bin_dir,
    )
    source = Path(release) / SOURCE_DIR
    cwd = source if source.is_dir() else Path(release)
    command = spec["command"]
    print(
        f"workload: process {identity.process_id}/{identity.num_processes} starting {json.dumps(command)} in {cwd}",
        flush=True,
    )
    return supervise(command, env, cwd)


def supervise(command: list[str], env: dict[str, str], cwd: Path) -> int:
    """Run ``command`` as this process's child and return the unit's exit status for it.

    The status is the command's own, with one exception: **exit 0 after a stop request
    (SIGTERM) is 75, "preempted"**. A training command that saves a checkpoint on SIGTERM and
    then exits 0 (MaxText's ``train.py`` calls ``sys.exit()`` once Orbax's ``reached_preemption``
    save is done) has stopped early, not finished; counting its 0 as complete would write
    ``COMPLETE`` and, with ``deleteOnComplete``, delete the capacity mid-run. A command that
    really had finished exits 0 again at its next start. A child killed by a signal makes this
    process die of the same signal, so systemd sees what it would see without the launcher.

    SIGTERM reaches the command from systemd itself (``KillMode=control-group`` signals every
    process of the unit); this process records it, and passes it on once in case it was sent to
    this process alone (``kill <main pid>``).
    """
    stop_requested = False
    child: subprocess.Popen[bytes] | None = None

    def on_sigterm(signum: int, frame: object) -> None:
        nonlocal stop_requested
        if not stop_requested and child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
        stop_requested = True

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        child = subprocess.Popen(command, env=env, cwd=cwd)
    except OSError as err:
        print(f"error: workload command {command[0]!r} cannot start: {err}", file=sys.stderr)
        return EXIT_CONFIG
    if stop_requested and child.poll() is None:  # the stop came while the child was starting
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)
    status = child.wait()
    if status < 0:  # killed by a signal: die of the same one
        print(f"workload: the command was killed by signal {-status}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL/SIGSTOP cannot be set, and need not be
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status  # not reached for a fatal signal
    if status == 0 and stop_requested:
        print(
            f"workload: the command exited 0 after a stop request (SIGTERM): counted as {EXIT_PREEMPTED} "
            "(preempted), not as complete; its next start resumes it",
            flush=True,
        )
        return EXIT_PREEMPTED
    return status


def completed_step(marker: bytes | None) -> int:
    """The step of a completion marker (``training.checkpoint.completion.read_completion``'s format),
    0 when absent or malformed."""
    try:
        step = json_record(marker or b"")["step"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return 0
    return step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else 0


def complete(spec_path: Path, run_dir_text: str) -> int:
    """Write ``COMPLETE`` for the run's steps (see the module docstring); 0, or 1 if it cannot."""
    from training.metrics.run_log import read_records
    from training.run_dir import RunDir

    try:
        steps = read_spec(spec_path)["steps"]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_FAILED
    run_dir = RunDir(run_dir_text)
    if completed_step(run_dir.read(COMPLETE_MARKER)) >= steps:
        return 0
    losses = [r["loss"] for r in read_records(run_dir, METRICS) if isinstance(r.get("loss"), (int, float))]
    record = {"step": steps, "loss": float(losses[-1]) if losses else None}
    run_dir.write(COMPLETE_MARKER, json.dumps(record, sort_keys=True).encode())  # training.checkpoint.manager's format
    print(f"workload: the command exited 0: the run is complete ({run_dir}/COMPLETE, step {steps})", flush=True)
    return 0


def record_preempted(run_dir_text: str) -> int:
    """After the command exited 75 on process 0: append a ``preempted`` event (``step``: the
    newest checkpoint's, ``time``, ``workload: "command"``), the record the bundled trainer writes
    at the same point (``training.train``), so ``status`` counts the next start as a preemption
    restart and not as a failure; 0, or 1 if it cannot be written."""
    from training.metrics.run_log import RecordLog
    from training.run_dir import RunDir

    try:
        run_dir = RunDir(run_dir_text)
        events = RecordLog(run_dir, EVENTS)
        events.append(
            {
                "event": "preempted",
                "step": newest_checkpoint_step(run_dir),
                "time": round(time.time(), 3),
                "workload": "command",
            }
        )
        events.sync()
    except OSError as err:
        print(f"error: the preempted event could not be written to {run_dir_text}: {err}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.workload", description=__doc__.split("\n")[0] if __doc__ else None
    )
    parser.add_argument("action", choices=("run", "complete", "preempted"))
    parser.add_argument("--spec", type=Path, required=True, help="workload.json of the release")
    parser.add_argument("--run-dir", required=True, help="the run directory (gs://… or a local path)")
    parser.add_argument("--bin", default=None, help="the workload virtualenv's bin/ directory (first on PATH)")
    args = parser.parse_args(argv)
    if args.action == "run":
        return run(args.spec, args.run_dir, args.bin)
    if args.action == "preempted":
        return record_preempted(args.run_dir)
    return complete(args.spec, args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
