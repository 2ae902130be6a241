"""The review reads a stack file as ``pulumi up`` does: :mod:`infra.readers.engine_config` against the
engine's own code.

``engine_readings.json`` holds what Pulumi's loader (``engine_oracle.go``: Pulumi's functions and the
real gopkg.in/yaml.v3) made of each stack file of ``engine_corpus.py``. For every one:

* what the review accepts, it reads exactly as the engine does (the same text for each key; for a map
  or a list, the same JSON), and builds the same StackConfig, or the same errors, as the deploy;
* what the engine refuses, the review refuses;
* where YAML 1.1 (the review's reading until now: PyYAML, then the tests' converter) and the engine
  read a file differently, the review refuses it in one line naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfigError, from_pulumi_config, load_stack_file, validate_stack
from infra.readers import engine_config, go_yaml
from infra.readers.stack_file import ScalarError, load_yaml
from tests.readers.engine_corpus import READINGS, REQUIRED, STACKS, cases

READ = json.loads(READINGS.read_text(encoding="utf-8"))
#: Refused although YAML 1.1 and the engine agree: text that begins like a date (the review does not
#: parse dates as Go's time.Parse does, it refuses them all), tags other than the plain ones, a key that
#: is a number (the engine would make it text), a top-level key the engine drops (a typo, most likely),
#: an integer past 2^63 - 1 (the engine keeps one up to 2^64 - 1 exactly at the top level only), a key
#: written with and without its namespace (the engine keeps either, as a Go map's order falls).
REFUSED_TO_BE_SAFE = (
    "begins like a date",
    "the tag !",
    "is not text to YAML",
    "Pulumi ignores this top-level key",
    "outside the 64-bit range",
    "written twice",
)


def ours(text: str) -> dict[str, Any]:
    """The review's reading of a stack file's text: the engine's config map.

    Raises:
      yaml.YAMLError: (ScalarError among them) the review refuses it.
    """
    data = load_yaml(text.removeprefix("\ufeff").replace("\r\n", "\n"), "corpus", check=engine_config.check_agreement)
    return engine_config.config_map(data) if isinstance(data, dict) else {}


def yaml11(text: str) -> dict[str, str] | None:
    """YAML 1.1's reading (PyYAML) of the file, its values written as the engine writes a value of their
    type (a date as its ISO text, bytes as Python writes them: neither is what the engine hands over)."""
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError):
        return None
    config = (data or {}).get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return {}
    named = {named_as_pulumi_does(str(k)): v for k, v in config.items()}
    try:
        return {key: engine_config.engine_text(value) for key, value in named.items()}
    except ValueError:  # .inf, .nan: no JSON form
        return None


def named_as_pulumi_does(key: str) -> str:
    """``slices`` → ``multislice:slices``, ``ns:config:name`` → ``ns:name`` (``config.ParseKey``)."""
    parts = key.split(":")
    if len(parts) == 1:
        return f"multislice:{key}"
    return f"{parts[0]}:{parts[2]}" if len(parts) == 3 and parts[1] == "config" else key


def same_text(a: str, b: str) -> bool:
    """Equal, or the same JSON value (a map's text may differ in spacing and escapes)."""
    if a == b:
        return True
    try:
        return json.loads(a) == json.loads(b) and a.strip()[:1] in "{["
    except ValueError:
        return False


def same_map(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(isinstance(a[k], str) and same_text(a[k], b[k]) for k in a)


def test_the_corpus_is_the_one_the_readings_were_made_of():
    assert {name: reading["yaml"] for name, reading in READ.items()} == {
        name: text for name, text in cases().items() if not name.startswith("stack:")
    } | {name: READ[name]["yaml"] for name in READ if name.startswith("stack:")}
    assert len(READ) > 1000


def test_the_review_reads_each_file_as_the_engine_does_or_refuses_it():
    problems = [f"{name}: {problem}" for name in sorted(READ) if (problem := _read_alike_or_refused(name))]
    assert problems == [], "\n".join(problems[:20])


def _read_alike_or_refused(name: str) -> str | None:
    reading = READ[name]
    text, engine = reading["yaml"], reading["config"]
    try:
        review: dict[str, Any] | None = ours(text)
        refusal = None
    except yaml.YAMLError as err:
        review, refusal = None, str(err)
    if review is not None and any(isinstance(v, dict) for v in review.values()):
        # kept for validate_stack to refuse (the oracle reads no secrets)
        return None if name == "structure:secure" else f"a map kept as a map: {review}"
    if engine is None:
        return None if review is None else f"the engine refuses it ({reading['error']}); the review read {review}"
    if review is not None:
        return None if review == engine or same_map(review, engine) else f"read {review}, the engine {engine}"
    old = yaml11(text)
    if old is not None and same_map(old, engine) and not any(why in str(refusal) for why in REFUSED_TO_BE_SAFE):
        return f"YAML 1.1 and the engine agree, yet the review refuses it: {refusal}"
    return None


def test_where_yaml_1_1_and_the_engine_disagree_the_review_refuses():
    accepted = []
    for name, reading in sorted(READ.items()):
        old, engine = yaml11(reading["yaml"]), reading["config"]
        if old is None or engine is None or same_map(old, engine):
            continue
        try:
            ours(reading["yaml"])
        except yaml.YAMLError:
            continue
        accepted.append(name)
    assert accepted == []


def test_the_corpus_holds_disagreements_and_agreements():
    """The two tests above are not empty: many files are read alike, many are not, some the engine refuses."""
    kinds = {"refused by the engine": 0, "read alike": 0, "read differently": 0}
    for reading in READ.values():
        old, engine = yaml11(reading["yaml"]), reading["config"]
        if engine is None:
            kinds["refused by the engine"] += 1
        elif old is not None and same_map(old, engine):
            kinds["read alike"] += 1
        else:
            kinds["read differently"] += 1
    assert min(kinds.values()) >= 50, kinds


def test_the_review_and_the_deploy_build_the_same_stack_config(tmp_path):
    """``load_stack_file`` (plan, check, render, local up) against ``validate_stack`` of the engine's map
    (pulumi up, as ``from_pulumi_config``): the same StackConfig, or the same problems."""
    compared, problems = 0, []
    for name, reading in sorted(READ.items()):
        if reading["config"] is None:
            continue
        try:
            ours(reading["yaml"])
        except yaml.YAMLError:
            continue  # the reader refuses the file: the tests above
        path = tmp_path / "Pulumi.corpus.yaml"
        path.write_text(reading["yaml"], encoding="utf-8")
        review = _built(load_stack_file, path, "corpus")
        deploy = _built(validate_stack, "corpus", reading["config"], str(path), base_dir=tmp_path)
        compared += 1
        if isinstance(review, StackConfigError) or isinstance(deploy, StackConfigError):
            if not (isinstance(review, StackConfigError) and isinstance(deploy, StackConfigError)):
                problems.append(f"{name}: {review!r} / {deploy!r}")
            elif review.lines != deploy.lines:
                problems.append(f"{name}: {review.lines} / {deploy.lines}")
        elif review != deploy:
            problems.append(f"{name}: two StackConfigs")
    assert problems == [], "\n".join(problems[:20])
    assert compared > 300


def _built(build: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return build(*args, **kwargs)
    except StackConfigError as err:
        return err


@pytest.mark.parametrize("path", sorted(STACKS.glob("Pulumi.*.yaml")), ids=lambda p: p.name)
def test_every_shipped_stack_reads_the_same_both_ways(path):
    stack = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    text = path.read_text(encoding="utf-8")
    assert ours(text) == yaml11(text)
    assert load_stack_file(path) == from_pulumi_config(stack, ours(text))


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("1:30", "1:30 (line 8, column 12) is the integer 90 to YAML 1.1 but text to Pulumi's YAML reader: "
         "quote it ('1:30') for text, or write 90"),
        ("0o17", "0o17 (line 8, column 12) is text to YAML 1.1 but the integer 15 to Pulumi's YAML reader: "
         "quote it ('0o17') for text, or write 15"),
        ("1e3", "1e3 (line 8, column 12) is text to YAML 1.1 but the number 1000 to Pulumi's YAML reader: "
         "quote it ('1e3') for text, or write 1000"),
        (".inf", ".inf (line 8, column 12) is infinite, which Pulumi cannot hand to a program (its config is "
         "JSON): write a number, or quote it for text"),
    ],
)  # fmt: skip
def test_a_disagreement_is_one_line_naming_the_key_and_how_to_write_it(tmp_path, written, message):
    path = tmp_path / "Pulumi.odd.yaml"
    path.write_text(
        "config:\n  gcp:project: acme-ml-dev\n  gcp:zone: us-central2-b\n  multislice:acceleratorType: v4-8\n"
        f"  multislice:training:\n    model: {{d_model: 64}}\n    parallelism: {{ici: {{fsdp: 4}}}}\n"
        f"    steps: {written}\n"
    )
    result = CliRunner().invoke(app, ["plan", "--config-file", str(path)], env={"COLUMNS": "250"}, color=False)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.stderr.splitlines() == [
        f"error: stack 'odd' ({path}) is invalid:",
        f"  multislice:training.steps: {message}",
    ]


@pytest.mark.parametrize(
    ("written", "where"),
    [("yes", "multislice:labels.team"), ("on", "multislice:network.iapSsh"), ("08", "multislice:slices")],
)
def test_yaml_1_1_booleans_and_octal_spellings_are_refused_where_they_are_written(written, where):
    place = {
        "multislice:labels.team": f"  multislice:labels:\n    team: {written}\n",
        "multislice:network.iapSsh": f"  multislice:network:\n    iapSsh: {written}\n",
        "multislice:slices": f"  multislice:slices: {written}\n",
    }[where]
    text = "config:\n  gcp:project: p-1\n  gcp:zone: us-central2-b\n  multislice:acceleratorType: v4-8\n" + place
    with pytest.raises(ScalarError) as err:
        ours(text)
    assert err.value.line.startswith(f"{where}: {written} (line "), err.value.line
    assert f"is the boolean {'false' if written == 'off' else 'true'} to YAML 1.1" in err.value.line or written == "08"


def test_a_misspelt_top_level_key_is_refused_with_the_nearest(tmp_path):
    with pytest.raises(ScalarError) as err:
        ours("config:\n  gcp:project: p-1\nconifg:\n  multislice:slices: 2\n")
    assert err.value.line == "conifg (line 3): Pulumi ignores this top-level key; did you mean config:?"


def test_a_key_written_with_and_without_its_namespace_is_refused():
    with pytest.raises(ScalarError) as err:
        ours("config:\n  slices: 2\n  multislice:slices: 3\n")
    assert err.value.line == (
        "multislice:slices: written twice ('slices' and 'multislice:slices'); Pulumi would keep either: keep one"
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [(1000.0, "1000"), (1.5, "1.5"), (-0.0, "0"), (1e21, "1e+21"), (1e-7, "1e-7"), (0.000001, "0.000001"),
     (1e20, "100000000000000000000"), (123456789.0, "123456789"), (0.1, "0.1"), (-2.5e-300, "-2.5e-300")],
)  # fmt: skip
def test_floats_are_handed_over_in_gos_json_form(value, text):
    assert go_yaml.go_number_text(value) == text


def test_the_oracle_source_is_kept_beside_its_readings():
    oracle = Path(__file__).with_name("engine_oracle.go").read_text(encoding="utf-8")
    assert "gopkg.in/yaml.v3" in oracle and "LoadProjectStackBytes" in oracle


# generated inputs --------------------------------------------------------------------------------

_SCALAR_TEXT = st.text(alphabet="0123456789+-._:eExXoObB ~yYnNtTfF'\"!#&*|>@`%,[]{}aZ\t\u00e9", max_size=14)


@settings(max_examples=120, derandomize=True, deadline=None)
@given(_SCALAR_TEXT)
def test_any_scalar_is_read_as_the_engine_would_or_refused_in_one_line(text):
    """Anything written as a value: a YAML error (one line naming the key when it is a disagreement), or
    the engine's map of text, whose value YAML 1.1 reads alike."""
    stack = f"{REQUIRED}  multislice:labels:\n    team: {text}\n  multislice:slices: {text}\n"
    try:
        engine = ours(stack)
    except ScalarError as err:
        assert "\n" not in err.line and err.line.startswith(("multislice:labels.team: ", "multislice:slices: "))
        return
    except yaml.YAMLError:
        return
    old = yaml11(stack)
    assert old is not None and same_map(old, engine), (old, engine)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.integers(min_value=-(1 << 70), max_value=1 << 70))
def test_decimal_integers_parse_as_go_parses_them(value):
    parsed = go_yaml.go_parse_int(str(value))
    assert parsed == (value if -(1 << 63) <= value < (1 << 63) else None)
    assert go_yaml.go_parse_int(str(value), signed=False) == (value if 0 <= value < (1 << 64) else None)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_s_text_reads_back_as_the_same_float(value):
    text = go_yaml.go_number_text(value)
    assert float(text) == value and "E" not in text and not text.endswith(".")
    assert ("e" in text) == (value != 0 and not 1e-6 <= abs(value) < 1e21)
