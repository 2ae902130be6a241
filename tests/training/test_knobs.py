"""training.knobs: the trainer's numeric environment knobs (the jax.distributed timeouts and port, the
agreement timeout, the preemption grace) are checked where they are read, a bad value one line naming
the variable, and all of them before ``python -m training run`` starts anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from training import agreement, cluster, knobs, preemption
from training.__main__ import app as training_app

BAD = ["ten", "0", "-5", "1.5", "nan", "inf", "86401", "9" * 5000]


@pytest.mark.parametrize("name", [name for name, knob in knobs.KNOBS.items() if not knob.fraction])
@pytest.mark.parametrize("text", BAD, ids=[text if len(text) < 10 else "digits" for text in BAD])
def test_a_whole_number_knob_refuses_what_is_not_one_in_its_range_naming_it(name, text):
    if name == "MULTISLICE_COORDINATOR_PORT" and text == "86401":
        text = "65536"
    with pytest.raises(knobs.KnobError) as raised:
        knobs.integer(name, 7, {name: text})
    message = str(raised.value)
    assert message.startswith(f"{name}='") and "\n" not in message and len(message) < 200
    assert message.endswith("; unset it for the default")


def test_in_range_blank_and_unset_values():
    assert knobs.integer("MULTISLICE_INIT_TIMEOUT_S", 900, {"MULTISLICE_INIT_TIMEOUT_S": " 120 "}) == 120
    assert knobs.integer("MULTISLICE_INIT_TIMEOUT_S", 900, {"MULTISLICE_INIT_TIMEOUT_S": ""}) == 900
    assert knobs.integer("MULTISLICE_INIT_TIMEOUT_S", 900, {}) == 900
    assert knobs.seconds("MULTISLICE_PREEMPTION_GRACE_S", 60.0, {"MULTISLICE_PREEMPTION_GRACE_S": "2.5"}) == 2.5
    with pytest.raises(knobs.KnobError, match=r"^MULTISLICE_PREEMPTION_GRACE_S='nan' is not a number of seconds"):
        knobs.seconds("MULTISLICE_PREEMPTION_GRACE_S", 60.0, {"MULTISLICE_PREEMPTION_GRACE_S": "nan"})
    assert knobs.problem({}) is None
    assert knobs.problem({"MULTISLICE_HEARTBEAT_TIMEOUT_S": "soon"}) == (
        "MULTISLICE_HEARTBEAT_TIMEOUT_S='soon' is not a whole number of seconds from 1 to 86,400; "
        "unset it for the default"
    )


def test_a_value_shown_is_cut_and_carries_no_token():
    with pytest.raises(knobs.KnobError) as raised:
        knobs.integer("MULTISLICE_INIT_TIMEOUT_S", 900, {"MULTISLICE_INIT_TIMEOUT_S": "ghp_" + "a" * 36})
    assert "aaaa" not in str(raised.value)
    with pytest.raises(knobs.KnobError) as raised:
        knobs.integer("MULTISLICE_INIT_TIMEOUT_S", 900, {"MULTISLICE_INIT_TIMEOUT_S": "x" * 1000})
    assert "x" * 41 not in str(raised.value)


def test_each_reader_of_a_knob_names_the_variable(monkeypatch):
    monkeypatch.setenv("MULTISLICE_AGREEMENT_TIMEOUT_S", "five minutes")
    with pytest.raises(knobs.KnobError, match="^MULTISLICE_AGREEMENT_TIMEOUT_S='five minutes' is not"):
        agreement.timeout_s()
    monkeypatch.setenv("MULTISLICE_PREEMPTION_GRACE_S", "-1")
    with pytest.raises(knobs.KnobError, match="^MULTISLICE_PREEMPTION_GRACE_S='-1' is not"):
        preemption.Notice()
    environ = {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "10.9.0.2", "MULTISLICE_COORDINATOR_PORT": "http"}
    with pytest.raises(cluster.MetadataError, match="^MULTISLICE_COORDINATOR_PORT='http' is not a port"):
        cluster.identity_from_environment(environ)
    monkeypatch.setenv("MULTISLICE_INIT_TIMEOUT_S", "1e3")
    two = cluster.ClusterIdentity(worker=0, workers_per_slice=2, slice_id=0, num_slices=1, coordinator_address="x:1")
    with pytest.raises(knobs.KnobError, match="^MULTISLICE_INIT_TIMEOUT_S='1e3' is not a whole number"):
        cluster.initialize(two)  # before jax.distributed is asked anything


def test_the_trainer_checks_every_knob_before_it_starts(tmp_path, monkeypatch):
    from training import train

    monkeypatch.setenv("MULTISLICE_HEARTBEAT_TIMEOUT_S", "0")
    config = tmp_path / "config.json"
    config.write_text("{}")
    result = CliRunner().invoke(training_app, ["run", "--config", str(config), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == train.EXIT_CONFIG
    assert result.output.strip() == (
        "error: MULTISLICE_HEARTBEAT_TIMEOUT_S='0' is not a whole number of seconds from 1 to 86,400; "
        "unset it for the default"
    )
    assert not (tmp_path / "run").exists()


def test_the_benchmark_checks_them_too(monkeypatch):
    monkeypatch.setenv("MULTISLICE_COORDINATOR_PORT", "x")
    result = CliRunner().invoke(training_app, ["bench", "shardings"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: MULTISLICE_COORDINATOR_PORT='x' is not a port: a whole number from 1 to 65,535; "
        "unset it for the default"
    )


@pytest.mark.parametrize("value", ["NOPE", "debug", "10", "INFO\nx", " INFO "])
def test_a_log_level_that_is_no_level_is_named(value):
    with pytest.raises(knobs.KnobError, match=r"^MULTISLICE_LOG_LEVEL=.* is not a log level.*; allowed: DEBUG, INFO"):
        knobs.log_level({"MULTISLICE_LOG_LEVEL": value})
    assert (knobs.problem({"MULTISLICE_LOG_LEVEL": value}) or "").startswith("MULTISLICE_LOG_LEVEL=")
    assert knobs.log_level({}) == "INFO" and knobs.log_level({"MULTISLICE_LOG_LEVEL": "DEBUG"}) == "DEBUG"


def test_run_refuses_a_log_level_before_anything_starts(tmp_path, monkeypatch):
    from training import train

    monkeypatch.setenv("MULTISLICE_LOG_LEVEL", "NOPE")
    config = tmp_path / "config.json"
    config.write_text("{}")
    result = CliRunner().invoke(training_app, ["run", "--config", str(config), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == train.EXIT_CONFIG
    assert result.output.strip() == (
        "error: MULTISLICE_LOG_LEVEL='NOPE' is not a log level; allowed: DEBUG, INFO, WARNING, ERROR, CRITICAL "
        "(unset: INFO)"
    )
    assert not (tmp_path / "run").exists()
