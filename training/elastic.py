"""The trainer on fewer slices than its stack's (elastic slices): the same training, on what is there.

With ``n`` of the ``N`` slices of ``parallelism.dcn`` in the job (``MEGASCALE_NUM_SLICES``), only the
DCN data axis changes: DCN fsdp and tensor keep their sizes (fsdp shards the parameters), so ``n`` must
be a multiple of ``dcn.fsdp × dcn.tensor`` and the DCN data axis becomes ``n / (dcn.fsdp × dcn.tensor)``.
The global batch ``B``, the rows of each step and the learning-rate schedule stay the config's: the
batch of step ``s`` is rows ``[0, B)`` of the data's step ``s`` at any count (``training.data.text``
and ``training.data.tokens`` make it a function of ``s`` and ``B`` alone; each process reads the rows
its devices hold, ``training.mesh.process_batch_rows``). So ``B`` must split evenly over the
data-parallel size at ``n`` (``batch_shards' = dcn.data' × dcn.fsdp × ici.data × ici.fsdp``). Each
replica's ``R' = B / batch_shards'`` rows then run as the fewest equal microbatches no larger than the
full count's ``B / batch_shards / microbatches`` rows (a chip holds no more activations than at the
full count): ``microbatches'`` is the smallest divisor ``k'`` of ``R'`` with ``R' / k' ≤`` those rows.
The loss is the mean over equal microbatches, so the update is the whole batch's, float32 sums in
another order (training/step.py). Where ``N / n`` is whole and divides ``dcn.data`` that is the full
count's microbatches × ``N / n``, the one rule before other counts were allowed.

Allowed only down to ``min_slices``; ``multislice:elastic.minSlices`` is checked against this same
rule (:func:`count_shape`, by infra/config/elastic.py) before any resource exists. Anything else is
the mismatch it always was (:class:`training.mesh.MeshError`). This module imports no jax, so that
the stack's checks read the rule without it.
"""

from __future__ import annotations

import dataclasses

from training.config import TrainConfig


class NotACount(ValueError):
    """The slice count cannot train the config's batch (the message says why, naming the keys)."""


@dataclasses.dataclass(frozen=True)
class CountShape:
    """The training of a config at one slice count (:func:`count_shape`).

    Attributes:
      slices: the slices training together.
      dcn_data: the DCN data axis (DCN fsdp and tensor keep the config's sizes).
      batch_shards: the data-parallel size, ``dcn_data × dcn.fsdp × ici.data × ici.fsdp``.
      microbatches: microbatches per step (gradient accumulation).
      microbatch_rows: rows of one microbatch on one replica (``B / batch_shards / microbatches``).
    """

    slices: int
    dcn_data: int
    batch_shards: int
    microbatches: int
    microbatch_rows: int


def count_shape(config: TrainConfig, slices: int, prefix: str = "") -> CountShape:
    """The shape of ``config``'s training on ``slices`` slices, from 1 to ``parallelism.dcn``'s
    count (the module docstring gives the rule; ``min_slices`` is :func:`for_slices`'s to check).

    Args:
      config: the trainer config (its ``parallelism.dcn`` is the full count).
      slices: the count asked for.
      prefix: put before the config keys the refusal names (the stack's ``multislice:training.``).

    Raises:
      NotACount: ``slices`` is outside 1 to the full count, not a multiple of ``dcn.fsdp × dcn.tensor``,
        or the global batch does not split over its data-parallel size.
    """
    par = config.parallelism
    full, kept = par.dcn.product, par.dcn.fsdp * par.dcn.tensor
    if not 1 <= slices <= full:
        raise NotACount(f"{slices} is not between 1 and {prefix}parallelism.dcn's {full} slices")
    if slices % kept:
        raise NotACount(
            f"{slices} is not a multiple of {prefix}parallelism.dcn fsdp×tensor = {par.dcn.fsdp}×{par.dcn.tensor}, "
            "which keep their sizes (only dcn.data shrinks)"
        )
    dcn_data = slices // kept
    shards = dcn_data * par.dcn.fsdp * par.ici.data * par.ici.fsdp  # batch_shards with this dcn.data
    batch = config.global_batch_size
    if batch % shards:
        raise NotACount(
            f"{prefix}global_batch_size {batch} does not split over the data-parallel size {shards} of {slices} "
            f"slices (dcn data {dcn_data} × dcn fsdp {par.dcn.fsdp} × ici data {par.ici.data} × ici fsdp "
            f"{par.ici.fsdp})"
        )
    rows = batch // shards
    most = batch // par.batch_shards // config.microbatches  # rows of the full count's microbatch
    microbatches = next(k for k in range(1, rows + 1) if rows % k == 0 and rows // k <= most)
    return CountShape(slices, dcn_data, shards, microbatches, rows // microbatches)


def for_slices(config: TrainConfig, slices: int) -> TrainConfig:
    """``config`` for a job of ``slices`` slices: itself when that is ``parallelism.dcn``'s count,
    else (elastic) with the DCN data axis and the microbatches of :func:`count_shape`.

    Raises:
      MeshError: ``slices`` is not a count the config may train on, naming the keys.
    """
    from training.mesh import MeshError  # jax: here, so that the stack's checks import this module without it

    par = config.parallelism
    full = par.dcn.product
    if slices == full:
        return config
    if config.min_slices is None or not config.min_slices <= slices < full:
        allowed = "" if config.min_slices is None else f" (min_slices {config.min_slices}: elastic down to it)"
        raise MeshError(f"parallelism.dcn: data×fsdp×tensor = {full} but the job has {slices} slice(s){allowed}")
    try:
        shape = count_shape(config, slices)
    except NotACount as refused:
        raise MeshError(f"parallelism.dcn: {full} slices cannot train as {slices}: {refused}") from None
    data = config.model_dump()
    data["parallelism"]["dcn"]["data"] = shape.dcn_data
    data["microbatches"] = shape.microbatches
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
