"""Numbers past what the code can hold (a 5,000-digit step, which ``int()`` refuses; a duration
that overflows ``timedelta``; ``inf`` megabytes; a benchmark past what JAX can allocate): one
``error:`` line naming the option, exit 2, nothing started."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.local.faults import FaultSpecError, parse_fault
from training.bench.spec import BenchConfigError, BenchSpec

HUGE = "9" * 5000  # past the 4,300 digits Python's int() converts


def invoke(tmp_path, *args: str):
    env = {"MULTISLICE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "250"}
    return CliRunner().invoke(app, list(args), env=env, color=False)


def refusal(result, option: str) -> str:
    """The one ``error:`` line naming ``option`` (exit 2, no traceback, short)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, Exception)  # SystemExit: an exit
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option}"), result.output
    assert len(lines[0]) < 400, lines[0]  # the 5,000 digits are not echoed
    return lines[0]


@pytest.mark.parametrize(
    ("option", "spec", "words"),
    [
        ("--kill", f"1@{HUGE}", "step 99999999… (5,000 digits) is outside the run"),
        ("--kill", f"{HUGE}@1", "slice 99999999… (5,000 digits) does not exist"),
        ("--preempt", f"0@{HUGE}", "is outside the run"),
        ("--preempt", f"{HUGE}@{HUGE}", "does not exist"),
        ("--kill", "1@99999999999999999999", "step 99999999… (20 digits) is outside the run"),
    ],
)
def test_local_up_refuses_a_fault_past_any_step_or_slice(tmp_path, option, spec, words):
    line = refusal(invoke(tmp_path, "local", "up", option, spec), option)
    assert words in line, line
    assert not (tmp_path / "state").exists()  # refused before anything was created


def test_a_fault_spec_of_leading_zeros_is_still_its_number():
    assert parse_fault("kill", "0@" + "0" * 5000 + "7", slices=1, total_steps=10).step == 7
    with pytest.raises(FaultSpecError, match=r"^--kill '1@0000.*characters\): step 9 is outside the run"):
        parse_fault("kill", "1@" + "0" * 5000 + "9", slices=2, total_steps=5)


@pytest.mark.parametrize("command", [["logs"], ["local", "logs"]])
@pytest.mark.parametrize("since", [f"{HUGE}s", "99999999999d", "9999999d", f"{HUGE}.5h"])
def test_logs_refuse_a_since_before_the_year_1(tmp_path, command, since):
    line = refusal(invoke(tmp_path, *command, "--since", since), "--since")
    assert "reaches back before the year 1" in line, line


@pytest.mark.parametrize("option", ["--shard-mb", "--bpe-train-mb"])
@pytest.mark.parametrize("value", ["inf", "1e300"])
def test_data_prepare_refuses_megabytes_past_a_petabyte(tmp_path, option, value):
    line = refusal(invoke(tmp_path, "data", "prepare", "stdlib", str(tmp_path / "ds"), option, value), option)
    assert "a finite number of megabytes from 0.001 to 1,000,000,000 (a petabyte)" in line, line
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("value", ["nan", "-1", "0"])
def test_data_prepare_refuses_megabytes_that_are_none(tmp_path, value):
    # The option's rule (infra.cli.option_values.Number) answers while the command line is read.
    line = refusal(
        invoke(tmp_path, "data", "prepare", "stdlib", str(tmp_path / "ds"), "--shard-mb", value), "--shard-mb"
    )
    assert "from 0.001 to 1,000,000,000" in line, line
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize(
    ("option", "value", "bound"),
    [
        ("--embedding-dimension", "1000000000000", "a whole number from 1 to 65,536"),
        ("--batch-size", "100000000000000000000", "a whole number from 1 to 65,536"),
    ],
)
def test_bench_shardings_refuses_dimensions_past_its_bounds(tmp_path, option, value, bound):
    line = refusal(invoke(tmp_path, "bench", "shardings", option, value), option)
    assert bound in line, line


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"layers": 10**9}, "--layers: at most 1,024; got 1000000000"),
        ({"steps": 10**12}, "--steps: at most 10,000"),
        ({"warmup": 10**5}, "--warmup: at most 10,000"),
        ({"embedding_dimension": 10**5000}, "--embedding-dimension: at most 65,536; got an integer of"),
        ({"ici": {"data": 10**6, "fsdp": 1, "tensor": 1}}, "--ici-*: 1000000 devices per slice"),
        ({"ici": {"data": 128, "fsdp": 128, "tensor": 2}}, "at most 16,384"),
        (
            {"dcn": {"data": 2048, "fsdp": 1, "tensor": 1}},
            "--dcn-*: 2048 slices (data 2048 × fsdp 1 × tensor 1); at most 1,024",
        ),
    ],
)
def test_bench_spec_bounds_name_the_option_and_the_bound(values, message):
    # Checked here, not through the command: past the bounds the command would start 100,000
    # emulated CPU devices or slices, or time 10**12 steps.
    with pytest.raises(BenchConfigError) as err:
        BenchSpec(**values)
    assert message in str(err.value)


def test_bench_spec_takes_its_bounds():
    BenchSpec(ici={"data": 1, "fsdp": 16384, "tensor": 1}, batch_size=65536, embedding_dimension=65536)
    BenchSpec(dcn={"data": 1024, "fsdp": 1, "tensor": 1}, layers=1024, steps=10_000, warmup=10_000)


def test_local_up_refuses_a_heartbeat_timeout_past_a_day(tmp_path):
    result = invoke(tmp_path, "local", "up", "--heartbeat-timeout", "100000000000000000000")
    line = refusal(result, "--heartbeat-timeout")
    assert "a whole number of seconds from 2 to 86,400" in line, line


@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf", "nan", "1e999"])
def test_local_up_refuses_a_boot_timeout_variable_that_is_no_number_of_seconds(tmp_path, monkeypatch, value):
    monkeypatch.setenv("MULTISLICE_BOOT_TIMEOUT", value)
    line = refusal(invoke(tmp_path, "local", "up"), "MULTISLICE_BOOT_TIMEOUT=")
    assert "is not a positive number of seconds" in line and "--boot-timeout" in line, line
    assert not (tmp_path / "state").exists()
