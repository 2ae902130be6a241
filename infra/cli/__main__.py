"""``python -m infra.cli``: the ``multislice`` command."""

from infra.cli import app

app()
