"""The TPU VM startup script, rendered for a stack: a small bootstrap carrying one release.

:func:`render` turns a :class:`~infra.config.StackConfig` into the bash script every TPU VM
of the stack boots with (metadata key ``startup-script``). The same bytes run in the local emulator
(``infra/local``). Equal inputs give equal bytes: no timestamps, no absolute local paths, sorted.

The script is a bootstrap (``infra/startup/startup.sh.in``) plus a **release**: an uncompressed tar
(:func:`infra.startup.bundle.build_archive`) of

* ``boot.sh`` (``infra/startup/boot.sh.in``, filled by :mod:`infra.startup.boot`): reads the metadata
  with bounded retries and shape checks, checks the release record in the bucket
  (:mod:`infra.components.release`), builds the virtualenv with bounded retries, writes and starts the
  ``multislice-trainer.service`` systemd unit (docs/vm-boot.md);
* ``identity.sh`` (the stack's backend's ``boot_identity.sh``, filled by
  :func:`infra.startup.boot.identity_script`): the phase of the boot that finds the VM's worker and
  slice, which ``boot.sh`` sources;
* ``trainer.sh`` (``infra/startup/trainer.sh``): the unit's ``ExecStart=`` (restart backoff, line
  prefix, ``exec`` of the trainer) and ``ExecStopPost=`` (one line per trainer exit);
* ``slice-watch.sh`` (the backend's, :func:`infra.startup.boot.slice_watch_script`): the release watch
  runs it to recreate a lost slice;
* ``delete-on-complete.sh`` (``infra/startup/delete_on_complete.sh``): after the trainer exits 0,
  worker 0 of slice 0 deletes the queued resource named by the metadata attribute
  ``multislice-delete-queued-resource`` (present only with ``deleteOnComplete``);
* ``training/*.py``, ``config.json`` (``config.training``), ``requirements.txt`` (the pinned,
  hash-checked wheels of ``infra.startup.lockfile``) and ``uv-requirements.txt`` (the pinned ``uv``):
  :func:`infra.startup.release.release_files`.

The **release id** is the sha256 of that tar: it changes with any of these and with the
bootstrap template (whose sha256 ``boot.sh`` carries), and never with the compressor. The
bootstrap carries the tar xz-compressed and base85-encoded (:func:`encode_payload`), checks
the sha256 of the decompressed tar against the release id, unpacks it once into
``$MULTISLICE_HOME/releases/<release id>/`` and runs its ``boot.sh``.

Runtime contract (the emulator, ``training/__main__.py`` and docs/vm-boot.md rely on it; the
names are declared in :mod:`infra.vm_contract`):

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
  :data:`~infra.vm_contract.TRAINER_UNIT`; the trainer exits 0 (complete: not restarted), 75
  (preempted: saved; restarted unless the unit is being stopped), 78
  (:data:`~infra.startup.boot.CONFIG_ERROR_STATUS`: never restarted) or other (restarted after the
  backoff, at most :data:`~infra.startup.boot.MAX_RESTARTS` times within
  :data:`~infra.startup.boot.START_LIMIT_INTERVAL_S`); ``trainer.sh`` itself exits 76
  (:data:`~infra.vm_contract.RELEASE_SUPERSEDED_STATUS`, not restarted) on a backend with a
  release watch when the release record names a newer release;
* on a backend with a release watch (``BackendSpec.release_watch``: the compute-engine backend)
  with a ``gs://`` run dir, :data:`~infra.vm_contract.RELEASE_WATCH_UNIT` too: it reads the
  release record every :data:`~infra.startup.boot.RELEASE_POLL_S` seconds and boots a new release in
  place (docs/vm-boot.md);
* in a container (``BackendSpec.supervisor``: the gke backend) no unit: the boot ends as
  ``trainer.sh foreground``, and the container's status is the trainer's.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

from infra.backends.spec import BackendSpec
from infra.config import StackConfig
from infra.startup import bundle, content_cache, lockfile
from infra.startup.boot import DEFAULT_HOME
from infra.startup.bundle import BUNDLE_PACKAGE
from infra.startup.release import file_digests, release_files, workload_files
from infra.startup.templates import fill, template
from infra.vm_contract import RELEASE_UNVERIFIED_STATUS

#: GCE limit on one metadata value: "less than or equal to 262144 bytes (256 KiB)"
#: (https://cloud.google.com/compute/docs/reference/rest/v1/Metadata, ``items[].value``).
METADATA_VALUE_LIMIT_BYTES = 256 * 1024

#: What we aim for (and what tests/startup/test_script.py checks for the checked-in stacks): well
#: under GCE's limit, so that a stack's own additions (a command's inline source, its requirements)
#: still fit. 64 KiB until the trainer gained its model family, prepared datasets and the workload
#: launcher (``data prepare`` is left out of the VMs' bundle: infra.startup.bundle.MACHINE_ONLY_PACKAGES);
#: then 80 KiB, a round number under the third, until the checked-in stacks reached it (prod 81,950);
#: then a third (87,381) until elastic slices (training/heartbeats.py, training/membership_gate.py)
#: took prod to 89,315; then 96 KiB until the warm standby (training/standby.py,
#: training/standby_handoff.py) took dev to 102,756; now 104 KiB, which leaves 152 KiB of the limit to
#: a stack's own additions.
TARGET_SIZE_BYTES = 104 * 1024


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
    cache: content_cache.ContentCache | None = None,
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
      cache: where the work done once per content is kept (the bundle, the pins, each shipped
        module, the compressed release); default: ``project_root``'s
        (:func:`infra.startup.content_cache.for_project`). Keyed by content, so a revision's
        checkout may share the working tree's (``multislice diff``).

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
    if cache is None:
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
        "RELEASE_UNVERIFIED_STATUS": str(RELEASE_UNVERIFIED_STATUS),
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
