"""What ``pulumi preview``/``up`` run: the program ``infra/__main__.py``, as ``__main__``.

Pulumi.yaml names no ``main``, so the Pulumi CLI runs this directory's ``__main__.py`` and
starts the queued resource's dynamic provider here too, where its launcher finds the uv
toolchain's ``.venv``; with ``main: infra/`` it would look for ``infra/.venv`` and exit
(docs/deploying.md, "How the Pulumi CLI starts the provider"). The program runs as the
language host ran it from ``main: infra/``: ``runpy.run_path`` of ``infra/``.
"""

import importlib.util
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent

if importlib.util.find_spec("pulumi") is None:
    # Not the Pulumi CLI's run of the program (its uv toolchain has pulumi): most likely
    # `uv run multislice …` from the directory above a clone named multislice, where uv found no
    # project and ran this directory with another Python. One line, not a traceback.
    print(
        f"error: {ROOT} is the multislice repository (its Pulumi program runs under `pulumi up`); run the CLI "
        f"from there with `uv run --frozen multislice …`, or from anywhere with "
        f"`uv run --project {ROOT} --frozen multislice …`",
        file=sys.stderr,
    )
    sys.exit(2)

runpy.run_path(str(ROOT / "infra"), run_name="__main__")
