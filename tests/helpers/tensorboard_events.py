"""What a run's TensorBoard event files hold."""

from __future__ import annotations

import struct

from training.run_dir import RunDir


def tensorboard_scalars(run_dir: RunDir, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` from every event file in ``<run>/tensorboard``, in name order,
    parsed as TFRecords (length, crc, data, crc) of tensorboardX's Event protos."""
    from tensorboardX.proto.event_pb2 import Event

    found = []
    for name in run_dir.list("tensorboard/*"):
        data = run_dir.read(name)
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            found += [(event.step, v.simple_value) for v in event.summary.value if v.tag == tag]
    return found
