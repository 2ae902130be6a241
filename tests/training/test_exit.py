"""The trainer's process ends without the interpreter's teardown (training.train.exit_process):
its code, its last log lines and printed output come out; atexit handlers do not run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from training import train
from training.__main__ import _setup_logging, app
from training.config import TrainConfig


def test_exit_process_flushes_logs_and_output_and_skips_teardown(tmp_path):
    log_file = tmp_path / "trainer.log"
    program = textwrap.dedent(
        f"""
        import atexit, logging, logging.handlers, sys
        from training import train
        buffered = logging.handlers.MemoryHandler(1000, target=logging.FileHandler({str(log_file)!r}))
        logging.basicConfig(handlers=[buffered], level=logging.INFO, force=True)  # written at shutdown
        atexit.register(lambda: print("teardown ran"))
        logging.getLogger("training").info("last line before exit")
        print("printed, not yet flushed", end="")
        sys.stderr.write("to stderr")
        train.exit_process(75)
        print("after exit")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as to a pipe
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 75
    assert result.stdout == "printed, not yet flushed"  # flushed; no atexit handler, nothing after
    assert "to stderr" in result.stderr
    assert "last line before exit" in log_file.read_text()


def test_the_run_command_ends_through_exit_process_with_mains_code(tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(json.loads(TrainConfig().model_dump_json())))
    ran: list[tuple] = []
    monkeypatch.setattr(train, "main", lambda *args: ran.append(args) or train.EXIT_PREEMPTED)

    class Exited(Exception):
        pass

    def exit_process(code: int):
        raise Exited(code)

    monkeypatch.setattr(train, "exit_process", exit_process)
    result = CliRunner().invoke(
        app, ["run", "--config", str(config), "--run-dir", str(tmp_path / "run"), "--single-process"]
    )
    assert isinstance(result.exception, Exited) and result.exception.args == (train.EXIT_PREEMPTED,)
    assert len(ran) == 1 and ran[0][1] == str(tmp_path / "run")


@pytest.mark.parametrize("code", [0, 1, 78])
def test_exit_process_passes_any_code(code):
    result = subprocess.run(
        [sys.executable, "-c", f"from training import train; train.exit_process({code})"], timeout=120, check=False
    )
    assert result.returncode == code


def test_a_command_run_in_this_process_leaves_no_handler_on_a_closed_stream(capfd):
    """`python -m training` configures the root logger on the stderr CliRunner gives it, closed
    once the command returns; the suite puts the logger back (tests.helpers.logging_state), so a
    later record of this process prints no "--- Logging error ---"."""
    import logging

    import typer

    from tests.helpers.logging_state import root_logger_kept

    command = typer.Typer()
    command.command()(lambda: _setup_logging("p0"))  # what `run` and `data prepare` do first
    with root_logger_kept():
        assert CliRunner().invoke(command, []).exit_code == 0
    logging.getLogger("training").warning("a record after the command")
    assert "Logging error" not in capfd.readouterr().err
