"""The options ``multislice status`` and ``multislice local status`` share (typer)."""

from __future__ import annotations

import typer

JSON_OPTION = typer.Option(False, "--json", help="Print the status as JSON (stable keys: infra/status/report.py).")
WATCH_OPTION = typer.Option(False, "--watch", "-w", help="Refresh in place until the run is COMPLETE (Ctrl-C stops).")
INTERVAL_OPTION = typer.Option(10.0, "--interval", min=0.5, help="Seconds between refreshes of --watch.")
PLOT_OPTION = typer.Option(
    None, "--plot", metavar="PATH", help="Also draw loss and tokens/s against step, restarts and preemptions marked, as a PNG."
)
