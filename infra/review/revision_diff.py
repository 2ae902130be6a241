"""What the change between a git revision and the working tree does to a stack, offline.

``multislice diff --stack S --against REV`` (or ``--config-file PATH`` for a stack file anywhere):
REV's tree is read with ``git archive`` (no
checkout, no worktree bookkeeping); both sides are rendered and evaluated with *this*
checkout's program under mocks (:mod:`infra.review.program_mocks`), so the difference is the one the
stack file and the trainer make, the way ``pulumi preview`` would see them after ``pulumi up``
of REV. Reported:

* the stack-file keys that changed (dotted paths into ``multislice:training``);
* the trainer bundle's sha256 on both sides and the bundled files added, removed or modified;
* each resource created, deleted or changed, with the changed input keys. The queued resource
  is classified by its provider's own ``diff`` (``QueuedResourceProvider.diff``: replace on
  :data:`infra.backends.queued_resource.provider.inputs.REPLACE_KEYS`, else update in place), from a healthy
  ACTIVE recorded state. On the compute-engine backend, the instance template is replaced
  whatever changed (Compute Engine cannot change a template:
  https://cloud.google.com/compute/docs/instance-templates; the program makes the new one
  first), and a group whose only change is ``versions`` is updated in place to point at the new
  template (``instanceGroupManagers.patch``; its ``OPPORTUNISTIC`` update policy recreates no
  VM: docs/deploying.md). A key the program marks ``replaceOnChanges`` (a group's target size
  policy, workload policy, accelerator type or bulk target size, which Compute Engine does not
  change on a group with VMs) replaces its resource, and a flex-start
  slice's resize request is replaced on any change (pulumi-gcp cannot update one). On the gke
  backend a new release is a new ConfigMap and a changed JobSet spec, which the program replaces
  (every Pod restarts on the new release: :data:`JOBSET_NOTE`). Other
  resources are pulumi-gcp's: whether a changed key replaces them is the provider schema's call
  (shown as ``update or replace``).

A stack file given by path is read at REV where git tracks it there (a file inside the checkout);
a file outside the checkout, or one git does not track, is not versioned, so both sides read it
from disk and the difference is the trainer's alone (:attr:`StackDiff.stack_file_versioned`).

No cloud credentials and no Pulumi CLI are needed.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DiffError", "ResourceChange", "StackDiff", "diff_stack"]

GIT_TIMEOUT_S = 60


class DiffError(ValueError):
    """A revision, stack or checkout the diff cannot read (one line)."""


@dataclass(frozen=True)
class ResourceChange:
    """``action``: create, delete, replace, update (in place) or update-or-replace (pulumi-gcp)."""

    name: str
    typ: str
    action: str
    keys: tuple[str, ...] = ()
    replace_keys: tuple[str, ...] = ()
    #: What the change means for the running VMs, when the action alone does not say it.
    note: str = ""


@dataclass
class StackDiff:
    stack: str
    against: str
    commit: str
    config_changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    bundle_sha256: tuple[str, str] = ("", "")
    trainer_files: list[tuple[str, str]] = field(default_factory=list)
    resources: list[ResourceChange] = field(default_factory=list)
    #: False when the stack file is not versioned at REV (outside the checkout, or untracked):
    #: both sides then read the file on disk.
    stack_file_versioned: bool = True
    #: ``(old backend, new backend, confirmed)`` when ``multislice:backend`` changed: ``pulumi up``
    #: refuses it unless the working tree sets ``multislice:allowBackendChange: true``
    #: (:mod:`infra.backends.change`); None otherwise.
    backend_change: tuple[str, str, bool] | None = None

    @property
    def replaces(self) -> bool:
        return any(r.action in ("replace", "delete") for r in self.resources)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=GIT_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise DiffError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise DiffError(f"git {args[0]} took longer than {GIT_TIMEOUT_S}s") from None


def _revision_tree(root: Path, against: str, stack: str, into: Path, stack_path: str | None) -> tuple[str, Path]:
    """Extract REV's tree into ``into``; return REV's commit and the project root inside it.
    ``stack_path``: the stack file relative to ``root`` that must exist at REV (None: none must)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top.returncode:
        raise DiffError(f"{root} is not in a git repository")
    resolved = _git(root, "rev-parse", "--verify", "--quiet", f"{against}^{{commit}}")
    if resolved.returncode:
        raise DiffError(f"--against {against!r}: no such commit in {top.stdout.decode().strip()}")
    commit = resolved.stdout.decode().strip()
    prefix = _git(root, "rev-parse", "--show-prefix").stdout.decode().strip()
    if stack_path is not None and _git(root, "cat-file", "-e", f"{commit}:{prefix}{stack_path}").returncode:
        raise DiffError(f"stack {stack!r} does not exist at {against} ({commit[:12]}): no {prefix}{stack_path}")
    archive = _git(root, "archive", "--format=tar", commit, "--", prefix or ".")
    if archive.returncode:
        raise DiffError(f"git archive {against}: {archive.stderr.decode().strip().splitlines()[-1:]}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return commit, into / prefix


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= _flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


def _backend_change(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, str, bool] | None:
    """The change of ``multislice:backend`` between the two stack files (absent: the default), and
    whether the new one confirms it; None when the backend is the same."""
    from infra.backends import registry
    from infra.backends.change import CONFIRM_KEY

    before, after = (str(side.get("multislice:backend") or registry.DEFAULT) for side in (old, new))
    return None if before == after else (before, after, new.get(CONFIRM_KEY) is True)


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old, new)`` for every stack-file key that differs; ``None``: absent."""
    a, b = _flatten(old), _flatten(new)
    return [(key, a.get(key), b.get(key)) for key in sorted(a.keys() | b.keys()) if a.get(key) != b.get(key)]


def trainer_file_changes(old_training: Path, new_training: Path) -> list[tuple[str, str]]:
    """``(training/<path>, added|removed|modified)`` over the bundled files of both trees."""
    from infra.startup.bundle import BUNDLE_PACKAGE, bundle_files

    def digests(directory: Path) -> dict[str, str]:
        files = bundle_files(directory) if directory.is_dir() else []
        return {
            f"{BUNDLE_PACKAGE}/{p.relative_to(directory).as_posix()}": hashlib.sha256(p.read_bytes()).hexdigest()
            for p in files
        }

    a, b = digests(old_training), digests(new_training)
    status = {path: "removed" for path in a.keys() - b.keys()} | {path: "added" for path in b.keys() - a.keys()}
    status |= {path: "modified" for path in a.keys() & b.keys() if a[path] != b[path]}
    return sorted(status.items())


def _side(
    stack: str, path: Path, project_root: Path, label: str, cache: Any, outside: Path | None = None
) -> tuple[dict[str, Any], Any]:
    """The raw ``config:`` map and the evaluated World of ``stack`` read from the stack file
    ``path``, with the trainer of ``project_root`` (``label`` names the side in errors: the
    revision, or "the working tree"). For a revision's copy of a stack file, ``outside`` is the
    working tree's copy's folder: a workload path that leaves the revision's tree is read there
    (:func:`infra.review.stack_paths.with_absolute_workload_paths`). ``cache``: the working tree's
    content cache (:mod:`infra.startup.content_cache`), for both sides: keyed by content, it holds
    a revision's bundle, pins and compressed release as well, where the revision's temporary
    checkout would start empty every time."""
    from infra import startup
    from infra.config import StackConfigError, load_stack_file, pulumi_config_of_file, validate_stack
    from infra.review import program_mocks
    from infra.review.stack_paths import with_absolute_workload_paths

    try:
        config = load_stack_file(path, stack) if outside is None else None
        config_map = program_mocks.decoded(pulumi_config_of_file(path, stack))
        absolute = with_absolute_workload_paths(config_map, path.parent, tree=project_root, outside=outside)
        config = config or validate_stack(stack, absolute, str(path), base_dir=path.parent)
        script = startup.render(config, project_root=project_root, cache=cache)
    except StackConfigError as err:  # the problems, not the summary that names a temporary path
        raise DiffError(f"stack {stack!r} in {label}: {'; '.join(err.lines) or err.summary}") from None
    except (ValueError, FileNotFoundError) as err:
        raise DiffError(f"stack {stack!r} in {label}: {str(err).splitlines()[0]}") from None
    return config_map, (program_mocks.evaluate(stack, absolute, script=script, preview=True), script)


def _queued_resource_change(name: str, typ: str, old: dict[str, Any], new: dict[str, Any]) -> ResourceChange | None:
    from infra.backends.queued_resource.provider import QueuedResourceProvider
    from infra.backends.queued_resource.provider.inputs import INPUT_KEYS, differs

    recorded = {**old, "state": "ACTIVE", "ready": True, "nodesInSync": True}  # a healthy QR, as REV left it
    result = QueuedResourceProvider().diff("diff", recorded, new)
    if not result.changes:
        return None
    keys = tuple(k for k in INPUT_KEYS if differs(old.get(k), new.get(k)))
    replaces = tuple(result.replaces or ())
    return ResourceChange(name, typ, "replace" if replaces else "update", keys, replaces)


#: The compute-engine backend's notes (:func:`_pulumi_gcp_change`).
TEMPLATE_NOTE = "a new template is made first and the groups move to it; no VM is recreated"
GROUP_NOTE = (
    "the group points at the new template; no VM is recreated (OPPORTUNISTIC); running VMs boot a new "
    "release through their release watch"
)


GROUP_REPLACE_NOTE = (
    "the slice's VMs are replaced: the group is deleted with its VMs and created again, because Compute Engine "
    "changes none of these on a group with VMs (its target size policy, its workload policy, its accelerator type, "
    "its target size in bulk mode: docs/compute-engine.md, section 3b); training resumes from the newest checkpoint"
)
#: The gke backend's note: the program replaces the JobSet on any change of its spec
#: (``replaceOnChanges``, deleted first: docs/gke.md section 5, "Updates").
JOBSET_NOTE = (
    "the JobSet is deleted, then created again: every running Pod gets SIGTERM (15 s to save) and stops, and new "
    "Pods on empty disks boot the new release and resume from the newest checkpoint"
)
RESIZE_REQUEST_NOTE = (
    "a new resize request: its group asks for the slice's VMs again, beside any the last request made that still "
    "run; change it after those ended (Compute Engine deletes them when their run duration ends)"
)


def _pulumi_gcp_change(
    name: str, typ: str, keys: tuple[str, ...], replace_on_changes: tuple[str, ...] = ()
) -> ResourceChange:
    """A pulumi-gcp resource's change: the program's own ``replaceOnChanges`` first, then what
    the module docstring says of each type."""
    from infra.review.program_mocks import GROUP_TYPE, JOBSET_TYPE, RESIZE_REQUEST_TYPE, TEMPLATE_TYPE

    if typ == TEMPLATE_TYPE:
        return ResourceChange(name, typ, "replace", keys, keys, TEMPLATE_NOTE)
    if typ == RESIZE_REQUEST_TYPE:  # pulumi-gcp replaces a resize request on any change
        return ResourceChange(name, typ, "replace", keys, keys, RESIZE_REQUEST_NOTE)
    replacing = tuple(key for key in keys if key in replace_on_changes)
    if replacing:
        note = {GROUP_TYPE: GROUP_REPLACE_NOTE, JOBSET_TYPE: JOBSET_NOTE}.get(typ, "")
        return ResourceChange(name, typ, "replace", keys, replacing, note)
    if typ == GROUP_TYPE and keys == ("versions",):
        return ResourceChange(name, typ, "update", keys, (), GROUP_NOTE)
    return ResourceChange(name, typ, "update-or-replace", keys)


def _resource_changes(old_world: Any, new_world: Any) -> list[ResourceChange]:
    from infra.review.program_mocks import QR_TYPE

    def by_urn(world: Any) -> dict[str, Any]:
        return {r.urn: r for r in world.registrations}

    old, new = by_urn(old_world), by_urn(new_world)
    changes = [ResourceChange(old[u].name, old[u].typ, "delete") for u in old.keys() - new.keys()]
    changes += [ResourceChange(new[u].name, new[u].typ, "create") for u in new.keys() - old.keys()]
    for urn in old.keys() & new.keys():
        a, b = old[urn], new[urn]
        inputs_a = {k: v for k, v in a.inputs.items() if k != "__provider"}
        inputs_b = {k: v for k, v in b.inputs.items() if k != "__provider"}
        if a.typ == QR_TYPE:
            change = _queued_resource_change(b.name, b.typ, inputs_a, inputs_b)
            if change:
                changes.append(change)
        elif inputs_a != inputs_b:
            keys = tuple(sorted(k for k in inputs_a.keys() | inputs_b.keys() if inputs_a.get(k) != inputs_b.get(k)))
            changes.append(_pulumi_gcp_change(b.name, b.typ, keys, tuple(b.replace_on_changes)))
    return sorted(changes, key=lambda c: (c.typ, c.name))


def _versioned_path(project_root: Path, path: Path) -> str | None:
    """``path`` relative to ``project_root`` when git tracks it there, else None."""
    try:
        relative = path.resolve().relative_to(project_root.resolve())
    except ValueError:
        return None
    tracked = _git(project_root, "ls-files", "--error-unmatch", "--", relative.as_posix())
    return relative.as_posix() if tracked.returncode == 0 else None


def diff_stack(stack: str, against: str, project_root: Path, stack_file: Path | None = None) -> StackDiff:
    """The change from ``against`` (a git revision) to the working tree of ``project_root``, for
    the stack ``stack`` of ``project_root/stacks`` or, with ``stack_file``, the stack file there
    (read at ``against`` only where git tracks it: the module docstring).

    Raises:
      DiffError: not a git checkout, no such revision, the stack is missing at the revision,
        or a side's stack file does not validate.
    """
    if stack_file is None:
        stack_file = project_root / "stacks" / f"Pulumi.{stack}.yaml"
        relative: str | None = f"stacks/Pulumi.{stack}.yaml"
        if not stack_file.is_file():
            raise DiffError(f"stack {stack!r} does not exist in the working tree (no {relative})")
    else:
        if not stack_file.is_file():
            raise DiffError(f"stack file {stack_file} does not exist")
        relative = _versioned_path(project_root, stack_file)
    from infra.startup import content_cache

    cache = content_cache.for_project(project_root)
    with tempfile.TemporaryDirectory(prefix="multislice-diff-") as tmp:
        commit, old_root = _revision_tree(project_root, against, stack, Path(tmp), relative)
        if relative is None:  # not versioned: both sides read the file on disk
            old_map, (old_world, old_script) = _side(stack, stack_file, old_root, against, cache)
        else:
            old_file = old_root / relative
            old_map, (old_world, old_script) = _side(
                stack, old_file, old_root, against, cache, outside=stack_file.parent
            )
        new_map, (new_world, new_script) = _side(stack, stack_file, project_root, "the working tree", cache)
        return StackDiff(
            stack=stack,
            against=against,
            commit=commit,
            config_changes=config_changes(old_map, new_map),
            backend_change=_backend_change(old_map, new_map),
            bundle_sha256=(old_script.bundle_sha256, new_script.bundle_sha256),
            trainer_files=trainer_file_changes(old_root / "training", project_root / "training"),
            resources=_resource_changes(old_world, new_world),
            stack_file_versioned=relative is not None,
        )
