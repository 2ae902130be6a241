"""What a CLI command imports: a driver that runs it in one interpreter and records every
module imported, and the heavy packages a light command must not import."""

from __future__ import annotations

HEAVY = ("jax", "jaxlib", "orbax", "tensorstore")

# Runs the CLI in this interpreter, then writes the names of every imported module to argv[1].
DRIVER = """
import json, sys
out, sys.argv = sys.argv[1], ["multislice", *sys.argv[2:]]
from infra.cli import app
try:
    app()
except SystemExit as exit:
    code = exit.code
else:
    code = 0
json.dump({"code": code, "modules": sorted(sys.modules)}, open(out, "w"))
"""
