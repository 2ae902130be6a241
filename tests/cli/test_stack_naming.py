"""One way to name a stack on every command that takes one: ``--stack NAME`` (``stacks/``, or
the stack file a local run of NAME was started from) or ``--config-file PATH``, with the same
error on every command when neither resolves; and the hints the commands print name the stack
the way it was named, so that they work as printed for a stack kept outside ``stacks/``."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra import planner
from infra.cli import app
from infra.config import load_stack_file, stack_args
from infra.emulated.state import LocalPaths

EMU = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"

#: Every command that takes a stack, with the arguments it needs besides the stack.
COMMANDS = {
    "plan": ["plan"],
    "render": ["render"],
    "check": ["check"],
    "diff": ["diff", "--against", "HEAD"],
    "status": ["status"],
    "logs": ["logs"],
    "exec": ["exec", "--", "true"],
    "reset": ["reset", "--yes"],
    "data prepare": ["data", "prepare", "in", "gs://b/out", "--emulated"],
    "local up": ["local", "up"],
    "local status": ["local", "status"],
    "local logs": ["local", "logs"],
    "local exec": ["local", "exec", "--", "true"],
    "local reset": ["local", "reset", "--yes"],
}


def invoke(tmp_path: Path, args: list[str]):
    env = {"COLUMNS": "250", "MULTISLICE_STATE_DIR": str(tmp_path / "state")}
    return CliRunner().invoke(app, args, env=env, color=False)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_stack_that_does_not_resolve_gets_the_same_error_everywhere(tmp_path, command):
    args = COMMANDS[command]
    split = args.index("--") if "--" in args else len(args)
    result = invoke(tmp_path, [*args[:split], "--stack", "nope", *args[split:]])
    assert result.exit_code == 2, result.output
    error = " ".join(result.stderr.split())
    assert error.startswith("error: no stack 'nope': ") and "Pulumi.nope.yaml does not exist; stacks here: " in error
    assert error.endswith(
        "; no local run of it was started from a stack file; a stack file anywhere: --config-file PATH"
    )


def outside_stack(tmp_path: Path) -> Path:
    """The emu stack kept in a file of the user's own, as stack ``long``."""
    path = tmp_path / "mine" / "Pulumi.long.yaml"
    path.parent.mkdir()
    path.write_text(EMU.read_text())
    return path


def test_a_stack_started_from_a_file_is_reached_by_its_name_on_every_command(tmp_path):
    path = outside_stack(tmp_path)
    assert invoke(tmp_path, ["plan", "--stack", "long"]).exit_code == 2  # not in stacks/, never run here
    # What `local up --config-file` records for it (infra.cli.local._record_stack_file).
    record = LocalPaths(tmp_path / "state" / "long").stack_file_record
    record.parent.mkdir(parents=True)
    record.write_text(f"{path}\n")
    for args in (["plan", "--stack", "long"], ["plan", "--config-file", str(path)], ["render", "--stack", "long"]):
        result = invoke(tmp_path, args)
        assert result.exit_code == 0, (args, result.output)
    assert "stack long" in invoke(tmp_path, ["plan", "--stack", "long"]).output
    # `local down` takes either too; nothing of long runs.
    for args in (["local", "down", "--stack", "long"], ["local", "down", "--config-file", str(path)]):
        result = invoke(tmp_path, args)
        assert result.exit_code == 0 and "no local run of stack 'long' is running" in result.output, result.output
    # A record whose file is gone resolves nothing: the same error as an unknown stack.
    path.unlink()
    assert "no local run of it was started from a stack file" in invoke(tmp_path, ["plan", "--stack", "long"]).stderr


def test_a_hint_names_a_stack_kept_outside_stacks_by_its_file_and_works_as_printed(tmp_path):
    path = outside_stack(tmp_path)
    config = load_stack_file(path)  # global batch 8 over 2 slices: predicted DCN-bound
    assert stack_args("long") == f"--config-file {shlex.quote(str(path.absolute()))}"
    lines = planner.advisories(config)
    hints = [line.split("`")[1] for line in lines if "`" in line]
    assert hints and all(h == f"multislice plan --config-file {path.absolute()}" for h in hints), lines
    result = invoke(tmp_path, shlex.split(hints[0])[1:])  # run as printed
    assert result.exit_code == 0, result.output
    # A stack of stacks/ keeps its name.
    from infra.config import load_stack, validate_stack

    load_stack("dev")
    assert stack_args("dev") == "--stack dev"
    # A config map of the same stack read after its file (the program `check` runs validates the
    # stack again from the engine's config) keeps naming the file: `check --config-file`'s warnings
    # say --config-file. A process that read no file of it (the Pulumi engine's) says --stack.
    keys = yaml.safe_load(EMU.read_text())["config"]
    validate_stack("long", keys, "a config map")
    assert stack_args("long") == f"--config-file {shlex.quote(str(path.absolute()))}"
    validate_stack("other", keys, "a config map")
    assert stack_args("other") == "--stack other"


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("long path", "cannot be looked up: File name too long"),
        ("fifo", "a FIFO, not a regular file"),
        ("link to /dev/zero", "a character device, not a regular file"),
        ("huge", "bytes, over the 4,096 read"),
        ("not utf-8", "not UTF-8 text"),
        ("relative", "is not an absolute path"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "local status", "render"])
def test_a_damaged_stack_file_record_is_one_line_naming_it_and_hangs_nothing(tmp_path, damage, why, command):
    """The record is read within bounds (infra/readers/files.py): a special file is never opened for a
    blocking read, a huge one never read whole, and what it says is checked before it is used."""
    record = LocalPaths(tmp_path / "state" / "long").stack_file_record
    record.parent.mkdir(parents=True)
    if damage == "long path":
        record.write_text("/" + "x" * 300 + "\n")  # one name over 255 bytes
    elif damage == "fifo":
        os.mkfifo(record)
    elif damage == "link to /dev/zero":
        record.symlink_to("/dev/zero")
    elif damage == "huge":
        record.write_text("/" + "y" * 10_000)
    elif damage == "not utf-8":
        record.write_bytes(b"/tmp/\xff\xfe/Pulumi.long.yaml\n")
    else:
        record.write_text("mine/Pulumi.long.yaml\n")
    result = invoke(tmp_path, [*command.split(), "--stack", "long"])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: the record of the stack file a local run of stack long started from (")
    assert why in line and line.endswith("; remove it, or name the stack file with --config-file"), line
