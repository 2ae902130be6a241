"""``multislice check`` (and ``multislice diff``): reviewing a stack without the Pulumi CLI or credentials.

    multislice check --stack prod [--policy-config policy.json]
    multislice diff --stack prod --against origin/main

Registered on :data:`infra.cli.app` by :func:`register`. ``check`` evaluates the program under
mocks (:mod:`infra.program_mocks`) and runs the policy pack's policies over what it declares
(:mod:`infra.policy.evaluate`): the verdict ``pulumi preview --policy-pack infra/policy``
gives, on a laptop or in CI. Exit 1 on a mandatory violation, 0 otherwise (advisory
violations print as warnings), 2 on bad input. ``diff`` prints what the change from a git
revision to the working tree does to a stack (:mod:`infra.review_diff`); exit 0, 2 on bad
input (no such revision, stack missing at it).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.text import Text


def _stack_and_config_map(stack: str, config_file: Path | None) -> tuple[str, dict]:
    """The stack name and its raw ``config:`` map, after validating it (one ``error:`` line)."""
    import yaml

    from infra.cli import load_config
    from infra.config import stack_file

    config = load_config(stack, config_file)  # exits 2 with the key's message if invalid
    path = config_file or stack_file(config.stack)
    return config.stack, yaml.safe_load(path.read_text())["config"]


def _resource_label(urn: str | None) -> str:
    if not urn:
        return "stack"
    qualified_type, name = urn.split("::")[-2:]
    return f"{name} ({qualified_type.split('$')[-1]})"


def check(
    stack: str = typer.Option("dev", "--stack", "-s", metavar="NAME", help="Stack name: the file stacks/Pulumi.NAME.yaml."),
    config_file: Path | None = typer.Option(
        None, "--config-file", metavar="PATH", help="A stack file anywhere (instead of --stack); the stack name is taken from it."
    ),
    policy_config: Path | None = typer.Option(
        None, "--policy-config", help="Policy configuration: the JSON file `pulumi preview --policy-pack-config` takes."
    ),
) -> None:
    """Run the policy pack (infra/policy) over the resources the stack would declare, offline.

    Same verdict as `pulumi preview --policy-pack infra/policy`: exit 1 on a mandatory violation;
    advisory violations are printed as warnings.
    """
    from infra.cli import console, err_console, fail
    from infra.policy.evaluate import PolicyConfigError, check_stack, load_policy_config
    from infra.policy.policies import POLICIES

    name, config_map = _stack_and_config_map(stack, config_file)
    try:
        raw = load_policy_config(policy_config) if policy_config else {}
        violations = check_stack(name, config_map, raw)
    except PolicyConfigError as err:
        raise fail(str(err)) from None
    for v in violations:
        tag = ("mandatory", "bold red") if v.mandatory else ("advisory", "yellow")
        err_console.print(Text.assemble(tag, f" [{v.policy}] {_resource_label(v.resource)}: {v.message}"), soft_wrap=True)
    mandatory = sum(v.mandatory for v in violations)
    summary = (f"stack {name}: {len(POLICIES)} policies, {mandatory} mandatory and "
               f"{len(violations) - mandatory} advisory violation(s)")
    console.print(summary, markup=False)
    if mandatory:
        raise fail(f"stack {name} violates mandatory policies: "
                   + ", ".join(sorted({v.policy for v in violations if v.mandatory})), 1)


def _value(value) -> str:
    import json

    return "(absent)" if value is None else json.dumps(value)


def diff(
    stack: str = typer.Option("dev", "--stack", "-s", metavar="NAME", help="Stack name: the file stacks/Pulumi.NAME.yaml."),
    against: str = typer.Option(..., "--against", help="A git revision (commit, branch, tag) to compare the working tree with."),
) -> None:
    """What the change from a git revision to the working tree does to the stack (offline).

    Config keys changed, the trainer bundle's hash and changed files, and which resources are
    created, deleted, replaced or updated in place (the queued resource by its provider's diff).
    """
    from infra.cli import console, fail
    from infra.config import default_stacks_dir
    from infra.review_diff import DiffError, diff_stack

    try:
        result = diff_stack(stack, against, default_stacks_dir().resolve().parent)
    except DiffError as err:
        raise fail(str(err)) from None
    say = lambda line: console.print(line, markup=False, soft_wrap=True)  # noqa: E731
    say(f"stack {stack}: working tree against {against} ({result.commit[:12]})")
    say("config:" if result.config_changes else "config: unchanged")
    for key, old, new in result.config_changes:
        say(f"  {key}: {_value(old)} -> {_value(new)}")
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
        say(f"  {change.action:17} {change.name} ({change.typ}){': ' + detail if detail else ''}")


def register(app: typer.Typer) -> None:
    """Add ``check`` and ``diff`` to the ``multislice`` app."""
    app.command("check")(check)
    app.command("diff")(diff)
