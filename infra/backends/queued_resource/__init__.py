"""The queued-resource backend: a multislice queued resource of the Cloud TPU API (tpu_v2)."""
