"""XLA's CPU code generation set for compile time in the tests' JAX programs.

Much of the suite's time is XLA compiling small models. Two of XLA's ``DebugOptions`` flags
(openxla/xla ``xla/debug_options_flags.cc``) make a CPU compile cheaper:

* ``--xla_backend_optimization_level=0`` (default 3: the LLVM optimization level of the CPU
  backend's code generation, ``xla/service/cpu``'s ``CodeGenOptLevel``) compiles without LLVM's
  optimizations. Measured with ``-n 0`` on the three layer-scan equality cases and the three
  remat comparisons of tests/training/test_step.py: 38.1 / 39.3 s -> 25.6 / 23.2 s.
* ``--xla_cpu_use_fusion_emitters=false`` (default true: "Use fusion emitters for code
  generation in the CPU backend", XLA:CPU's MLIR fusion emitters) emits fusions through XLA's
  older elemental IR emitter instead, which compiles these programs in a third of the time:
  the emu stack's train step on 8 CPU devices 2.0 -> 0.65 CPU-s and a 2-layer one 2.4 -> 0.77
  CPU-s (two runs each, ``lower(...).compile()`` timed in fresh processes); all of
  tests/training/test_step.py and test_layer_scan.py with ``-n 0``: 63.8 -> 30.2 CPU-s, every
  test passing (docs/development.md, "Measured").

No test reads a step time. The tests that read the compiled HLO or XLA's memory analysis pass
with both. Results can differ in the last bits from those of other code generation (LLVM may
form fused multiply-adds one way and not another), so every comparison of results is between
programs compiled alike: the tests' own, or the emulated VMs' trainers among themselves.

The test process and the trainer subprocesses the tests start (tests/trainer_process.py) use
them. The emulated VMs get the environment the emulator gives them, as on a TPU VM, and
:data:`EMULATED_VM_FLAGS` through ``MULTISLICE_EMULATED_XLA_FLAGS`` (infra/local/topology.py): the
same flags, and XLA's CPU kernels on one thread each, since an emulation's processes (2–4 VMs,
and up to three emulations at once under pytest-xdist) already outnumber the 2 cores the suite
is sized for. Measured on the compute-engine emulation (2 slices × 2 VMs, a kill at step 6, 24
steps, a cold compilation cache), the CPU time of its 8 trainer processes, one run each on an
idle 2-core machine: 116.7 s with no flags, 102.0 s with the optimization level alone, 93.8 s
with it and the one thread (user + system time, sampled with psutil).
"""

from __future__ import annotations

#: ``XLA_FLAGS`` entries of the tests' and the emulated VMs' programs, by flag name.
FLAGS = {
    "xla_backend_optimization_level": "--xla_backend_optimization_level=0",
    "xla_cpu_use_fusion_emitters": "--xla_cpu_use_fusion_emitters=false",
}
#: ``XLA_FLAGS`` of the emulated VMs' processes: :data:`FLAGS`, and Eigen's intra-op thread pool
#: off (``DebugOptions.xla_cpu_multi_thread_eigen``, default true).
EMULATED_VM_FLAGS = " ".join([*FLAGS.values(), "--xla_cpu_multi_thread_eigen=false"])


def with_fast_compile(xla_flags: str | None) -> str:
    """``xla_flags`` (an ``XLA_FLAGS`` value, or None) with each of :data:`FLAGS` added that it
    does not set already."""
    current = xla_flags or ""
    added = [flag for name, flag in FLAGS.items() if name not in current]
    return " ".join([current, *added]).strip()
