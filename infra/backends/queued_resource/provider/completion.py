"""Has the queued resource's run completed? The provider's view of ``deleteOnComplete``.

With ``multislice:queuedResource.deleteOnComplete`` worker 0 of slice 0 deletes the queued
resource once its trainer exits 0 (the run wrote ``<run dir>/COMPLETE``; the VM side is
``infra/startup/delete_on_complete.sh``). A later refresh then finds the QR gone; without this module
the provider would report it gone and ``pulumi up`` would create it again, booting VMs that
find the run complete and do nothing. Instead the provider reads the completion record the
trainer wrote (``training.checkpoint.completion.write_completion``: JSON ``{"step": N, "loss": …}``)
and reports a QR that is gone (or being deleted) while the run is complete for the recorded
``trainer.steps`` as **deleted on complete** (``deletedOnComplete``): converged.
:func:`new_run_reason` says which input change starts a new run (a new run directory, or
more steps than the completion reached), the only changes that bring the QR back.

The record is read through the Cloud Storage JSON API
(https://cloud.google.com/storage/docs/json_api/v1/objects/get, ``alt=media``) with the
operator's credentials (:mod:`infra.credentials`, as the queued-resource provider loads them),
or anonymously against ``STORAGE_EMULATOR_HOST`` (the emulated storage, as gcsfs reads it).
Nothing here imports jax or the trainer: this runs in the Pulumi provider process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from pulumi.runtime.rpc import UNKNOWN

from infra.backends.queued_resource.provider.inputs import outputs_for
from infra.vm_contract import COMPLETE_MARKER, DEFAULT_STORAGE_ENDPOINT, STORAGE_ENDPOINT_ENV

#: Seconds one read of the marker may take.
READ_TIMEOUT_S = 20.0


class CompletionUnknown(Exception):
    """The completion record could not be read (no permission, no answer): completion unknown."""


def storage_endpoint(environ: Mapping[str, str] | None = None) -> str:
    """``STORAGE_EMULATOR_HOST`` (``host:port`` or a URL), else Google's Cloud Storage."""
    environ = os.environ if environ is None else environ
    host = environ.get(STORAGE_ENDPOINT_ENV) or DEFAULT_STORAGE_ENDPOINT
    return (host if "://" in host else f"http://{host}").rstrip("/")


def marker_url(run_dir: str, environ: Mapping[str, str] | None = None) -> str:
    """The JSON API media URL of ``<run_dir>/COMPLETE`` (``run_dir`` = ``gs://bucket/path``).

    Raises:
      ValueError: ``run_dir`` is not a ``gs://bucket/...`` URI.
    """
    if not run_dir.startswith("gs://") or len(run_dir) <= len("gs://"):
        raise ValueError(f"run directory {run_dir!r} is not a gs://bucket/path URI")
    bucket, _, prefix = run_dir[len("gs://") :].partition("/")
    name = f"{prefix.rstrip('/')}/{COMPLETE_MARKER}" if prefix.strip("/") else COMPLETE_MARKER
    return f"{storage_endpoint(environ)}/storage/v1/b/{bucket}/o/{quote(name, safe='')}?alt=media"


def completed_step(record: bytes, total_steps: int) -> int | None:
    """The step of a completion record when it reaches ``total_steps``, else None (also for a
    malformed record: the trainer, too, treats one as absent)."""
    from training.run_objects import json_record  # jax-free; here, not above: the program never imports it

    try:
        step = json_record(record)["step"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        return None
    return step if step >= total_steps else None


def run_completion(
    props: Mapping[str, Any], credentials: Any | None, environ: Mapping[str, str] | None = None
) -> int | None:
    """The completion step of the run of ``props`` (its ``runDir`` and ``trainer.steps``), or
    None when the run has not completed them (no marker, or a marker for fewer steps).

    Args:
      props: the queued resource's recorded properties.
      credentials: ``google.auth`` credentials for the request, or None (anonymous: the
        emulated storage).

    Raises:
      CompletionUnknown: the marker could not be read (HTTP status other than 200/404, no
        answer within :data:`READ_TIMEOUT_S`, no usable run directory or step count).
    """
    import requests
    from google.auth.transport.requests import AuthorizedSession

    run_dir, steps = props.get("runDir"), (props.get("trainer") or {}).get("steps")
    if not isinstance(run_dir, str) or not isinstance(steps, (int, float)) or isinstance(steps, bool):
        raise CompletionUnknown(
            f"no run directory and step count recorded (runDir {run_dir!r}, trainer.steps {steps!r})"
        )
    try:
        url = marker_url(run_dir, environ)
    except ValueError as err:
        raise CompletionUnknown(str(err)) from None
    session = AuthorizedSession(credentials) if credentials is not None else requests.Session()
    try:
        response = session.get(url, timeout=READ_TIMEOUT_S)
    except Exception as err:  # requests and google-auth raise many types (ConnectionError, RefreshError, ...)
        raise CompletionUnknown(
            f"{run_dir}/{COMPLETE_MARKER}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from None
    finally:
        session.close()
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise CompletionUnknown(f"{run_dir}/{COMPLETE_MARKER}: HTTP {response.status_code} {response.text[:120]!r}")
    return completed_step(response.content, int(steps))


def new_run_reason(olds: Mapping[str, Any], news: Mapping[str, Any]) -> str | None:
    """Which input of ``news`` starts a new run on a QR deleted on complete (``olds``), or None.

    ``runDir`` when the run directory changed (``multislice:runName``), ``trainer`` when
    ``trainer.steps`` exceeds the completion step (the trainer resumes the finished run from
    its last checkpoint: ``training.checkpoint.completion.is_complete``). Any other change leaves a
    finished run finished (its trainer would exit at once), so the QR stays deleted. A
    value not known yet (``pulumi preview``) counts as a new run.
    """
    if news.get("runDir") == UNKNOWN or news.get("runDir") != olds.get("runDir"):
        return "runDir"
    trainer = news.get("trainer")
    steps = trainer.get("steps") if isinstance(trainer, dict) else UNKNOWN
    done = olds.get("completedStep")
    if (
        steps == UNKNOWN
        or not isinstance(done, (int, float))
        or not isinstance(steps, (int, float))
        or int(steps) > int(done)
    ):
        return "trainer"
    return None


def deleted_on_complete_message(props: Mapping[str, Any], step: int) -> str:
    """The status line of a QR deleted on complete (``statusMessage``; the program warns with it)."""
    return (
        f"deleted on complete: the run {props.get('runDir')} completed at step {step}, so the queued resource "
        f"{props.get('queuedResourceId')!r} was deleted and is not recreated; raise "
        "multislice:training.steps (multislice:workload.steps for a command) or set a new multislice:runName to start "
        "a new run"
    )


def deleted_on_complete_outputs(
    props: Mapping[str, Any], qr: Any | None, credentials: Any | None, say: Callable[[str], None]
) -> dict[str, Any] | None:
    """The outputs of a QR deleted on complete (``deletedOnComplete`` true, ``completedStep``,
    the status line of :func:`deleted_on_complete_message`) when the run of ``props`` is
    complete, else None. A completion that cannot be read is said through ``say`` and counts
    as not complete: the QR then reads as gone and is created again, as before
    deleteOnComplete existed (its VMs find the run complete and delete it again), and
    ``pulumi destroy`` still works.

    Args:
      qr: the live ``tpu_v2.QueuedResource`` (DELETING) or None (gone).
    """
    try:
        step = run_completion(props, credentials)
    except CompletionUnknown as exc:
        say(f"{props.get('queuedResourceId')}: gone, and whether its run completed is unknown ({exc})")
        return None
    if step is None:
        return None
    return outputs_for(
        dict(props), qr, [], ready=True, message=deleted_on_complete_message(props, step), completed_step=step
    )
