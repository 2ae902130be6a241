"""A stack's prepared dataset against its model, before any resource exists: ``multislice
plan`` and ``pulumi preview``/``up`` read the manifest of ``multislice:training.data.source``.

The trainer takes the model's vocabulary from the dataset's ``manifest.json`` when
``multislice:training.model.vocab_size`` is unset, and refuses a stated (or preset) vocabulary
smaller than the manifest's, or one the tensor mesh axis does not divide
(``training.data.sources.with_vocabulary``); but only on the TPU VMs, once the queued resource is
ACTIVE and paid for. :func:`check_dataset` reads the same manifest with the same checks
(``training.data.manifest.parse``) and raises the same refusals as a
:class:`~infra.config.StackConfigError` naming the key; it also gives the stack with the
manifest's vocabulary filled in, so the plan's parameters and memory are those the VMs train.

Where the manifest is read from (docs/data.md, "Checked at plan and preview"):

* a ``gs://`` source without wildcards: ``<source>/manifest.json`` through google-cloud-storage
  (``Blob.download_as_bytes``, https://cloud.google.com/python/docs/reference/storage/latest),
  one request bounded by :data:`MANIFEST_TIMEOUT_S`, no retries, billed to the stack's
  project, with the credentials the queued-resource provider would use (:mod:`infra.credentials`:
  the environment variables pulumi-gcp reads, then Application Default Credentials); with
  none configured nothing is sent (checked offline first). ``STORAGE_EMULATOR_HOST`` points it
  at an emulator, anonymously (the local emulation's fake-gcs-server);
* a local path without wildcards: ``<source>/manifest.json`` on this machine (the path the
  emulated VMs of ``multislice local up`` read; a real VM's path may not exist here);
* ``stdlib``, a glob, a local file, a ``gs://`` object: bytes (vocabulary 256), which
  ``training.config`` already checks; nothing is read.

A manifest that cannot be read (no credentials, no permission, not found: the dataset may be
prepared after the stack is created, no answer in time) does not fail the stack: the check is
skipped and :attr:`DatasetCheck.warning` says why, naming the source. A manifest that is read
but is not a valid manifest fails it (the trainer would refuse it too).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.config.loading import StackConfigError
from infra.config.schema import StackConfig
from infra.readers.files import UnreadableFile, read_bounded
from training.config import vocabulary_mismatch
from training.model import presets
from training.warning_text import WarningText, no_action

#: Seconds the manifest request may take (connect, and each read of the answer); a manifest is
#: a few hundred bytes per shard.
MANIFEST_TIMEOUT_S = 20.0

#: The variable google-cloud-storage (and gcsfs) read an emulator's address from; the same name as
#: ``infra.vm_contract.STORAGE_ENDPOINT_ENV``, written out: the startup package is a layer above.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"

_SOURCE = "multislice:training.data.source"
_VOCAB = "multislice:training.model.vocab_size"
_PRESET = "multislice:training.model.preset"


class ManifestUnreadable(Exception):
    """The manifest could not be read (no credentials, no permission, not found, no answer):
    the check is skipped; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class DatasetCheck:
    """What :func:`check_dataset` found.

    Attributes:
      config: the stack, with ``training.model.vocab_size`` set to the manifest's when the
        stack leaves it unset (as the trainer resolves it); else the stack unchanged. For the
        planner only: the program declares the stack as written.
      manifest: where the manifest was read (``gs://…/manifest.json`` or a local path); None
        when the source is not a prepared dataset or the manifest could not be read.
      vocab_size: the manifest's vocabulary (token ids), or None as for ``manifest``.
      warning: one line saying the vocabulary check was skipped and why, naming the source (no
        action needed: the trainer checks it); None when it ran or did not apply.
    """

    config: StackConfig
    manifest: str | None = None
    vocab_size: int | None = None
    warning: WarningText | None = None


def manifest_location(source: str) -> str | None:
    """Where the manifest of ``source`` (``training.data.source``) would be, or None when the
    source can only be bytes: ``stdlib``, a wildcard, a scheme other than ``gs://``, a local
    file (the trainer's rule, ``training.data.sources.is_prepared_dataset``)."""
    if source == "stdlib" or any(ch in source for ch in "*?["):
        return None
    from training.data import (
        manifest as manifest_lib,  # here: it imports numpy, which a preview of a byte stack never needs
    )

    if "://" in source:
        return f"{source.rstrip('/')}/{manifest_lib.MANIFEST}" if source.startswith("gs://") else None
    if Path(source).is_file():
        return None
    return str(Path(source) / manifest_lib.MANIFEST)


def read_manifest_bytes(
    location: str, project: str, environ: Mapping[str, str] | None = None, *, timeout: float = MANIFEST_TIMEOUT_S
) -> bytes | None:
    """The bytes of ``location`` (a ``gs://`` object or a local file), or None when ``location``
    is a ``gs://`` manifest whose source is itself an object (a byte source, not a dataset).

    Raises:
      ManifestUnreadable: not found, no credentials (nothing sent), permission denied, the
        request failed or took longer than ``timeout`` seconds.
    """
    if not location.startswith("gs://"):
        from training.run_objects import MAX_OBJECT_BYTES  # the most the manifest's reader decodes

        try:
            return read_bounded(location, MAX_OBJECT_BYTES)  # a FIFO or a device is refused unread
        except FileNotFoundError:
            source = Path(location).parent
            raise ManifestUnreadable(
                f"{location} does not exist (not prepared yet?)"
                if source.is_dir()
                else f"{source} does not exist on this machine (a path on the VMs is checked where it exists here too)"
            ) from None
        except UnreadableFile as err:
            raise ManifestUnreadable(f"cannot read {location}: {err.why}") from None
        except OSError as err:
            raise ManifestUnreadable(f"cannot read {location}: {err.strerror or err}") from None
    environ = os.environ if environ is None else environ
    bucket_name, _, name = location.removeprefix("gs://").partition("/")
    credentials = _credentials(project, environ)
    from google.api_core import exceptions as api_exceptions
    from google.cloud import storage

    # Documented as "float or tuple" and "None will disable retries" (Blob.download_as_bytes);
    # the library's inferred signature says int and Retry.
    bounded: dict[str, Any] = {"timeout": timeout, "retry": None}
    try:
        client = storage.Client(project=project, credentials=credentials)
        bucket = client.bucket(bucket_name)
        try:
            return bucket.blob(name).download_as_bytes(**bounded)
        except api_exceptions.NotFound:
            from training.data.manifest import MANIFEST

            source = name[: -len(MANIFEST)].rstrip("/")  # "" for a bucket's root
            if source and bucket.blob(source).exists(**bounded):
                return None  # gs://bucket/corpus.txt: one text object, read as bytes
            raise ManifestUnreadable(
                f"{location} does not exist (not prepared yet, or the bucket does not exist)"
            ) from None
    except ManifestUnreadable:
        raise
    except api_exceptions.Forbidden as err:
        raise ManifestUnreadable(f"permission denied reading {location}: {err.message}") from None
    except Exception as err:  # google-auth, requests and the API raise many types (RefreshError, Timeout, ...)
        text = str(err).splitlines()[0] if str(err) else ""
        raise ManifestUnreadable(f"cannot read {location}: {type(err).__name__}: {text}") from None


def _credentials(project: str, environ: Mapping[str, str]) -> object:
    """Anonymous credentials against an emulator, else the provider's (:mod:`infra.credentials`).

    Raises:
      ManifestUnreadable: no usable credentials (found out offline: nothing is sent).
    """
    from infra import credentials

    if environ.get(EMULATOR_ENV):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    settings = credentials.CredentialSettings.resolve({}, environ)
    missing = credentials.problem(settings, environ)
    if missing:
        raise ManifestUnreadable(missing)
    try:
        return credentials.load(settings, quota_project=settings.quota_project(project))
    except credentials.CredentialsError as err:
        raise ManifestUnreadable(str(err)) from None


def vocabulary_problems(config: StackConfig, data_vocab: int) -> list[str]:
    """``key: problem`` lines for a model of ``config`` on data of ``data_vocab`` token ids (its
    prepared dataset's manifest): a vocabulary that is smaller (stated, or a preset's), or one the
    tensor mesh axis does not divide; the refusals of ``training.data.sources.with_vocabulary``."""
    model = config.training.model
    tensor = config.training.parallelism.mesh_shape["tensor"]
    stated = model.vocab_size
    data = f"the vocabulary of {_SOURCE} {config.training.data.source} ({data_vocab:,} ids in its manifest.json)"
    mismatch = vocabulary_mismatch(stated, data_vocab, tensor)
    if mismatch == "smaller":
        assert stated is not None
        preset = presets.PRESETS.get(model.preset or "", {})
        if preset.get("vocab_size") == stated:
            return [
                f"{_PRESET}: {model.preset}'s vocabulary of {stated:,} ids is smaller than {data}: token ids up to "
                f"{data_vocab - 1:,} would have no embedding; set {_VOCAB} to at least {data_vocab} (it overrides "
                "the preset's) or prepare the data with the preset's tokenizer"
            ]
        return [
            f"{_VOCAB}: {stated:,} is smaller than {data}: token ids up to {data_vocab - 1:,} would have no "
            f"embedding; set it to at least {data_vocab} or leave it out (the model then takes the manifest's)"
        ]
    if mismatch == "indivisible" and stated is None:  # a stated one the config itself refuses
        padded = -(-data_vocab // tensor) * tensor
        return [
            f"{_VOCAB}: unset, so the model takes {data}, which the tensor mesh axis size {tensor} does not "
            f"divide; set {_VOCAB} to {padded} (the embedding padded to a multiple of {tensor})"
        ]
    return []


def check_dataset(
    config: StackConfig, environ: Mapping[str, str] | None = None, *, timeout: float = MANIFEST_TIMEOUT_S
) -> DatasetCheck:
    """Read the manifest of the stack's ``training.data.source`` (if it names a prepared
    dataset) and check the model's vocabulary against it (module docstring).

    Raises:
      StackConfigError: the vocabulary is smaller than the manifest's (naming
        ``multislice:training.model.vocab_size`` or ``.preset`` and both numbers), the tensor
        axis does not divide the manifest's vocabulary the model would take, or the manifest
        is read but is not a valid manifest (naming ``multislice:training.data.source``).
    """
    source = config.training.data.source
    location = None if config.workload is not None else manifest_location(source)
    if location is None:
        return DatasetCheck(config)
    try:
        data = read_manifest_bytes(location, config.project, environ, timeout=timeout)
    except ManifestUnreadable as err:
        return DatasetCheck(
            config,
            warning=no_action(
                f"{_SOURCE} {source}: the model's vocabulary was not checked against the dataset's manifest ({err})",
                "the trainer checks it on the TPU VMs before its first step",
            ),
        )
    if data is None:
        return DatasetCheck(config)
    summary = f"stack {config.stack!r} does not fit its training data:"
    from training.data import manifest as manifest_lib

    try:
        manifest = manifest_lib.parse(data, location)
    except manifest_lib.ManifestError as err:
        raise StackConfigError(
            summary, [f"{_SOURCE}: {err}; the trainer would refuse it (prepare the dataset again)"]
        ) from None
    problems = vocabulary_problems(config, manifest.vocab_size)
    if problems:
        raise StackConfigError(summary, problems)
    planned = config
    if config.training.model.vocab_size is None:
        train = config.training
        model = train.model.model_copy(update={"vocab_size": manifest.vocab_size})
        planned = config.model_copy(update={"training": train.model_copy(update={"model": model})})
    return DatasetCheck(planned, location, manifest.vocab_size)
