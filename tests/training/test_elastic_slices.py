"""The trainer on fewer slices than its config's (training/elastic.py): the DCN data axis shrinks,
the microbatches grow, and the global batch, the data of each step and the schedule stay, at every
count the global batch splits over (not only divisors of the DCN data axis: the counts are checked
against tests/helpers/slice_counts.py's brute force); one step on 2 slices of a 3-slice config has
the loss of the step on 3; a run that went from 2 slices to 1 and back stays within float32
rounding of one that never changed (the figure: docs/faults.md, "Elastic slices")."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from tests.helpers import datasets
from tests.helpers.slice_counts import brute_force_counts, divisor_rule
from tests.trainer_process import Job, write_config
from training import elastic, membership_gate, mesh as mesh_lib, state as state_lib, step as step_lib
from training.config import MESH_AXES, TrainConfig
from training.mesh import MeshError
from training.metrics.run_log import read_records
from training.model import transformer as model
from training.run_dir import RunDir

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def config(dcn: dict, min_slices: int | None = 1, **update) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
            "sequence_length": 32,
            "global_batch_size": 8,
            "steps": 4,
            "optimizer": {"warmup_steps": 2, "schedule": "constant"},
            "checkpoint": {"interval_steps": 4, "keep": 3, "async_save": False},
            "log_every_steps": 1,
            "parallelism": {"ici": {"fsdp": 2}, "dcn": dcn},
            "min_slices": min_slices,
        }
        | update
    )


def test_fewer_slices_shrink_the_dcn_data_axis_and_take_more_microbatches():
    full = config({"data": 4}, microbatches=1, global_batch_size=16)
    two = elastic.for_slices(full, 2)
    assert (two.parallelism.dcn.data, two.microbatches, two.global_batch_size) == (2, 2, 16)
    one = elastic.for_slices(full, 1)
    assert (one.parallelism.dcn.data, one.microbatches, one.global_batch_size) == (1, 4, 16)
    assert one.parallelism.ici == full.parallelism.ici and one.optimizer == full.optimizer
    assert elastic.for_slices(full, 4) is full


@pytest.mark.parametrize(
    ("full", "slices", "words"),
    [
        (config({"data": 4}, min_slices=None), 2, "the job has 2 slice(s)"),  # not elastic: the old mismatch
        (config({"data": 4}, min_slices=2), 1, "(min_slices 2: elastic down to it)"),
        # 8 sequences over 3 × ici fsdp 2 = 6 replicas
        (config({"data": 4}), 3, "cannot train as 3: global_batch_size 8 does not split over the data-parallel size 6"),
        # only dcn data shrinks: 1 slice would be half a DCN fsdp of 2
        (config({"data": 2, "fsdp": 2}, global_batch_size=16), 1, "1 is not a multiple of parallelism.dcn fsdp×tensor"),
        (config({"data": 2}), 4, "the job has 4 slice(s)"),  # more than the config's
    ],
)
def test_a_count_the_config_does_not_allow_is_a_mesh_error(full, slices, words):
    with pytest.raises(MeshError, match=r"^parallelism\.dcn: ") as refused:
        elastic.for_slices(full, slices)
    assert words in str(refused.value)


#: Configs whose counts are not all divisors of the DCN data axis (ici fsdp 2 unless named).
ANY_COUNT = {
    "3 slices: 2 and 1": config({"data": 3}, global_batch_size=24),
    "3 slices, 12 sequences: 2 as 3 microbatches of 1": config({"data": 3}, global_batch_size=12),
    "4 slices: 3, 2 and 1": config({"data": 4}, global_batch_size=24),
    "4 slices, 2 microbatches: 2 and 1, not 3": config({"data": 4}, global_batch_size=32, microbatches=2),
    "dcn data 3 x fsdp 2: 4 and 2": config({"data": 3, "fsdp": 2}, global_batch_size=24),
    "ici data 2 x fsdp 2, dcn data 3": config(
        {"data": 3}, global_batch_size=24, parallelism={"ici": {"data": 2, "fsdp": 2}, "dcn": {"data": 3}}
    ),
    "5 slices, 40 sequences: 4, 2 and 1, not 3": config({"data": 5}, global_batch_size=40),
}


@pytest.mark.parametrize("full", ANY_COUNT.values(), ids=ANY_COUNT.keys())
def test_every_count_the_global_batch_splits_over_is_allowed_with_microbatches_no_larger(full):
    expected = {count[0]: count for count in brute_force_counts(full)}
    for slices in range(full.parallelism.dcn.product, 0, -1):
        if slices not in expected:
            with pytest.raises(MeshError, match=rf"^parallelism\.dcn: .* cannot train as {slices}: "):
                elastic.for_slices(full, slices)
            continue
        _, dcn_data, microbatches, _ = expected[slices]
        got = elastic.for_slices(full, slices)
        assert (got.parallelism.dcn.data, got.microbatches) == (dcn_data, microbatches), slices
        assert got.global_batch_size == full.global_batch_size and got.optimizer == full.optimizer
        assert (got.parallelism.ici, got.parallelism.dcn.fsdp) == (full.parallelism.ici, full.parallelism.dcn.fsdp)
        shape = elastic.count_shape(full, slices)
        assert (shape.slices, shape.dcn_data, shape.microbatches, shape.microbatch_rows) == expected[slices]
    assert membership_gate.counts(full) == list(expected)


def test_the_counts_of_the_examples_worked_by_hand():
    # (slices, dcn data, microbatches, rows of one replica's microbatch); e.g. 3 slices of 24
    # sequences over 3 × 2 replicas hold 4 rows each, in one microbatch; on 2 slices 4 replicas
    # hold 6, as 2 microbatches of 3 (one of 6 would be larger than 4); on 1, 12 as 3 of 4.
    by_hand = {
        "3 slices: 2 and 1": [(3, 3, 1, 4), (2, 2, 2, 3), (1, 1, 3, 4)],
        "3 slices, 12 sequences: 2 as 3 microbatches of 1": [(3, 3, 1, 2), (2, 2, 3, 1), (1, 1, 3, 2)],
        "4 slices: 3, 2 and 1": [(4, 4, 1, 3), (3, 3, 2, 2), (2, 2, 2, 3), (1, 1, 4, 3)],
        "4 slices, 2 microbatches: 2 and 1, not 3": [(4, 4, 2, 2), (2, 2, 4, 2), (1, 1, 8, 2)],
        "dcn data 3 x fsdp 2: 4 and 2": [(6, 3, 1, 2), (4, 2, 3, 1), (2, 1, 3, 2)],
        "ici data 2 x fsdp 2, dcn data 3": [(3, 3, 1, 2), (2, 2, 3, 1), (1, 1, 3, 2)],
        "5 slices, 40 sequences: 4, 2 and 1, not 3": [(5, 5, 1, 4), (4, 4, 5, 1), (2, 2, 5, 2), (1, 1, 5, 4)],
    }
    assert {name: brute_force_counts(c) for name, c in ANY_COUNT.items()} == by_hand


@pytest.mark.parametrize("microbatches", [1, 2])
@pytest.mark.parametrize("dcn", [{"data": 4}, {"data": 8}, {"data": 2, "fsdp": 2}, {"data": 4, "fsdp": 2}])
def test_the_counts_that_divide_the_dcn_data_axis_train_as_before(dcn, microbatches):
    full = config(dcn, global_batch_size=64, microbatches=microbatches)
    for slices in range(full.parallelism.dcn.product - 1, 0, -1):
        before = divisor_rule(full, slices)
        if before is None:
            continue
        data = full.model_dump()
        data["parallelism"]["dcn"]["data"], data["microbatches"] = before
        assert elastic.for_slices(full, slices) == TrainConfig.model_validate(data), slices


def one_step(train: TrainConfig, rows: np.ndarray) -> tuple[float, float, list[np.ndarray]]:
    """Loss, gradient norm and updated parameters of one train step of ``rows`` from the seed's
    parameters, on a mesh of ``train``'s shape over the first of the 8 CPU devices (one process:
    the slices are blocks of the data axis, as the DCN data axis is of the real mesh)."""
    shape = tuple(train.parallelism.mesh_shape.values())
    mesh = Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), MESH_AXES)
    opt = optax.sgd(1.0)  # the update is the mean gradient itself (tests/training/test_step.py says why)
    shardings = state_lib.shardings(train, mesh, opt)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    step = step_lib.make_train_step(train.model, opt, mesh, shardings, batch_sharding, microbatches=train.microbatches)
    params = model.init_params(train.model, train.vocab_size, jax.random.key(train.seed))
    state = jax.device_put({"params": params, "opt_state": opt.init(params)}, shardings)
    state, metrics = step(state, jax.device_put(rows, batch_sharding))
    updated = [np.asarray(leaf) for leaf in jax.tree.leaves(jax.device_get(state["params"]))]
    return float(metrics["loss"]), float(metrics["grad_norm"]), updated


def test_one_step_on_2_slices_of_a_3_slice_config_is_the_step_on_3():
    # 3 slices × ici fsdp 2 (6 CPU devices), 24 sequences: 6 replicas of 4 rows, 1 microbatch. On 2
    # slices (4 devices): 4 replicas of 6 rows as 2 microbatches of 3, a count no divisor rule allows.
    full = config({"data": 3}, global_batch_size=24, sequence_length=16)
    two = elastic.for_slices(full, 2)
    assert (two.parallelism.dcn.data, two.microbatches) == (2, 2)
    rows = np.random.default_rng(3).integers(0, 256, (24, full.sequence_length + 1), dtype=np.int32)
    loss, norm, params = one_step(full, rows)
    loss_2, norm_2, params_2 = one_step(two, rows)
    # float32: the same mean over the same rows, summed in another order
    assert loss_2 == pytest.approx(loss, rel=1e-6) and norm_2 == pytest.approx(norm, rel=1e-6)
    for a, b in zip(params_2, params, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    print(f"relative loss difference, 3 slices vs 2: {abs(loss_2 - loss) / abs(loss):.1e}")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """A glob of 20 files of the standard library as text (tests/helpers/datasets.py)."""
    return datasets.corpus(tmp_path_factory.mktemp("corpus"), files=20)


def losses(run_dir: Path) -> dict[int, float]:
    """Each step's loss, the last record of a step kept (a step trained again after a restart)."""
    return {r["step"]: r["loss"] for r in read_records(RunDir(str(run_dir)), "metrics") if "loss" in r}


def run(tmp: Path, name: str, train: TrainConfig, run_dir: Path, processes: int) -> Job:
    logs = tmp / name
    logs.mkdir()
    job = Job(write_config(tmp / f"{name}.json", train), run_dir, logs, num_processes=processes)
    codes = job.wait()
    assert codes == [0] * processes, "\n".join(job.log(i)[-3000:] for i in range(processes))
    return job


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_that_shrinks_to_one_slice_and_grows_back_stays_the_same_training(corpus, tmp_path):
    base = config({"data": 2}, data={"source": corpus})
    steady, elastic_run = tmp_path / "steady", tmp_path / "elastic"
    run(tmp_path, "first", base, steady, processes=2)  # steps 1-4 on both slices
    shutil.copytree(steady, elastic_run)
    run(tmp_path, "steady-rest", base.model_copy(update={"steps": 12}), steady, processes=2)

    shrunk = run(tmp_path, "shrunk", base.model_copy(update={"steps": 8}), elastic_run, processes=1)
    said = shrunk.log(0)
    assert "elastic: training on 1 of 2 slices: dcn data 1, 2 microbatches per step (global batch 8)" in said, said
    assert "resuming at step 4/8" in said
    run(tmp_path, "grown", base.model_copy(update={"steps": 12}), elastic_run, processes=2)

    expected, got = losses(steady), losses(elastic_run)
    assert sorted(got) == sorted(expected) == list(range(1, 13))
    assert all(got[step] == expected[step] for step in range(1, 5))  # the same job: bit-identical
    drift = max(abs(got[s] - expected[s]) / abs(expected[s]) for s in range(5, 13))
    # Steps 5-8 on one slice add the same rows' gradients in another order (2 microbatches, one
    # replica); float32 rounding compounds through AdamW, as on any other mesh (docs/faults.md,
    # "Elastic resume": 1e-7 measured there). Measured here: see docs/faults.md, "Elastic slices".
    assert drift < 1e-4, {s: (got[s], expected[s]) for s in range(5, 13)}
    print(f"largest relative loss drift, steps 5-12: {drift:.2e}")


def decision(**changes):
    """``elastic.decide`` for 4 slices that may train as 4, 2 or 1 (shrink after 120 s, grow after 3 h)."""
    given = {
        "counts": [4, 2, 1],
        "members": (0, 1, 2, 3),
        "healthy": {0, 1, 2, 3},
        "lost_since": {},
        "last_change": 0.0,
        "now": 1000.0,
        "shrink_after_s": 120,
        "grow_after_s": 3 * 3600,
    }
    return elastic.decide(**(given | changes))


def test_a_lost_slice_is_waited_for_then_left_behind_at_an_allowed_count():
    lost = {"healthy": {0, 1, 2}, "lost_since": {3: 950.0}}
    assert decision(**lost) is None  # away 50 s of the 120
    # away 120 s: 3 alive, but 3 of 4 is no allowed count: the 2 lowest
    assert decision(**lost, now=1070.0) == ((0, 1), "slice 3 lost, not back within 2m")
    assert decision(healthy={0}, lost_since={1: 0.0, 2: 0.0, 3: 0.0}) == (
        (0,),
        "slice 1, slice 2, slice 3 lost, not back within 2m",
    )
    # no allowed count left (all lost): keep waiting, as a stack that is not elastic does
    assert decision(healthy=set(), lost_since={s: 0.0 for s in range(4)}) is None
    # already at the count the alive slices allow
    assert decision(members=(0, 1), healthy={0, 1, 2}, lost_since={3: 0.0}, counts=[4, 2, 1]) is None


def test_a_returned_slice_is_taken_back_only_after_grow_after():
    shrunk = {"members": (0, 1), "last_change": 1000.0}
    assert decision(**shrunk, now=1000.0 + 3 * 3600 - 1) is None
    assert decision(**shrunk, now=1000.0 + 3 * 3600) == (
        (0, 1, 2, 3),
        "slice 2, slice 3 back, 3h after the last change",
    )
    # one back of two: 3 is no allowed count, so it waits for the fourth
    assert decision(**shrunk, healthy={0, 1, 2}, now=20000.0) is None
    assert decision(members=(0,), healthy={0, 2}, last_change=0.0, now=20000.0) == (
        (0, 2),
        "slice 2 back, 3h after the last change",
    )
    # a member lost meanwhile: no grow
    assert decision(**shrunk, healthy={0, 2, 3}, lost_since={1: 19990.0}, now=20000.0) is None
