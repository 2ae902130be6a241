"""A stand-in checkpoint manager whose restore fails with an error that carries object reprs,
and the pattern of the reprs and spec dumps a message about a checkpoint must not show."""

from __future__ import annotations

import re
from pathlib import Path

REPR = re.compile(r"<bound method|object at 0x|tensorstore_spec")


class Store:
    def read(self):  # a method whose bound repr ends up in an error message
        return None


class StandInManager:
    """A CheckpointManager whose step 12 fails with an error that carries object reprs."""

    def __init__(self, directory: Path, fail: set[int]):
        self.directory, self.fail = directory, fail

    def all_steps(self):
        return [8, 12]

    def restore(self, step, args):
        if step in self.fail:
            raise KeyError(f'{Store().read} [tensorstore_spec=\'{{"driver":"zarr"}}\']')
        return {"step": step}

    def reload(self):
        pass
