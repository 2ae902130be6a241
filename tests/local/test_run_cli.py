"""The emulation tests' runner (tests.helpers.emulation.run_cli): a command that outlives its
bound is stopped, and the failure names it with its last lines, within pytest's own timeout."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import emulation


def test_a_command_past_its_bound_is_stopped_and_named_with_its_last_lines(tmp_path, monkeypatch):
    # Its own SIGINT handler, as `local up` installs one (infra.emulated.stop_signals): an xdist
    # worker starts its children with SIGINT ignored.
    script = (
        "import signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "for i in range(3): print(f'line {i}', flush=True)\ntime.sleep(120)"
    )
    monkeypatch.setattr(emulation, "CLI", [sys.executable, "-c", script])
    with pytest.raises(AssertionError) as raised:
        emulation.run_cli(["local", "up"], tmp_path, timeout=3)
    message = str(raised.value)
    assert message.startswith("`multislice local up` did not finish within 3 s; stopped. Its last lines:")
    assert "line 0\nline 1\nline 2" in message and "KeyboardInterrupt" in message, message  # stopped by SIGINT
