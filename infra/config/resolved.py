"""The resolved stack config: every key of a validated StackConfig, defaults filled in.

``multislice render --config`` prints it as a stack file (``config:`` with the stack-file
keys), so a reviewer sees what the program will use, not only what the file sets. Keys
whose value is unset (``None``: a default the program derives, e.g. the bucket name) are
left out, as the engine stores no nulls.
"""

from __future__ import annotations

from typing import Any

import yaml

from infra.config.schema import StackConfig


def resolved_config(config: StackConfig) -> dict[str, Any]:
    """``{"config": {<stack-file key>: value}}`` for ``config`` (JSON types; no ``None``)."""
    return {"config": config.model_dump(by_alias=True, mode="json", exclude={"stack"}, exclude_none=True)}


def resolved_config_yaml(config: StackConfig) -> str:
    """:func:`resolved_config` as YAML, keys in declaration order, with a header naming the stack."""
    body = yaml.safe_dump(resolved_config(config), sort_keys=False, default_flow_style=False)
    return f"# stack {config.stack}: resolved config (defaults filled in)\n{body}"
