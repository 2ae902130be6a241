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


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def decide(
    *,
    counts: list[int],
    members: tuple[int, ...],
    healthy: set[int],
    lost_since: dict[int, float],
    last_change: float,
    now: float,
    shrink_after_s: float,
    grow_after_s: float,
) -> tuple[tuple[int, ...], str] | None:
    """The membership to propose next (training/membership.py), or None to keep the current one.

    Args:
      counts: the slice counts the run may train on, most first (``multislice:elastic``).
      members: the slices of the current membership.
      healthy: the slices whose VMs are up now, members or not.
      lost_since: when each member not healthy was first seen lost (seconds).
      last_change: when the current membership took effect.
      now: this moment.
      shrink_after_s, grow_after_s: ``multislice:elastic.shrinkAfter`` and ``growAfter``.

    Returns:
      ``(slices, reason)``: shrink to the healthy members once a lost one has been away
      ``shrink_after_s`` (the most of them an allowed count takes, lowest ids first; none where no
      allowed count is left: the run waits, as a stack that is not elastic does); grow to the most
      healthy slices an allowed count takes once ``grow_after_s`` passed since the last change.
    """
    lost = sorted(s for s in members if s not in healthy and now - lost_since.get(s, now) >= shrink_after_s)
    if lost:
        alive = sorted(s for s in members if s in healthy)
        fits = [n for n in counts if n <= len(alive)]
        if not fits or fits[0] == len(members):
            return None
        gone = ", ".join(f"slice {s}" for s in lost)
        return tuple(alive[: fits[0]]), f"{gone} lost, not back within {_duration(shrink_after_s)}"
    if any(s not in healthy for s in members) or now - last_change < grow_after_s:
        return None
    fits = [n for n in counts if n <= len(healthy)]
    if not fits or fits[0] <= len(members):
        return None
    back = sorted(healthy - set(members))
    chosen = tuple(sorted(set(members) | set(back[: fits[0] - len(members)])))
    returned = ", ".join(f"slice {s}" for s in sorted(set(chosen) - set(members)))
    return chosen, f"{returned} back, {_duration(grow_after_s)} after the last change"
