"""``multislice diff``: what the change from a git revision to the working tree does to a stack, offline.

    multislice diff --stack prod --against origin/main
    multislice diff --config-file ~/Pulumi.long.yaml --against origin/main

The comparison is :mod:`infra.review.revision_diff`; exit 0, 2 on bad input (no such revision, stack
missing at it). The stack is named as on every command (:func:`infra.cli.options.resolved_stack_source`).
"""

from __future__ import annotations

from pathlib import Path

import typer

from infra.cli.options import (
    CONFIG_FILE_OPTION,
    STACK_OPTION,
    console,
    fail,
    print_program_warning,
    resolved_stack_source,
)


def _value(value) -> str:
    import json

    return "(absent)" if value is None else json.dumps(value)


def diff(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    against: str = typer.Option(
        ..., "--against", help="A git revision (commit, branch, tag) to compare the working tree with."
    ),
) -> None:
    """What the change from a git revision to the working tree does to the stack (offline).

    Config keys changed, the trainer bundle's hash and changed files, and which resources are
    created, deleted, replaced or updated in place (the queued resource by its provider's diff).
    """
    from infra.config import StackConfigError, default_stacks_dir, stack_file, stack_name_of_file
    from infra.review.program_warnings import printed_as_warnings
    from infra.review.revision_diff import DiffError, diff_stack

    source = resolved_stack_source(stack, config_file)
    try:
        with printed_as_warnings(print_program_warning):  # both sides' program warns alike: each warning once
            if source != stack_file(stack):
                stack = stack_name_of_file(source)
                result = diff_stack(stack, against, default_stacks_dir().resolve().parent, source.absolute())
            else:
                result = diff_stack(stack, against, default_stacks_dir().resolve().parent)
    except (DiffError, StackConfigError) as err:
        raise fail(str(err)) from None
    say = lambda line: console.print(line, markup=False, soft_wrap=True)  # noqa: E731
    say(f"stack {stack}: working tree against {against} ({result.commit[:12]})")
    if not result.stack_file_versioned:
        say(
            f"stack file {source}: not versioned in this repository, the same on both sides; "
            "the change is the trainer's"
        )
    say("config:" if result.config_changes else "config: unchanged")
    for key, old, new in result.config_changes:
        say(f"  {key}: {_value(old)} -> {_value(new)}")
    if result.backend_change is not None:
        before, after, confirmed = result.backend_change
        say(
            f"  note: multislice:backend {before} -> {after} replaces every TPU VM of the stack; "
            + (
                "multislice:allowBackendChange: true confirms it, so pulumi up carries it out"
                if confirmed
                else "pulumi up refuses it unless the stack sets multislice:allowBackendChange: true "
                '(docs/deploying.md, "The compute-engine backend": changing the backend of a deployed stack)'
            )
        )
    old_sha, new_sha = result.bundle_sha256
    if old_sha == new_sha:
        say(f"trainer bundle: unchanged ({new_sha[:12]})")
    else:
        say(f"trainer bundle: {old_sha[:12]} -> {new_sha[:12]}")
        for path, status in result.trainer_files:
            say(f"  {status:8} {path}")
    say("resources:" if result.resources else "resources: no changes")
    for change in result.resources:
        detail = ", ".join(change.keys)
        if change.replace_keys:
            detail += f" (replaced because of: {', '.join(change.replace_keys)})"
        elif change.action == "update":
            detail += " (in place; no capacity given up)"
        if change.note:
            detail += f"; {change.note}"
        say(f"  {change.action:17} {change.name} ({change.typ}){': ' + detail if detail else ''}")
