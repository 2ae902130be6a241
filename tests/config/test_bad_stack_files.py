"""Stack files that YAML or the file system read otherwise than their writer meant, each refused by
``multislice plan --config-file`` with one ``error:`` line (and, for a key, one line naming it), exit 2,
never a traceback:

* a value YAML reads as another type: an unquoted date (YAML 1.1's timestamps) where a name belongs,
  a scalar whose tag (``!!int abc``, ``!!float x``, ``!!bool maybe``) or whose spelling (``0x_``) names
  a type its text is not;
* a path that is not a regular file (a FIFO, a device, ``/proc``), refused before it is opened or read
  past the size limit;
* a document of more YAML nodes than a stack file holds, refused as it is parsed (the first node past
  the limit stops the parser: a syntax error after it is never reached);
* thousands of unknown keys: the allowed keys are listed once and the unknown keys past the first
  :data:`training.validation.UNKNOWN_KEYS_SHOWN` only counted.

Nothing here measures time or memory (the tests' timeouts only stop a regression from hanging).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfigError, load_stack, load_stack_file, loading
from infra.readers import stack_file as stack_yaml
from infra.readers.stack_file import MAX_FILE_BYTES, MAX_NODES
from training.validation import UNKNOWN_KEYS_SHOWN

DEV = Path(__file__).resolve().parents[2] / "stacks" / "Pulumi.dev.yaml"


def dev_text(old: str | None = None, new: str = "") -> str:
    """The dev stack file's text, with the line ``old`` replaced by ``new`` (or ``new`` appended)."""
    text = DEV.read_text()
    if old is None:
        return text + new
    assert text.count(f"{old}\n") == 1, old
    return text.replace(f"{old}\n", f"{new}\n")


def write(tmp_path: Path, text: str, name: str = "Pulumi.bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def position(text: str, needle: str) -> str:
    """``line L, column C`` (1-based) of the first ``needle`` in ``text``."""
    index = text.index(needle)
    line = text.count("\n", 0, index) + 1
    return f"line {line}, column {index - text.rfind(chr(10), 0, index)}"


def plan_stderr(path: Path) -> list[str]:
    """``multislice plan --config-file path``'s error lines, once it exited 2 without a traceback."""
    result = CliRunner().invoke(app, ["plan", "--config-file", str(path)], env={"COLUMNS": "250"}, color=False)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output and result.stderr.startswith("error: "), result.output
    return result.stderr.splitlines()


def refusal(path: Path) -> str:
    with pytest.raises(StackConfigError) as err:
        load_stack_file(path)
    return str(err.value)


# values YAML reads as another type --------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "key", "value"),
    [
        (
            "  multislice:capacity: spot",
            "  multislice:capacity: spot\n  multislice:runName: 2024-01-01",
            "multislice:runName",
            "2024-01-01",
        ),
        ("  gcp:project: acme-ml-dev", "  gcp:project: 2024-01-01", "gcp:project", "2024-01-01"),
        ("  gcp:project: acme-ml-dev", "  gcp:project: 2024-02-30", "gcp:project", "2024-02-30"),  # no such day
        (
            "  multislice:capacity: spot",
            "  multislice:capacity: spot\n  multislice:labels: {run: 2024-01-01 10:00:00}",
            "multislice:labels.run",
            "2024-01-01 10:00:00",
        ),
    ],
    ids=["run-name", "project", "no-such-day", "nested-time"],
)
def test_an_unquoted_date_is_one_line_naming_its_key(tmp_path, old, new, key, value):
    text = dev_text(old, new)
    path = write(tmp_path, text)
    where = position(text, value)
    assert plan_stderr(path) == [
        f"error: stack 'bad' ({path}) is invalid:",
        f"  {key}: {value} ({where}) is a date to YAML, and no stack key takes a date: quote it ('{value}') to "
        "give text",
    ]


def test_a_quoted_date_is_text(tmp_path):
    path = write(
        tmp_path,
        dev_text("  multislice:capacity: spot", "  multislice:capacity: spot\n  multislice:runName: '2024-01-01'"),
    )
    assert load_stack_file(path).run_name == "2024-01-01"


@pytest.mark.parametrize(
    ("old", "new", "key", "written", "problem"),
    [
        (
            "    steps: 120",
            "    steps: !!int abc",
            "multislice:training.steps",
            "!!int 'abc'",
            "is not an integer: drop the tag, or write an integer",
        ),
        (
            "      peak_learning_rate: 0.003",
            "      peak_learning_rate: !!float x",
            "multislice:training.optimizer.peak_learning_rate",
            "!!float 'x'",
            "is not a number: drop the tag, or write a number",
        ),
        (
            "    iapSsh: true",
            "    iapSsh: !!bool maybe",
            "multislice:network.iapSsh",
            "!!bool 'maybe'",
            "is not a boolean: drop the tag, or write true or false",
        ),
        (
            "  gcp:zone: us-central2-b",
            "  gcp:zone: !!timestamp us-central2-b",
            "gcp:zone",
            "!!timestamp 'us-central2-b'",
            "is not a date: drop the tag",
        ),
        (
            "  multislice:slices: 2",
            "  multislice:slices: 0x_",
            "multislice:slices",
            "0x_",
            "reads as an integer in YAML but is not one: quote it to give text, or write an integer",
        ),
        (
            "  multislice:slices: 2",
            "  multislice:slices: 2\n  !!int abc: 1",
            "multislice:abc",
            "!!int 'abc'",
            "is not an integer: drop the tag, or write an integer",
        ),
    ],
    ids=["int", "float", "bool", "timestamp", "implicit-hex", "a-key"],
)
def test_a_scalar_that_is_not_its_tags_type_names_its_key_line_and_tag(tmp_path, old, new, key, written, problem):
    text = dev_text(old, new)
    path = write(tmp_path, text)
    where = position(text, written.replace("'", ""))  # where the tag (or the text) starts
    assert plan_stderr(path) == [f"error: stack 'bad' ({path}) is invalid:", f"  {key}: {written} ({where}) {problem}"]


def test_a_bad_tag_outside_config_is_refused_too(tmp_path):
    text = dev_text(new="encryptionsalt: !!int v1:abc\n")
    path = write(tmp_path, text)
    assert plan_stderr(path)[1:] == [
        f"  encryptionsalt: !!int 'v1:abc' ({position(text, '!!int')}) is not an integer: drop the tag, or write an "
        "integer"
    ]


def test_a_collection_tag_on_a_scalar_is_a_yaml_error(tmp_path):
    path = write(tmp_path, dev_text("    iapSsh: true", "    iapSsh: !!map x"))
    (line, *_) = plan_stderr(path)
    assert line == (
        f"error: stack file {path} is not valid YAML: expected a mapping node, but found scalar (line 13, column 13)"
    )


def test_any_other_failure_of_a_constructor_names_the_line_and_the_tag(tmp_path, monkeypatch):
    def broken(loader, node):
        raise KeyError(node.value)

    monkeypatch.setitem(stack_yaml._UniqueKeyLoader.yaml_constructors, "!broken", broken)
    text = dev_text("    iapSsh: true", "    iapSsh: !broken x")
    path = write(tmp_path, text)
    assert plan_stderr(path) == [
        f"error: stack file {path} is not valid YAML: cannot read the value tagged !broken "
        f"({position(text, '!broken')}): KeyError: 'x'"
    ]


# files that are not regular files ------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_without_being_opened(tmp_path):
    path = tmp_path / "Pulumi.fifo.yaml"
    os.mkfifo(path)  # opening it for reading would wait for a writer forever
    expected = f"stack file {path} is not a regular file (a FIFO); give a Pulumi.<stack>.yaml file"
    assert plan_stderr(path) == [f"error: {expected}"]
    with pytest.raises(StackConfigError) as err:
        load_stack("fifo", tmp_path)  # not "no stack 'fifo'": it is there
    assert str(err.value) == expected


@pytest.mark.timeout(30)
@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero"])
def test_a_device_is_refused_without_being_read(tmp_path, device):
    link = tmp_path / "Pulumi.device.yaml"
    link.symlink_to(device)  # /dev/zero never ends
    expected = "is not a regular file (a character device); give a Pulumi.<stack>.yaml file"
    assert plan_stderr(link) == [f"error: stack file {link} {expected}"]
    assert refusal(Path(device)) == f"stack file {device} {expected}"


@pytest.mark.timeout(30)
def test_a_proc_file_that_fails_to_read_is_one_line(tmp_path):
    link = tmp_path / "Pulumi.mem.yaml"
    link.symlink_to("/proc/self/mem")  # a regular file of size 0 whose first page cannot be read
    assert plan_stderr(link) == [f"error: stack file {link} cannot be read: Input/output error"]


@pytest.mark.timeout(60)
def test_a_file_over_the_limit_its_size_hides_is_read_no_further_than_the_limit(tmp_path):
    kallsyms = Path("/proc/kallsyms")  # size 0 to stat, megabytes to read
    if not kallsyms.exists() or kallsyms.stat().st_size != 0:
        pytest.skip("no /proc/kallsyms of size 0 here")
    with kallsyms.open("rb") as f:
        if len(f.read(MAX_FILE_BYTES + 1)) <= MAX_FILE_BYTES:
            pytest.skip("/proc/kallsyms is small here")
    link = tmp_path / "Pulumi.ksyms.yaml"
    link.symlink_to(kallsyms)
    assert plan_stderr(link) == [
        f"error: stack file {link} is over {MAX_FILE_BYTES:,} bytes; a stack file is a few KB (at most "
        f"{MAX_FILE_BYTES:,} bytes are read)"
    ]


def test_a_missing_file_and_a_directory_are_still_named_so(tmp_path):
    assert refusal(tmp_path / "Pulumi.none.yaml") == f"stack file {tmp_path / 'Pulumi.none.yaml'} does not exist"
    (tmp_path / "Pulumi.dir.yaml").mkdir()
    assert refusal(tmp_path / "Pulumi.dir.yaml") == (
        f"stack file {tmp_path / 'Pulumi.dir.yaml'} is a directory, not a Pulumi.<stack>.yaml file"
    )


# documents of too many nodes ------------------------------------------------------------------

TOO_MANY = f"holds more than {MAX_NODES:,} YAML nodes (keys, values and list items); a stack file holds a few hundred"
THROUGH_ALIASES = (
    f"expands to more than {MAX_NODES:,} YAML nodes through its aliases; a stack file holds a few hundred: write "
    "the values out instead of nesting aliases"
)


@pytest.mark.timeout(60)
def test_a_flow_list_of_half_a_million_scalars_is_refused_for_its_nodes(tmp_path):
    head = dev_text(new="  multislice:labels: [1")
    count = (MAX_FILE_BYTES - len(head) - 3) // 2
    path = write(tmp_path, head + ",1" * count + "]\n")
    assert path.stat().st_size <= MAX_FILE_BYTES and count > 500_000
    assert refusal(path) == f"stack file {path} {TOO_MANY}"


@pytest.mark.timeout(60)
def test_many_keys_are_refused_for_their_nodes(tmp_path):
    path = write(tmp_path, dev_text(new="  multislice:labels:\n" + "".join(f"    k{i}: v\n" for i in range(MAX_NODES))))
    assert refusal(path) == f"stack file {path} {TOO_MANY}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("items", "reason"),
    [("1", TOO_MANY), ("*a", THROUGH_ALIASES)],
    ids=["scalars", "aliases"],
)
def test_the_parser_stops_at_the_first_node_past_the_limit(tmp_path, items, reason):
    # the syntax error at the end is never reached: the limit holds while the document is parsed
    listed = ", ".join([items] * MAX_NODES)
    text = dev_text(new=f"  multislice:labels: &a {{team: ml}}\n  multislice:network: [{listed}]]]\n")
    assert refusal(write(tmp_path, text)).endswith(reason)


def test_a_document_at_the_limit_is_read(tmp_path):
    text = dev_text()
    nodes = stack_yaml.expanded_nodes(yaml.compose(text))
    items = MAX_NODES - nodes - 2  # the key and the list
    path = write(tmp_path, dev_text(new=f"  multislice:allowUnlisted: [{', '.join(['zone'] * items)}]\n"))
    assert stack_yaml.expanded_nodes(yaml.compose(path.read_text())) == MAX_NODES
    assert load_stack_file(path).allow_unlisted


# many unknown keys ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["top", "nested"])
def test_thousands_of_unknown_keys_list_the_allowed_keys_once_and_count_the_rest(tmp_path, where):
    unknown = [f"zz{i:05d}" for i in range(3000)]
    if where == "top":
        text = dev_text(new="".join(f"  multislice:{key}: 1\n" for key in unknown))
        paths = [f"multislice:{key}" for key in unknown]
    else:
        text = dev_text("    steps: 120", "    steps: 120\n" + "".join(f"    {key}: 1\n" for key in unknown))
        paths = [f"multislice:training.{key}" for key in unknown]
    lines = plan_stderr(write(tmp_path, text))
    assert lines[0].startswith("error: stack 'bad' (")
    shown = [line.strip() for line in lines[1:-1]]
    assert [line.split(": ", 1)[0] for line in shown] == paths[:UNKNOWN_KEYS_SHOWN]
    assert shown[0].startswith(f"{paths[0]}: unknown key; allowed keys: ")
    assert shown[1:] == [f"{path}: unknown key (allowed keys listed above)" for path in paths[1:UNKNOWN_KEYS_SHOWN]]
    assert lines[-1] == f"  … and {3000 - UNKNOWN_KEYS_SHOWN:,} more unknown keys"
    assert len("\n".join(lines)) < 5_000


def test_a_few_unknown_keys_each_name_the_nearest_one():
    config = yaml.safe_load(DEV.read_text())["config"] | {"multislice:slice": 2, "multislice:captivity": "spot"}
    with pytest.raises(StackConfigError) as err:
        loading.validate_stack("t", config, "test")
    assert err.value.lines == [
        "multislice:slice: unknown key (did you mean multislice:slices?)",
        "multislice:captivity: unknown key (did you mean multislice:capacity?)",
    ]
