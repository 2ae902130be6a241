"""training/validation.py: strict config models and their one-line error messages."""

from __future__ import annotations

from typing import Literal

import pydantic
import pytest
from pydantic import model_validator

from training.config import MAX_STEPS, load_train_config
from training.validation import StrictModel, format_errors, invalid, shorten


class Inner(StrictModel):
    size: int | None = None
    ratio: float = 0.5
    flag: bool = False
    mode: Literal["a", "b"] = "a"

    @model_validator(mode="after")
    def _cross(self) -> Inner:
        if self.size == 3:
            raise invalid("size", "3 is unlucky")
        return self


class Outer(StrictModel):
    inner: Inner = Inner()


def lines_of(data: dict, prefix: str = "", model: type[StrictModel] | None = None) -> list[str]:
    with pytest.raises(pydantic.ValidationError) as info:
        Outer.model_validate(data)
    return format_errors(info.value, prefix, model)


def test_error_lines_name_the_key_path_and_what_is_allowed():
    assert lines_of({"inner": {"mode": "c"}}, "ns:outer") == ["ns:outer.inner.mode: got 'c'; allowed: 'a' or 'b'"]
    assert lines_of({"inner": {"extra": 1}}) == ["inner.extra: unknown key"]
    assert lines_of({"inner": {"size": 3}}) == ["inner.size: 3 is unlucky"]


@pytest.mark.parametrize("key", ["size", "ratio"])
def test_booleans_are_refused_for_numbers_even_in_optional_fields(key):
    assert lines_of({"inner": {key: True}}) == [f"inner.{key}: got true; expected a number, not a boolean"]
    assert Outer.model_validate({"inner": {"flag": True}}).inner.flag is True


def test_models_are_immutable_and_finite():
    outer = Outer()
    with pytest.raises(pydantic.ValidationError):
        outer.inner.ratio = 1.0  # type: ignore[misc]
    assert lines_of({"inner": {"ratio": float("inf")}}) == ["inner.ratio: Input should be a finite number"]


# The trainer's own keys (training.config): typos, implausible sizes, a warmup past the run.


def trainer_lines(data: dict) -> list[str]:
    with pytest.raises(ValueError) as info:
        load_train_config(data)
    return str(info.value).splitlines()[1:]


def test_a_trainer_key_typo_names_the_nearest_key():
    assert trainer_lines({"step": 10}) == ["  step: unknown key (did you mean 'steps'?)"]
    assert trainer_lines({"model": {"dmodel": 64}}) == ["  model.dmodel: unknown key (did you mean 'd_model'?)"]
    assert trainer_lines({"optimizer": {"warmup": 3}}) == [
        "  optimizer.warmup: unknown key (did you mean 'warmup_steps'?)"
    ]
    (line,) = trainer_lines({"checkpoint": {"zzz": 1}})
    assert line == "  checkpoint.zzz: unknown key; allowed keys: 'interval_steps', 'keep', 'async_save'"


def test_without_the_model_an_unknown_key_is_only_named():
    assert lines_of({"inner": {"sise": 1}}) == ["inner.sise: unknown key"]
    assert lines_of({"inner": {"sise": 1}}, model=Outer) == ["inner.sise: unknown key (did you mean 'size'?)"]


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ({"steps": MAX_STEPS + 1}, "steps: Input should be less than or equal to 100000000"),
        ({"sequence_length": (1 << 20) + 1}, "sequence_length: Input should be less than or equal to 1048576"),
        ({"global_batch_size": (1 << 20) + 1}, "global_batch_size: Input should be less than or equal to 1048576"),
        ({"model": {"d_model": 1 << 17, "n_heads": 1}}, "model.d_model: Input should be less than or equal to 65536"),
        ({"model": {"n_layers": 1025}}, "model.n_layers: Input should be less than or equal to 1024"),
        ({"model": {"n_heads": 2048}}, "model.n_heads: Input should be less than or equal to 1024"),
        ({"model": {"d_ff": 1 << 19}}, "model.d_ff: Input should be less than or equal to 262144"),
        (
            {"global_batch_size": 1 << 20, "sequence_length": 1 << 11},
            "global_batch_size: 1048576 sequences × sequence_length 2048 = 2,147,483,648 tokens per step, above the "
            "limit 1,073,741,824 (published runs use tens of millions)",
        ),
        (
            {"steps": 100, "optimizer": {"warmup_steps": 101}},
            "optimizer.warmup_steps: 101 is longer than the run (steps: 100): the learning rate would never reach "
            "its peak; use fewer warmup steps than steps",
        ),
    ],
)
def test_sizes_beyond_any_run_are_refused(data, line):
    assert trainer_lines(data) == [f"  {line}"]


def test_the_default_warmup_is_clamped_for_short_runs_not_refused():
    assert load_train_config({"steps": 5}).optimizer.warmup_steps == 20
    # A config written out with its defaults filled in (train_config.json, render --config) reads back.
    written = load_train_config({"steps": 5}).model_dump(mode="json")
    assert load_train_config(written).optimizer.warmup_steps == 20
    assert load_train_config({"steps": 100, "optimizer": {"warmup_steps": 100}}).steps == 100


def test_values_in_messages_are_shortened():
    assert shorten("x" * 10) == "'xxxxxxxxxx'"
    assert shorten("x" * 500) == "'" + "x" * 198 + "… (502 characters)"
    (line,) = lines_of({"inner": {"mode": "c" * 5000}})
    assert line.startswith("inner.mode: got 'cccc") and "… (5002 characters); allowed: 'a' or 'b'" in line
    assert len(line) < 300
    (line,) = trainer_lines({"data": {"source": "relative/" + "d" * 5000}})
    assert "… (5011 characters) must be 'stdlib'" in line and len(line) < 500
