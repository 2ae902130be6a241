"""training.metrics.recorder: the per-step metrics records, TensorBoard scalars and syncs, from given
losses and an injected clock (no wall-clock time), written to a local run directory."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from tests.helpers.tensorboard_events import tensorboard_scalars
from tests.helpers.train_step import CONFIG
from training import compile_cache
from training.metrics.recorder import MetricsRecorder
from training.metrics.run_log import RecordLog, TensorBoardLog, read_records
from training.model import transformer as model
from training.run_dir import RunDir

CFG = CONFIG.model_copy(update={"log_every_steps": 2, "steps": 5})
DEVICES = 8
TIMES = [100.0, 100.5, 100.75, 102.75, 103.0]  # construction, then one per record
LOSSES = {1: (5.5, 2.0), 2: (5.25, 1.5), 3: (5.0, 1.25)}  # step: (loss, grad_norm)


class Clock:
    def __init__(self, times):
        self.times = iter(times)

    def __call__(self) -> float:
        return next(self.times)


@pytest.fixture
def parts(tmp_path):
    run = RunDir(str(tmp_path))
    logs = RecordLog(run, "metrics"), RecordLog(run, "events"), TensorBoardLog(run, 0)
    recorder = MetricsRecorder(CFG, lambda count: 0.001 * count, *logs, DEVICES, clock=Clock(TIMES))
    return run, recorder, logs


def metrics(step: int) -> dict:
    loss, grad_norm = LOSSES[step]
    return {"loss": np.float32(loss), "grad_norm": np.float32(grad_norm)}


def test_each_step_gets_its_rates_and_the_first_says_it_includes_compilation(parts):
    run, recorder, logs = parts
    recorder.train(1, metrics(1))
    assert read_records(run, "metrics") == []  # step 1 is not a log step: nothing synced yet
    recorder.train(2, metrics(2))
    assert [r["step"] for r in read_records(run, "metrics")] == [1, 2]  # synced at log_every_steps
    recorder.train(3, metrics(3))
    for log in logs:
        log.close()
    records = read_records(run, "metrics")
    flops_per_token = model.flops_per_token(CFG.model, CFG.sequence_length, CFG.vocab_size)
    tokens = CFG.global_batch_size * CFG.sequence_length
    for step, record in zip((1, 2, 3), records, strict=True):  # rates are rounded to 6 significant digits
        step_time = TIMES[step] - TIMES[step - 1]
        assert record["loss"] == LOSSES[step][0] and record["grad_norm"] == LOSSES[step][1]
        assert record["learning_rate"] == pytest.approx(0.001 * (step - 1))
        assert record["step_time_s"] == pytest.approx(step_time, rel=1e-5)
        assert record["tokens_per_s"] == pytest.approx(tokens / step_time, rel=1e-5)
        assert record["tflops_per_device"] == pytest.approx(
            flops_per_token * tokens / step_time / DEVICES / 1e12, rel=1e-5
        )
    assert records[0]["includes_compile"] is True
    assert records[0]["compile_cache_hits"] == compile_cache.stats().hits
    assert all("includes_compile" not in r and "compile_cache_hits" not in r for r in records[1:])
    assert recorder.last_loss == LOSSES[3][0]
    assert tensorboard_scalars(run, "train/loss") == [(s, LOSSES[s][0]) for s in (1, 2, 3)]
    assert [s for s, _ in tensorboard_scalars(run, "train/tokens_per_s")] == [1, 2, 3]
    assert all("mfu" not in r for r in records)  # no peak FLOP/s configured: no MFU


def test_eval_records_the_mean_loss_and_its_time_which_the_next_step_excludes(parts):
    run, recorder, logs = parts
    recorder.eval(4, [2.0, 3.5])
    recorder.train(1, metrics(1))
    for log in logs:
        log.close()
    eval_record, step_record = read_records(run, "metrics")
    eval_s = TIMES[1] - TIMES[0]  # construction to the eval's record
    assert eval_record == {
        "step": 4,
        "eval_loss": 2.75,
        "eval_s": eval_s,
        "time": pytest.approx(recorder.epoch + TIMES[1], abs=1e-3),
    }
    assert step_record["step_time_s"] == pytest.approx(TIMES[2] - TIMES[1], rel=1e-5)  # not the eval's 0.5 s
    assert tensorboard_scalars(run, "eval/loss") == [(4, 2.75)]


def test_a_lap_is_the_time_since_the_last_record_and_is_not_a_steps_time(parts):
    run, recorder, logs = parts
    recorder.train(1, metrics(1))
    assert recorder.lap() == pytest.approx(TIMES[2] - TIMES[1])  # e.g. a checkpoint save
    recorder.train(2, metrics(2))
    logs[0].close()
    records = read_records(run, "metrics")
    assert records[1]["step_time_s"] == pytest.approx(TIMES[3] - TIMES[2], rel=1e-5)
    # ``time`` is the record's wall-clock time: the clock's reading plus a fixed epoch offset.
    assert [r["time"] for r in records] == pytest.approx(
        [recorder.epoch + TIMES[1], recorder.epoch + TIMES[3]], abs=1e-3
    )
    assert abs(recorder.epoch + TIMES[0] - time.time()) < 3600  # seconds since the epoch, not of the clock


def test_mfu_is_the_per_chip_rate_over_the_configured_peak(tmp_path):
    run = RunDir(str(tmp_path))
    peak = 2.5e9  # FLOP/s per chip
    logs = RecordLog(run, "metrics"), RecordLog(run, "events"), TensorBoardLog(run, 0)
    cfg = CFG.model_copy(update={"peak_flops_per_chip": peak})
    recorder = MetricsRecorder(cfg, lambda count: 0.001, *logs, DEVICES, clock=Clock(TIMES))
    recorder.train(1, metrics(1))
    for log in logs:
        log.close()
    (record,) = read_records(run, "metrics")
    flops = (
        model.flops_per_token(CFG.model, CFG.sequence_length, CFG.vocab_size)
        * CFG.global_batch_size
        * CFG.sequence_length
    )
    assert record["mfu"] == pytest.approx(flops / (TIMES[1] - TIMES[0]) / DEVICES / peak, rel=1e-5)
    assert [s for s, _ in tensorboard_scalars(run, "train/mfu")] == [1]


@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_a_non_finite_loss_is_an_error_naming_the_step(parts, loss):
    run, recorder, logs = parts
    recorder.train(1, metrics(1))
    with pytest.raises(FloatingPointError, match=f"loss is {loss} at step 2"):
        recorder.train(2, {"loss": np.float32(loss), "grad_norm": np.float32(1.0)})
    logs[0].close()
    assert [r["step"] for r in read_records(run, "metrics")] == [1]
