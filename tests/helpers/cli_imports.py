"""What a CLI command imports: a driver that runs it in one interpreter and records every
module imported (and, for each package a light command must not import, the chain of modules
whose imports first brought it in), the packages that are heavy, and the environment a command
runs in for it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

HEAVY = ("jax", "jaxlib", "orbax", "tensorstore")

#: What a command that does not use them must not import: Pulumi and its providers and
#: policy SDK (``multislice check`` and ``diff`` evaluate the program, nothing else does), JAX and
#: what checkpoints with it, and Google's client libraries (``google.cloud.*``: ``status`` reads the
#: TPU API and the bucket with ``requests``, infra/backends/queued_resource/capacity.py).
UNUSED = ("pulumi", "pulumi_gcp", "pulumi_kubernetes", "pulumi_policy", *HEAVY, "google.cloud")

# Runs the CLI in this interpreter, then writes to argv[1] the names of every imported module and,
# for each of UNUSED first imported, the chain of importers: the innermost module first, each
# `module:line` of an import statement that was running (importlib's own frames left out).
DRIVER = f"""
import json, sys
WATCHED = {UNUSED!r}
chains = {{}}

class Recorder:
    def find_spec(self, name, path=None, target=None):
        root = next((w for w in WATCHED if name == w or name.startswith(w + ".")), None)
        if root is not None and root not in chains:
            chain, frame = [], sys._getframe(1)
            while frame is not None:
                module = frame.f_globals.get("__name__", "?")
                if not module.startswith(("importlib", "_frozen_importlib")) and (not chain or chain[-1][0] != module):
                    chain.append((module, frame.f_lineno))
                frame = frame.f_back
            chains[root] = [f"{{m}}:{{line}}" for m, line in chain]
        return None

sys.meta_path.insert(0, Recorder())
out, sys.argv = sys.argv[1], ["multislice", *sys.argv[2:]]
from infra.cli import app
try:
    app()
except SystemExit as exit:
    code = exit.code
else:
    code = 0
json.dump({{"code": code, "modules": sorted(sys.modules), "importers": chains}}, open(out, "w"))
"""


def root_of(module: str, roots: tuple[str, ...] = UNUSED) -> str | None:
    """The entry of ``roots`` that ``module`` is or is under, else None."""
    return next((root for root in roots if module == root or module.startswith(root + ".")), None)


def unused_imports(result: dict, allowed: tuple[str, ...] = ()) -> dict[str, str]:
    """What a :data:`DRIVER` run imported of :data:`UNUSED` beyond ``allowed``: each root and who
    first imported it, the project's modules of the chain innermost first (all of it when none is)."""
    found: dict[str, str] = {}
    for module in result["modules"]:
        root = root_of(module)
        if root is None or root in allowed or root in found:
            continue
        chain = result.get("importers", {}).get(root, [])
        ours = [frame for frame in chain if frame.startswith(("infra", "training"))]
        found[root] = " <- ".join(ours or chain) or "(no importer recorded)"
    return found


def hermetic_env(tmp_path: Path, stacks: Path | None = None) -> dict[str, str]:
    """The environment of a command run for :data:`DRIVER`: a home, local state and (unless
    ``stacks`` is None) a stacks folder of its own, a copy of ``stacks``."""
    home, state = tmp_path / "home", tmp_path / "state"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "MULTISLICE_STATE_DIR": str(state), "COLUMNS": "200"}
    if stacks is not None:
        shutil.copytree(stacks, tmp_path / "stacks", dirs_exist_ok=True)
        env["MULTISLICE_STACKS_DIR"] = str(tmp_path / "stacks")
    return env
