"""The readers of bytes from outside the program: every byte it did not write in this process is
read here, with a bound on its size and shape, into a value or one line saying why not.

* :mod:`.stack_file`: a stack file (``stacks/Pulumi.<stack>.yaml`` or ``--config-file``), its YAML
  read with the limits and refusals documented there, and :class:`~.stack_file.StackConfigError`;
* :mod:`.state_records`: the records of a local run's state directory (``emulator.json``,
  ``deleted.json``, ``stack-file``);
* :mod:`.environment`: the environment variables that move the tool's own directories.

They stand on the ground floor of ``infra/`` (``tests/test_import_graph.py``): they import nothing
of the project, so that config, the emulated platform and the commands read through the same ones.
The run directory's objects (membership records, heartbeats, run logs, the completion marker) are
still decoded beside the types they build (``training/membership.py``, ``heartbeats.py``,
``metrics/run_log.py``, ``checkpoint/completion.py``; ``infra/status/progress.py``): the trainer
imports nothing of ``infra/``, so their one reader will be the trainer's, which this package's
commands import.
"""
