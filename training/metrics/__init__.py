"""What a run records: JSON-lines records and TensorBoard scalars (:mod:`training.metrics.run_log`),
the per-step metrics, log line and MFU (:mod:`~training.metrics.recorder`), goodput with
badput by cause (:mod:`~training.metrics.goodput`), and restarts named by cause
(:mod:`~training.metrics.restarts`). docs/goodput.md."""
