"""A stack file's relative paths made absolute, for the review commands that evaluate the program
from a stack file's raw ``config:`` map (``check``; ``diff`` on a revision's tree).

The program itself resolves ``multislice:workload.source`` and ``.requirements`` against the
project's ``stacks/`` folder (where ``pulumi up`` reads ``Pulumi.<stack>.yaml``), while every
review command resolves them against the folder of the stack file it was given
(:mod:`infra.config.workload`). A stack file kept elsewhere (``--config-file``), or a revision's
copy of one in a temporary tree, would then name other folders in the program than in the config
check. :func:`with_absolute_workload_paths` resolves them once, with the config check's own
:func:`infra.config.workload.resolve_path`, so the program sees the same files.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from infra.config.workload import resolve_path

WORKLOAD_KEY = "multislice:workload"
#: The keys of ``multislice:workload`` that name files on this machine.
PATH_KEYS = ("source", "requirements")


def with_absolute_workload_paths(
    config_map: dict[str, Any], stacks_dir: Path, *, tree: Path | None = None, outside: Path | None = None
) -> dict[str, Any]:
    """A copy of ``config_map`` whose relative workload paths are absolute, relative to
    ``stacks_dir`` (the stack file's folder). With ``tree`` and ``outside``, a path that leaves
    ``tree`` (a revision's checkout) is taken relative to ``outside`` instead (the working tree's
    ``stacks/``): files outside the repository are not versioned, so both sides of a diff read the
    ones on disk. Values that are not non-empty strings are left for the config check to refuse. The
    workload may be a map (a typed map) or its JSON text (the engine's map); it is returned the same way."""
    out = copy.deepcopy(config_map)
    workload = out.get(WORKLOAD_KEY)
    as_json = isinstance(workload, str)  # the engine's map (infra.config.pulumi_config_of_file): JSON text
    if as_json:
        try:
            workload = json.loads(workload)
        except ValueError:
            return out  # the config check refuses it
    if not isinstance(workload, dict):
        return out
    for key in PATH_KEYS:
        value = workload.get(key)
        if not isinstance(value, str) or not value.strip() or os.path.isabs(os.path.expanduser(value)):
            continue
        path = resolve_path(value, stacks_dir)
        if tree is not None and outside is not None and not path.is_relative_to(tree.absolute()):
            path = resolve_path(value, outside)
        workload[key] = str(path)
    out[WORKLOAD_KEY] = json.dumps(workload) if as_json else workload
    return out
