"""The command line's refusals (infra/cli/option_values.py, infra/readers/environment.py): each is
one ``error:`` line naming the option or variable and the rule it breaks, exit 2, before the command
runs or anything starts. tests/cli/test_option_fuzz.py drives every option with generated values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.accelerators import MAX_SLICES, accelerator_types, parse_accelerator_type
from infra.cli import app, data as data_cli, option_values
from infra.cli.option_values import MAX_SECONDS, Number
from infra.config import load_stack_file, stack_file
from infra.local.faults import Fault, FaultSpecError
from infra.local.withholds import Withhold, parse_withhold, parse_withholds
from tests.helpers import cli_options
from tests.helpers.emulation import gke_stack
from training.config import MAX_STEPS
from training.data.manifest import DTYPE_LIMITS
from training.prepare.arguments import MAX_MB

PARAMETERS = cli_options.parameters()
STACK = stack_file("dev")


@pytest.fixture
def stubbed(monkeypatch):
    """The commands replaced by stubs that record their names; nothing may start."""
    cli_options.forbid_starting_anything(monkeypatch)
    return cli_options.stub_commands(monkeypatch)


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env, color=False)


def refusal(result) -> str:
    """The one ``error:`` line of a refused command line (exit 2, no traceback), without ``error: ``."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0].removeprefix("error: ")


# --- --withhold, --kill, --preempt ---------------------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [("1:40s", "1:10s"), ("1:40s", "01:40s"), ("0:1m", "0:1m")])
def test_a_slice_withheld_twice_is_refused_naming_withhold_and_the_slice(stubbed, first, second):
    line = refusal(invoke("local", "up", "--kill", "1@3", "--withhold", first, "--withhold", second))
    slice_id = first.split(":")[0].lstrip("0") or "0"
    assert line == (
        f"--withhold '{second}': slice {slice_id} is withheld twice (also --withhold '{first}'); "
        "give one --withhold per slice"
    )
    assert stubbed == []


def test_withholds_are_checked_for_form_then_repeats_then_the_stack():
    kill = [Fault("kill", 0, 3), Fault("kill", 1, 3)]
    assert parse_withholds(["0:1m", "1:30s"], slices=2, faults=kill) == {
        0: Withhold(seconds=60.0),
        1: Withhold(seconds=30.0),
    }
    with pytest.raises(FaultSpecError, match="slice 1 is withheld twice"):
        parse_withholds(["1:1m", "1:30s"], slices=2, faults=kill)
    with pytest.raises(FaultSpecError, match=r"^--withhold '1:xx' is malformed: 'xx' is not a duration"):
        parse_withhold("1:xx", slices=2, faults=[])  # no fault strikes slice 1: the form is said first
    with pytest.raises(FaultSpecError, match=r"^--withhold '5:xx' is malformed"):
        parse_withhold("5:xx", slices=2, faults=kill)  # nor is slice 5 missing


@pytest.mark.parametrize(
    ("args", "says"),
    [
        # Without any --kill: the form is what is wrong, not "no fault strikes slice 1".
        (["--withhold", "1:xx"], "--withhold '1:xx' is malformed: 'xx' is not a duration"),
        (
            ["--withhold", "1"],
            "--withhold '1' is malformed: the form is SLICE:DURATION or SLICE:until-step-STEP, "
            "e.g. --withhold 1:120s or --withhold 1:until-step-80",
        ),
        (["--withhold", "1:until-step-x"], "--withhold '1:until-step-x' is malformed: 'until-step-x' names no step"),
        (["--withhold", "x:1m"], "--withhold 'x:1m' is malformed: the form is SLICE:DURATION"),
        (["--kill", "1@x"], "--kill '1@x' is malformed: the form is SLICE@STEP, e.g. --kill 1@40"),
        (["--preempt", "@3"], "--preempt '@3' is malformed: the form is SLICE@STEP, e.g. --preempt 1@40"),
        (["--crash", "1@x"], "--crash '1@x' is malformed: the form is SLICE@STEP, e.g. --crash 1@40"),
        (["--kill", ""], "--kill '' is malformed"),
        # Before the stack is read: a stack file that does not exist is not what is reported.
        (["--config-file", "/nonexistent/Pulumi.x.yaml", "--kill", "1@"], "--kill '1@' is malformed"),
    ],
)
def test_a_malformed_fault_spec_is_refused_as_malformed_with_its_form(stubbed, args, says):
    line = refusal(invoke("local", "up", *args))
    assert line.startswith(says), line
    assert "strikes" not in line and stubbed == []


def test_a_crash_leaves_its_slice_the_capacity_a_withhold_would_take():
    """``--crash`` kills trainers, not VMs: a ``--withhold`` of its slice needs a --kill or --preempt."""
    with pytest.raises(FaultSpecError, match="no --kill or --preempt strikes slice 1"):
        parse_withholds(["1:30s"], slices=2, faults=[Fault("crash", 1, 3)])
    assert parse_withholds(["1:30s"], slices=2, faults=[Fault("crash", 1, 3), Fault("kill", 1, 5)]) == {
        1: Withhold(seconds=30.0)
    }


@pytest.mark.parametrize(
    ("stack", "where"),
    [
        ("gke", "its Pods' containers run it"),
        ("Pulumi.emu-command.yaml", "the stack runs its own command"),
    ],
)
def test_a_crash_is_refused_where_no_bundled_trainer_runs_on_a_vm(monkeypatch, tmp_path, stack, where):
    cli_options.forbid_starting_anything(monkeypatch)
    path = gke_stack(tmp_path) if stack == "gke" else Path(__file__).parents[1] / "stacks" / stack
    line = refusal(invoke("local", "up", "--config-file", str(path), "--crash", "1@3"))
    assert line == f"--crash 1@3: it strikes the bundled trainer on a VM, and {where}: use --kill"


# --- numbers -------------------------------------------------------------------------------------

NUMBERS = sorted(key for key, p in PARAMETERS.items() if isinstance(cli_options.parser_of(p), Number))
FLOATS = [key for key in NUMBERS if not cli_options.parser_of(PARAMETERS[key]).whole]
WHOLES = [key for key in NUMBERS if cli_options.parser_of(PARAMETERS[key]).whole]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "Infinity"])
@pytest.mark.parametrize("option", FLOATS, ids=" ".join)
def test_every_float_option_refuses_what_is_no_finite_number(stubbed, option, value):
    path, name = option
    rule = cli_options.parser_of(PARAMETERS[option])
    line = refusal(invoke(*path.split(), *cli_options.command_line(path, name, value)))
    assert line == f"{name} {value!r}: must be {rule.describe()}"
    assert f"a finite number{' of ' + rule.unit if rule.unit else ''} " in line
    assert stubbed == []


@pytest.mark.parametrize("option", WHOLES, ids=" ".join)
def test_every_whole_option_refuses_a_huge_integer_with_its_range(stubbed, option):
    path, name = option
    rule = cli_options.parser_of(PARAMETERS[option])
    line = refusal(invoke(*path.split(), *cli_options.command_line(path, name, "99999999999999999999")))
    assert line.startswith(f"{name} '99999999999999999999': must be a whole number")
    assert f"from {rule.low:,} to {rule.high:,}" in line, line
    assert stubbed == []


def test_the_seconds_options_say_seconds():
    seconds = [key for key in NUMBERS if "timeout" in key[1] or key[1] in ("--interval", "--preempt-grace")]
    assert len(seconds) == 11
    assert all(cli_options.parser_of(PARAMETERS[key]).unit == "seconds" for key in seconds)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["local", "up", "--preempt-grace", "nan"],
            "--preempt-grace 'nan': must be a finite number of seconds from 0 to 31,536,000 (365 days)",
        ),
        (
            ["local", "up", "--timeout", "inf"],
            "--timeout 'inf': must be a finite number of seconds from 1 to 31,536,000 (365 days)",
        ),
        (
            ["data", "prepare", "stdlib", "out", "--eval-fraction", "0.5"],
            "--eval-fraction '0.5': must be a finite number greater than 0 and less than 0.5",
        ),
        (
            ["bench", "shardings", "--steps", "1.5"],
            "--steps '1.5': must be a whole number from 1 to 10,000",
        ),
    ],
)
def test_a_refusal_names_the_rule_the_value_breaks(stubbed, args, line):
    assert refusal(invoke(*args)) == line


def test_a_value_inside_the_rules_is_taken(stubbed):
    result = invoke("local", "up", "--preempt-grace", "0", "--timeout", " 31536000 ", "--hold-at", "99999999")
    assert result.exit_code == 0, result.output
    assert stubbed == ["local_up"]


def test_the_shared_bounds_are_their_sources():
    assert option_values.SLICE.high == MAX_SLICES - 1
    most_vms = max(parse_accelerator_type(name).hosts for name in accelerator_types())
    assert option_values.WORKER.high == most_vms - 1
    assert option_values.STEP.high == MAX_STEPS - 1
    assert option_values.MAX_SECONDS == MAX_SECONDS == 365 * 86_400
    assert data_cli.VOCAB_SIZE.parser.high == DTYPE_LIMITS["uint32"]
    assert data_cli.SHARD_MB.parser.high == data_cli.BPE_TRAIN_MB.parser.high == MAX_MB


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["local", "up", "--bogus"], "No such option: --bogus; root local up --help lists what it takes"),
        (["local", "up", "--fresh=yes"], "Option '--fresh' does not take a value"),
        (["diff"], "Missing option '--against'; root diff --help lists what it takes"),
        (["nope"], "No such command 'nope'; root --help lists what it takes"),
    ],
)
def test_any_other_usage_error_is_one_line_too(stubbed, args, line):
    assert refusal(invoke(*args)).startswith(line)
    assert stubbed == []


# --- --stack with --config-file ------------------------------------------------------------------

BOTH = sorted(path for path, name in PARAMETERS if name == "--stack" and (path, "--config-file") in PARAMETERS)


@pytest.mark.parametrize("path", BOTH)
@pytest.mark.parametrize("first", ["--stack", "--config-file"])
def test_stack_and_config_file_together_are_refused_naming_both(stubbed, path, first):
    named = {"--stack": "prod", "--config-file": str(STACK)}
    second = "--config-file" if first == "--stack" else "--stack"
    args = [first, named[first], second, named[second]]
    line = refusal(invoke(*path.split(), *args, *_base(path)))
    assert line == (
        f"--stack 'prod' and --config-file {str(STACK)!r} both name the stack: give one (--config-file takes the "
        "stack's name from its file name, Pulumi.<stack>.yaml)"
    )
    assert stubbed == []


def _base(path: str) -> list[str]:
    return [*cli_options.BASE_ARGS.get(path, []), *cli_options.TRAILING_ARGS.get(path, [])]


@pytest.mark.parametrize("path", BOTH)
def test_either_alone_is_taken(stubbed, path):
    assert len(BOTH) == 15
    for args in (["--stack", "prod"], ["--config-file", str(STACK)], ["-s", "prod"]):
        result = invoke(*path.split(), *args, *_base(path))
        assert result.exit_code == 0, result.output
    assert len(stubbed) == 3


# --- environment variables -----------------------------------------------------------------------


@pytest.mark.parametrize("command", [["plan"], ["local", "down"], ["data", "prepare", "stdlib", "out"]])
@pytest.mark.parametrize("value", ["NOPE", "debug", "10"])
def test_a_log_level_that_is_none_is_refused_before_any_command(stubbed, monkeypatch, command, value):
    monkeypatch.setenv("MULTISLICE_LOG_LEVEL", value)
    line = refusal(invoke(*command))
    assert line.startswith(f"MULTISLICE_LOG_LEVEL={value!r} is not a log level")
    assert line.endswith("allowed: DEBUG, INFO, WARNING, ERROR, CRITICAL (unset: INFO)")
    assert stubbed == []


@pytest.mark.parametrize("value", ["DEBUG", "WARNING", ""])
def test_a_log_level_is_taken(stubbed, monkeypatch, value):
    monkeypatch.setenv("MULTISLICE_LOG_LEVEL", value)
    assert invoke("plan").exit_code == 0 and stubbed == ["plan"]


def test_a_stacks_dir_that_is_a_file_is_refused_as_one(monkeypatch, tmp_path):
    cli_options.forbid_starting_anything(monkeypatch)
    (tmp_path / "stacks").write_text("not a folder\n")
    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(tmp_path / "stacks"))
    line = refusal(invoke("plan", "--stack", "dev"))
    assert line.startswith(f"MULTISLICE_STACKS_DIR={str(tmp_path / 'stacks')!r} names a file, not a directory")
    assert "no stack" not in line
    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(tmp_path / "stacks" / "deeper"))
    assert f"names a path under a file, not a directory: {tmp_path / 'stacks'} is a file" in refusal(invoke("plan"))


def test_a_stacks_dir_that_is_a_directory_is_read(monkeypatch):
    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(STACK.parent))
    result = invoke("render", "--config")
    assert result.exit_code == 0, result.output


# --- data prepare: every option before anything starts -------------------------------------------


@pytest.fixture
def no_storage(monkeypatch):
    """``data prepare --emulated`` may not start the emulated storage (nor anything else)."""
    from infra.emulated import gcs_clients

    def served(*args, **kwargs):
        raise AssertionError("the emulated storage was started")

    monkeypatch.setattr(gcs_clients, "bucket_served", served)
    cli_options.forbid_starting_anything(monkeypatch)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--tokenizer", "bpe", "--vocab-size", "99999999999999999999"],
            "--vocab-size '99999999999999999999': must be a whole number of tokens from 257 to 4,294,967,296",
        ),
        (["--tokenizer", "bpe"], "--tokenizer bpe needs --vocab-size"),
        (["--vocab-size", "300"], "--vocab-size applies only to --tokenizer bpe"),
        (["--dtype", "int8"], "token dtype 'int8' is not one of auto, uint16, uint32"),
        (["--tokenizer", "bpe", "--vocab-size", "70000", "--dtype", "uint16"], "more than uint16 holds"),
        (["--tokenizer", "/nonexistent/t.json"], "cannot read the tokenizer file /nonexistent/t.json (--tokenizer)"),
        (["--eval-fraction", "nan"], "--eval-fraction 'nan': must be a finite number"),
        (["--shard-mb", "1e300"], "--shard-mb '1e300': must be a finite number of megabytes"),
    ],
)
def test_data_prepare_checks_every_option_before_the_emulated_storage_starts(no_storage, tmp_path, args, says):
    bucket = load_stack_file(STACK).bucket_name
    output = f"gs://{bucket}/datasets/fuzz"
    line = refusal(invoke("data", "prepare", "stdlib", output, "--emulated", "--config-file", str(STACK), *args))
    assert says in line, line


# --- the process itself --------------------------------------------------------------------------


def test_the_installed_command_refuses_in_one_line_on_stderr(tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MULTISLICE_")},
        "MULTISLICE_STATE_DIR": str(tmp_path / "state"),
        "MULTISLICE_LOG_LEVEL": "NOPE",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "infra.cli", "local", "up", "--preempt-grace", "nan"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("error: MULTISLICE_LOG_LEVEL='NOPE' is not a log level")
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "state").exists()
    del env["MULTISLICE_LOG_LEVEL"]
    proc = subprocess.run(
        [sys.executable, "-m", "infra.cli", "local", "up", "--preempt-grace", "nan"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: --preempt-grace 'nan': must be a finite number of seconds from 0 to 31,536,000 (365 days)\n"
    )
    assert not (tmp_path / "state").exists()
