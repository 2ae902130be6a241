"""The README's "Day one", run exactly as written: each command line of its ``bash`` blocks through
``bash -c`` in the repository, ``~`` a temporary home, ``uv`` the set-up's (the README's alias),
and the YAML lines added where the README says. The stack is kept outside ``stacks/``
(``~/Pulumi.long.yaml``), and every command reaches it as printed; ``--stack long`` reaches the
same run, as the README says.

What the environment adds, never the command lines: the state directory (``MULTISLICE_STATE_DIR``),
the session's compilation cache, and holds after steps :data:`HOLD_AT` and :data:`HOLD_AGAIN_AT`
(``MULTISLICE_HOLD_AT``, the ``--hold-at`` of docs/emulation.md): the 1,000-step run waits there
until the test has acted, so it cannot end first however fast or slow the machine, and the test
never releases it (``local down`` stops it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.helpers.documented_lines import Lines, shell_env
from tests.helpers.emulation import BackgroundCli, processes_under, run_records
from tests.helpers.readme import bash_lines, day_one, readme_commands

#: The steps the day-one run waits at: before the reset, and after it (a reset stops the trainers
#: as a preemption notice does: they save the step they agree on, past the first hold, and resume
#: from it: docs/exec-and-reset.md).
HOLD_AT, HOLD_AGAIN_AT = 2, 4
STEPS = 1000


def lines_of_day_one() -> dict[str, str]:
    """Day one's command lines by what they do."""
    written = bash_lines(day_one())
    text = " ".join(day_one().split())
    assert [" ".join(c.split()) for c in written] == [c for c in readme_commands() if c in text]
    # The README's alias names the set-up's uv: the shell's PATH gives it here (shell_env).
    commands = [c for c in written if not c.startswith("alias uv=")]
    found = {
        "copy": [c for c in commands if c.startswith("sed ")],
        "up": [c for c in commands if c.endswith("local up --config-file ~/Pulumi.long.yaml")],
        "status": [c for c in commands if c.endswith("local status --config-file ~/Pulumi.long.yaml")],
        "plot": [c for c in commands if " local status " in c and "--plot ~/long.png" in c],
        "logs": [c for c in commands if " local logs " in c],
        "exec": [c for c in commands if " local exec " in c],
        "reset": [c for c in commands if " local reset " in c],
        "down": [c for c in commands if " local down " in c],
        "prepare": [c for c in commands if " data prepare " in c],
        "up fresh": [c for c in commands if c.endswith("local up --config-file ~/Pulumi.long.yaml --fresh")],
    }
    assert all(len(lines) == 1 for lines in found.values()), found
    assert len(commands) == len(found), (commands, found)  # nothing in day one left unrun
    return {name: lines[0] for name, lines in found.items()}


def held_at(state: Path, step: int) -> int:
    """How many times both VMs' trainers have stopped at the hold after ``step`` (their fault
    gate's line in each VM's console log: training/fault_gate.py)."""
    logs = [state / "long" / "logs" / f"slice-{s}-worker-0.log" for s in (0, 1)]
    line = f"fault gate: step {step} done; waiting"
    return min(log.read_text().count(line) if log.is_file() else 0 for log in logs)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_day_one_runs_as_written(tmp_path, monkeypatch):
    lines = lines_of_day_one()
    env = shell_env(tmp_path, MULTISLICE_HOLD_AT=f"{HOLD_AT} {HOLD_AGAIN_AT}")
    run_line = Lines(env)
    home, state = Path(env["HOME"]), tmp_path / "state"
    copied = run_line(lines["copy"])
    assert copied.returncode == 0 and (home / "Pulumi.long.yaml").is_file(), copied.stderr

    with BackgroundCli(["bash", "-c", lines["up"]], tmp_path, env=env) as run:
        run.wait_until(lambda: held_at(state, HOLD_AT) == 1, 600, f"both trainers held after step {HOLD_AT} of {STEPS}")
        status = run_line(lines["status"])
        assert status.returncode == 0, status.stdout + status.stderr
        assert re.search(rf"│ step +│ {HOLD_AT}/{STEPS} ", status.stdout), status.stdout
        plot = run_line(lines["plot"])
        assert plot.returncode == 0, plot.stdout + plot.stderr
        assert (home / "long.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        logs = run_line(lines["logs"])
        assert logs.returncode == 0 and "[slice 0 worker 0]" in logs.stdout and "[slice 1 worker 0]" in logs.stdout
        echoed = run_line(lines["exec"])
        assert echoed.returncode == 0, echoed.stdout + echoed.stderr
        assert sorted(line.split(" 127.0.0.1:")[0] for line in echoed.stdout.splitlines()) == [
            "[slice 0 worker 0]",
            "[slice 1 worker 0]",
        ], echoed.stdout
        # As the README says of exec: a command that uses JAX fails while the run holds the chips.
        jax_line = lines["exec"].split(" -- ")[0] + ' -- \'"$MULTISLICE_PYTHON" -c "import jax; jax.devices()"\''
        refused = run_line(jax_line)
        assert refused.returncode == 1 and refused.stdout.count("The TPU is already in use") == 2, refused.stdout
        assert "Traceback" not in refused.stdout, refused.stdout  # one line per VM, the traceback in its log
        reset = run_line(lines["reset"])
        assert reset.returncode == 0, reset.stdout + reset.stderr
        assert "slice 0 worker 0: booted again" in reset.stdout and "slice 1 worker 0: booted again" in reset.stdout
        run.wait_until(
            lambda: held_at(state, HOLD_AGAIN_AT) == 1,
            600,
            f"the reset run to resume and hold after step {HOLD_AGAIN_AT}",
        )
        # "`--stack long` above reaches the same run" (the README).
        by_name = run_line("uv run --frozen multislice local status --stack long")
        assert by_name.returncode == 0, by_name.stdout + by_name.stderr
        by_file = run_line(lines["status"])
        assert by_name.stdout.splitlines()[0] == by_file.stdout.splitlines()[0]
        assert by_name.stdout.startswith("stack long: running (")
        assert "gs://acme-ml-dev-long-ckpt/runs/long" in by_name.stdout
        down = run_line(lines["down"])
        assert down.returncode == 0, down.stdout + down.stderr
        code = run.finish(300)
    out, err = run.output(), run.stderr()
    run_line.outputs.append(out + err)
    assert code == 0, out + err
    assert "reset: restarting every VM of the queued resource (ResetQueuedResource)" in out
    # Stopped on purpose: one plain line on stderr with how to resume, no error.
    assert "stopped by `uv run --frozen multislice local down`" in err and "error:" not in out + err, err
    starts = [e["step"] for e in run_records(state, "events", home / "Pulumi.long.yaml") if e["event"] == "start"]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= HOLD_AT, starts  # resumed, not from scratch
    assert processes_under(tmp_path) == []

    prepared = run_line(lines["prepare"], timeout=600)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    # The two YAML lines, right under `multislice:training:` as the README says.
    (yaml_lines,) = re.findall(r"```yaml\n(.*?)```", day_one(), flags=re.S)
    stack_file = home / "Pulumi.long.yaml"
    anchor = "  multislice:training:\n"
    stack_file.write_text(stack_file.read_text().replace(anchor, anchor + yaml_lines))
    source = yaml.safe_load(yaml_lines)["data"]["source"]
    with BackgroundCli(["bash", "-c", lines["up fresh"]], tmp_path, env=env) as run:  # held at HOLD_AT
        # --fresh starts the VMs' logs anew: once this run trains, their holds are this run's.
        run.wait_until(
            lambda: "training started at step 0" in run.output() and held_at(state, HOLD_AT) >= 1,
            600,
            f"the fresh run on the dataset to hold after step {HOLD_AT}",
        )
        down = run_line(lines["down"])
        assert down.returncode == 0, down.stdout + down.stderr
        code = run.finish(300)
    out, err = run.output(), run.stderr()
    assert code == 0, out + err
    assert "training started at step 0" in out and "resumed" not in out  # --fresh: from step 0
    assert source in (state / "long" / "logs" / "slice-0-worker-0.log").read_text()
    assert processes_under(tmp_path) == []
    run_line.outputs.append(out + err)
    # Every hint printed on the way works as printed (each `local up`'s logs and resume hints).
    run_line.check_hints(monkeypatch, minimum=4)
