"""Per-step training metrics: records (training.metrics.run_log), TensorBoard scalars, the log line;
and the run's goodput (training.metrics.goodput) as ``goodput.json`` and TensorBoard scalars."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable

import jax
import numpy as np
import optax

from training import compile_cache
from training.config import TrainConfig
from training.metrics import goodput
from training.metrics.run_log import RecordLog, TensorBoardLog, read_records
from training.model import transformer as model

#: The goodput report process 0 writes in the run directory at completion and at each preemption exit.
GOODPUT_FILE = "goodput.json"

log = logging.getLogger("training")


class MetricsRecorder:
    """Writes one ``metrics`` record per step. Step time is ``clock()`` (seconds) since the
    previous record, :meth:`lap` or construction, so the first one ``includes_compile``;
    ``time`` is seconds since the epoch. TFLOP/s per device uses
    :func:`training.model.transformer.flops_per_token` over ``devices`` (one device per TPU chip), MFU
    divides it by ``cfg.peak_flops_per_chip``. ``metrics_log`` and ``events_log`` sync every
    ``log_every_steps`` and at the last step."""

    def __init__(
        self,
        cfg: TrainConfig,
        schedule: optax.Schedule,
        metrics_log: RecordLog,
        events_log: RecordLog,
        tensorboard: TensorBoardLog,
        devices: int,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.cfg, self.devices, self.clock = cfg, devices, clock
        # Jitted: optax's schedules are jnp code, which run op by op would trace, lower and
        # compile each of their primitives at a process's first record (0.36 against 0.07 CPU-s
        # for a run's first 24 learning rates, fresh processes: docs/goodput.md, "Start-up").
        self.schedule = jax.jit(schedule)
        self.metrics_log, self.events_log, self.tensorboard = metrics_log, events_log, tensorboard
        self.flops_per_step = (
            model.flops_per_token(cfg.model, cfg.sequence_length, cfg.vocab_size) * cfg.global_batch_tokens
        )
        self.last_loss: float | None = None
        self.last_time = clock()
        self.epoch = time.time() - self.last_time  # clock() + epoch: seconds since the epoch
        self.first = True

    def lap(self) -> float:
        """Seconds since the last record or lap (e.g. a checkpoint save); the next step's
        time starts now, so it excludes them."""
        now = self.clock()
        seconds, self.last_time = now - self.last_time, now
        return _significant(seconds)

    def train(self, step: int, metrics: dict) -> None:
        """Record step ``step``'s ``{"loss", "grad_norm"}`` (scalars; blocks until computed).
        Raises FloatingPointError on a non-finite loss."""
        loss = float(metrics["loss"])
        now = self.clock()
        step_time = now - self.last_time
        self.last_time = now
        self.last_loss = loss
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step}")
        entry = {
            "step": step,
            "loss": loss,
            "grad_norm": float(metrics["grad_norm"]),
            "learning_rate": float(np.asarray(self.schedule(step - 1))),  # a 0-d array (optax's ArrayLike)
            "step_time_s": _significant(step_time),
            "tokens_per_s": _significant(self.cfg.global_batch_tokens / step_time),
            "tflops_per_device": _significant(self.flops_per_step / step_time / self.devices / 1e12),
            "time": round(self.epoch + now, 3),
        }
        if self.cfg.peak_flops_per_chip:
            entry["mfu"] = _significant(self.flops_per_step / step_time / self.devices / self.cfg.peak_flops_per_chip)
        if self.first:
            entry["includes_compile"] = True
            cache = compile_cache.stats()
            entry["compile_cache_hits"] = cache.hits
            log.info(
                "compilation cache: %d executables loaded, %.1f s of compilation saved", cache.hits, cache.seconds_saved
            )
            self.first = False
        self.metrics_log.append(entry)
        names = ("loss", "grad_norm", "learning_rate", "tokens_per_s", "tflops_per_device", "mfu")
        self.tensorboard.scalars(step, {f"train/{k}": entry[k] for k in names if k in entry})
        if step % self.cfg.log_every_steps == 0 or step == self.cfg.steps:
            self.metrics_log.sync()  # one object per window: training.metrics.run_log
            self.events_log.sync()
            log.info(
                "step %d/%d loss %.4f  %.3f s/step  %.0f tokens/s  %.4f TFLOP/s/device",
                step,
                self.cfg.steps,
                loss,
                step_time,
                entry["tokens_per_s"],
                entry["tflops_per_device"],
            )

    def eval(self, step: int, losses: list[float]) -> None:
        """Record the mean of ``losses`` (one per eval batch) as ``eval_loss`` at ``step``, with
        ``eval_s``, the seconds since the last record or lap (the eval: not a step's time)."""
        value = sum(losses) / len(losses)
        eval_s = self.lap()
        self.metrics_log.append(
            {"step": step, "eval_loss": value, "eval_s": eval_s, "time": round(self.epoch + self.last_time, 3)}
        )
        self.tensorboard.scalars(step, {"eval/loss": value})
        log.info("step %d eval loss %.4f (%d batches)", step, value, len(losses))

    def write_goodput(self, step: int) -> dict | None:
        """Process 0: sync the records, account the run's goodput over every attempt
        (training.metrics.goodput), write it as ``goodput.json`` and as ``goodput/*`` TensorBoard
        scalars at ``step``; the report (None on other processes or before any start)."""
        if not self.metrics_log.enabled:
            return None
        self.metrics_log.sync()
        self.events_log.sync()
        run_dir = self.metrics_log.run_dir
        tokens = self.cfg.global_batch_tokens
        report = goodput.account(
            read_records(run_dir, "events"),
            read_records(run_dir, "metrics"),
            tokens,
            self.flops_per_step,
            self.cfg.peak_flops_per_chip,
        )
        if report is None:
            return None
        run_dir.write(GOODPUT_FILE, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
        scalars = {"goodput/goodput": report["goodput"]} | {
            f"goodput/badput_{k}_s": v for k, v in report["badput"].items()
        }
        self.tensorboard.scalars(step, scalars)
        log.info(
            "goodput %.3f of %.1f s; badput %s",
            report["goodput"],
            report["wall_seconds"],
            ", ".join(f"{k} {v:.1f} s" for k, v in report["badput"].items() if v),
        )
        return report


def _significant(value: float, digits: int = 6) -> float:
    """``value`` rounded to ``digits`` significant digits (keeps tiny CPU rates non-zero)."""
    return float(f"{value:.{digits}g}")
