"""The release's boot, filled for a stack: ``boot.sh``, the backend's identity phase and slice watch,
and the systemd and retry settings they carry.

* :func:`boot_script`: ``boot.sh`` (``boot.sh.in``): reads the metadata with bounded retries and shape
  checks, checks the release record in the bucket (:mod:`infra.components.release`), builds the
  virtualenv with bounded retries, writes and starts the ``multislice-trainer.service`` systemd unit
  (docs/vm-boot.md), or on a container runs the trainer in the foreground;
* :func:`identity_script`: ``identity.sh``, the stack's backend's ``boot_identity.sh``: the phase of
  the boot that finds the VM's worker and slice, which ``boot.sh`` sources;
* :func:`slice_watch_script`: ``slice-watch.sh``, the backend's, which the release watch runs to
  recreate a lost slice.

The settings below are what the unit and the retries do (the trainer's exit statuses: the
runtime contract of :mod:`infra.startup.script`).
"""

from __future__ import annotations

import hashlib
import shlex
from typing import TYPE_CHECKING

from infra.startup.templates import BOOT_RESOURCE, PLACEHOLDER, fill, template
from infra.vm_contract import (
    COMPILATION_CACHE_FOLDER,
    DEFAULT_COMPUTE_API_ENDPOINT,
    DEFAULT_METADATA_HOST,
    RELEASE_SUPERSEDED_STATUS,
    RELEASE_UNVERIFIED_STATUS,
    RELEASE_WATCH_UNIT,
    RUN_DIR_KEY,
    STANDBY_UNIT,
    TRAINER_UNIT,
    record_object,
)

if TYPE_CHECKING:  # the types only: who renders a release has imported them (a constant's reader need not)
    from infra.backends.spec import BackendSpec
    from infra.config import StackConfig
    from infra.startup import lockfile, workload as workload_release

#: Restarts of a failing trainer within :data:`START_LIMIT_INTERVAL_S` before systemd gives up
#: (``StartLimitBurst=`` is this + 1 starts; systemd.unit(5)).
MAX_RESTARTS = 10
START_LIMIT_INTERVAL_S = 3600

#: Trainer exit status for a configuration that can never work (EX_CONFIG from sysexits.h;
#: ``training.train.EXIT_CONFIG``): ``RestartPreventExitStatus=`` keeps systemd from restarting it.
CONFIG_ERROR_STATUS = 78

#: Trainer exit status after a planned stop: it saved a checkpoint after a stop notice, or to change
#: its slice count (EX_TEMPFAIL; ``training.train.EXIT_PREEMPTED``). The unit lists it in both
#: ``SuccessExitStatus=`` (systemd logs ``Deactivated successfully``, not ``Failed with result
#: 'exit-code'``, for a stop that went as planned) and ``RestartForceExitStatus=`` (so that
#: ``Restart=on-failure`` still restarts it: systemd.service(5); systemd's ``service_shall_restart``
#: tests the forced statuses before ``Restart=``, and a manual stop before both).
PLANNED_STOP_STATUS = 75

#: Seconds between two reads of the release record by a compute-engine VM's release watch
#: (``release_watch.sh``; ``MULTISLICE_RELEASE_POLL_S``): a ``pulumi up`` that changes the
#: trainer reaches the VMs within about this long (one small object read a minute per VM).
RELEASE_POLL_S = 60

#: First trainer restart delay and its cap, seconds (``trainer.sh`` doubles it per restart:
#: systemd 249 of Ubuntu 22.04 has no ``RestartSteps=``, added in systemd 254).
RESTART_BACKOFF_S = 1
RESTART_BACKOFF_MAX_S = 60
#: systemd's own delay before a restart (``RestartSec=``; its default, systemd.service(5)).
RESTART_SEC = "100ms"

#: ``TimeoutStopSec=``: seconds systemd waits after SIGTERM before SIGKILL. GCE gives a VM
#: 30 s (Spot) or 120 s (standard) between ACPI soft off and power off
#: (https://cloud.google.com/compute/docs/reference/rest/v1/instances, ``scheduling.skipGuestOsShutdown``);
#: the trainer's preemption save must fit in the notice, and this must not cut it shorter.
STOP_TIMEOUT_S = 120

#: Boot retries: metadata and bucket reads (ATTEMPTS tries, first delay RETRY_DELAY_S doubling
#: to 60 s) and the virtualenv build (BUILD_ATTEMPTS tries, first delay BUILD_RETRY_DELAY_S).
ATTEMPTS = 6
RETRY_DELAY_S = 1
BUILD_ATTEMPTS = 4
BUILD_RETRY_DELAY_S = 15

#: Defaults of a real TPU VM: state directory, unit directory (the metadata host,
#: :data:`~infra.vm_contract.DEFAULT_METADATA_HOST`, is the contract's).
DEFAULT_HOME = "/var/lib/multislice"
DEFAULT_UNIT_DIR = "/etc/systemd/system"

#: Metadata attribute that holds the run directory (set by the queued resource).
RUN_DIR_ATTRIBUTE = RUN_DIR_KEY


def boot_script(
    config: StackConfig,
    pins: lockfile.VmPins,
    workload: workload_release.WorkloadRelease | None = None,
    spec: BackendSpec | None = None,
) -> str:
    """``boot.sh`` of the release: ``infra/startup/boot.sh.in`` filled for ``config`` (and its
    command's release files, with ``multislice:workload``) and backend ``spec`` (default: the stack's)."""
    spec = spec or config.backend_spec
    values = {
        "WORKLOAD": "trainer" if workload is None else "command",
        "WORKLOAD_REQUIREMENTS_SHA256": workload.requirements_sha256 if workload else "",
        "WORKLOAD_SOURCE_OBJECT": (workload.source_object or "") if workload else "",
        "WORKLOAD_SOURCE_SHA256": workload.source_sha256 if workload and workload.source_object else "",
        "STACK": config.stack,
        "ACCELERATOR": config.accelerator_type,
        "SLICES": str(config.slices),
        "BOOTSTRAP_SHA256": hashlib.sha256(template().encode()).hexdigest(),
        "REQUIREMENTS_SHA256": pins.requirements_sha256,
        "PYTHON_VERSION": shlex.quote(pins.python_version),
        "UV_VERSION": pins.uv_version,
        "UNIT": TRAINER_UNIT,
        "ATTEMPTS": str(ATTEMPTS),
        "BUILD_ATTEMPTS": str(BUILD_ATTEMPTS),
        "RETRY_DELAY_S": str(RETRY_DELAY_S),
        "BUILD_RETRY_DELAY_S": str(BUILD_RETRY_DELAY_S),
        "BACKOFF": str(RESTART_BACKOFF_S),
        "BACKOFF_MAX": str(RESTART_BACKOFF_MAX_S),
        "RESTART_SEC": RESTART_SEC,
        "START_LIMIT_INTERVAL_S": str(START_LIMIT_INTERVAL_S),
        "START_LIMIT_BURST": str(MAX_RESTARTS + 1),
        "CONFIG_ERROR_STATUS": str(CONFIG_ERROR_STATUS),
        "PLANNED_STOP_STATUS": str(PLANNED_STOP_STATUS),
        "RELEASE_SUPERSEDED_STATUS": str(RELEASE_SUPERSEDED_STATUS),
        "RELEASE_UNVERIFIED_STATUS": str(RELEASE_UNVERIFIED_STATUS),
        "WATCH_UNIT": RELEASE_WATCH_UNIT,
        "RELEASE_POLL_S": str(RELEASE_POLL_S),
        "STOP_TIMEOUT_S": str(STOP_TIMEOUT_S),
        "DEFAULT_HOME": DEFAULT_HOME,
        "DEFAULT_METADATA_HOST": DEFAULT_METADATA_HOST,
        "DEFAULT_UNIT_DIR": DEFAULT_UNIT_DIR,
        "RUN_DIR_ATTRIBUTE": RUN_DIR_ATTRIBUTE,
        "RECORD_OBJECT": record_object(config.stack),
        "COMPILATION_CACHE_FOLDER": COMPILATION_CACHE_FOLDER,
        # What the stack's backend tells the boot and the trainer (infra.backends.spec.BackendSpec).
        "BACKEND": spec.name,
        "RELEASE_WATCH": "yes" if spec.release_watch else "no",
        "IDENTITY_SOURCE": spec.identity_source,
        "LOG_RESOURCE": spec.log_resource,
        "SUPERVISOR": spec.supervisor,
        "WARM_STANDBY": "yes" if config.warm_standby else "no",
        "STANDBY_UNIT": STANDBY_UNIT,
    }
    return fill(template(BOOT_RESOURCE), values, BOOT_RESOURCE)


#: The contract's endpoint defaults, offered to every backend's identity phase (each takes those
#: its template names).
ENDPOINT_DEFAULTS = {
    "DEFAULT_METADATA_HOST": DEFAULT_METADATA_HOST,
    "DEFAULT_COMPUTE_API_ENDPOINT": DEFAULT_COMPUTE_API_ENDPOINT,
}


def identity_script(config: StackConfig, spec: BackendSpec | None = None) -> str:
    """``identity.sh`` of the release: the identity phase of backend ``spec`` (default: the stack's;
    :attr:`infra.backends.spec.BackendSpec.boot_identity`, which ``boot.sh`` sources), filled with
    the backend's values and the contract's endpoint defaults it names."""
    spec = spec or config.backend_spec
    return _backend_script(spec.boot_identity_template(), spec.boot_values(), f"{spec.name}'s {spec.boot_identity}")


def slice_watch_script(config: StackConfig, spec: BackendSpec | None = None) -> str | None:
    """``slice-watch.sh`` of the release (:meth:`infra.backends.spec.BackendSpec.slice_watch` of ``spec``,
    default the stack's backend), filled with the endpoint defaults it names; None when it has none."""
    spec = spec or config.backend_spec
    file = spec.slice_watch(config)
    if file is None:
        return None
    return _backend_script(spec.package_text(file), spec.slice_watch_values(config), f"{spec.name}'s {file}")


def _backend_script(text: str, values: dict[str, str], what: str) -> str:
    used = set(PLACEHOLDER.findall(text))
    return fill(text, {name: value for name, value in ENDPOINT_DEFAULTS.items() if name in used} | values, what)
