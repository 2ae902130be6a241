"""The model: a decoder-only transformer in plain JAX (:mod:`training.model.transformer`), its
causal attention and kernels (:mod:`~training.model.attention`; which kernel runs, without jax:
:mod:`~training.model.kernels`), the layer stack's scan (:mod:`~training.model.layer_scan`), the
parameters' shapes and logical axes without jax (:mod:`~training.model.shapes`, which the planner
reads too) and the named presets a stack selects (:mod:`~training.model.presets`). docs/model.md."""
