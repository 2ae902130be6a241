"""A run directory's objects, read the way ``multislice status`` needs them: one listing per
folder (names, sizes and update times, up to 1,000 objects per request) and the few objects it
needs fetched concurrently, never a whole log.

The run directory is ``gs://<bucket>/runs/<run name>`` (:func:`infra.naming.run_dir`), read
through the Cloud Storage JSON API (``objects.list`` with ``prefix`` and ``delimiter``,
https://cloud.google.com/storage/docs/json_api/v1/objects/list; ``objects.get`` with
``alt=media``, https://cloud.google.com/storage/docs/json_api/v1/objects/get) over a
``requests`` session: google-auth's ``AuthorizedSession`` with the credentials given, or a plain
session for an emulator (``STORAGE_EMULATOR_HOST``, which gcsfs and google-cloud-storage also
honour: the local emulation's fake-gcs-server). Not gcsfs or google-cloud-storage: importing
either costs about a second of CPU (aiohttp, the storage gRPC and protobuf modules), half the
command's 2-second budget, for two GET requests.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from infra.vm_contract import DEFAULT_STORAGE_ENDPOINT, STORAGE_ENDPOINT_ENV

#: Seconds one storage request may take.
REQUEST_TIMEOUT_S = 30.0
#: Cloud Storage's JSON API.
GOOGLE_STORAGE = DEFAULT_STORAGE_ENDPOINT
#: Objects fetched at once.
CONCURRENCY = 8


class StoreError(RuntimeError):
    """The run directory cannot be read; the message says why, in one line."""


@dataclass(frozen=True)
class Entry:
    """One object of a listing: its name relative to the run directory, size in bytes and
    last update (seconds since the epoch; None when the store does not say)."""

    name: str
    size: int
    updated: float | None


def _epoch(value: Any) -> float | None:
    """An RFC 3339 time (``updated`` of an object resource) in seconds since the epoch."""
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def storage_url() -> str:
    """The JSON API's base URL: ``$STORAGE_EMULATOR_HOST`` (``http://`` added when bare) or Google's."""
    emulator = os.environ.get(STORAGE_ENDPOINT_ENV, "")
    if emulator and emulator != "default":
        return (emulator if "://" in emulator else f"http://{emulator}").rstrip("/")
    return GOOGLE_STORAGE


class RunStore:
    """The objects of the run directory ``root`` (``gs://bucket/prefix``).

    Args:
      credentials: ``google.auth`` credentials; None: anonymous (an emulator).

    Raises:
      StoreError: ``root`` is not a ``gs://`` URI.
    """

    def __init__(self, root: str, credentials: Any = None):
        import requests

        self.root = root.rstrip("/")
        if not self.root.startswith("gs://") or "/" not in self.root[len("gs://") :]:
            raise StoreError(f"the run directory {root!r} is not a gs://<bucket>/<path> URI")
        self.bucket, self.prefix = self.root[len("gs://") :].split("/", 1)
        self.base = f"{storage_url()}/storage/v1/b/{quote(self.bucket, safe='')}/o"
        if credentials is None:
            self.session = requests.Session()
        else:
            from google.auth.transport.requests import AuthorizedSession

            self.session = AuthorizedSession(credentials)

    def __str__(self) -> str:
        return self.root

    def _get(self, url: str, params: dict[str, Any] | None, what: str) -> Any:
        try:
            response = self.session.get(url, params=params, timeout=REQUEST_TIMEOUT_S)
        except Exception as err:  # requests and google-auth errors (network, refresh)
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise StoreError(f"cannot read {what} of {self.root}: {first}") from None
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:200].strip()
            raise StoreError(f"cannot read {what} of {self.root}: HTTP {response.status_code} {message}")
        return response

    def list(self, folder: str = "") -> list[Entry]:
        """The objects directly in ``folder`` (relative to the run directory; "" for the root),
        sorted by name; [] when there are none. Sub-folders are left out.

        Raises:
          StoreError: the storage refused or did not answer (credentials, permissions, network).
        """
        prefix = f"{self.prefix}/{folder}/" if folder else f"{self.prefix}/"
        params = {
            "prefix": prefix,
            "delimiter": "/",
            "maxResults": 1000,
            "fields": "items(name,size,updated),nextPageToken",
        }
        entries = []
        while True:
            response = self._get(self.base, params, f"the listing of {folder or 'the run directory'}")
            page = response.json() if response is not None else {}
            for item in page.get("items", []):
                name = str(item["name"])[len(f"{self.prefix}/") :]
                entries.append(Entry(name, int(item.get("size") or 0), _epoch(item.get("updated"))))
            if not page.get("nextPageToken"):
                break
            params = {**params, "pageToken": page["nextPageToken"]}
        return sorted(entries, key=lambda entry: entry.name)

    def list_many(self, folders: list[str]) -> dict[str, list[Entry]]:
        """:meth:`list` of each folder, concurrently."""
        with ThreadPoolExecutor(max_workers=max(1, len(folders))) as pool:
            return dict(zip(folders, pool.map(self.list, folders), strict=True))

    def _read_one(self, name: str) -> bytes | None:
        url = f"{self.base}/{quote(f'{self.prefix}/{name}', safe='')}"
        response = self._get(url, {"alt": "media"}, name)
        return None if response is None else response.content

    def read(self, names: list[str]) -> dict[str, bytes]:
        """The bytes of each object of ``names`` that exists (fetched :data:`CONCURRENCY` at once).

        Raises:
          StoreError: as :meth:`list`.
        """
        if not names:
            return {}
        with ThreadPoolExecutor(max_workers=min(CONCURRENCY, len(names))) as pool:
            found = dict(zip(names, pool.map(self._read_one, names), strict=True))
        return {name: data for name, data in found.items() if data is not None}
