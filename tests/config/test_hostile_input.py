"""Input built to break the stack reader rather than to configure a stack: each is refused (or read) in
time linear in its size, as one line naming its key path, never a traceback.

* a requirements line with a long whitespace run (infra/config/workload.py: the option split was a
  regular expression quadratic in the run's length);
* a workload ``source`` nested deeper than Python's recursion limit (the walk was ``os.walk``,
  recursive in Python 3.11);
* an integer longer than Python converts (a ValueError out of the YAML reader).

The inputs are sized so that the quadratic or recursive code they replaced takes minutes or crashes:
``pytest.mark.timeout`` fails a regression instead of letting it hang. Nothing here measures time.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfigError, load_stack_file, loading, requirement_urls, validate_stack, workload
from infra.config.workload import MAX_SOURCE_DEPTH, parse_requirements, source_files
from infra.readers.stack_file import MAX_INT_CHARS

STACKS = Path(__file__).resolve().parents[2] / "stacks"
HASH = "a" * 64
BASE = {"gcp:project": "my-project-123", "gcp:zone": "us-central2-b", "multislice:acceleratorType": "v4-8"}
#: Long enough that the old split (``re.split(r"\s+(?=--)", line)``) takes minutes on it (measured:
#: 10 s for 40,000 spaces, 285 s for 200,000), and far under the 1 MiB file limit.
RUN = 200_000
runner = CliRunner()


def workload_stack(tmp_path: Path, workload_key: dict) -> Path:
    path = tmp_path / "stacks" / "Pulumi.hostile.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"config": {**BASE, "multislice:workload": workload_key}}))
    return path


def error_lines(path: Path) -> list[str]:
    with pytest.raises(StackConfigError) as err:
        load_stack_file(path)
    return err.value.lines


# quadratic parsing --------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_requirement_with_a_long_whitespace_run_is_refused_naming_the_key(tmp_path):
    requirements = tmp_path / "req.txt"
    requirements.write_text("numpy==2.0.0" + " " * RUN + f"x --hash=sha256:{HASH}\n")
    path = workload_stack(tmp_path, {"command": ["x"], "steps": 1, "requirements": str(requirements)})
    (line,) = error_lines(path)
    assert line.startswith(f"multislice:workload.requirements: {requirements}: line 1: 'numpy==2.0.0  "), line
    assert "is not pinned as name==version" in line


@pytest.mark.timeout(60)
def test_a_marker_after_a_long_whitespace_run_is_read():
    text = "numpy==2.0.0 ;" + " " * RUN + f"python_version >= '3.11' --hash=sha256:{HASH}\n"
    (requirement,) = parse_requirements(text)
    assert (requirement.name, requirement.version, requirement.hashes) == ("numpy", "2.0.0", (HASH,))
    assert requirement.marker == "python_version >= '3.11'"


@pytest.mark.timeout(60)
def test_options_after_long_whitespace_runs_are_read():
    text = "numpy==2.0.0" + " " * RUN + f"--hash=sha256:{HASH}" + "\t" * RUN + f"--hash=sha256:{'b' * 64}\n"
    (requirement,) = parse_requirements(text)
    assert requirement.hashes == (HASH, "b" * 64)


def test_the_option_split_is_the_old_one_on_every_short_line():
    """Every line of up to 7 characters of whitespace, ``-`` and a letter splits as the old pattern split it."""
    old = re.compile(r"\s+(?=--)")
    for length in range(8):
        for chars in itertools.product(" \t-a", repeat=length):
            line = "".join(chars)
            assert workload._OPTION_BREAK.split(line) == old.split(line), repr(line)


#: Runs of each kind of character the patterns name, alone and after the prefixes they look for.
HOSTILE = [
    prefix + run * (RUN // len(run)) + end
    for prefix in ("", "--hash=", "git+https://github.com/a/", "numpy @ https://x/")
    for run in (" ", "\t", "-", " -", "a", "0", "#", " #", "/", "@", ".", ":", "+", "=", "a/", "1:", "a@", ".git")
    for end in ("", "\x00")
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("module", [workload, requirement_urls, loading], ids=lambda module: module.__name__)
def test_every_pattern_of_the_stack_reader_is_linear_on_long_runs(module):
    patterns = [value for value in vars(module).values() if isinstance(value, re.Pattern)]
    assert patterns or module is loading  # loading.py has no pattern today: the test covers a new one
    for pattern in patterns:
        for text in HOSTILE:
            pattern.search(text)
            pattern.split(text)


# a deep source tree -------------------------------------------------------------------------------


def deep_tree(root: Path, depth: int) -> Path:
    """``root`` with ``depth`` one-letter folders nested below it and a file at the bottom (made one
    folder at a time: ``os.makedirs`` is recursive too)."""
    bottom = root
    bottom.mkdir()
    for _ in range(depth):
        bottom = bottom / "d"
        bottom.mkdir()
    (bottom / "deepest.py").write_text("x = 1\n")
    return bottom


def remove_deep_tree(root: Path, depth: int) -> None:
    """Undo :func:`deep_tree` from the bottom up (``shutil.rmtree``, which pytest's cleanup uses, recurses)."""
    bottom = root.joinpath(*["d"] * depth)
    (bottom / "deepest.py").unlink()
    for level in range(depth, -1, -1):
        root.joinpath(*["d"] * level).rmdir()


@pytest.mark.timeout(60)
def test_a_source_deeper_than_the_recursion_limit_is_one_line_naming_the_key(tmp_path):
    depth = sys.getrecursionlimit() + 10  # about 2,000 characters of path: under the OS's 4,096
    deep_tree(tmp_path / "src", depth)
    try:
        path = workload_stack(tmp_path, {"command": ["x"], "steps": 1, "source": str(tmp_path / "src")})
        (line,) = error_lines(path)
        assert line.startswith(
            f"multislice:workload.source: {tmp_path / 'src'} is nested deeper than {MAX_SOURCE_DEPTH} folders (d/d/"
        ), line
        result = runner.invoke(app, ["plan", "--config-file", str(path)])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
        assert [x for x in result.output.splitlines() if "multislice:workload.source" in x] == [f"  {line}"]
        assert "Traceback" not in result.output
    finally:
        remove_deep_tree(tmp_path / "src", depth)


def test_a_source_exactly_as_deep_as_the_limit_ships(tmp_path):
    bottom = deep_tree(tmp_path / "src", MAX_SOURCE_DEPTH)
    assert source_files(tmp_path / "src") == [bottom / "deepest.py"]
    (bottom / "one-more").mkdir()
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_SOURCE_DEPTH} folders"):
        source_files(tmp_path / "src")


def test_a_folder_the_walk_cannot_read_is_named_not_skipped(tmp_path):
    """Made with ``mkdir(dir_fd=…)``: each folder's full path grows past the OS's 4,096 characters
    within the depth limit, which ``os.walk`` skipped without a word (its files would not ship)."""
    name = "n" * 250
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match=r"cannot be read \(File name too long\)"):
        source_files(tmp_path)


# integers longer than Python converts --------------------------------------------------------------


def digits(n: int) -> str:
    return ("1234567890" * (n // 10 + 1))[:n]


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("multislice:slices: 2", f"multislice:slices: {digits(5000)}", "multislice:slices"),
        ("    steps: 120", f"    steps: {digits(5000)}", "multislice:training.steps"),
        ("multislice:slices: 2", f"multislice:slices: 0x{'f' * 4998}", "multislice:slices"),  # converts, but
        ("multislice:slices: 2", "multislice:slices: 11" + ":59" * 1666, "multislice:slices"),  # prints nowhere
    ],
    ids=["decimal", "nested", "hex", "sexagesimal"],
)
def test_cli_an_integer_longer_than_python_converts_is_one_line_naming_its_key(tmp_path, old, new, key):
    text = (STACKS / "Pulumi.dev.yaml").read_text()
    assert text.count(old + "\n") == 1
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(text.replace(old + "\n", new + "\n"))
    result = runner.invoke(app, ["plan", "--config-file", str(path)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    expected = f"  {key}: is an integer 5,000 characters long; a stack file's integers have at most {MAX_INT_CHARS}"
    assert result.output.splitlines() == [f"error: stack 'bad' ({path}) is invalid:", expected]


def test_an_integer_in_a_list_is_named_by_its_index(tmp_path):
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(yaml.safe_dump({"config": {**BASE, "multislice:workload": {"command": ["x", 7], "steps": 1}}}))
    path.write_text(path.read_text().replace("- 7", f"- {digits(MAX_INT_CHARS + 1)}"))
    assert error_lines(path) == [
        f"multislice:workload.command.1: is an integer {MAX_INT_CHARS + 1} characters long; a stack file's integers "
        f"have at most {MAX_INT_CHARS}"
    ]


def test_an_integer_in_the_engines_json_is_one_line_naming_its_key():
    config = {**BASE, "multislice:training": f'{{"steps": {digits(5000)}}}'}
    with pytest.raises(StackConfigError) as err:
        validate_stack("t", config, "pulumi config")
    assert err.value.lines == [
        f"multislice:training: holds an integer 5,000 characters long; a stack file's integers have at most "
        f"{MAX_INT_CHARS}"
    ]


def test_integers_as_long_as_the_limit_are_read():
    config = {**BASE, "multislice:training": f'{{"steps": {digits(MAX_INT_CHARS)}}}'}
    with pytest.raises(StackConfigError) as err:  # read, then refused by the schema as too many steps
        validate_stack("t", config, "pulumi config")
    assert all("characters long" not in line for line in err.value.lines)
    assert any(line.startswith("multislice:training.steps") for line in err.value.lines), err.value.lines
