"""The run summary's ``idle_capacity_slice_seconds``: how long slices held their capacity without training,
waiting for a slice whose capacity was withheld (``local up --withhold``).

While a slice has no capacity, every other slice that keeps its own (its VMs, or on gke its nodes, where
JobSet's new Pods start at once and wait for the missing slice's: infra/backends/gke/emulation.py) is
billed and trains nothing, unless the run trains on without the missing slice (elastic slices, where they
are carried out: :func:`infra.config.elastic.carried_out`). Each such second of each such slice counts one
slice-second. Where the platform starts no slice before every slice has capacity
(:attr:`~infra.backends.interface.Emulation.all_slices_or_none`: GKE's queued provisioning), no slice
holds any meanwhile: none counts. It is the flex-start waste GKE's queued provisioning removes: slices that
get capacity first are billed, and their maximum run duration runs, while they wait for the others
(docs/gke.md section 3).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from infra.backends.interface import Emulation
from infra.config import StackConfig


class IdleCapacity:
    """Slice-seconds of capacity held without training (module docstring), summed as the withheld slices
    change (:meth:`withheld`); ``clock`` is ``time.monotonic`` unless a test says otherwise."""

    def __init__(self, config: StackConfig, capacity: Emulation, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.capacity = capacity
        self.clock = clock
        self._seconds = 0.0
        self._since = clock()
        self._holders = 0
        #: Whether a slice's capacity was withheld in this run (the figure means something).
        self.counted = False

    def holders(self, withheld: Collection[int]) -> int:
        """How many slices hold capacity without training while ``withheld`` have none."""
        if not withheld or self.capacity.all_slices_or_none:
            return 0
        left = self.config.slices - len(withheld)
        minimum = self.config.elastic.min_slices
        from infra.config import elastic

        if minimum is not None and minimum <= left and elastic.carried_out(self.config):
            return 0  # they train on without the missing slices
        return left

    def withheld(self, slices: Collection[int]) -> None:
        """The withheld slices are now ``slices``: what was held until now is counted."""
        now = self.clock()
        self.counted = self.counted or bool(slices)
        self._seconds += (now - self._since) * self._holders
        self._since, self._holders = now, self.holders(slices)

    @property
    def seconds(self) -> float:
        """The slice-seconds counted so far, up to now."""
        return self._seconds + (self.clock() - self._since) * self._holders
