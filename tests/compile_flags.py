"""XLA's CPU code generation at LLVM's lowest optimization level for the tests' JAX programs.

Much of the suite's time is XLA compiling small models, and a large part of a CPU compile is
LLVM optimizing the generated code. ``--xla_backend_optimization_level=0`` (XLA's
``DebugOptions.xla_backend_optimization_level``, default 3: the LLVM optimization level of the
CPU backend's code generation, openxla/xla ``xla/service/cpu``'s ``CodeGenOptLevel``) compiles
without it. The tests that read the compiled HLO or XLA's memory analysis pass with it.
Measured with ``-n 0`` on the three layer-scan equality cases and the three remat
comparisons of tests/training/test_step.py: 38.1 / 39.3 s -> 25.6 / 23.2 s. No test reads a
step time. Results can differ in the last bits from those of optimized code (LLVM may form fused
multiply-adds at one level and not at another), so every comparison of results is between
programs compiled alike: the tests' own, or the emulated VMs' trainers among themselves.

The test process and the trainer subprocesses the tests start (tests/trainer_process.py) use
it. The emulated VMs get the environment the emulator gives them, as on a TPU VM, and
:data:`EMULATED_VM_FLAGS` through ``MULTISLICE_EMULATED_XLA_FLAGS`` (infra/local/topology.py): the
same optimization level, and XLA's CPU kernels on one thread each, since an emulation's processes
(2–4 VMs, and up to three emulations at once under pytest-xdist) already outnumber the 2 cores the
suite is sized for. Measured on the compute-engine emulation (2 slices × 2 VMs, a kill at step 6,
24 steps, a cold compilation cache), the CPU time of its 8 trainer processes, one run each on
an idle 2-core machine: 116.7 s with no flags, 102.0 s with the optimization level alone, 93.8 s
with both (user + system time, sampled with psutil).
"""

from __future__ import annotations

FLAG = "--xla_backend_optimization_level=0"
#: ``XLA_FLAGS`` of the emulated VMs' processes: :data:`FLAG`, and Eigen's intra-op thread pool
#: off (``DebugOptions.xla_cpu_multi_thread_eigen``, default true).
EMULATED_VM_FLAGS = f"{FLAG} --xla_cpu_multi_thread_eigen=false"


def with_fast_compile(xla_flags: str | None) -> str:
    """``xla_flags`` (an ``XLA_FLAGS`` value, or None) with :data:`FLAG` added, unless it
    already sets the optimization level."""
    current = xla_flags or ""
    if "xla_backend_optimization_level" in current:
        return current
    return f"{current} {FLAG}".strip()
