"""Generated inputs (Hypothesis) for every reader of outside bytes: each keeps its contract on any
input, one kind of error and nothing else (no RecursionError, no OverflowError, no hang), and a value
shown in a message carries no secret.

The readers are :data:`FUZZED`; a public function added to ``infra/readers/`` or
``training/run_objects.py`` that is not listed there fails :func:`test_every_reader_is_fuzzed`.
Examples are derandomized (the same on every run) and few enough for the suite's budget; set
``HYPOTHESIS_PROFILE=long`` for more (benchmarks and local hunts).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest
from hypothesis import assume, given, strategies as st

from infra.backends.gke.image_reference import check_image
from infra.config import StackConfigError, load_stack_file
from infra.readers import engine_config, environment, files, go_yaml, stack_file, state_records
from tests.helpers.fuzzing import load_profile
from training import redaction, run_objects

load_profile()

#: Module → the public readers in it that this file drives (and how).
FUZZED = {
    files: {"read_bounded", "open_regular", "special_kind"},
    state_records: {"emulator_state", "deletion_record", "recorded_stack_file", "state_damage"},
    stack_file: {"read_stack_text", "load_yaml", "check_file"},
    # tests/readers/test_engine_reading.py drives these: the engine's corpus, and generated scalars
    engine_config: {"check_agreement", "config_map"},
    go_yaml: {"v3_plain", "v3_scalar", "go_parse_int"},
    environment: {"stacks_dir", "state_dir", "log_level", "check_all"},  # tests/readers/test_environment.py
    run_objects: {"json_record", "file_bytes", "open_regular"},
}

#: JSON-ish bytes: nested values, odd numbers, and raw bytes.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_BYTES = st.one_of(
    st.binary(max_size=300),
    _JSON.map(lambda value: json.dumps(value).encode()),
    st.integers(min_value=1, max_value=50_000).map(lambda depth: b"[" * depth),
    st.integers(min_value=4000, max_value=6000).map(lambda digits: b"9" * digits),
)


def test_every_reader_is_fuzzed():
    listed = {module.__name__: names for module, names in FUZZED.items()}
    for module in (files, state_records, stack_file, engine_config, go_yaml, environment, run_objects):
        public = {
            name
            for name, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")
        }
        readers = {name for name in public if name in listed[module.__name__]}
        assert public - readers <= _NOT_READERS.get(module.__name__, set()), (
            f"{module.__name__}: {sorted(public - readers)} read outside bytes? fuzz them here or say why not"
        )


#: Public functions of those modules that take no outside bytes (they format or build), and why.
_NOT_READERS = {
    "infra.readers.stack_file": {
        "check_scalars",  # driven through load_yaml
        "expanded_nodes",  # driven through load_yaml
        "long_int",  # formats a scalar for a message
        "short_key",  # formats a key for a message
        "yaml_problem",  # formats a YAML error for a message
    },
    "infra.readers.engine_config": {"engine_text"},  # writes a value as the engine hands it over
    "infra.readers.go_yaml": {
        "go_number_text",  # writes a float as the engine hands it over
        "kind",  # names a value's kind
    },
}


@given(_BYTES)
def test_a_run_directory_object_is_its_json_or_a_value_error(data):
    try:
        run_objects.json_record(data)
    except ValueError:
        pass


@given(_BYTES)
def test_emulator_state_is_a_state_or_a_damaged_record(data):
    try:
        state = state_records.emulator_state(data)
    except state_records.DamagedRecord as err:
        assert err.why and "\n" not in err.why
    else:
        assert state_records.state_damage(state) is None


@given(data=_BYTES, limit=st.integers(min_value=0, max_value=400))
def test_a_file_is_read_within_its_limit_or_refused(tmp_path_factory, data, limit):
    path = tmp_path_factory.mktemp("file") / "f"
    path.write_bytes(data)
    try:
        assert files.read_bounded(path, limit) == data and len(data) <= limit
    except files.UnreadableFile as err:
        assert err.too_long and len(data) > limit
    try:  # the trainer's twin
        assert run_objects.file_bytes(path, limit) == data and len(data) <= limit
    except run_objects.UnreadableObject as err:
        assert isinstance(err, ValueError) and "over" in str(err) and len(data) > limit
    fd = files.open_regular(path)  # a regular file's descriptor, whatever its bytes
    os.close(fd)


def _open_and_close(open_regular):
    def opened(path, _limit):
        os.close(open_regular(path))

    return opened


READS = {
    "read_bounded": (files.read_bounded, files.UnreadableFile),
    "open_regular": (_open_and_close(files.open_regular), files.UnreadableFile),
    "file_bytes": (run_objects.file_bytes, run_objects.UnreadableObject),
    "run_objects.open_regular": (_open_and_close(run_objects.open_regular), run_objects.UnreadableObject),
}


@pytest.mark.parametrize("reader", list(READS))
@pytest.mark.parametrize("make", ["fifo", "dir", "dev", "missing", "through-a-file"])
def test_special_files_are_refused_before_a_read(tmp_path, make, reader):
    read, refusal = READS[reader]
    path = tmp_path / "f"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "dir":
        path.mkdir()
    elif make == "dev":
        path.symlink_to("/dev/zero")
    elif make == "through-a-file":
        path.write_text("x")
        path = path / "g"
    expected = {"missing": FileNotFoundError, "through-a-file": NotADirectoryError}.get(make, refusal)
    with pytest.raises(expected):
        read(path, 1 << 20)


@given(_BYTES)
def test_the_stack_file_record_names_a_file_or_is_damaged(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("record") / "stack-file"
    path.write_bytes(data)
    try:
        found = state_records.recorded_stack_file(path)
    except state_records.DamagedRecord as err:
        assert err.why and "\n" not in err.why
    else:
        assert found is None or found.is_absolute() and found.is_file()
    assert state_records.deletion_record(path) is None or isinstance(state_records.deletion_record(path), dict)


#: Odd YAML scalars, where YAML 1.1 readers and others differ or numbers overflow.
_SCALARS = st.one_of(
    st.sampled_from(
        [
            "1:30",
            "yes",
            "off",
            "0o17",
            "010",
            "0x18",
            "2_4",
            "1e400",
            "-.inf",
            ".nan",
            "2026-12-07",
            "!!binary aGk=",
            "~",
            "''",
            "[",
            "{a: 1}",
            "&a 1",
            "*a",
            "9" * 5000,
            "\t",
            "'\\x00'",
        ]
    ),
    st.text(max_size=30).map(json.dumps),
)


@given(key=st.sampled_from(["steps", "slices", "accelerator", "bucket"]), scalar=_SCALARS)
def test_a_stack_with_any_scalar_is_a_stack_or_one_error_naming_the_key(tmp_path_factory, key, scalar):
    text = (Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml").read_text()
    if key == "steps":
        text = text.replace("    steps: 24", f"    steps: {scalar}", 1)
    else:
        text = text.replace("config:\n", f"config:\n  multislice:{key}: {scalar}\n", 1)
    path = tmp_path_factory.mktemp("stack") / "Pulumi.fuzz.yaml"
    path.write_text(text)
    try:
        load_stack_file(path)
    except StackConfigError as err:
        message = str(err)
        assert message and len(message) < 2000
    except UnicodeDecodeError:
        pass


_SECRET = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=12, max_size=24)


@given(secret=_SECRET, rest=st.text(max_size=30), form=st.sampled_from(["userinfo", "token", "scheme"]))
def test_an_image_refusal_never_echoes_its_credentials(secret, rest, form):
    assume(secret not in rest)
    image = {
        "userinfo": f"ci:{secret}@registry.example.com/{rest}",
        "token": f"ghp_{secret}{secret}@ghcr.io/{rest}",
        "scheme": f"https://u:{secret}@registry.example.com/{rest}",
    }[form]
    try:
        check_image(image)
    except ValueError as err:
        assert secret not in str(err)


@given(st.text(max_size=60))
def test_redaction_is_idempotent_and_total(text):
    once = redaction.redacted(text)
    assert redaction.redacted(once) == once
