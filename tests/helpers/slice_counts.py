"""The slice counts a trainer config may train on, found by brute force: the oracle of the elastic
tests (tests/training/test_elastic_slices.py, tests/config/test_elastic.py), written from the rule's
statement and TrainConfig's own validation, not from training/elastic.py.

The rule: with ``n`` slices only the DCN data axis changes; the global batch stays the config's; each
replica's microbatch is no larger than the full count's; and of those, the fewest microbatches."""

from __future__ import annotations

import pydantic

from training.config import TrainConfig


def brute_force_counts(config: TrainConfig, smallest: int = 1) -> list[tuple[int, int, int, int]]:
    """``(slices, dcn_data, microbatches, microbatch_rows)`` of every count from ``parallelism.dcn``'s
    down to ``smallest``, most first: each DCN data size and each microbatch count tried, kept where
    TrainConfig accepts the config so changed, its slice count is ``n`` and its microbatch (rows per
    replica) is no larger than the full count's."""
    dcn, batch = config.parallelism.dcn, config.global_batch_size
    full_rows = batch // config.parallelism.batch_shards // config.microbatches
    found = []
    for slices in range(dcn.product, smallest - 1, -1):
        for dcn_data in range(1, dcn.data + 1):
            if dcn_data * dcn.fsdp * dcn.tensor != slices:
                continue
            for microbatches in range(1, batch + 1):
                data = config.model_dump()
                data["parallelism"]["dcn"]["data"] = dcn_data
                data["microbatches"] = microbatches
                try:
                    changed = TrainConfig.model_validate(data)
                except pydantic.ValidationError:
                    continue
                rows = batch // changed.parallelism.batch_shards // microbatches
                if rows <= full_rows:
                    found.append((slices, dcn_data, microbatches, rows))
                    break
    return found


def divisor_rule(config: TrainConfig, slices: int) -> tuple[int, int] | None:
    """``(dcn_data, microbatches)`` at ``slices`` by the rule before any other count was allowed:
    ``N / n`` whole and dividing ``dcn.data``, which shrinks by it while the microbatches grow by it;
    None where that rule refused the count."""
    full, data = config.parallelism.dcn.product, config.parallelism.dcn.data
    if full % slices or data % (full // slices):
        return None
    return data // (full // slices), config.microbatches * (full // slices)
