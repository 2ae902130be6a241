"""infra/readers/environment.py: the tool's own variables, each a value or one line refusing it
(:class:`~infra.readers.environment.VariableError`), on any value the environment can hold
(Hypothesis; tests/readers/test_fuzz.py lists these readers as fuzzed here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from infra.readers import environment
from infra.readers.environment import LOG_LEVELS, VariableError
from tests.helpers.fuzzing import load_profile

load_profile()


@pytest.mark.parametrize("value", [None, ""])
def test_unset_or_empty_is_the_default(monkeypatch, value):
    for name in (environment.STACKS_DIR_ENV, environment.STATE_DIR_ENV, environment.LOG_LEVEL_ENV):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert (environment.stacks_dir(), environment.state_dir(), environment.log_level()) == (None, None, None)
    environment.check_all()


@pytest.mark.parametrize("level", LOG_LEVELS)
def test_each_log_level_is_taken(monkeypatch, level):
    monkeypatch.setenv(environment.LOG_LEVEL_ENV, level)
    assert environment.log_level() == level


@pytest.mark.parametrize(
    ("value", "hint"),
    [("NOPE", ""), ("info", " (did you mean INFO?)"), (" DEBUG", " (did you mean DEBUG?)"), ("20", "")],
)
def test_any_other_log_level_is_refused_naming_the_levels(monkeypatch, value, hint):
    monkeypatch.setenv(environment.LOG_LEVEL_ENV, value)
    with pytest.raises(VariableError) as err:
        environment.log_level()
    assert str(err.value) == (
        f"MULTISLICE_LOG_LEVEL={value!r} is not a log level{hint}; allowed: DEBUG, INFO, WARNING, ERROR, CRITICAL "
        "(unset: INFO)"
    )
    with pytest.raises(VariableError):
        environment.check_all()


def test_a_stacks_dir_that_is_a_directory_or_not_there_yet_is_its_path(monkeypatch, tmp_path):
    for path in (tmp_path, tmp_path / "missing", tmp_path / "missing" / "deeper"):
        monkeypatch.setenv(environment.STACKS_DIR_ENV, str(path))
        assert environment.stacks_dir() == path


@pytest.mark.parametrize("make", ["file", "fifo", "under a file", "dangling link"])
def test_a_stacks_dir_that_is_no_directory_is_refused(monkeypatch, tmp_path, make):
    thing = tmp_path / "stacks"
    named = thing
    if make == "file":
        thing.write_text("x")
    elif make == "fifo":
        os.mkfifo(thing)
    elif make == "under a file":
        thing.write_text("x")
        named = thing / "inner"
    else:
        thing.symlink_to(tmp_path / "gone")
    monkeypatch.setenv(environment.STACKS_DIR_ENV, str(named))
    with pytest.raises(VariableError) as err:
        environment.stacks_dir()
    kind = {"file": "a file", "fifo": "a FIFO", "under a file": "a path under a file", "dangling link": ""}[make]
    message = str(err.value)
    assert message.startswith(f"MULTISLICE_STACKS_DIR={str(named)!r} names {kind}"), message
    assert "not a directory" in message and "\n" not in message
    if make == "under a file":
        assert f": {thing} is a file;" in message


#: What an environment variable can hold: any text but NUL, in the file system's encoding.
_VALUES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["INFO", "info", "/", ".", "..", "/etc/passwd", "/dev/null", "/proc/self", "a" * 5000]),
).filter(lambda value: "\x00" not in value and _encodable(value))


def _encodable(value: str) -> bool:
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return False
    return True


@given(value=_VALUES)
def test_every_variable_is_a_value_or_one_line_refusing_it(monkeypatch, tmp_path, value):
    monkeypatch.chdir(tmp_path)  # a relative value names nothing of the repository's
    for name, read in (
        (environment.STACKS_DIR_ENV, environment.stacks_dir),
        (environment.STATE_DIR_ENV, environment.state_dir),
        (environment.LOG_LEVEL_ENV, environment.log_level),
    ):
        monkeypatch.setenv(name, value)
        try:
            found = read()
        except VariableError as err:
            message = str(err)
            assert message.startswith(f"{name}=") and "\n" not in message and len(message) < 600, message
        else:
            if not value:
                assert found is None
            elif name == environment.LOG_LEVEL_ENV:
                assert found == value and value in LOG_LEVELS
            else:
                assert found == Path(value)
        monkeypatch.delenv(name)
