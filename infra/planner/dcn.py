"""DCN arithmetic: is data parallelism over DCN compute-bound or DCN-bound?

Source: the Cloud TPU Multislice overview (:data:`MULTISLICE_OVERVIEW`), its DCN arithmetic.

* Hardware arithmetic intensity ``AI = chips per host × peak FLOP/s per chip ÷ DCN
  bits/s per host`` (FLOP per bit). v4: 4 × 275e12 / 50e9 = 22,000. Every figure comes from
  the catalog: ``AcceleratorType.chips_per_host``, ``Generation.peak_bf16_flops_per_chip``
  and ``AcceleratorType.dcn_bits_per_second_per_host`` (their sources are in
  ``Generation.sources`` and are repeated in ``Plan.sources``).
* With data parallelism over DCN, each step all-reduces every parameter's float32 gradient
  between the DCN replicas: 32 bits per parameter with 2 replicas, up to 64 with more
  (:func:`dcn_bits_per_parameter`).
* The backward pass costs 4·B FLOPs per parameter (of the 6·B·P of a transformer step), so
  the model's operational intensity is ``OI = 4·B / 32`` (2 replicas) or ``4·B / 64`` (more).
  The step is DCN-bound when ``OI < AI``; the minimum batch is ``AI × bits / 4`` tokens per
  replica (v4: 176,000 for 2 slices, 352,000 for more; the global batch is that × replicas),
  and the overview recommends a large margin because DCN can drop packets briefly: "data
  parallelism only at ≥ ~350,000 tokens per pod (two pods) to ~700,000 (many pods)", i.e.
  :data:`SAFETY_MARGIN` = 2 × the minimum.

**Which batch B is.** B is the number of tokens *one DCN replica* processes per step: the
global batch in tokens divided by ``parallelism.dcn.data`` (``global_batch_size ×
sequence_length / dcn.data``). With ``dcn.fsdp = 1`` a replica is one slice ("tokens per
pod" in the overview); with ``dcn.fsdp > 1`` it is a group of ``dcn.fsdp`` slices. This is the
only reading under which the overview's inequality compares like with like: a replica of n
chips computes ``4·B·P`` backward FLOPs in ``4·B·P / (n · peak)`` seconds while its n /
chips-per-host hosts move ``32·P`` bits in ``32·P / (n · DCN bits/s per chip)`` seconds, so
compute hides the all-reduce iff ``4·B/32 ≥ peak / DCN per chip = AI``. The *global* batch is
B × replicas (the overview's "scale the global batch linearly" with the number of slices).
The number of replicas taking part in the all-reduce (``dcn.data``) chooses 32 or 64 bits.
The traffic of FSDP over DCN (``dcn.fsdp > 1``: parameter all-gathers and gradient
reduce-scatters between the slices of a group) is not covered by the overview's formula and
is not modelled; the plan says so.
"""

from __future__ import annotations

import dataclasses

from infra.accelerators import AcceleratorType
from training.config import ParallelismConfig

__all__ = [
    "BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN",
    "DCN_BITS_PER_PARAMETER_MANY_REPLICAS",
    "DCN_BITS_PER_PARAMETER_TWO_REPLICAS",
    "MULTISLICE_OVERVIEW",
    "SAFETY_MARGIN",
    "DcnCheck",
    "dcn_bits_per_parameter",
    "dcn_check",
    "hardware_arithmetic_intensity",
    "min_tokens_per_replica",
    "operational_intensity",
]

#: The public source of the DCN arithmetic and of the parallelism guidance.
MULTISLICE_OVERVIEW = "Cloud TPU Multislice overview, https://cloud.google.com/tpu/docs/multislice-introduction"

#: Backward-pass FLOPs per parameter per token: "the backward pass is 4·B per parameter"
#: (of the 6·B·P FLOPs of a transformer step). Source: :data:`MULTISLICE_OVERVIEW`.
BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN = 4

#: DCN bits per parameter per step for an all-reduce between exactly 2 replicas, and the
#: upper bound the overview uses for more than 2 (float32 gradients; a ring all-reduce moves
#: 2·(n−1)/n × 32 bits, which tends to 64). Source: :data:`MULTISLICE_OVERVIEW`.
DCN_BITS_PER_PARAMETER_TWO_REPLICAS = 32
DCN_BITS_PER_PARAMETER_MANY_REPLICAS = 64

#: The overview's margin over the minimum batch: "use a large margin: data parallelism only
#: at ≥ ~350,000 tokens per pod (two pods) to ~700,000 (many pods)" against minimums of
#: 176,000 and 352,000, i.e. about 2×. Source: :data:`MULTISLICE_OVERVIEW`.
SAFETY_MARGIN = 2.0


def hardware_arithmetic_intensity(accelerator: AcceleratorType) -> float:
    """FLOP per DCN bit the hardware can sustain: chips per host × peak bf16 FLOP/s per chip ÷
    DCN bits/s per host (TPU VM). v4: 4 × 275e12 / 50e9 = 22,000.

    For v5e/v6e multi-host slices the VM holds 4 of the physical host's 8 chips and the
    catalog shares the host's DCN evenly (``AcceleratorType.dcn_bits_per_second_per_host``),
    so the result equals ``Generation.flops_per_dcn_bit`` for every slice size.
    Source: :data:`MULTISLICE_OVERVIEW`; figures from ``infra.accelerators``.
    """
    gen = accelerator.generation
    return accelerator.chips_per_host * gen.peak_bf16_flops_per_chip / accelerator.dcn_bits_per_second_per_host


def dcn_bits_per_parameter(replicas: int) -> int:
    """DCN bits per parameter per step of the gradient all-reduce between ``replicas`` DCN
    data-parallel replicas: 32 for 2, 64 for more (:data:`MULTISLICE_OVERVIEW`).

    Raises:
      ValueError: ``replicas`` < 2 (one replica sends no gradients over DCN).
    """
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
        raise ValueError(f"replicas must be an int ≥ 2 (DCN data-parallel replicas); got {replicas!r}")
    return DCN_BITS_PER_PARAMETER_TWO_REPLICAS if replicas == 2 else DCN_BITS_PER_PARAMETER_MANY_REPLICAS


def operational_intensity(tokens_per_replica: float, replicas: int) -> float:
    """The model's FLOP per DCN bit under data parallelism over DCN: ``4·B / 32`` (2 replicas)
    or ``4·B / 64`` (more), B = tokens per step of one replica (per pod).

    Raises:
      ValueError: ``tokens_per_replica`` ≤ 0 or ``replicas`` < 2.
    """
    if not tokens_per_replica > 0:
        raise ValueError(f"tokens_per_replica must be positive; got {tokens_per_replica!r}")
    return BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN * tokens_per_replica / dcn_bits_per_parameter(replicas)


def min_tokens_per_replica(arithmetic_intensity: float, replicas: int) -> float:
    """Smallest batch B of one replica (tokens per step per pod, not the global batch) for
    which ``operational_intensity ≥ arithmetic_intensity``: ``AI × bits / 4``. v4: 176,000
    (2 replicas), 352,000 (more); the global batch is that × ``replicas``.

    Raises:
      ValueError: ``arithmetic_intensity`` ≤ 0 or ``replicas`` < 2.
    """
    if not arithmetic_intensity > 0:
        raise ValueError(f"arithmetic_intensity must be positive; got {arithmetic_intensity!r}")
    return arithmetic_intensity * dcn_bits_per_parameter(replicas) / BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN


@dataclasses.dataclass(frozen=True)
class DcnCheck:
    """The Multislice overview's DCN check for one stack.

    Attributes:
      replicas: DCN data-parallel replicas (``parallelism.dcn.data``).
      tokens_per_replica: B, tokens per step of one replica (global tokens ÷ replicas).
      arithmetic_intensity: hardware FLOP per DCN bit.
      peak_flops_per_chip, dcn_bits_per_second_per_host: catalog figures (FLOP/s, bit/s per
        TPU VM) the arithmetic intensity is computed from, with ``chips_per_host``.
      bits_per_parameter: 32 or 64; None with a single replica.
      operational_intensity: 4·B / bits, FLOP per bit; None with a single replica.
      min_tokens_per_replica: minimum B (tokens per step of one replica); None with a single
        replica.
      recommended_tokens_per_replica: ``safety_margin × min_tokens_per_replica``; None with
        one replica.
      safety_margin: :data:`SAFETY_MARGIN`.
      dcn_bound: True when ``operational_intensity < arithmetic_intensity``.
      meets_margin: True when B ≥ the recommended batch (or no DCN all-reduce happens).
      dcn_fsdp: ``parallelism.dcn.fsdp`` (FSDP traffic over DCN is not modelled when > 1).
      chips_per_host: chips per TPU VM.

    Derived (not constructor arguments): ``min_global_batch_tokens`` and
    ``recommended_global_batch_tokens``, the two per-replica figures × ``replicas`` (tokens
    per step over all slices, comparable with ``Plan.global_batch_tokens``); None with one
    replica. Every token count says whether it is per replica or global, in the field name
    and in its ``--json`` key.

    A field's ``metadata["json"]`` is its key in ``multislice plan --json`` (``Plan.to_json``);
    ``dcn_fsdp`` and ``chips_per_host`` are left out there (the plan's ``mesh`` and
    ``chips_per_host`` carry them).
    """

    replicas: int = dataclasses.field(metadata={"json": "dcn_replicas"})
    tokens_per_replica: float
    arithmetic_intensity: float
    peak_flops_per_chip: float
    dcn_bits_per_second_per_host: float
    bits_per_parameter: int | None = dataclasses.field(metadata={"json": "dcn_bits_per_parameter"})
    operational_intensity: float | None
    min_tokens_per_replica: float | None
    recommended_tokens_per_replica: float | None
    safety_margin: float
    dcn_bound: bool
    meets_margin: bool = dataclasses.field(metadata={"json": "meets_dcn_margin"})
    dcn_fsdp: int = dataclasses.field(metadata={"json": None})
    chips_per_host: int = dataclasses.field(metadata={"json": None})
    min_global_batch_tokens: float | None = dataclasses.field(init=False)
    recommended_global_batch_tokens: float | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        for per_replica, global_ in (
            ("min_tokens_per_replica", "min_global_batch_tokens"),
            ("recommended_tokens_per_replica", "recommended_global_batch_tokens"),
        ):
            value = getattr(self, per_replica)
            object.__setattr__(self, global_, None if value is None else value * self.replicas)

    @property
    def applies(self) -> bool:
        """Whether gradients cross DCN in a data-parallel all-reduce (more than one replica)."""
        return self.replicas > 1


def dcn_check(accelerator: AcceleratorType, parallelism: ParallelismConfig, global_batch_tokens: int) -> DcnCheck:
    """The DCN verdict for data parallelism over ``parallelism.dcn.data`` replicas.

    Args:
      accelerator: the slice type (catalog entry).
      parallelism: the mesh (validated with the accelerator, e.g. a ``StackConfig``'s);
        ``dcn.data`` is the replica count.
      global_batch_tokens: tokens per optimizer step over all slices.

    Raises:
      ValueError: ``global_batch_tokens`` ≤ 0.
    """
    if not isinstance(global_batch_tokens, int) or global_batch_tokens <= 0:
        raise ValueError(f"global_batch_tokens must be a positive int; got {global_batch_tokens!r}")
    replicas = parallelism.dcn.data
    tokens = global_batch_tokens / replicas
    ai = hardware_arithmetic_intensity(accelerator)
    common = {
        "replicas": replicas,
        "tokens_per_replica": tokens,
        "arithmetic_intensity": ai,
        "peak_flops_per_chip": accelerator.generation.peak_bf16_flops_per_chip,
        "dcn_bits_per_second_per_host": accelerator.dcn_bits_per_second_per_host,
        "safety_margin": SAFETY_MARGIN,
        "dcn_fsdp": parallelism.dcn.fsdp,
        "chips_per_host": accelerator.chips_per_host,
    }
    if replicas < 2:
        return DcnCheck(
            **common,
            bits_per_parameter=None,
            operational_intensity=None,
            min_tokens_per_replica=None,
            recommended_tokens_per_replica=None,
            dcn_bound=False,
            meets_margin=True,
        )
    oi = operational_intensity(tokens, replicas)
    minimum = min_tokens_per_replica(ai, replicas)
    return DcnCheck(
        **common,
        bits_per_parameter=dcn_bits_per_parameter(replicas),
        operational_intensity=oi,
        min_tokens_per_replica=minimum,
        recommended_tokens_per_replica=SAFETY_MARGIN * minimum,
        dcn_bound=oi < ai,
        meets_margin=tokens >= SAFETY_MARGIN * minimum,
    )
