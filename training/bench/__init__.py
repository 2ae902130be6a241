"""The shardings benchmark (``bench shardings``): what a (DCN × ICI) mesh achieves on an MLP
stack (:mod:`training.bench.shardings`), and the benchmark's spec and command-line options
(:mod:`~training.bench.spec`)."""
