"""What the job's processes agree on, through ``jax.distributed``'s coordination service
(its key-value store and barriers), never through device collectives: every wait has a
timeout, so a peer that is gone or stuck becomes an :class:`AgreementError` within
``MULTISLICE_AGREEMENT_TIMEOUT_S`` (default 300 s, Orbax's own barrier timeout,
``orbax.checkpoint._src.multihost.multihost.coordination_timeout``) instead of a hang.

The client is ``jax._src.distributed.global_state.client`` (the one Orbax's multihost
barriers use too); its ``key_value_set`` / ``blocking_key_value_get(key, timeout_in_ms)`` /
``wait_at_barrier(id, timeout_in_ms)`` are the coordination service's API
(https://docs.jax.dev/en/latest/_autosummary/jax.distributed.initialize.html starts it).
Keys live as long as the job's coordination service (one start of the job), so each name is
used once per start.

With one process (no ``jax.distributed``) every function answers locally.
"""

from __future__ import annotations

import os

DEFAULT_TIMEOUT_S = 300
_PREFIX = "multislice/"


class AgreementError(RuntimeError):
    """A peer did not take part in time (gone, stuck, or failed); restarting the job helps."""


def timeout_s() -> int:
    return int(os.environ.get("MULTISLICE_AGREEMENT_TIMEOUT_S", DEFAULT_TIMEOUT_S))


def client():
    """The coordination-service client of this process, or None without ``jax.distributed``."""
    from jax._src import distributed

    return distributed.global_state.client


def all_gather(name: str, value: str) -> list[str]:
    """Every process's ``value`` for ``name``, in process order.

    Raises:
      AgreementError: a process did not publish its value within :func:`timeout_s`.
    """
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
                f"process {process} did not report {name!r} within {timeout_s()} s ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
            ) from None
    return values


def barrier(name: str) -> None:
    """Wait until every process reaches barrier ``name``.

    Raises:
      AgreementError: not every process arrived within :func:`timeout_s`.
    """
    import jax

    kv = client()
    if kv is None or jax.process_count() == 1:
        return
    try:
        kv.wait_at_barrier(f"{_PREFIX}{name}", timeout_s() * 1000)
    except Exception as err:
        raise AgreementError(f"not every process reached {name!r} within {timeout_s()} s ({str(err).splitlines()[0]})") from None
