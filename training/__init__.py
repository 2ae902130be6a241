"""The JAX trainer that ships to the TPU VMs inside the startup script (``python -m training``).

Where each part lives:

* the run: :mod:`training.train` (the step loop, exit codes), :mod:`training.setup` (mesh, data,
  optimizer, jitted steps, restore and warm-up before the first step), :mod:`training.step`,
  :mod:`training.state`, :mod:`training.optimizer`, :mod:`training.mesh`;
* who this process is and how the job agrees: :mod:`training.cluster`, :mod:`training.agreement`,
  :mod:`training.preemption`, their environment knobs checked by :mod:`training.knobs`;
* configuration: :mod:`training.config` (validated by :mod:`training.validation`);
* :mod:`training.model` (the transformer, attention kernels, the layer scan, parameter shapes),
  :mod:`training.data` (byte and token readers, prepared datasets), :mod:`training.checkpoint`
  (Orbax, restore agreement, integrity), :mod:`training.metrics` (records, TensorBoard, goodput),
  :mod:`training.bench` (the shardings benchmark), :mod:`training.prepare` (``data prepare``:
  runs on the user's machine only and is left out of the VMs' bundle);
* process-level entry points the startup script runs: :mod:`training.workload` (a stack's own
  command), :mod:`training.log_shipping`; :mod:`training.host_allocator`, :mod:`training.compile_cache`,
  :mod:`training.run_dir`, :mod:`training.aot`.

Nothing here imports ``infra``.
"""
