"""The readers of bytes from outside the program: every byte it did not write in this process is
read here, with a bound on its size and shape, into a value or one line saying why not.

* :mod:`.stack_file`: a stack file (``stacks/Pulumi.<stack>.yaml`` or ``--config-file``), its YAML
  read with the limits and refusals documented there, and :class:`~.stack_file.StackConfigError`;
* :mod:`.engine_config`: the stack file's ``config:`` as the Pulumi engine hands it to the program,
  refusing what YAML 1.1 and the engine read differently; :mod:`.go_yaml`: how Go's YAML library
  reads a scalar and Go writes a number (what it builds on);
* :mod:`.files`: any file, a regular one only, read no further than a limit;
* :mod:`.state_records`: the records of a local run's state directory (``emulator.json``,
  ``deleted.json``, ``stack-file``);
* :mod:`.environment`: the tool's own environment variables (its directories, the trainer's log
  level), each refused in one line when it cannot mean what it names.

They stand on the ground floor of ``infra/`` (``tests/test_import_graph.py``): they import nothing
of the project, so that config, the emulated platform and the commands read through the same ones.
The run directory's objects (membership records, heartbeats, the completion marker, the recorded
config) are decoded by the trainer's :mod:`training.run_objects` (the trainer imports nothing of
``infra/``), which this package's commands use too.
"""
