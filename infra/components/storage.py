"""The checkpoint bucket: private, in the TPU region's storage location, with lifecycle rules
for old checkpoint objects."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp
from pydantic import Field

from infra import naming
from infra.config.environment import BucketSettings
from infra.naming import RUNS_PREFIX
from training.validation import StrictModel


class BucketArgs(StrictModel):
    """What :class:`CheckpointBucket` needs.

    ``stack``/``project`` name the bucket (``infra.naming.bucket_name``: ``settings.name`` or
    ``<project>-<stack>-ckpt``); ``location`` is a Cloud Storage location
    (``StackConfig.bucket_location``: not every TPU region is one); ``run_name`` names the run
    directory; ``labels`` are the resource labels (``infra.naming.resource_labels``);
    ``protect`` is Pulumi ``protect``; ``soft_delete_days`` the soft-delete retention
    (``StackConfig.bucket_soft_delete_days``: 7 on production stacks, else 0, unless set).
    """

    stack: str
    project: str
    location: str
    run_name: str
    labels: dict[str, str]
    protect: bool = False
    soft_delete_days: int = Field(default=0, ge=0, le=90)
    settings: BucketSettings = BucketSettings()


def lifecycle_rules(bucket: BucketSettings) -> list[gcp.storage.BucketLifecycleRuleArgs]:
    """Lifecycle rules of the checkpoint bucket (``multislice:bucket``).

    * incomplete multipart uploads (an interrupted checkpoint write) are aborted after 1 day;
    * objects under ``runs/`` move to Nearline after ``nearlineAfterDays`` (default 30): Orbax
      keeps rewriting the newest checkpoints, so only checkpoints of old or finished runs age
      that far;
    * objects under ``runs/`` are deleted after ``deleteAfterDays`` when it is set (off by
      default: deleting the last checkpoint of a paused run would lose it).

    Source for the rule semantics: https://cloud.google.com/storage/docs/lifecycle
    """
    rules = [
        gcp.storage.BucketLifecycleRuleArgs(
            action=gcp.storage.BucketLifecycleRuleActionArgs(type="AbortIncompleteMultipartUpload"),
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=1),
        )
    ]
    if bucket.nearline_after_days is not None:
        rules.append(
            gcp.storage.BucketLifecycleRuleArgs(
                action=gcp.storage.BucketLifecycleRuleActionArgs(type="SetStorageClass", storage_class="NEARLINE"),
                condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                    age=bucket.nearline_after_days,
                    matches_prefixes=[RUNS_PREFIX],
                    matches_storage_classes=["STANDARD"],
                ),
            )
        )
    if bucket.delete_after_days is not None:
        rules.append(
            gcp.storage.BucketLifecycleRuleArgs(
                action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                    age=bucket.delete_after_days, matches_prefixes=[RUNS_PREFIX]
                ),
            )
        )
    return rules


class CheckpointBucket(pulumi.ComponentResource):
    """The checkpoint bucket, in ``args.location``.

    Uniform bucket-level access, public access prevention enforced, Standard class, the
    stack's labels, :func:`lifecycle_rules`, soft delete ``args.soft_delete_days`` (7 days on
    production stacks, 0 elsewhere: Orbax deletes superseded checkpoints all the time, and
    each soft-deleted one stays billed for the retention). ``force_destroy`` is off
    unless ``multislice:bucket.forceDestroy``; the bucket is ``protect``-ed when
    ``args.protect`` (on prod stacks by default: ``StackConfig.bucket_protected``).

    Destroy and deploy again (:func:`bucket_options`): without ``forceDestroy`` the bucket is
    ``retainOnDelete``: ``pulumi destroy`` removes it from the stack and leaves it, with its
    checkpoints, in the project (it would otherwise fail on the non-empty bucket after
    everything else is gone); ``multislice:bucket.adopt`` imports that bucket into the stack
    on the next ``pulumi up`` instead of creating it (a create would fail: the name is taken).

    Attributes (Outputs): ``name``, ``url`` (``gs://<name>``), ``run_dir``
    (``gs://<name>/runs/<run name>``, the nodes' ``multislice-run-dir``), ``on_destroy``
    (:func:`on_destroy`, exported as ``bucketOnDestroy``).
    """

    def __init__(self, name: str, args: BucketArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("multislice:gcp:CheckpointBucket", name, None, opts)
        settings = args.settings
        self.bucket = gcp.storage.Bucket(
            name,
            name=naming.bucket_name(args.project, args.stack, settings.name),
            project=args.project,
            location=args.location.upper(),
            storage_class="STANDARD",
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            force_destroy=settings.force_destroy,
            labels=dict(sorted(args.labels.items())),
            lifecycle_rules=lifecycle_rules(settings),
            soft_delete_policy=gcp.storage.BucketSoftDeletePolicyArgs(
                retention_duration_seconds=args.soft_delete_days * 86400
            ),
            opts=bucket_options(args, parent=self),
        )
        self.name = self.bucket.name
        self.url = self.bucket.name.apply(lambda n: f"gs://{n}")
        self.run_dir = self.bucket.name.apply(lambda n: naming.run_dir(n, args.run_name))
        self.on_destroy = self.bucket.name.apply(lambda n: on_destroy(n, args))
        self.register_outputs({"name": self.name, "url": self.url, "runDir": self.run_dir})


def bucket_options(args: BucketArgs, parent: pulumi.Resource | None = None) -> pulumi.ResourceOptions:
    """The bucket's resource options.

    * ``protect``: ``args.protect``;
    * ``retain_on_delete`` unless ``forceDestroy``: Pulumi then "will not call through to the
      resource provider's Delete method when deleting or replacing the resource during pulumi
      up or pulumi destroy [...] the resource will not be deleted from the backing cloud
      provider, but will be removed from the Pulumi state"
      (https://www.pulumi.com/docs/iac/concepts/resources/options/retainondelete/). The
      destroy preview marks the row ``delete[retain]`` and prints "This update will leave 1
      resource(s) untracked in your environment" (pulumi/pulumi pkg/backend/apply.go and
      pkg/backend/display/object_diff.go ``addRetainStatusFlag``, since CLI v3.64);
    * ``import_`` = the bucket name with ``multislice:bucket.adopt``: a bucket kept by an
      earlier destroy is imported instead of created. The import succeeds only if the program's
      inputs match the bucket (same settings as when it was kept), and once the bucket is in
      the stack the option is a no-op ("If the resource exists and has the same ID or
      ImportID, the resource is treated like any other resource": pulumi/pulumi
      developer-docs/architecture/import.md; https://www.pulumi.com/docs/iac/concepts/resources/options/import/);
    * ``delete_before_replace``: a replacement keeps the name, which must be free first.
    """
    name = naming.bucket_name(args.project, args.stack, args.settings.name)
    return pulumi.ResourceOptions(
        parent=parent,
        protect=args.protect,
        retain_on_delete=not args.settings.force_destroy,
        import_=name if args.settings.adopt else None,
        delete_before_replace=True,
    )


def on_destroy(bucket: str, args: BucketArgs) -> str:
    """What ``pulumi destroy`` does with the bucket ``bucket``, in one line (the stack output
    ``bucketOnDestroy``, shown after every ``pulumi up`` and by ``pulumi stack output``)."""
    if args.protect:
        return (
            f"protected: pulumi destroy fails at gs://{bucket} (multislice:bucket.protect); set "
            "multislice:bucket.protect: false and run pulumi up first, or run pulumi destroy --exclude-protected "
            "to keep it in the stack"
        )
    if args.settings.force_destroy:
        return (
            f"deleted: pulumi destroy deletes gs://{bucket} and every checkpoint in it (multislice:bucket.forceDestroy)"
        )
    return (
        f"kept: pulumi destroy removes gs://{bucket} from the stack and leaves it and its checkpoints in project "
        f"{args.project}; delete it with: gcloud storage rm -r gs://{bucket}; or deploy this stack again with "
        "multislice:bucket.adopt: true to resume from them"
    )
