"""The files of a stack's release: what a TPU VM (or a GKE Pod) unpacks and runs.

:func:`release_files` lists them, path → content: ``boot.sh``, ``identity.sh`` and ``slice-watch.sh``
(:mod:`infra.startup.boot`), ``trainer.sh``, ``delete-on-complete.sh`` and ``release-watch.sh``
(:mod:`infra.startup.templates`), ``training/*.py`` (:func:`infra.startup.bundle.trainer_files`),
``config.json`` (``config.training``) or a command's files (:func:`workload_files`,
:mod:`infra.startup.workload`), ``requirements.txt`` (the pinned, hash-checked wheels of
:mod:`infra.startup.lockfile`) and ``uv-requirements.txt`` (the pinned ``uv``).
:func:`file_digests` is what a preview shows of them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from infra.backends.spec import BackendSpec
from infra.config import StackConfig
from infra.startup import bundle, content_cache, lockfile, workload as workload_release
from infra.startup.boot import boot_script, identity_script, slice_watch_script
from infra.startup.bundle import BUNDLE_PACKAGE
from infra.startup.templates import DELETE_ON_COMPLETE_RESOURCE, RELEASE_WATCH_RESOURCE, TRAINER_RESOURCE, template
from infra.startup.uv_lock import Lock


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
    per content with ``cache``, :func:`infra.startup.lockfile.vm_pins`, as is each trainer module's
    stripping, :func:`infra.startup.bundle.trainer_files`). With a command
    (``workload``, :func:`workload_files`) the release carries the command's files instead of
    the trainer's ``config.json``; the trainer package still ships (its launcher,
    ``training.workload``, and its log shipper run the command), for backend ``spec`` (default: the stack's)."""
    pins = lockfile.vm_pins(project_root, cache)
    files = bundle.trainer_files(project_root / BUNDLE_PACKAGE, cache)
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
        training = config.training.model_copy(  # the elastic settings: training/membership_gate.py
            update={
                "min_slices": config.elastic.min_slices,
                "shrink_after_s": float(config.elastic.shrink_after),
                "grow_after_s": float(config.elastic.grow_after),
            }
        )
        files["config.json"] = (training.model_dump_json() + "\n").encode()
    else:
        files.update(workload.files)
    return files, pins


#: Hex digits of each file's sha256 a preview shows (64 bits: a changed file is never missed
#: by chance in practice, and a line of the diff stays short).
FILE_DIGEST_CHARS = 16


def file_digests(files: dict[str, bytes]) -> dict[str, str]:
    """Path → short sha256 (:data:`FILE_DIGEST_CHARS` hex digits) of each file, sorted by path."""
    return {path: hashlib.sha256(files[path]).hexdigest()[:FILE_DIGEST_CHARS] for path in sorted(files)}
