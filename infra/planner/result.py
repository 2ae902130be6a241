"""The record of a plan, :class:`Plan`, and its JSON (``multislice plan --json``), made from
its dataclass fields. Assembled by :func:`infra.planner.plan`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from infra.planner.dcn import DcnCheck
from infra.planner.elastic import ElasticPlan
from infra.planner.levers import DcnBatchFit
from infra.planner.memory import MemoryEstimate
from training.config import MESH_AXES, ParallelismConfig


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything ``multislice plan`` reports about one stack.

    Attributes:
      stack, accelerator_type, generation: names.
      slices, chips_per_slice, chips, hosts_per_slice, hosts, chips_per_host: the job's size
        (hosts = TPU VMs, one process each).
      parallelism: the ICI and DCN axis sizes.
      mesh: derived from ``parallelism``: ``axis -> {"dcn": n, "ici": n, "size": n}`` for
        data, fsdp, tensor.
      parameters: parameter count (``training.model.shapes.param_count``).
      sequence_length, global_batch_size: sequences of tokens per step.
      global_batch_tokens: tokens per optimizer step over all slices.
      dcn: the DCN check.
      memory: per-chip memory estimate.
      recommendations: advice from the Multislice overview's parallelism guidance, most
        important first.
      sources: figure -> where it comes from.
      dcn_batch: when the stack is DCN-bound, the DCN minimum batch against HBM: the
        microbatch count and remat policy that fit it (:mod:`infra.planner.levers`); else None.
      capacity: how the backend requests and keeps the capacity, when its resources depend on
        it beyond the capacity's name (``BackendSpec.capacity_plan``); else None. ``capacity_plan``
        in ``--json``.
      apis: the Google APIs ``pulumi up`` enables for the stack (those of every stack and its
        backend's: :func:`infra.components.apis.apis_for`).
      elastic: the slice counts the run may train on (``multislice:elastic``), each with its
        microbatches and tokens/s ceiling (:mod:`infra.planner.elastic`).
    """

    stack: str
    accelerator_type: str
    generation: str
    slices: int
    chips_per_slice: int
    chips: int
    hosts_per_slice: int
    hosts: int
    chips_per_host: int
    parallelism: ParallelismConfig = dataclasses.field(metadata={"json": None})  # as "mesh"
    mesh: dict[str, dict[str, int]] = dataclasses.field(init=False)
    parameters: int
    sequence_length: int
    global_batch_size: int
    global_batch_tokens: int
    dcn: DcnCheck = dataclasses.field(metadata={"json": ""})
    memory: MemoryEstimate = dataclasses.field(metadata={"json": ""})
    recommendations: tuple[str, ...]
    sources: dict[str, str]
    dcn_batch: DcnBatchFit | None = dataclasses.field(default=None, metadata={"json": "dcn_min_batch_in_hbm"})
    capacity: str | None = dataclasses.field(default=None, metadata={"json": "capacity_plan"})
    apis: tuple[str, ...] = ()
    elastic: ElasticPlan | None = None

    def __post_init__(self) -> None:
        par = self.parallelism
        mesh = {
            axis: {"dcn": getattr(par.dcn, axis), "ici": getattr(par.ici, axis), "size": par.mesh_shape[axis]}
            for axis in MESH_AXES
        }
        object.__setattr__(self, "mesh", mesh)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``multislice plan --json``), made from the dataclass fields of the
        plan, of its :class:`DcnCheck` and of its :class:`MemoryEstimate` (see
        :func:`_json_document`)."""
        return _json_document(self)


def _json_document(obj: Any) -> dict[str, Any]:
    """The dataclass ``obj`` as a JSON-ready dict: one key per field, the field name or its
    ``metadata["json"]`` (a dotted key nests; None leaves the field out; ``""`` puts a nested
    dataclass's keys at this level). Nested dataclasses become objects, tuples become lists.

    Raises:
      ValueError: two fields map to the same key (a programming error).
    """
    out: dict[str, Any] = {}
    for path, value in _json_leaves(obj, ()):
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        if path[-1] in node:
            raise ValueError(f"two fields map to the JSON key {'.'.join(path)!r}")
        node[path[-1]] = value
    return out


def _json_leaves(obj: Any, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(key path, JSON value)`` of every field of the dataclass ``obj`` (see :func:`_json_document`)."""
    for field in dataclasses.fields(obj):
        key = field.metadata.get("json", field.name)
        if key is None:
            continue
        path = prefix + tuple(part for part in key.split(".") if part)
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(value):
            yield from _json_leaves(value, path)
        else:
            yield path, _json_value(value)


def _json_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _json_document(value)
    if isinstance(value, Mapping):
        return {key: _json_value(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [_json_value(item) for item in value]
    return value
