"""``multislice render``: the stack's startup script (or its resolved config)."""

from __future__ import annotations

from pathlib import Path

import typer

from infra.cli.option_values import PATH
from infra.cli.options import CONFIG_FILE_OPTION, STACK_OPTION, err_console, fail, load_config, render_release


def render(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    output: Path | None = typer.Option(
        None, "--output", "-o", metavar="PATH", parser=PATH, help="Write the script here instead of stdout."
    ),
    resolved_config: bool = typer.Option(
        False, "--config", help="Print the resolved stack config (every key, defaults filled in) instead of the script."
    ),
) -> None:
    """Print the stack's startup script: the exact bytes every TPU VM of the stack boots."""
    config = load_config(stack, config_file)
    if resolved_config:
        from infra.config.resolved import resolved_config_yaml

        typer.echo(resolved_config_yaml(config), nl=False)
        return
    script = render_release(config)
    if output:
        try:
            output.write_text(script.text)
        except OSError as err:
            raise fail(f"--output {output}: {err.strerror or err}") from None
        err_console.print(
            f"wrote {output}: {script.size_bytes} bytes, script sha256 {script.sha256}, "
            f"bundle sha256 {script.bundle_sha256}"
        )
    else:
        typer.echo(script.text, nl=False)
