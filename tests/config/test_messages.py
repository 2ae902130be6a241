"""What a stack file written the wrong way is told: a scalar or a list where a map belongs (and a
scalar or a map where a list belongs) is named as what it is, with an example of the key, not as a
JSON error; a stack file named otherwise than ``Pulumi.<stack>.yaml`` is told the name Pulumi reads.
``multislice plan`` prints one ``error:`` line for each and exits 2."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfig, StackConfigError, from_pulumi_config, load_stack_file, structured

DEV = Path(__file__).resolve().parents[2] / "stacks" / "Pulumi.dev.yaml"
CE_EXAMPLE = "e.g. multislice:computeEngine: {maxRunDuration: 3d}"
#: The required keys, as the Pulumi engine hands them to the program.
REQUIRED = {"gcp:project": "acme-ml-dev", "gcp:zone": "us-central2-b", "multislice:acceleratorType": "v4-8"}


def dev_with(tmp_path: Path, line: str, name: str = "Pulumi.dev.yaml") -> Path:
    """The dev stack file with ``line`` (a ``config:`` entry, as written) added, saved as ``name``."""
    text = DEV.read_text()
    path = tmp_path / name
    path.write_text(text.replace("  multislice:capacity: spot\n", f"  multislice:capacity: spot\n  {line}\n"))
    return path


def error_lines(path: Path) -> list[str]:
    with pytest.raises(StackConfigError) as err:
        load_stack_file(path)
    return err.value.lines


def plan_error(path: Path) -> str:
    """``multislice plan --config-file path``'s stderr, once it checked there is one ``error:`` line and exit 2."""
    result = CliRunner().invoke(app, ["plan", "--config-file", str(path)], env={"COLUMNS": "250"}, color=False)
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if "error:" in line] == result.stderr.splitlines()[:1]
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output, result.output
    return result.stderr


@pytest.mark.parametrize(
    ("written", "described"),
    [
        ("3d", "is the scalar '3d'"),
        ("3", "is the scalar 3"),
        ("true", "is the scalar true"),
        ("[3d]", "is a list"),
        ("", "is empty"),
    ],
)
def test_a_scalar_or_a_list_where_a_map_belongs_is_named_with_an_example(tmp_path, written, described):
    path = dev_with(tmp_path, f"multislice:computeEngine: {written}".rstrip())
    line = f"multislice:computeEngine: {described}; it takes a map of keys, {CE_EXAMPLE}"
    assert error_lines(path) == [line]
    assert plan_error(path).splitlines()[1:] == [f"  {line}"]


def test_the_engines_text_of_a_scalar_is_named_the_same_way():
    with pytest.raises(StackConfigError) as err:
        from_pulumi_config("dev", REQUIRED | {"multislice:computeEngine": "3d"})
    assert err.value.lines == [f"multislice:computeEngine: is the scalar '3d'; it takes a map of keys, {CE_EXAMPLE}"]


def test_broken_json_text_is_still_a_json_error():
    with pytest.raises(StackConfigError) as err:
        from_pulumi_config("dev", REQUIRED | {"multislice:computeEngine": '{"maxRunDuration": '})
    (line,) = err.value.lines
    assert line.startswith("multislice:computeEngine: not a JSON object (Expecting value")


@pytest.mark.parametrize("key", structured.STRUCTURED_KEYS)
def test_every_structured_key_names_a_scalar_with_an_example_its_model_accepts(tmp_path, key):
    example = structured.EXAMPLES[key]
    annotation = next(f.annotation for f in StackConfig.model_fields.values() if f.alias == key)
    assert annotation is not None
    pydantic.TypeAdapter(annotation).validate_python(yaml.safe_load(example), context={"base_dir": tmp_path})
    shape = "a list" if structured.takes_list(key) else "a map of keys"
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": REQUIRED | {key: "oops"}}))
    assert error_lines(path) == [f"{key}: is the scalar 'oops'; it takes {shape}, e.g. {key}: {example}"]


def test_a_map_where_a_list_belongs_is_named():
    with pytest.raises(ValueError, match=r"^is a map; it takes a list, e.g. multislice:allowUnlisted: \[zone\]$"):
        structured.parse("multislice:allowUnlisted", {"zone": True}, int)


def test_a_long_scalar_is_named_by_its_length():
    with pytest.raises(ValueError, match=r"^is a scalar 502 characters long; it takes a map"):
        structured.parse("multislice:network", "x" * 500, int)


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("Pulumi.dev.yml", "rename it to Pulumi.dev.yaml"),
        ("Pulumi.dev.YAML", "rename it to Pulumi.dev.yaml"),
        ("pulumi.dev.yaml", "rename it to Pulumi.dev.yaml"),
        ("dev.yaml", "rename it to Pulumi.dev.yaml"),
        ("dev", "rename it to Pulumi.dev.yaml"),
        ("Pulumi.dev.yaml.bak", "rename it to Pulumi.dev.yaml"),
        (".yaml", "rename it to Pulumi.<stack>.yaml, e.g. Pulumi.dev.yaml"),
        ("Pulumi.yaml", "this is the project file (Pulumi.yaml): give a stack's file, e.g. stacks/Pulumi.dev.yaml"),
    ],
)
def test_a_stack_file_named_otherwise_is_told_the_name_pulumi_reads(tmp_path, name, fix):
    path = tmp_path / name
    path.write_text(DEV.read_text())
    expected = f"stack file {path}: Pulumi reads stack files named Pulumi.<stack>.yaml; {fix}"
    with pytest.raises(StackConfigError) as err:
        load_stack_file(path)
    assert str(err.value) == expected
    assert plan_error(path) == f"error: {expected}\n"


def test_a_stack_named_by_the_caller_is_read_from_any_file_name(tmp_path):
    path = tmp_path / "Pulumi.dev.yml"
    path.write_text(DEV.read_text())
    assert load_stack_file(path, "dev").stack == "dev"
