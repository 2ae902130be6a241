"""Test-session setup: JAX runs on CPU with 8 emulated devices in the test process.

Set before anything imports jax (the device count is fixed at import: docs/jax-on-cpu.md).
Subprocesses (the local emulation) get their own JAX environment from the emulator.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
