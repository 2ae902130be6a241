"""What ``pulumi up`` writes to the stack's bucket for a release (:func:`bucket_objects`): the
release record every boot reads (:func:`record_text`; docs/vm-boot.md, "The release record"),
the release's payload (:func:`payload_text`) and a command's source when it travels through the
bucket. ``infra.components.release`` writes them; the local emulation uploads the same objects.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from infra.vm_contract import record_object, release_object, release_record


def record_text(stack: str, release_id: str, run_dir: str) -> str:
    """The release record's content (``multislice/<stack>/release.json``, :func:`record_object`):
    one line of JSON, keys sorted, so equal inputs give equal bytes
    (docs/vm-boot.md, "The release record")."""
    record = release_record(stack=stack, release_id=release_id, run_dir=run_dir)
    return json.dumps(record, sort_keys=True) + "\n"


def payload_text(release: bytes) -> str:
    """The release tar as the base64 text of its bucket object (:func:`release_object`)."""
    return base64.encodebytes(release).decode("ascii")


def bucket_objects(stack: str, run_dir: str, rendered: Any) -> dict[str, bytes]:
    """Object name → content of what ``pulumi up`` writes to the stack's bucket for a release
    (``infra.components.release``): the record, the release's payload, and a command's source
    when it travels through the bucket. The local emulation uploads the same objects.
    ``rendered`` is the :class:`~infra.startup.script.RenderedScript` of the release."""
    objects = {
        record_object(stack): record_text(stack, rendered.release_id, run_dir).encode(),
        release_object(stack, rendered.release_id): payload_text(rendered.release).encode(),
    }
    if rendered.workload_source_object:
        objects[rendered.workload_source_object] = rendered.workload_source
    return objects
