"""The trainer on fewer slices than its stack's (elastic slices): the same training, on what is there.

With ``n`` of the ``N`` slices of ``parallelism.dcn`` in the job (``MEGASCALE_NUM_SLICES``), the
DCN data axis shrinks by ``N / n`` and every data-parallel replica runs ``N / n`` times the
microbatches: the global batch, the rows of each step (``training.data``) and the learning-rate
schedule stay the config's, and the state is restored onto the smaller mesh as on any other
(docs/faults.md, "Elastic resume"). Allowed only down to ``min_slices`` and where ``N / n`` is whole
and divides ``dcn.data`` (the rule ``multislice:elastic`` checks before any resource exists:
infra/config/elastic.py); anything else is the mismatch it always was (:class:`MeshError`).
"""

from __future__ import annotations

from training.config import TrainConfig
from training.mesh import MeshError


def for_slices(config: TrainConfig, slices: int) -> TrainConfig:
    """``config`` for a job of ``slices`` slices: itself when that is ``parallelism.dcn``'s count,
    else (elastic) with the DCN data axis and the microbatches scaled (see the module docstring).

    Raises:
      MeshError: ``slices`` is not a count the config may train on, naming the keys.
    """
    par = config.parallelism
    full = par.dcn.product
    if slices == full:
        return config
    if config.min_slices is None or not config.min_slices <= slices < full:
        allowed = "" if config.min_slices is None else f" (min_slices {config.min_slices}: elastic down to it)"
        raise MeshError(f"parallelism.dcn: data×fsdp×tensor = {full} but the job has {slices} slice(s){allowed}")
    factor, rest = divmod(full, slices)
    if rest or par.dcn.data % factor:
        raise MeshError(
            f"parallelism.dcn: {full} slices cannot train as {slices}: the DCN data axis ({par.dcn.data}) would "
            f"shrink by {full}/{slices}, which is not a whole divisor of it"
        )
    data = config.model_dump()
    data["parallelism"]["dcn"]["data"] = par.dcn.data // factor
    data["microbatches"] = config.microbatches * factor
    return TrainConfig.model_validate(data)
