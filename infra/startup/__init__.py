"""Stack → TPU VM startup script, and the contract between ``pulumi up`` and a TPU VM.

Modules:

* :mod:`~infra.startup.script`: :func:`render` (the startup script of a stack: a bootstrap
  carrying one release) and the systemd/retry settings it fills into the templates;
* :mod:`~infra.startup.contract`: the names both sides spell: node metadata keys, the
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

The public names of :mod:`~infra.startup.script` are also names of this package
(``from infra import startup; startup.render(config)``), loaded on first use: importing
:mod:`~infra.startup.contract` or :mod:`~infra.startup.bundle` alone (as the queued-resource
provider does) does not import the stack config.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from infra.startup.script import (  # noqa: F401
        ATTEMPTS,
        BOOT_RESOURCE,
        BUILD_ATTEMPTS,
        BUILD_RETRY_DELAY_S,
        BUNDLE_PACKAGE,
        CONFIG_ERROR_STATUS,
        DEFAULT_HOME,
        DEFAULT_METADATA_HOST,
        DEFAULT_UNIT_DIR,
        DELETE_ON_COMPLETE_RESOURCE,
        FILE_DIGEST_CHARS,
        MAX_RESTARTS,
        METADATA_VALUE_LIMIT_BYTES,
        PAYLOAD_ALPHABET,
        RELEASE_POLL_S,
        RELEASE_SUPERSEDED_STATUS,
        RELEASE_WATCH_RESOURCE,
        RELEASE_WATCH_UNIT,
        RESTART_BACKOFF_MAX_S,
        RESTART_BACKOFF_S,
        RESTART_SEC,
        RETRY_DELAY_S,
        RUN_DIR_ATTRIBUTE,
        START_LIMIT_INTERVAL_S,
        STOP_TIMEOUT_S,
        TARGET_SIZE_BYTES,
        TEMPLATE_RESOURCE,
        TRAINER_RESOURCE,
        TRAINER_UNIT,
        RenderedScript,
        StartupScriptTooLarge,
        boot_script,
        bucket_objects,
        encode_payload,
        file_digests,
        fill,
        record_object,
        release_files,
        release_id_of,
        release_object,
        render,
        template,
    )

#: The names of :mod:`infra.startup.script` this package re-exports.
__all__ = [
    "ATTEMPTS",
    "BOOT_RESOURCE",
    "BUILD_ATTEMPTS",
    "BUILD_RETRY_DELAY_S",
    "BUNDLE_PACKAGE",
    "CONFIG_ERROR_STATUS",
    "DEFAULT_HOME",
    "DEFAULT_METADATA_HOST",
    "DEFAULT_UNIT_DIR",
    "FILE_DIGEST_CHARS",
    "MAX_RESTARTS",
    "METADATA_VALUE_LIMIT_BYTES",
    "PAYLOAD_ALPHABET",
    "DELETE_ON_COMPLETE_RESOURCE",
    "RELEASE_POLL_S",
    "RELEASE_SUPERSEDED_STATUS",
    "RELEASE_WATCH_RESOURCE",
    "RELEASE_WATCH_UNIT",
    "RESTART_BACKOFF_MAX_S",
    "RESTART_BACKOFF_S",
    "RESTART_SEC",
    "RETRY_DELAY_S",
    "RUN_DIR_ATTRIBUTE",
    "START_LIMIT_INTERVAL_S",
    "STOP_TIMEOUT_S",
    "TARGET_SIZE_BYTES",
    "TEMPLATE_RESOURCE",
    "TRAINER_RESOURCE",
    "TRAINER_UNIT",
    "RenderedScript",
    "StartupScriptTooLarge",
    "boot_script",
    "bucket_objects",
    "encode_payload",
    "file_digests",
    "fill",
    "record_object",
    "release_files",
    "release_id_of",
    "release_object",
    "render",
    "template",
]
SCRIPT_NAMES = frozenset(__all__)


def __getattr__(name: str) -> Any:
    """A name of :mod:`infra.startup.script`, imported on first use (PEP 562)."""
    if name in SCRIPT_NAMES:
        value = getattr(importlib.import_module("infra.startup.script"), name)
        globals()[name] = value  # later look-ups (and monkeypatching) find it here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(SCRIPT_NAMES))
