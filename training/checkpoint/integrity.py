"""What a restored train state must pass before the run trusts it: the checksums its save
recorded, and finite values.

Damage that keeps a checkpoint's sizes (bytes overwritten in a data file: a torn or
bit-rotted write) can still decode, so Orbax restores it without complaint; the loss is NaN a
few steps later (or, with finite garbage, silently wrong). So every save records, in the
checkpoint itself, a checksum of each array of the state (:func:`summarize`), and a restore
compares the restored arrays' checksums with it (:func:`problems`).

Why checksums of the values, computed on the devices, rather than of the files:

* Atomic with the checkpoint. They travel as Orbax's ``custom_metadata`` of the step
  (``CheckpointManager.save(..., custom_metadata=...)``, stored in the step's
  ``_CHECKPOINT_METADATA``, https://orbax.readthedocs.io/en/latest/api_reference/
  checkpoint.checkpoint_manager.html), which Orbax writes into the step's temporary
  directory before it finalizes it (the rename on a local disk, ``commit_success.txt`` on
  ``gs://``). A checksum file written by the trainer after an async save finalized would be
  a second, separate write that a crash can leave missing or stale.
* No second read and no knowledge of Orbax's file layout (OCDBT, zarr chunks, compression):
  the restored arrays are checked, whatever stored them.
* The same on every mesh: a checksum is a sum modulo 2³² of one hashed word per element
  (murmur3's 32-bit finalizer of the element's bits mixed with its flat index), so it does not
  depend on how the array is sharded or in which order the reduction adds; a checkpoint saved
  on 2 × 4 devices and restored on 4 × 2 (elastic resume, bit for bit the same values)
  passes. Computed where the arrays live, in one jitted pass over the state (a reduction per
  array, the global result on every process), it costs about one read of the state's memory
  per save and per restore.

Non-finite values (NaN, ±inf) in the parameters or optimizer moments are refused as well:
they catch damage in a checkpoint saved before checksums were recorded, and a state that went
non-finite in memory before its save (whose checksums match). A save refuses such a state
(:func:`nonfinite`), so a checkpoint never holds one.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: The key of the record in a step's ``custom_metadata``, and the checksum's version.
METADATA_KEY = "multislice_integrity"
ALGORITHM = "fmix32-index-sum/1"


def _fmix32(h: jax.Array) -> jax.Array:
    """murmur3's 32-bit finalizer (uint32 arithmetic wraps modulo 2³²)."""
    h = h ^ (h >> 16)
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
    """The bits of ``x`` as uint32 words (one per element of up to 4 bytes; a wider element
    adds a trailing axis of its words)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    size = x.dtype.itemsize
    if size >= 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * size}")).astype(jnp.uint32)


def _checksum(x: jax.Array) -> jax.Array:
    words = _words(x)
    index = jnp.zeros(words.shape, jnp.uint32)
    stride = 1
    for dim in reversed(range(words.ndim)):  # the flat index, without reshaping a sharded array
        index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, dim) * np.uint32(stride % 2**32)
        stride *= words.shape[dim]
    return jnp.sum(_fmix32(words ^ _fmix32(index + np.uint32(0x9E3779B9))), dtype=jnp.uint32)


def _nonfinite(x: jax.Array) -> jax.Array:
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros((), jnp.int32)
    return jnp.sum(~jnp.isfinite(x), dtype=jnp.int32)


@jax.jit
def _summary(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return _checksum(x), _nonfinite(x)


@jax.jit
def _summaries(state: Any) -> tuple[Any, Any]:
    # One jitted call per array: JAX traces each distinct shape, dtype and sharding once (a
    # state's parameters and its optimizer moments share theirs), which makes tracing the
    # whole state several times cheaper than one trace of every array's operations.
    pairs = [_summary(x) for x in jax.tree.leaves(state)]
    treedef = jax.tree.structure(state)
    return jax.tree.unflatten(treedef, [c for c, _ in pairs]), jax.tree.unflatten(treedef, [n for _, n in pairs])


def prepare(abstract_state: Any) -> None:
    """Compile (or load from the compilation cache) what :func:`summarize` runs for a state of
    ``abstract_state``'s shapes, dtypes and shardings (``jax.ShapeDtypeStruct`` leaves), so that
    its first call only runs (a start does this while it restores: training.train)."""
    _summaries.lower(abstract_state).compile()


def summarize(state: Any) -> dict[str, tuple[int, int]]:
    """``{array name: (checksum, non-finite count)}`` of every array of ``state``, named by
    its path (``params/blocks/0/w``). A collective: every process calls it with its part of
    the same global arrays and gets the same result."""
    checksums, counts = jax.device_get(_summaries(state))
    named = jax.tree_util.tree_flatten_with_path(checksums)[0]
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): (int(checksum), int(count))
        for (path, checksum), count in zip(named, jax.tree.leaves(counts), strict=True)
    }


def record(summary: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """The ``custom_metadata`` a save records: ``{METADATA_KEY: {"algorithm", "checksums"}}``."""
    return {METADATA_KEY: {"algorithm": ALGORITHM, "checksums": {name: c for name, (c, _) in summary.items()}}}


def nonfinite(summary: dict[str, tuple[int, int]]) -> str:
    """``""``, or which arrays hold non-finite values: ``3 non-finite values in params/w, ...``."""
    bad = [(name, count) for name, (_, count) in summary.items() if count]
    if not bad:
        return ""
    shown = ", ".join(f"{count} in {name}" for name, count in bad[:3])
    more = f" and {len(bad) - 3} more arrays" if len(bad) > 3 else ""
    return f"non-finite values ({shown}{more})"


def problems(summary: dict[str, tuple[int, int]], custom_metadata: Any) -> str:
    """Why a restored state whose :func:`summarize` is ``summary`` must not be trusted, in one
    line, or ``""``. ``custom_metadata`` is the step's (Orbax's ``StepMetadata.
    custom_metadata``); a checkpoint without a record of this :data:`ALGORITHM` (saved
    before checksums were recorded) is checked for non-finite values only."""
    recorded = custom_metadata.get(METADATA_KEY) if isinstance(custom_metadata, dict) else None
    reasons = []
    if isinstance(recorded, dict) and recorded.get("algorithm") == ALGORITHM:
        checksums = recorded.get("checksums") or {}
        differing = [name for name, (c, _) in summary.items() if checksums.get(name) != c]
        if differing:
            shown = ", ".join(
                f"{name} (recorded {checksums[name]:#010x}, restored {summary[name][0]:#010x})"
                if isinstance(checksums.get(name), int)
                else f"{name} (not recorded)"
                for name in differing[:3]
            )
            more = f" and {len(differing) - 3} more" if len(differing) > 3 else ""
            reasons.append(f"checksum mismatch in {len(differing)} of {len(summary)} arrays: {shown}{more}")
    bad = nonfinite(summary)
    if bad:
        reasons.append(f"restored state has {bad}")
    return "; ".join(reasons)
