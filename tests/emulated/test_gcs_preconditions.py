"""The emulated Cloud Storage honours ``ifGenerationMatch`` as Cloud Storage does: a write whose
precondition fails is answered 412 and changes nothing, on the multipart and the resumable upload
paths, and of writers racing from the same generation exactly one wins. Elastic slices' membership
record is to rest on it (docs/faults.md, "Elastic slices"); fake-gcs-server's support differs by
upload path and storage backend (fsouza/fake-gcs-server #2308, #2260, #994, #2343), so it is shown
here for the server and backend the emulation runs (infra/emulated/gcs.py: the filesystem backend).

Cloud Storage's semantics: https://cloud.google.com/storage/docs/request-preconditions
(``ifGenerationMatch=0``: the object must not exist; a failed precondition: 412)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from infra.emulated.gcs import STORAGE_ENDPOINT_ENV

SMALL = b'{"slices": [0, 1]}'  # a membership record's size: one multipart request
LARGE = b"x" * (300 * 1024)  # past the chunk size set below: the resumable path


def client() -> storage.Client:
    endpoint = os.environ[STORAGE_ENDPOINT_ENV]  # the session's emulated Cloud Storage (conftest's gcs_server)
    return storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint})


def blob(bucket: str, name: str, resumable: bool) -> storage.Blob:
    found = client().bucket(bucket).blob(name)
    if resumable:
        found.chunk_size = 256 * 1024
    return found


@pytest.mark.parametrize("resumable", [False, True], ids=["multipart", "resumable"])
def test_a_write_whose_generation_does_not_match_is_answered_412_and_changes_nothing(bucket, resumable):
    data = LARGE if resumable else SMALL
    first = blob(bucket, "record", resumable)
    first.upload_from_string(data, if_generation_match=0)  # created: it did not exist
    generation = int(first.generation)
    for stale in (0, generation + 1):  # "must not exist", and a generation it never had
        with pytest.raises(exceptions.PreconditionFailed) as refused:
            blob(bucket, "record", resumable).upload_from_string(data[::-1] + b"!", if_generation_match=stale)
        assert refused.value.code == 412
    kept = client().bucket(bucket).get_blob("record")
    assert kept is not None and int(kept.generation) == generation and kept.download_as_bytes() == data
    current = blob(bucket, "record", resumable)
    current.upload_from_string(data + b"2", if_generation_match=generation)  # the current one: accepted
    assert int(current.generation) != generation


def test_of_writers_racing_from_one_generation_exactly_one_wins(bucket):
    start = blob(bucket, "membership", resumable=False)
    start.upload_from_string(SMALL, if_generation_match=0)
    generation = int(start.generation)

    def write(writer: int) -> bool:
        try:
            blob(bucket, "membership", resumable=False).upload_from_string(
                f'{{"writer": {writer}}}'.encode(), if_generation_match=generation
            )
            return True
        except exceptions.PreconditionFailed:
            return False

    with ThreadPoolExecutor(max_workers=8) as pool:
        won = list(pool.map(write, range(8)))
    assert won.count(True) == 1, won
    winner = won.index(True)
    assert client().bucket(bucket).blob("membership").download_as_bytes() == f'{{"writer": {winner}}}'.encode()
