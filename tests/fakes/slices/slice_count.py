"""The slice check of the Multislice overview's experiment (MaxText's
``pedagogical_examples/shardings.py``), as a program of its own: in a multislice environment
(devices with ``slice_index``) the DCN data parallelism it is given must equal
``1 + max(d.slice_index for d in jax.devices())``. Usage: ``python slice_count.py DCN_DATA``; exit 0
and a line ``process P: N slices``, or the overview's AssertionError message."""

from __future__ import annotations

import sys

import jax

dcn_data_parallelism = int(sys.argv[1])
devices = jax.devices()
assert hasattr(devices[0], "slice_index"), f"{devices[0]} carries no slice_index"
found = 1 + max(d.slice_index for d in devices)
assert dcn_data_parallelism == found, (
    f"Number of slices given {dcn_data_parallelism} does not match the number fetched from jax devices ({found})"
)
print(f"process {jax.process_index()}: {found} slices", flush=True)
