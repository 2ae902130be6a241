"""Per-step training metrics: records (training.run_log), TensorBoard scalars, the log line."""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

import optax

from training import compile_cache, model
from training.config import TrainConfig
from training.run_log import RecordLog, TensorBoardLog

log = logging.getLogger("training")


class MetricsRecorder:
    """Writes one ``metrics`` record per step. Step time is ``clock()`` (seconds) since the
    previous record or construction, so the first one ``includes_compile``; TFLOP/s per device
    uses :func:`training.model.flops_per_token` over ``devices``. ``metrics_log`` and
    ``events_log`` sync every ``log_every_steps`` and at the last step."""

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
        self.cfg, self.schedule, self.devices, self.clock = cfg, schedule, devices, clock
        self.metrics_log, self.events_log, self.tensorboard = metrics_log, events_log, tensorboard
        self.flops_per_step = model.flops_per_token(cfg.model, cfg.sequence_length) * cfg.global_batch_tokens
        self.last_loss: float | None = None
        self.last_time = clock()
        self.first = True

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
            "learning_rate": float(self.schedule(step - 1)),
            "step_time_s": _significant(step_time),
            "tokens_per_s": _significant(self.cfg.global_batch_tokens / step_time),
            "tflops_per_device": _significant(self.flops_per_step / step_time / self.devices / 1e12),
        }
        if self.first:
            entry["includes_compile"] = True
            cache = compile_cache.stats()
            entry["compile_cache_hits"] = cache.hits
            log.info("compilation cache: %d executables loaded, %.1f s of compilation saved", cache.hits, cache.seconds_saved)
            self.first = False
        self.metrics_log.append(entry)
        self.tensorboard.scalars(step, {f"train/{k}": entry[k] for k in ("loss", "grad_norm", "learning_rate", "tokens_per_s", "tflops_per_device")})
        if step % self.cfg.log_every_steps == 0 or step == self.cfg.steps:
            self.metrics_log.sync()  # one object per window: training.run_log
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
        """Record the mean of ``losses`` (one per eval batch) as ``eval_loss`` at ``step``."""
        value = sum(losses) / len(losses)
        self.metrics_log.append({"step": step, "eval_loss": value})
        self.tensorboard.scalars(step, {"eval/loss": value})
        log.info("step %d eval loss %.4f (%d batches)", step, value, len(losses))


def _significant(value: float, digits: int = 6) -> float:
    """``value`` rounded to ``digits`` significant digits (keeps tiny CPU rates non-zero)."""
    return float(f"{value:.{digits}g}")
