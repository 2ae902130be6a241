"""training/validation.py: strict config models and their one-line error messages."""

from __future__ import annotations

from typing import Literal

import pydantic
import pytest
from pydantic import model_validator

from training.validation import StrictModel, format_errors, invalid


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


def lines_of(data: dict, prefix: str = "") -> list[str]:
    with pytest.raises(pydantic.ValidationError) as info:
        Outer.model_validate(data)
    return format_errors(info.value, prefix)


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
