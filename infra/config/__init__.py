"""A stack's configuration: schema, loading, and the names derived from it.

* :mod:`infra.config.schema`: :class:`StackConfig`, the validated model of a stack's
  ``config:`` map (its derived names delegate to :mod:`infra.naming`);
* :mod:`infra.config.environment`: the ``multislice:network`` and ``multislice:bucket`` models
  (each backend's own key is its settings model: :mod:`infra.backends`, re-exported here);
* :mod:`infra.config.workload`: ``multislice:workload``, the user's command instead of the
  bundled trainer (docs/workloads.md);
* :mod:`infra.config.loading`: the stack file (YAML, duplicate keys refused) and the Pulumi
  engine's config map → :class:`StackConfig`, stack discovery, :class:`StackConfigError`;
* :mod:`infra.stack_naming`: :func:`stack_args`, how a printed hint names a stack so that
  it works as printed;
* :mod:`infra.config.dataset`: a prepared dataset's manifest (local or ``gs://``) against the
  model's vocabulary, read by ``multislice plan`` and the program before any resource exists.

Everything but :mod:`infra.config.dataset` is importable from ``infra.config`` itself (it reads
a manifest, locally or from Cloud Storage: its callers import it, and parsing a stack sends no request).
"""

from infra.backends.compute_engine.spec import ComputeEngineSettings
from infra.backends.queued_resource.spec import QueuedResourceSettings
from infra.config.environment import BucketSettings, Duration, NetworkSettings, parse_duration
from infra.config.loading import (
    GCP_KEYS,
    NAMESPACE,
    STRUCTURED_KEYS,
    DuplicateKeyError,
    StackConfigError,
    available_stacks,
    default_stacks_dir,
    from_pulumi_config,
    load_stack,
    load_stack_file,
    pulumi_config_map,
    pulumi_config_of_file,
    stack_file,
    stack_name_of_file,
    validate_stack,
)
from infra.config.schema import BACKENDS, CAPACITY_TYPES, Backend, Capacity, StackConfig
from infra.config.workload import WorkloadSettings
from infra.naming import RESERVED_LABELS, gce_name, label_value
from infra.stack_naming import stack_args

__all__ = [
    "CAPACITY_TYPES",
    "GCP_KEYS",
    "NAMESPACE",
    "RESERVED_LABELS",
    "STRUCTURED_KEYS",
    "BucketSettings",
    "Capacity",
    "DuplicateKeyError",
    "Duration",
    "NetworkSettings",
    "QueuedResourceSettings",
    "ComputeEngineSettings",
    "BACKENDS",
    "Backend",
    "StackConfig",
    "StackConfigError",
    "WorkloadSettings",
    "available_stacks",
    "default_stacks_dir",
    "from_pulumi_config",
    "gce_name",
    "label_value",
    "load_stack",
    "load_stack_file",
    "pulumi_config_of_file",
    "parse_duration",
    "pulumi_config_map",
    "stack_args",
    "stack_file",
    "stack_name_of_file",
    "validate_stack",
]
