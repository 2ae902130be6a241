"""What a run records: JSON-lines records and TensorBoard scalars (:mod:`training.metrics.run_log`),
the per-step metrics, log line and MFU (:mod:`~training.metrics.recorder`), and goodput with
badput by cause (:mod:`~training.metrics.goodput`). docs/goodput.md."""
