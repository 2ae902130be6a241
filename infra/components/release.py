"""The release record: which release every TPU VM of a stack runs, declared by ``pulumi up``.

A queued resource's node spec cannot change after creation (there is no API for it:
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources), so
after an in-place update (``UpdateNode`` + reset, :mod:`infra.queued_resource`) the QR still
holds the creation-time metadata, and a slice Cloud TPU recreates from it boots the startup
script of that time. So every ``pulumi up`` also writes two objects to the checkpoint bucket
(:class:`ReleaseRecord`):

* ``multislice/<stack>/releases/<release id>.tar.b64``: the release (the uncompressed tar the
  startup script embeds, :attr:`infra.startup.RenderedScript.release`), base64;
* ``multislice/<stack>/release.json`` (:func:`record_json`): ``{"format": 1, "payload":
  <that object>, "release": <release id>, "runDir": <run dir>, "stack": <stack>}``, written
  after the payload exists (object names and fields: :mod:`infra.vm_contract`);
* with a ``multislice:workload`` source too large for the startup script,
  ``multislice/<stack>/sources/<sha256>.tar``: the source's tar, which ``boot.sh`` fetches and
  checks against the sha256 its release names (:mod:`infra.startup.workload`). It is uploaded
  from a file (a ``FileAsset``: Pulumi's state keeps its hash, not its bytes) under the
  project's content cache.

A booting VM (``boot.sh``, docs/vm-boot.md) reads the record over the GCS JSON API with its
metadata-server token; when the record names another release than the one it carries, it
fetches the payload, checks that its sha256 is the release id, and runs that release (and the
record's run dir) instead. Both objects hold uncompressed content, so their bytes, like the
release id, do not depend on the operator's compressor: a no-op ``pulumi up`` stays a no-op.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from infra import vm_contract as contract
from infra.startup import release_objects
from training.validation import StrictModel


class ReleaseRecordArgs(StrictModel):
    """What :class:`ReleaseRecord` needs: the stack, its run directory and the release (the
    program builds it from the StackConfig and the rendered script)."""

    stack: str
    run_dir: str
    #: hex sha256 of ``release``.
    release_id: str
    #: The uncompressed tar the startup script embeds (``RenderedScript.release``).
    release: bytes
    #: A command's source tar that travels through the bucket, and its object (``RenderedScript``).
    workload_source: bytes = b""
    workload_source_object: str | None = None


def record_json(args: ReleaseRecordArgs) -> str:
    """The record's content: one line of JSON, keys sorted (equal inputs give equal bytes)."""
    return release_objects.record_text(args.stack, args.release_id, args.run_dir)


def payload_text(args: ReleaseRecordArgs) -> str:
    """The release tar as base64 text (a ``BucketObject``'s ``content`` is a string)."""
    return release_objects.payload_text(args.release)


def source_file(args: ReleaseRecordArgs, directory: Path) -> Path:
    """The workload source tar as a file ``<directory>/<sha256>.tar`` (written once per content)."""
    path = Path(directory) / f"{hashlib.sha256(args.workload_source).hexdigest()}.tar"
    if not path.is_file() or path.stat().st_size != len(args.workload_source):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(args.workload_source)
        tmp.replace(path)
    return path


class ReleaseRecord(pulumi.ComponentResource):
    """The stack's current release in its checkpoint bucket (see the module docstring).

    Args:
      name: Pulumi name of the component.
      args: the stack, its run directory and the release to record.
      bucket: the checkpoint bucket's name.
    """

    def __init__(
        self,
        name: str,
        args: ReleaseRecordArgs,
        *,
        bucket: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("multislice:gcp:ReleaseRecord", name, None, opts)
        self.payload = gcp.storage.BucketObject(
            f"{name}-payload",
            bucket=bucket,
            name=contract.release_object(args.stack, args.release_id),
            content=payload_text(args),
            content_type="text/plain",
            opts=pulumi.ResourceOptions(parent=self),
        )
        needed: list[pulumi.Resource] = [self.payload]
        self.source: gcp.storage.BucketObject | None = None
        if args.workload_source_object is not None:
            from infra.startup import content_cache, lockfile

            cache = content_cache.for_project(lockfile.default_project_root())
            self.source = gcp.storage.BucketObject(
                f"{name}-workload-source",
                bucket=bucket,
                name=args.workload_source_object,
                source=pulumi.FileAsset(str(source_file(args, cache.directory / "workload-sources"))),
                content_type="application/x-tar",
                opts=pulumi.ResourceOptions(parent=self),
            )
            needed.append(self.source)
        self.record = gcp.storage.BucketObject(
            f"{name}-record",
            bucket=bucket,
            name=contract.record_object(args.stack),
            content=record_json(args),
            content_type="application/json",
            cache_control="no-store",
            opts=pulumi.ResourceOptions(parent=self, depends_on=needed),
        )
        self.release_id = args.release_id
        self.register_outputs({"releaseId": args.release_id, "record": self.record.self_link})
