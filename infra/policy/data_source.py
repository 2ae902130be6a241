"""Does a ``gs://`` training data source match any object? Checked at review time, when the
credentials at hand may list the bucket (the policy ``data-source-exists``).

The trainer refuses a source that matches no non-empty file (``training.data.base.DataError``, exit
78, not restarted), but only once the queued resource is ACTIVE and paid for. Listing uses
gcsfs (the same client the VMs use for ``gs://``; anonymous against ``STORAGE_EMULATOR_HOST``)
with the credentials the queued-resource provider would use (:mod:`infra.credentials`: the
environment variables pulumi-gcp reads, then Application Default Credentials), billed to the
stack's project; with none configured nothing is sent (checked offline first). Each request is
bounded by :data:`LIST_TIMEOUT_S`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, cast

from infra.vm_contract import STORAGE_ENDPOINT_ENV

#: Seconds one listing request may take.
LIST_TIMEOUT_S = 20.0


class SourceUnlistable(Exception):
    """The source could not be listed (no credentials, no permission, no answer): unchecked."""


@dataclasses.dataclass(frozen=True)
class Listing:
    """What a glob matched: ``objects`` (count) of which ``non_empty`` have bytes."""

    objects: int
    non_empty: int


def split_glob(source: str) -> tuple[str, str]:
    """``gs://b/dir/*.txt`` → (``b/dir``, ``*.txt``): the longest wildcard-free prefix and the
    rest (the trainer splits a source the same way)."""
    parts = source.removeprefix("gs://").split("/")
    for index, part in enumerate(parts):
        if any(ch in part for ch in "*?["):
            return "/".join(parts[:index]), "/".join(parts[index:])
    return "/".join(parts), ""


def list_gs_source(source: str, project: str, environ: Mapping[str, str] | None = None) -> Listing:
    """List what ``source`` (``gs://bucket/prefix/glob``) matches, billed to ``project``.

    Raises:
      SourceUnlistable: no credentials (nothing sent), permission denied, or the request failed
        or timed out.
      FileNotFoundError: the bucket does not exist.
    """
    from infra import credentials

    environ = os.environ if environ is None else environ
    base, pattern = split_glob(source)
    bucket = base.split("/")[0]
    if environ.get(STORAGE_ENDPOINT_ENV):
        token: object = "anon"
    else:
        settings = credentials.CredentialSettings.resolve({}, environ)
        missing = credentials.problem(settings, environ)
        if missing:
            raise SourceUnlistable(missing)
        try:
            token = credentials.load(settings, quota_project=project)
        except credentials.CredentialsError as err:
            raise SourceUnlistable(str(err)) from err
    import gcsfs

    try:
        fs = gcsfs.GCSFileSystem(
            token=token, project=project, requests_timeout=LIST_TIMEOUT_S, retries=1, skip_instance_cache=True
        )
        if not fs.exists(bucket):
            raise FileNotFoundError(f"bucket gs://{bucket} does not exist")
        # A prepared dataset (``data prepare``) is a prefix without a wildcard: its manifest is what counts.
        target = f"{base}/{pattern}" if pattern else base
        if not pattern and fs.exists(f"{base}/manifest.json"):
            target = f"{base}/manifest.json"
        # detail=True: a dict of name -> info (fsspec's glob is unannotated; its inferred type is the list)
        found = cast("dict[str, dict[str, Any]]", fs.glob(target, detail=True))
    except FileNotFoundError:
        raise
    except Exception as err:  # gcsfs/google-auth raise many types (HttpError, RefreshError, OSError, ...)
        raise SourceUnlistable(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
    files = [info for info in found.values() if info.get("type") != "directory"]
    return Listing(objects=len(files), non_empty=sum(1 for info in files if int(info.get("size") or 0) > 0))
