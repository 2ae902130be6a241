"""Stack → TPU VM startup script, and the contract between ``pulumi up`` and a TPU VM.

Modules:

* :mod:`~infra.startup.script`: :func:`render` (the startup script of a stack: a bootstrap
  carrying one release); :mod:`~infra.startup.release` (the release's files),
  :mod:`~infra.startup.boot` (``boot.sh``, the backend's identity phase and slice watch, and the
  systemd/retry settings they carry), :mod:`~infra.startup.templates` (the templates and how they
  are filled);
* :mod:`~infra.vm_contract`: the names both sides spell: node metadata keys, the
  release record's bucket objects and fields, the environment variables of the VM's scripts
  and trainer, and the default endpoints (the program, the provider, the emulator and
  ``status`` import them from here);
* :mod:`~infra.startup.bundle`: the trainer bundle and the release tar (reproducible), and
  :mod:`~infra.startup.shipped_source` (what of ``training/`` ships);
* :mod:`~infra.startup.lockfile` (uv.lock → the VM's pinned, hash-checked requirements), with
  :mod:`~infra.startup.uv_lock` (reading the lock) and :mod:`~infra.startup.install_target`
  (the VM as an install target);
* :mod:`~infra.startup.content_cache`: work done once per content (bundle, pins, compression).

Templates (package data, read with :mod:`importlib.resources`): ``startup.sh.in`` (the
bootstrap), ``boot.sh.in`` (the release's boot logic), ``trainer.sh`` (the unit's launcher)
``delete_on_complete.sh`` and ``release_watch.sh`` (docs/vm-boot.md).

The public names of those modules are also names of this package (``from infra import startup;
startup.render(config)``; :data:`SOURCES` says which module each comes from), loaded on first use: importing
:mod:`~infra.vm_contract` or :mod:`~infra.startup.bundle` alone (as the queued-resource
provider does) does not import the stack config.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from infra.startup.boot import (  # noqa: F401
        ATTEMPTS,
        BUILD_ATTEMPTS,
        BUILD_RETRY_DELAY_S,
        CONFIG_ERROR_STATUS,
        DEFAULT_HOME,
        DEFAULT_UNIT_DIR,
        MAX_RESTARTS,
        RELEASE_POLL_S,
        RESTART_BACKOFF_MAX_S,
        RESTART_BACKOFF_S,
        RESTART_SEC,
        RETRY_DELAY_S,
        RUN_DIR_ATTRIBUTE,
        START_LIMIT_INTERVAL_S,
        STOP_TIMEOUT_S,
        boot_script,
    )
    from infra.startup.bundle import BUNDLE_PACKAGE, release_id_of  # noqa: F401
    from infra.startup.release import FILE_DIGEST_CHARS, file_digests, release_files  # noqa: F401
    from infra.startup.release_objects import bucket_objects  # noqa: F401
    from infra.startup.script import (  # noqa: F401
        METADATA_VALUE_LIMIT_BYTES,
        PAYLOAD_ALPHABET,
        TARGET_SIZE_BYTES,
        RenderedScript,
        StartupScriptTooLarge,
        encode_payload,
        render,
    )
    from infra.startup.templates import (  # noqa: F401
        BOOT_RESOURCE,
        DELETE_ON_COMPLETE_RESOURCE,
        RELEASE_WATCH_RESOURCE,
        TEMPLATE_RESOURCE,
        TRAINER_RESOURCE,
        fill,
        template,
    )
    from infra.vm_contract import (  # noqa: F401
        DEFAULT_METADATA_HOST,
        RELEASE_SUPERSEDED_STATUS,
        RELEASE_WATCH_UNIT,
        TRAINER_UNIT,
        record_object,
        release_object,
    )

#: The module of :mod:`infra.startup` each name of this package comes from.
SOURCES: dict[str, str] = {
    **dict.fromkeys(
        (
            "METADATA_VALUE_LIMIT_BYTES",
            "PAYLOAD_ALPHABET",
            "RenderedScript",
            "StartupScriptTooLarge",
            "TARGET_SIZE_BYTES",
            "encode_payload",
            "render",
        ),
        "infra.startup.script",
    ),
    **dict.fromkeys(
        (
            "ATTEMPTS",
            "BUILD_ATTEMPTS",
            "BUILD_RETRY_DELAY_S",
            "CONFIG_ERROR_STATUS",
            "DEFAULT_HOME",
            "DEFAULT_UNIT_DIR",
            "MAX_RESTARTS",
            "RELEASE_POLL_S",
            "RESTART_BACKOFF_MAX_S",
            "RESTART_BACKOFF_S",
            "RESTART_SEC",
            "RETRY_DELAY_S",
            "RUN_DIR_ATTRIBUTE",
            "START_LIMIT_INTERVAL_S",
            "STOP_TIMEOUT_S",
            "boot_script",
        ),
        "infra.startup.boot",
    ),
    **dict.fromkeys(
        (
            "BOOT_RESOURCE",
            "DELETE_ON_COMPLETE_RESOURCE",
            "RELEASE_WATCH_RESOURCE",
            "TEMPLATE_RESOURCE",
            "TRAINER_RESOURCE",
            "fill",
            "template",
        ),
        "infra.startup.templates",
    ),
    **dict.fromkeys(("FILE_DIGEST_CHARS", "file_digests", "release_files"), "infra.startup.release"),
    **dict.fromkeys(("BUNDLE_PACKAGE", "release_id_of"), "infra.startup.bundle"),
    **dict.fromkeys(
        (
            "DEFAULT_METADATA_HOST",
            "RELEASE_SUPERSEDED_STATUS",
            "RELEASE_WATCH_UNIT",
            "TRAINER_UNIT",
            "record_object",
            "release_object",
        ),
        "infra.vm_contract",
    ),
    **dict.fromkeys(("bucket_objects",), "infra.startup.release_objects"),
}


def __getattr__(name: str) -> Any:
    """A name of :data:`SOURCES`, imported from its module on first use (PEP 562)."""
    if name in SOURCES:
        value = getattr(importlib.import_module(SOURCES[name]), name)
        globals()[name] = value  # later look-ups (and monkeypatching) find it here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(SOURCES))
