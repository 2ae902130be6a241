#!/bin/bash
# ExecStart= and ExecStopPost= of multislice-trainer.service, the unit that boot.sh writes
# (part of the release; docs/vm-boot.md). Every line it writes starts with [slice S worker W].
#
#   trainer.sh run PYTHON CONFIG RUN_DIR
#       Before a restart, wait the backoff: MULTISLICE_RESTART_BACKOFF_S doubled per restart
#       (the unit's NRestarts), at most MULTISLICE_RESTART_BACKOFF_MAX_S; then become the
#       trainer (exec, so that systemd's SIGTERM reaches it). Its output goes through the log
#       shipper (training/log_shipping.py: the prefix, and Cloud Logging on a TPU VM), which
#       ignores SIGTERM and ends when the trainer does.
#       With MULTISLICE_STANDBY_DIR (multislice:warmStandby), the attempt goes to the VM's warm
#       standby when it can take it (python -m training.standby_handoff), else starts cold.
#   trainer.sh standby PYTHON RUN_DIR
#       ExecStart= of multislice-standby.service: the warm standby (python -m training.standby),
#       its output through the log shipper.
#   trainer.sh command PYTHON RUN_DIR BIN
#       The same for a stack's own command (multislice:workload): after the backoff, become
#       `python -m training.workload run` (the release on its PYTHONPATH), which becomes the
#       command with the workload contract's environment and BIN first on PATH (docs/workloads.md).
#   On the compute-engine backend both first read the release record (MULTISLICE_RELEASE_RECORD)
#   and exit 76 instead when it names another release (see superseded below).
#   trainer.sh stopped [PYTHON RUN_DIR]
#       One line saying how the trainer ended (systemd sets SERVICE_RESULT, EXIT_CODE and
#       EXIT_STATUS for ExecStopPost=); after status 0, a command's run is marked complete
#       (training.workload complete, on worker 0 of slice 0) and delete-on-complete.sh runs (on
#       worker 0 of the slice that wrote the marker: python -m training completed-by);
#       after status 75, a command's preemption is recorded (training.workload preempted, on
#       worker 0 of slice 0); with PYTHON, through the log shipper too.
#   trainer.sh foreground run|command ARGS...
#       Where no systemd runs the unit (a container: the gke backend's Pod, boot.sh): the same
#       `run` or `command` as a child in a process group of its own, SIGTERM and SIGINT passed on
#       to every process of that group (as systemd signals a unit's cgroup; one that arrives before
#       the child exists is passed on once it does), then `stopped` with the variables systemd sets
#       for ExecStopPost=; ends with the child's status (128 + N after signal N: a child that exits
#       130 or 143 itself reads as SIGINT or SIGTERM), which is the container's. Nothing restarts it
#       here: the Pod's restart policy and the JobSet's failure policy decide what follows.
set -euo pipefail

readonly UNIT=multislice-trainer.service
release=$(cd "${0%/*}" && pwd -P)
prefix="[slice ${MULTISLICE_SLICE:-?} worker ${MULTISLICE_WORKER:-?}] "
say() { printf '%s%s\n' "$prefix" "$*"; }
# ship PYTHON RUN_DIR: from here on, this script's output goes through the log shipper.
ship() {
  exec > >(trap '' TERM INT HUP; PYTHONPATH=$release exec "$1" -m training.log_shipping "$2") 2>&1
  prefix=''
}
# superseded: on the compute-engine backend (MULTISLICE_RELEASE_RECORD, set by boot.sh), stop with
# status 76 (not restarted) when the release record names another release than this one: an older
# trainer never starts beside updated slices; the release watch boots the recorded release. A
# record that cannot be read is no reason not to start (the boot read it moments before).
superseded() {
  local current
  [[ -n ${MULTISLICE_RELEASE_RECORD:-} ]] || return 0
  current=$(bash "$release/release-watch.sh" current "$MULTISLICE_RELEASE_RECORD") || return 0
  [[ $current != "${release##*/}" ]] || return 0
  say "$1: the release record names release ${current:0:12}, not this unit's ${release##*/}: not starting an older $1 beside updated slices; multislice-release-watch.service boots the recorded one"
  exec >&- 2>&- # let the shipper write the line out before systemd stops the unit's processes
  wait "$!" || true
  exit 76
}
# backoff: before a restart, wait MULTISLICE_RESTART_BACKOFF_S doubled per restart (at most _MAX_S);
# none after a planned stop: status 75 (ExecMainStatus, the last run's), a checkpoint saved to resume
# from (an elastic resize, a stop notice honoured), is no failure to slow down for; nor the trainer's
# status 69: another process of the job ended (its collective or coordination service lost the peer),
# and the next start waits in jax.distributed.initialize for that peer, whose own unit backs off.
# (A command's 69 is its own: the workload contract gives it no meaning, docs/workloads.md.)
backoff() {
  local restarts delay last
  restarts=$(systemctl show --property=NRestarts --value "$UNIT" 2>/dev/null) || restarts=0
  [[ $restarts =~ ^[0-9]+$ ]] || restarts=0
  last=$(systemctl show --property=ExecMainStatus --value "$UNIT" 2>/dev/null) || last=''
  if ((restarts > 0)) && [[ $last == 75 ]]; then
    say "$1: restart $restarts, at once: the last run saved a checkpoint and stopped as planned (status 75)"
  elif ((restarts > 0)) && [[ $1 == trainer && $last == 69 ]]; then
    say "$1: restart $restarts, at once: the last run ended because another process of the job was gone (status 69); it waits for that process's restart"
  elif ((restarts > 0)); then
    delay=$(awk -v b="${MULTISLICE_RESTART_BACKOFF_S:-1}" -v m="${MULTISLICE_RESTART_BACKOFF_MAX_S:-60}" -v n="$restarts" \
      'BEGIN { d = b * 2 ^ (n - 1); print (d < m) ? d : m }')
    say "$1: restart $restarts, after ${delay}s of backoff"
    sleep "$delay"
  fi
}

case ${1:-} in
  run)
    (($# == 4)) || { say "usage: trainer.sh run PYTHON CONFIG RUN_DIR"; exit 2; }
    py=$2 config=$3 run_dir=$4
    ship "$py" "$run_dir"
    superseded trainer
    backoff trainer
    say "trainer: starting $py -m training run --config $config --run-dir $run_dir"
    # The attempt starts here, after the backoff, which is a restart's boot and not its initialization
    # (docs/goodput.md): the trainer counts its start-up from this time, not from this script's start.
    MULTISLICE_ATTEMPT_STARTED=$(date +%s.%N) && export MULTISLICE_ATTEMPT_STARTED
    if [[ -n ${MULTISLICE_STANDBY_DIR:-} ]]; then # warm from the standby if it can, else cold (same pid)
      exec "$py" -m training.standby_handoff --config "$config" --run-dir "$run_dir"
    fi
    exec "$py" -m training run --config "$config" --run-dir "$run_dir"
    ;;
  standby)
    (($# == 3)) || { say "usage: trainer.sh standby PYTHON RUN_DIR"; exit 2; }
    py=$2 run_dir=$3
    ship "$py" "$run_dir"
    exec "$py" -m training.standby
    ;;
  command)
    (($# == 4)) || { say "usage: trainer.sh command PYTHON RUN_DIR BIN"; exit 2; }
    py=$2 run_dir=$3 bin=$4
    ship "$py" "$run_dir"
    superseded workload
    backoff workload
    say "workload: starting the command of $release/workload.json (run dir $run_dir)"
    PYTHONPATH=$release${PYTHONPATH:+:$PYTHONPATH} exec "$py" -m training.workload run --spec "$release/workload.json" --run-dir "$run_dir" --bin "$bin"
    ;;
  stopped)
    if (($# == 3)); then ship "$2" "$3"; fi
    status=${EXIT_STATUS:-?}
    case ${EXIT_CODE:-}:$status in
      exited:0) say "trainer: exited with status 0: training is complete" ;;
      exited:75) say "trainer: exited with status 75: it saved a checkpoint after a stop notice (a preemption, a maintenance event, a stop) or to change its slice count (elastic)" ;;
      exited:69) if [[ -f $release/workload.json ]]; then say "trainer: exited with status 69 ($SERVICE_RESULT)"; else
        say "trainer: exited with status 69: another process of the job was gone (that process's log says why)"; fi ;;
      exited:76) say "trainer: exited with status 76: the release record names a newer release; the release watch boots it" ;;
      exited:78)
        if [[ -n ${MULTISLICE_FOREGROUND:-} ]]; then
          say "trainer: exited with status 78: its configuration cannot work here; the container ends (the JobSet's failure policy decides what follows)"
        else
          say "trainer: exited with status 78: its configuration cannot work here; it is not restarted"
        fi
        ;;
      exited:*) say "trainer: exited with status $status ($SERVICE_RESULT)" ;;
      *) say "trainer: ended by signal $status (${SERVICE_RESULT:-?})" ;;
    esac
    # --- a command exited 0: its run is complete (worker 0 of slice 0 writes the marker).
    if [[ ${EXIT_CODE:-}:$status == exited:0 && -f $release/workload.json && (($# == 3)) ]] &&
      [[ ${MULTISLICE_SLICE:-} == 0 && ${MULTISLICE_WORKER:-} == 0 ]]; then
      PYTHONPATH=$release "$2" -m training.workload complete --spec "$release/workload.json" --run-dir "$3" ||
        say "workload: the completion marker could not be written"
    fi
    # --- a command exited 75 (preempted): worker 0 of slice 0 records it, as the trainer does itself.
    if [[ ${EXIT_CODE:-}:$status == exited:75 && -f $release/workload.json && (($# == 3)) ]] &&
      [[ ${MULTISLICE_SLICE:-} == 0 && ${MULTISLICE_WORKER:-} == 0 ]]; then
      PYTHONPATH=$release "$2" -m training.workload preempted --spec "$release/workload.json" --run-dir "$3" ||
        say "workload: the preempted event could not be written"
    fi
    # --- deleteOnComplete: the run is complete; worker 0 of the slice whose trainer wrote the
    # completion marker deletes the queued resource (slice 0 unless an elastic run finished without
    # it; python -m training completed-by). (A queued resource's; a container's capacity is not
    # deleted from inside it.)
    if [[ ${EXIT_CODE:-}:$status == exited:0 && -z ${MULTISLICE_FOREGROUND:-} ]]; then
      writer=0
      if (($# == 3)) && [[ ${MULTISLICE_WORKER:-} == 0 ]]; then
        writer=$(PYTHONPATH=$release "$2" -m training completed-by "$3" 2>/dev/null) || writer=0
        [[ $writer =~ ^[0-9]+$ ]] || writer=0
      fi
      MULTISLICE_COMPLETION_SLICE=$writer MULTISLICE_LINE_PREFIX=$prefix bash "${0%/*}/delete-on-complete.sh" || true
    fi
    if (($# == 3)); then # let the shipper write the line out before the unit's processes are stopped
      exec >&- 2>&-
      wait "$!" || true
    fi
    ;;
  foreground)
    case ${2:-}:$# in
      run:5) py=$3 run_dir=$5 ;;
      command:5) py=$3 run_dir=$4 ;;
      *) say "usage: trainer.sh foreground run PYTHON CONFIG RUN_DIR | trainer.sh foreground command PYTHON RUN_DIR BIN"; exit 2 ;;
    esac
    shift
    child='' pending=''
    pass_on() { # the signal to every process of the child's group, or later if there is none yet
      if [[ -n $child ]]; then kill "-$1" -- "-$child" 2>/dev/null || true; else pending=$1; fi
    }
    trap 'pass_on TERM' TERM # before the fork: a container's first process drops what it does not handle
    trap 'pass_on INT' INT
    set -m # job control: the child leads a process group, and does not start with SIGINT ignored
    /bin/bash "$0" "$@" &
    child=$!
    set +m
    if [[ -n $pending ]]; then pass_on "$pending"; fi
    while kill -0 "$child" 2>/dev/null; do wait "$child" || true; done # a trapped signal ends a wait early
    status=0
    wait "$child" || status=$? # the status of the child reaped above (bash keeps it)
    if ((status > 128)) && signal=$(kill -l "$((status - 128))" 2>/dev/null); then
      MULTISLICE_FOREGROUND=1 EXIT_CODE=killed EXIT_STATUS=$signal SERVICE_RESULT=signal \
        /bin/bash "$0" stopped "$py" "$run_dir" || true
    else
      result=success
      ((status == 0)) || result=exit-code
      MULTISLICE_FOREGROUND=1 EXIT_CODE=exited EXIT_STATUS=$status SERVICE_RESULT=$result \
        /bin/bash "$0" stopped "$py" "$run_dir" || true
    fi
    exit "$status"
    ;;
  *)
    say "usage: trainer.sh run PYTHON CONFIG RUN_DIR | trainer.sh standby PYTHON RUN_DIR | trainer.sh command PYTHON RUN_DIR BIN | trainer.sh stopped [PYTHON RUN_DIR] | trainer.sh foreground run|command ..."
    exit 2
    ;;
esac
