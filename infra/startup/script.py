"""The TPU VM startup script, rendered for a stack: a small bootstrap carrying one release.

:func:`render` turns a :class:`~infra.config.StackConfig` into the bash script every TPU VM
of the stack boots with (metadata key ``startup-script``). The same bytes run in the local emulator
(``infra/local``). Equal inputs give equal bytes: no timestamps, no absolute local paths, sorted.

The script is a bootstrap (``infra/startup/startup.sh.in``) plus a **release**: an uncompressed tar
(:func:`infra.startup.bundle.build_archive`) of

* ``boot.sh`` (``infra/startup/boot.sh.in``, filled here): reads the metadata with bounded retries
  and shape checks, checks the release record in the bucket (:mod:`infra.components.release`), builds
  the virtualenv with bounded retries, writes and starts the ``multislice-trainer.service``
  systemd unit (docs/vm-boot.md);
* ``identity.sh`` (the stack's backend's ``boot_identity.sh``, filled here: :func:`identity_script`):
  the phase of the boot that finds the VM's worker and slice, which ``boot.sh`` sources;
* ``trainer.sh`` (``infra/startup/trainer.sh``): the unit's ``ExecStart=`` (restart backoff, line
  prefix, ``exec`` of the trainer) and ``ExecStopPost=`` (one line per trainer exit);
* ``slice-watch.sh`` (the backend's, :func:`slice_watch_script`): the release watch runs it to recreate a lost slice;
* ``delete-on-complete.sh`` (``infra/startup/delete_on_complete.sh``): after the trainer exits 0,
  worker 0 of slice 0 deletes the queued resource named by the metadata attribute
  ``multislice-delete-queued-resource`` (present only with ``deleteOnComplete``);
* ``training/*.py``, ``config.json`` (``config.training``), ``requirements.txt`` (the pinned,
  hash-checked wheels of ``infra.startup.lockfile``) and ``uv-requirements.txt`` (the pinned ``uv``).

The **release id** is the sha256 of that tar: it changes with any of these and with the
bootstrap template (whose sha256 ``boot.sh`` carries), and never with the compressor. The
bootstrap carries the tar xz-compressed and base85-encoded (:func:`encode_payload`), checks
the sha256 of the decompressed tar against the release id, unpacks it once into
``$MULTISLICE_HOME/releases/<release id>/`` and runs its ``boot.sh``.

Runtime contract (the emulator, ``training/__main__.py`` and docs/vm-boot.md rely on it; the
names are declared in :mod:`infra.startup.contract`):

* environment variables, all optional (defaults are a real TPU VM): those ``boot.sh``'s header
  lists (``GCE_METADATA_IP``, ``MULTISLICE_HOME``, ``MULTISLICE_PYTHON``, ``STORAGE_EMULATOR_HOST``, …);
* metadata (``instance/``): ``attributes/multislice-run-dir`` (``gs://bucket/path`` or a local path;
  unless the identity phase gives the run dir: a gke Pod's environment), ``service-accounts/default/token``
  (for the release record, with a ``gs://`` run dir), and what the backend's identity phase reads
  (``boot_identity.sh`` of each backend package; docs/vm-boot.md);
* the trainer's unit carries ``MULTISLICE_IDENTITY`` (where the trainer finds its identity) and
  ``MULTISLICE_LOG_RESOURCE`` (where its lines go), from the backend's spec;
* every output line starts with ``[slice S worker W] ``;
* ``systemctl daemon-reload | reset-failed | start | restart | is-active | show`` on
  :data:`TRAINER_UNIT`; the trainer exits 0 (complete: not restarted), 75 (preempted: saved;
  restarted unless the unit is being stopped), 78 (:data:`CONFIG_ERROR_STATUS`: never
  restarted) or other (restarted after the backoff, at most :data:`MAX_RESTARTS` times within
  :data:`START_LIMIT_INTERVAL_S`); ``trainer.sh`` itself exits 76
  (:data:`RELEASE_SUPERSEDED_STATUS`, not restarted) on a backend with a release watch when the
  release record names a newer release;
* on a backend with a release watch (``BackendSpec.release_watch``: the compute-engine backend)
  with a ``gs://`` run dir, :data:`RELEASE_WATCH_UNIT` too: it reads the release record every
  :data:`RELEASE_POLL_S` seconds and boots a new release in place (docs/vm-boot.md);
* in a container (``BackendSpec.supervisor``: the gke backend) no unit: the boot ends as
  ``trainer.sh foreground``, and the container's status is the trainer's.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
import shlex
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from infra.backends.spec import BackendSpec
from infra.config import StackConfig
from infra.startup import bundle, content_cache, lockfile, workload as workload_release
from infra.startup.bundle import BUNDLE_PACKAGE, release_id_of  # noqa: F401 (part of this module's API)
from infra.startup.contract import (  # noqa: F401 (record_object, release_object: part of this module's API)
    COMPILATION_CACHE_FOLDER,
    DEFAULT_COMPUTE_API_ENDPOINT,
    DEFAULT_METADATA_HOST,
    RELEASE_SUPERSEDED_STATUS,
    RELEASE_WATCH_UNIT,
    RUN_DIR_KEY,
    TRAINER_UNIT,
    record_object,
    release_object,
    release_record,
)
from infra.startup.release_objects import bucket_objects, payload_text, record_text  # noqa: F401 (this module's API)
from infra.startup.uv_lock import Lock

#: GCE limit on one metadata value: "less than or equal to 262144 bytes (256 KiB)"
#: (https://cloud.google.com/compute/docs/reference/rest/v1/Metadata, ``items[].value``).
METADATA_VALUE_LIMIT_BYTES = 256 * 1024

#: What we aim for (and what tests/startup/test_script.py checks for the checked-in stacks): a third
#: of GCE's limit, so that a stack's own additions (a command's inline source, its requirements)
#: still fit. 64 KiB until the trainer gained its model family, prepared datasets and the workload
#: launcher (``data prepare`` is left out of the VMs' bundle: infra.startup.bundle.MACHINE_ONLY_PACKAGES);
#: then 80 KiB, a round number under the third, until the checked-in stacks reached it (prod 81,950).
TARGET_SIZE_BYTES = METADATA_VALUE_LIMIT_BYTES // 3

#: Restarts of a failing trainer within :data:`START_LIMIT_INTERVAL_S` before systemd gives up
#: (``StartLimitBurst=`` is this + 1 starts; systemd.unit(5)).
MAX_RESTARTS = 10
START_LIMIT_INTERVAL_S = 3600

#: Trainer exit status for a configuration that can never work (EX_CONFIG from sysexits.h;
#: ``training.train.EXIT_CONFIG``): ``RestartPreventExitStatus=`` keeps systemd from restarting it.
CONFIG_ERROR_STATUS = 78

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
#: :data:`~infra.startup.contract.DEFAULT_METADATA_HOST`, is the contract's).
DEFAULT_HOME = "/var/lib/multislice"
DEFAULT_UNIT_DIR = "/etc/systemd/system"

#: Metadata attribute that holds the run directory (set by the queued resource).
RUN_DIR_ATTRIBUTE = RUN_DIR_KEY

#: Package data of :mod:`infra.startup`: the bootstrap, the boot logic and the unit's launcher.
TEMPLATE_RESOURCE = "startup.sh.in"
BOOT_RESOURCE = "boot.sh.in"
TRAINER_RESOURCE = "trainer.sh"
#: ``delete-on-complete.sh`` of the release: deletes the queued resource once the run is
#: complete (``multislice:queuedResource.deleteOnComplete``; run by trainer.sh).
DELETE_ON_COMPLETE_RESOURCE = "delete_on_complete.sh"
#: ``release-watch.sh`` of the release: on the compute-engine backend, reads the release record
#: and boots a new release on a running VM (``multislice-release-watch.service``).
RELEASE_WATCH_RESOURCE = "release_watch.sh"

_PLACEHOLDER = re.compile(r"@@([A-Z0-9_]+)@@")


class StartupScriptTooLarge(ValueError):
    """The rendered script does not fit in one GCE metadata value (256 KiB)."""


@dataclass(frozen=True)
class RenderedScript:
    """A rendered startup script.

    Attributes:
      text: the whole bash script (UTF-8, ``\\n`` line ends).
      sha256: hex sha256 of ``text`` encoded as UTF-8 (depends on the compressor).
      release_id: hex sha256 of ``release`` (does not).
      release: the release, an uncompressed tar (what the bucket's release record points to).
      bundle_sha256: hex sha256 of the trainer bundle alone (``infra.startup.bundle.build_bundle``).
      requirements_sha256: hex sha256 of the pinned requirements text.
      size_bytes: ``len(text.encode())``, what counts against the metadata limit.
      workload_source: a command's source tar when it travels through the bucket (too large
        for the script: :mod:`infra.startup.workload`), else empty.
      workload_source_object: the bucket object it goes to, else None.
      files: path in the release → the first :data:`FILE_DIGEST_CHARS` hex digits of the
        file's sha256, sorted by path: what a preview shows of a release change (the files
        that changed), instead of the script's base64.
    """

    text: str
    sha256: str
    release_id: str
    release: bytes
    bundle_sha256: str
    requirements_sha256: str
    size_bytes: int
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    workload_source: bytes = b""
    workload_source_object: str | None = None


def template(resource: str = TEMPLATE_RESOURCE) -> str:
    """A template of the script, placeholders unfilled (package data of :mod:`infra.startup`).

    Everything but the ``@@NAME@@`` placeholders is literal bash. A payload placeholder has a
    line of its own, followed by the line that ends its quoted heredoc, so that the template
    itself is a well-formed script that shellcheck can lint.
    """
    return resources.files("infra.startup").joinpath(resource).read_text(encoding="utf-8")


def fill(text: str, values: dict[str, str], name: str = TEMPLATE_RESOURCE) -> str:
    """``text`` with every ``@@NAME@@`` replaced by ``values[NAME]``, in one pass (a value
    that happens to contain ``@@NAME@@`` is never substituted again).

    Raises:
      ValueError: a placeholder has no value, or a value has no placeholder (the template
        ``name`` and the renderer disagree; the message names them).
    """
    used = set(_PLACEHOLDER.findall(text))
    if used != set(values):
        missing, unused = sorted(used - set(values)), sorted(set(values) - used)
        raise ValueError(
            f"{name} and infra/startup/script.py disagree: placeholders without a value {missing}, "
            f"values without a placeholder {unused}"
        )
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


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
        "RELEASE_SUPERSEDED_STATUS": str(RELEASE_SUPERSEDED_STATUS),
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
    return None if file is None else _backend_script(spec.package_text(file), {}, f"{spec.name}'s {file}")


def _backend_script(text: str, values: dict[str, str], what: str) -> str:
    used = set(_PLACEHOLDER.findall(text))
    return fill(text, {name: value for name, value in ENDPOINT_DEFAULTS.items() if name in used} | values, what)


#: Hex digits of each file's sha256 a preview shows (64 bits: a changed file is never missed
#: by chance in practice, and a line of the diff stays short).
FILE_DIGEST_CHARS = 16


def file_digests(files: dict[str, bytes]) -> dict[str, str]:
    """Path → short sha256 (:data:`FILE_DIGEST_CHARS` hex digits) of each file, sorted by path."""
    return {path: hashlib.sha256(files[path]).hexdigest()[:FILE_DIGEST_CHARS] for path in sorted(files)}


def workload_files(config: StackConfig, project_root: Path) -> workload_release.WorkloadRelease | None:
    """The release files of the stack's command (:mod:`infra.startup.workload`), None for the trainer.

    Raises:
      infra.startup.workload.WorkloadError: its requirements cannot install on the VMs.
    """
    if config.workload is None:
        return None
    lock_path = project_root / "uv.lock"
    lock = Lock(lock_path) if lock_path.is_file() else None
    return workload_release.workload_files(config.stack, config.workload, lockfile.install_target(project_root), lock)


def release_files(
    config: StackConfig,
    project_root: Path,
    cache: content_cache.ContentCache | None = None,
    workload: workload_release.WorkloadRelease | None = None,
    spec: BackendSpec | None = None,
) -> tuple[dict[str, bytes], lockfile.VmPins]:
    """Path → content of every file of the stack's release, and the VM's pins (computed once
    per content with ``cache``, :func:`infra.startup.lockfile.vm_pins`). With a command
    (``workload``, :func:`workload_files`) the release carries the command's files instead of
    the trainer's ``config.json``; the trainer package still ships (its launcher,
    ``training.workload``, and its log shipper run the command), for backend ``spec`` (default: the stack's)."""
    pins = lockfile.vm_pins(project_root, cache)
    files = bundle.trainer_files(project_root / BUNDLE_PACKAGE)
    files.update(
        {
            "boot.sh": boot_script(config, pins, workload, spec).encode(),
            "identity.sh": identity_script(config, spec).encode(),
            "trainer.sh": template(TRAINER_RESOURCE).encode(),
            "delete-on-complete.sh": template(DELETE_ON_COMPLETE_RESOURCE).encode(),
            "release-watch.sh": template(RELEASE_WATCH_RESOURCE).encode(),
            "requirements.txt": pins.requirements_text.encode(),
            "uv-requirements.txt": pins.uv_requirement_text.encode(),
        }
    )
    if (watch := slice_watch_script(config, spec)) is not None:
        files["slice-watch.sh"] = watch.encode()
    if workload is None:
        files["config.json"] = (config.training.model_dump_json() + "\n").encode()
    else:
        files.update(workload.files)
    return files, pins


#: Characters the embedded payload may hold: the base85 alphabet of RFC 1924
#: (https://datatracker.ietf.org/doc/html/rfc1924#section-4), which Python's
#: ``base64.b85encode`` writes (https://docs.python.org/3/library/base64.html#base64.b85encode).
#: None is a quote, backslash, space, comma, period, slash or colon: inside the quoted heredoc
#: (``<<'MULTISLICE_RELEASE'``) bash expands nothing (bash(1), "Here Documents"), and as a
#: metadata value the JSON string escapes none of them.
PAYLOAD_ALPHABET = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~")


def encode_payload(compressed: bytes) -> str:
    """The compressed release as one line of base85 (RFC 1924 alphabet, :data:`PAYLOAD_ALPHABET`):
    5 characters per 4 bytes, 6.25 % smaller than base64's 4 per 3 (about 3.6 KB of a 60 KB
    script). The bootstrap decodes it with the VM's ``python3`` (``base64.b85decode``, Python
    3.4+), which boot.sh needs anyway to install uv. One line: line breaks would add bytes.

    Raises:
      ValueError: the encoding produced a character outside :data:`PAYLOAD_ALPHABET` (never
        with the standard library's encoder; a guard for the heredoc's safety).
    """
    text = base64.b85encode(compressed).decode("ascii")
    stray = set(text) - PAYLOAD_ALPHABET
    if stray:
        raise ValueError(f"base85 payload holds characters outside RFC 1924's alphabet: {sorted(stray)}")
    return text


def render(
    config: StackConfig,
    *,
    project_root: Path | None = None,
    compress=None,
    spec: BackendSpec | None = None,
) -> RenderedScript:
    """Render the startup script of a stack.

    Args:
      config: the validated stack (its ``training`` is the release's config.json).
      project_root: checkout with ``training/``, ``uv.lock``, ``.python-version``; default:
        the one this module lives in. The output does not depend on where it is.
      compress: ``bytes -> xz bytes`` for the embedded release; default
        :func:`infra.startup.bundle.compress`, done once per content (:func:`infra.startup.bundle.cached_compress`).
        Tests pass another level or implementation to show that the release id does not
        depend on it.
      spec: the backend whose release it is (default: the stack's; the gke Pod's, until it is registered).

    Returns:
      RenderedScript; ``text`` is identical for identical inputs (and compressor).

    Raises:
      StartupScriptTooLarge: the script exceeds :data:`METADATA_VALUE_LIMIT_BYTES` (256 KiB,
        the GCE limit on one metadata value).
      infra.startup.uv_lock.LockfileError: the lock cannot give the VM's pinned requirements.
      infra.startup.workload.WorkloadError: the command's requirements cannot install on the VMs.
      FileNotFoundError: no ``training/*.py`` under ``project_root``.
    """
    root = Path(project_root) if project_root is not None else lockfile.default_project_root()
    cache = content_cache.for_project(root)  # bundle, pins and compressed release: once per content
    bundle_sha256 = hashlib.sha256(bundle.cached_bundle(root / BUNDLE_PACKAGE, cache)).hexdigest()
    workload = workload_files(config, root)
    files, pins = release_files(config, root, cache, workload, spec)
    release = bundle.build_archive(files)
    release_id = hashlib.sha256(release).hexdigest()
    compressed = bundle.cached_compress(release, cache) if compress is None else compress(release)
    values = {
        "STACK": config.stack,
        "ACCELERATOR": config.accelerator_type,
        "SLICES": str(config.slices),
        "RELEASE_ID": release_id,
        "BUNDLE_SHA256": bundle_sha256,
        "REQUIREMENTS_SHA256": pins.requirements_sha256,
        "DEFAULT_HOME": DEFAULT_HOME,
        "RELEASE_BASE85": encode_payload(compressed),
    }
    text = fill(template(), values)
    data = text.encode("utf-8")
    if len(data) > METADATA_VALUE_LIMIT_BYTES:
        what = "multislice:workload: the startup script" if config.workload else "the startup script"
        shrink = "shrink the workload's env or requirements" if config.workload else "shrink training/ or requirements"
        raise StartupScriptTooLarge(
            f"{what} of stack {config.stack!r} is {len(data)} bytes ({len(data) / 1024:.1f} KiB), "
            f"over the GCE metadata value limit of {METADATA_VALUE_LIMIT_BYTES} bytes "
            f"({METADATA_VALUE_LIMIT_BYTES // 1024} KiB); {shrink}"
        )
    return RenderedScript(
        text=text,
        sha256=hashlib.sha256(data).hexdigest(),
        release_id=release_id,
        release=release,
        bundle_sha256=values["BUNDLE_SHA256"],
        requirements_sha256=pins.requirements_sha256,
        size_bytes=len(data),
        files=file_digests(files),
        workload_source=workload.source_tar if workload and workload.source_object else b"",
        workload_source_object=workload.source_object if workload else None,
    )
