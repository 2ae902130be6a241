"""Agreement among the job's processes through ``jax.distributed``'s coordination service
(key-value store, barriers), never device collectives: every wait times out after
``MULTISLICE_AGREEMENT_TIMEOUT_S`` (default 300 s, as Orbax's barriers) with an
:class:`AgreementError` instead of hanging. Each name is used once per start of the job.
"""

from __future__ import annotations

from training import knobs

DEFAULT_TIMEOUT_S = 300
_PREFIX = "multislice/"


class AgreementError(RuntimeError):
    """A peer did not take part in time (gone, stuck, or failed); restarting the job helps."""


def timeout_s() -> int:
    """``MULTISLICE_AGREEMENT_TIMEOUT_S`` (:mod:`training.knobs`: 1 s to a day). Raises KnobError."""
    return knobs.integer("MULTISLICE_AGREEMENT_TIMEOUT_S", DEFAULT_TIMEOUT_S)


def client():
    """The coordination-service client (Orbax uses the same), or None."""
    from jax._src import distributed

    return distributed.global_state.client


def all_gather(name: str, value: str) -> list[str]:
    """Every process's ``value`` for ``name``, in process order. Raises AgreementError."""
    import jax

    kv = client()
    if kv is None or jax.process_count() == 1:
        return [value]
    kv.key_value_set(f"{_PREFIX}{name}/{jax.process_index()}", value)
    values = []
    for process in range(jax.process_count()):
        try:
            values.append(kv.blocking_key_value_get(f"{_PREFIX}{name}/{process}", timeout_s() * 1000))
        except Exception as err:  # the client raises XlaRuntimeError (DEADLINE_EXCEEDED, UNAVAILABLE, ...)
            raise AgreementError(
                f"process {process} did not report {name!r} within {timeout_s()} s "
                f"({str(err).splitlines()[0] if str(err) else type(err).__name__})"
            ) from None
    return values


def barrier(name: str) -> None:
    """Wait until every process reaches barrier ``name``. Raises AgreementError."""
    import jax

    kv = client()
    if kv is None or jax.process_count() == 1:
        return
    try:
        kv.wait_at_barrier(f"{_PREFIX}{name}", timeout_s() * 1000)
    except Exception as err:
        raise AgreementError(
            f"not every process reached {name!r} within {timeout_s()} s ({str(err).splitlines()[0]})"
        ) from None
