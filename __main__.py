"""What ``pulumi preview``/``up`` run: the program ``infra/__main__.py``, as ``__main__``.

Pulumi.yaml names no ``main``, so the Pulumi CLI runs this directory's ``__main__.py`` and
starts the queued resource's dynamic provider here too, where its launcher finds the uv
toolchain's ``.venv``; with ``main: infra/`` it would look for ``infra/.venv`` and exit
(docs/deploying.md, "How the Pulumi CLI starts the provider"). The program runs as the
language host ran it from ``main: infra/``: ``runpy.run_path`` of ``infra/``.
"""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parent / "infra"), run_name="__main__")
