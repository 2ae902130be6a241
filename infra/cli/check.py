"""``multislice check``: the policy pack's verdict on a stack, without the Pulumi CLI or credentials.

    multislice check --stack prod [--policy-config policy.json]

Evaluates the program under mocks (:mod:`infra.review.program_mocks`) and runs the policy pack's
policies over what it declares (:mod:`infra.policy.evaluate`): the verdict ``pulumi preview
--policy-pack infra/policy`` gives, on a laptop or in CI. Exit 1 on a mandatory violation, 0
otherwise (advisory violations print as warnings), 2 on bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from infra.cli.option_values import PATH
from infra.cli.options import (
    CONFIG_FILE_OPTION,
    STACK_OPTION,
    console,
    err_console,
    fail,
    load_config,
    print_program_warning,
    render_release,
)


def _stack_and_config_map(stack: str, config_file: Path | None) -> tuple[str, dict, Any]:
    """The stack name, its raw ``config:`` map and its rendered script, after validating it and
    building its release (one ``error:`` line and exit 2 for either)."""
    from infra.config import pulumi_config_of_file, stack_file
    from infra.review.stack_paths import with_absolute_workload_paths

    config = load_config(stack, config_file)  # exits 2 with the key's message if invalid
    script = render_release(config)  # and if its release cannot be built, as `render` says it
    path = config_file or stack_file(config.stack)
    # What pulumi up hands the program (read as load_config read it: a second read of the same bounded
    # reader), its workload paths relative to the stack file (the program reads them from stacks/).
    config_map = with_absolute_workload_paths(pulumi_config_of_file(path, config.stack), path.parent)
    return config.stack, config_map, script


def _resource_label(urn: str | None) -> str:
    if not urn:
        return "stack"
    qualified_type, name = urn.split("::")[-2:]
    return f"{name} ({qualified_type.split('$')[-1]})"


def check(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    policy_config: Path | None = typer.Option(
        None,
        "--policy-config",
        metavar="PATH",
        parser=PATH,
        help="Policy configuration: the JSON file `pulumi preview --policy-pack-config` takes.",
    ),
) -> None:
    """Run the policy pack (infra/policy) over the resources the stack would declare, offline.

    Same verdict as `pulumi preview --policy-pack infra/policy`: exit 1 on a mandatory violation;
    advisory violations are printed as warnings.
    """
    from infra.policy.evaluate import PolicyConfigError, check_stack, load_policy_config
    from infra.policy.policies import POLICIES
    from infra.review.program_warnings import printed_as_warnings

    name, config_map, script = _stack_and_config_map(stack, config_file)
    try:
        raw = load_policy_config(policy_config) if policy_config else {}
        with printed_as_warnings(print_program_warning):  # each once, load_config's too
            violations = check_stack(name, config_map, raw, script=script)
    except PolicyConfigError as err:
        raise fail(str(err)) from None
    for v in violations:
        tag = ("mandatory", "bold red") if v.mandatory else ("advisory", "yellow")
        err_console.print(
            Text.assemble(tag, f" [{v.policy}] {_resource_label(v.resource)}: {v.message}"), soft_wrap=True
        )
    mandatory = sum(v.mandatory for v in violations)
    summary = (
        f"stack {name}: {len(POLICIES)} policies, {mandatory} mandatory and "
        f"{len(violations) - mandatory} advisory violation(s)"
    )
    console.print(summary, markup=False)
    if mandatory:
        raise fail(
            f"stack {name} violates mandatory policies: "
            + ", ".join(sorted({v.policy for v in violations if v.mandatory})),
            1,
        )
