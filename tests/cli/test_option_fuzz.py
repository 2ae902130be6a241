"""Generated values (Hypothesis) for every option of ``multislice``: each is read by the parser of
its kind (infra/cli/option_values.py) while the command line is read, and is either taken (a value
its rule allows) or refused in one ``error:`` line naming the option, exit 2, no traceback, with
nothing started and the command never run.

:data:`KINDS` gives every option of the command tree its kind; an option added without one (or
one whose parser is not its kind's) fails :func:`test_every_option_has_a_kind` /
:func:`test_each_option_is_read_by_the_parser_of_its_kind`, naming it. Examples are derandomized
and few (tests/helpers/fuzzing.py); ``HYPOTHESIS_PROFILE=long`` runs more.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st
from typer.testing import CliRunner

from infra.cli import app
from infra.cli.option_values import (
    PATH_MAX,
    FaultSpec,
    Number,
    OptionRefused,
    PathValue,
    Since,
    error_line,
    one_stack_source,
)
from tests.helpers import cli_options
from tests.helpers.fuzzing import load_profile

load_profile()

#: Every option (and argument) of the command tree by name, and its kind: how its value is read.
KINDS = {
    # A stack's name or file: the two exclude each other (option_values.one_stack_source).
    "--stack": "stack",
    "--config-file": "stack file",
    # Read by option_values.Number: finite, in range, whole where a count.
    **dict.fromkeys(
        [
            "--compile-timeout",
            "--interval",
            "--timeout",
            "--stall-timeout",
            "--boot-timeout",
            "--preempt-grace",
            "--heartbeat-timeout",
            "--slice",
            "--worker",
            "--polls",
            "--hold-at",
            "--coordinator-port",
            "--gcs-port",
            "--vocab-size",
            "--eval-fraction",
            "--shard-mb",
            "--bpe-train-mb",
            "--ici-data",
            "--ici-fsdp",
            "--ici-tensor",
            "--dcn-data",
            "--dcn-fsdp",
            "--dcn-tensor",
            "--batch-size",
            "--embedding-dimension",
            "--layers",
            "--steps",
            "--warmup",
        ],
        "number",
    ),
    **dict.fromkeys(["--output", "--summary-json", "--plot", "--log-dir", "--policy-config"], "path"),
    **dict.fromkeys(["--kill", "--preempt", "--crash"], "fault"),
    # SLICE:DURATION or SLICE:until-step-STEP (infra/local/withholds.py), read by the fault-spec parser.
    "--withhold": "withhold",
    "--since": "since",
    # Words the command checks before it starts anything (a git revision, a dtype, a tokenizer, a
    # data source, the command to run).
    **dict.fromkeys(["--against", "--dtype", "--tokenizer", "SOURCE", "OUTPUT", "COMMAND"], "text"),
    **dict.fromkeys(
        [
            "--config",
            "--json",
            "--compile",
            "--watch",
            "--follow",
            "--libraries",
            "--background",
            "--yes",
            "--fresh",
            "--emulated",
        ],
        "flag",
    ),
}

#: What each kind's parameter is declared with.
KIND_CHECKS = {
    "stack": lambda p: cli_options.callback_of(p) is one_stack_source and cli_options.parser_of(p) is None,
    "stack file": lambda p: (
        isinstance(cli_options.parser_of(p), PathValue) and cli_options.callback_of(p) is one_stack_source
    ),
    "number": lambda p: isinstance(cli_options.parser_of(p), Number),
    "path": lambda p: isinstance(cli_options.parser_of(p), PathValue),
    "fault": lambda p: isinstance(cli_options.parser_of(p), FaultSpec) and cli_options.parser_of(p).kind != "withhold",
    "withhold": lambda p: (
        isinstance(cli_options.parser_of(p), FaultSpec) and cli_options.parser_of(p).kind == "withhold"
    ),
    "since": lambda p: isinstance(cli_options.parser_of(p), Since),
    "text": lambda p: cli_options.parser_of(p) is None and p.type_descriptor.annotation in (str, list[str]),
    "flag": lambda p: bool(getattr(p, "is_flag", False)),
}

PARAMETERS = cli_options.parameters()
COMMANDS = cli_options.commands()
#: The options that take a value on the command line, ``(command path, option)``.
VALUED = sorted(key for key in PARAMETERS if key[1].startswith("--") and KINDS.get(key[1], "flag") != "flag")

#: Values that have broken parsers elsewhere: odd numbers, infinities, huge integers, other
#: scripts' digits, NUL and other control characters, empty and very long text, and values shaped
#: like the options' own (a fault spec, a duration, a time).
ODD = [
    "",
    " ",
    "0",
    "-0",
    "+1",
    "-1",
    "1.5",
    ".5",
    "5.",
    "1e3",
    "1e999",
    "1e-400",
    "inf",
    "-inf",
    "Infinity",
    "nan",
    "NaN",
    "1_000",
    "1,000",
    "0x10",
    "１",
    "٣",
    "²",
    "9" * 25,
    "-" + "9" * 25,
    "9" * 5000,
    "\x00",
    "1\x00",
    "\n",
    "\t1",
    "\x1b[31m",
    "é",
    "💥",
    "a" * 5000,
    "a/" * 3000,
    "/",
    ".",
    "..",
    "~",
    "--help",
    "-s",
    "=",
    "1@2",
    "1@",
    "@",
    "1:2s",
    "1:until-step-80",
    "1:until-step-",
    "1:until-step-0",
    "1:until-step-٨",
    "1:until-step-8x",
    "1:UNTIL-STEP-8",
    "1:until-step-" + "9" * 5000,
    "1:" + "9" * 5000,
    ":",
    "10m",
    "9" * 5000 + "d",
    "2026-11-30T17:00:00Z",
    "2026-11-30T17:00:00",
]
VALUES = st.one_of(
    st.sampled_from(ODD),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=30),
    st.from_regex(r"\A[0-9]{1,3}[@:][0-9]{1,4}[smhd]?\Z"),
    st.from_regex(r"\A[0-9]{1,3}:until-step-[0-9]{0,4}\Z"),
)


def test_every_option_has_a_kind():
    unknown = sorted(f"{path} {name}" for path, name in PARAMETERS if name not in KINDS)
    assert unknown == [], (
        f"options this test does not know: {unknown}; give each a kind in KINDS (and the parser of its kind, "
        "infra/cli/option_values.py)"
    )
    gone = sorted(set(KINDS) - {name for _, name in PARAMETERS})
    assert gone == [], f"KINDS lists options no command has: {gone}"


def test_each_option_is_read_by_the_parser_of_its_kind():
    wrong = sorted(
        f"{path} {name} ({KINDS[name]})"
        for (path, name), p in PARAMETERS.items()
        if name in KINDS and not KIND_CHECKS[KINDS[name]](p)
    )
    assert wrong == []


def test_every_number_option_is_read_by_a_number_rule():
    numbers = {
        f"{path} {name}"
        for (path, name), p in PARAMETERS.items()
        if p.type_descriptor.annotation in (int, float, list[int], list[float])
    }
    assert numbers and numbers == {f"{path} {name}" for path, name in PARAMETERS if KINDS.get(name) == "number"}


def refusal(line: str, option: str) -> None:
    """``line`` is an error line as the contract words it: one short printable line naming ``option``."""
    assert line.startswith(f"{option} ") and line.isprintable(), line
    assert len(line) < 400, line


def taken(option: tuple[str, str], value) -> None:
    """``value``, taken for ``option``, is one its rule allows."""
    param = PARAMETERS[option]
    kind, parser = KINDS[option[1]], cli_options.parser_of(param)
    for item in value if isinstance(value, (list, tuple)) else [value]:
        if kind == "number":
            assert isinstance(item, int if parser.whole else float) and math.isfinite(item)
            assert parser(item) == item  # within the range
        elif kind in ("path", "stack file"):
            assert isinstance(item, Path) and "\x00" not in str(item) and len(os.fsencode(str(item))) <= PATH_MAX
        else:
            assert isinstance(item, str)


@pytest.fixture
def nothing_starts(monkeypatch):
    cli_options.forbid_starting_anything(monkeypatch)


def test_every_parser_takes_or_refuses_each_odd_value_in_one_line(nothing_starts):
    """Each option's parser on each of :data:`ODD`, directly (the generated tests below sample them)."""
    for option in VALUED:
        param, parser = PARAMETERS[option], cli_options.parser_of(PARAMETERS[option])
        for value in ODD if parser is not None else []:
            try:
                found = parser(value)
            except OptionRefused as error:
                error.param = param
                refusal(error_line(error), option[1])
            else:
                taken(option, found)


@given(option=st.sampled_from(VALUED), value=VALUES)
def test_an_option_takes_its_value_or_refuses_it_in_one_line(nothing_starts, option, value):
    path, name = option
    result = cli_options.parse(path, cli_options.command_line(path, name, value), COMMANDS[path])
    if isinstance(result, str):
        refusal(result, name)
    else:
        taken(option, result.params[PARAMETERS[option].name])


@pytest.fixture
def stubbed(monkeypatch):
    """The commands replaced by stubs (whatever the values, no command runs) and nothing may start."""
    cli_options.forbid_starting_anything(monkeypatch)
    return cli_options.stub_commands(monkeypatch)


def invoke(path: str, args: list[str]):
    return CliRunner().invoke(app, [*path.split(), *args], color=False)


def refused(result, option: str) -> str:
    """The one ``error:`` line of a refused command line (exit 2, no traceback)."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    refusal(lines[0].removeprefix("error: "), option)
    return lines[0]


@given(option=st.sampled_from(VALUED), value=VALUES)
def test_the_command_line_runs_the_command_or_refuses_in_one_error_line(stubbed, option, value):
    path, name = option
    ran = len(stubbed)
    result = invoke(path, cli_options.command_line(path, name, value))
    if result.exit_code == 0:
        assert len(stubbed) == ran + 1, result.output
    else:
        refused(result, name)
        assert len(stubbed) == ran  # the command never ran


#: A value each kind refuses.
REFUSED = {"number": "nan", "path": "", "stack file": "", "fault": "x", "withhold": "1:until-step-x", "since": "x"}


@pytest.mark.parametrize("option", [key for key in VALUED if KINDS[key[1]] in REFUSED], ids=" ".join)
def test_each_option_refuses_a_bad_value_in_one_error_line(stubbed, option):
    path, name = option
    refused(invoke(path, cli_options.command_line(path, name, REFUSED[KINDS[name]])), name)
    assert stubbed == []
