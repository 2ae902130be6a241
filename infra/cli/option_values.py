"""The values of ``multislice``'s options, parsed by one set of rules while the command line is
read (before a command loads a stack or starts anything), and the one ``error:`` line a refused
value prints.

* :class:`Number`: every integer and float option. An integer is ASCII digits; a float is a
  finite decimal number (``inf``, ``nan`` and ``1e999`` are refused: the line says the option
  "must be a finite number of seconds from 1 to …", in the option's unit); each lies in its range,
  named in the refusal and in ``--help``.
* :class:`PathValue`: every path option: not empty, no NUL, within the system's limits on a path.
* :class:`FaultSpec`: ``--kill``/``--preempt``/``--crash`` ``SLICE@STEP`` and ``--withhold SLICE:DURATION`` (or
  ``SLICE:until-step-STEP``),
  their form (the stack's slices and steps are checked once it is loaded), and
  :func:`distinct_withholds`: one ``--withhold`` per slice.
* :class:`Since`: ``--since`` (a duration or an RFC 3339 time).
* :func:`one_stack_source`: ``--stack`` and ``--config-file`` together are refused (each names
  the stack; neither would silently win).

A refusal is an :class:`OptionRefused`; :func:`error_line` words any usage error of the command
line as one line naming the option (:class:`infra.cli.options.ClosedPipeGroup` prints it, exit 2).
tests/cli/test_option_fuzz.py drives every option through these with generated values.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

if TYPE_CHECKING:
    from typer.models import OptionInfo

#: The longest any seconds option may be: 365 days. Past it a timer overflows what ``time.sleep``
#: and ``threading`` take (``inf`` and ``1e300`` seconds once did).
MAX_SECONDS = 365 * 86_400
#: The most bytes a path may have, and a name in it (Linux's PATH_MAX and NAME_MAX).
PATH_MAX = 4096
NAME_MAX = 255

_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: Longer text is no number in any option's range; it is refused before Python converts it.
_MAX_NUMBER_CHARS = 40


class OptionRefused(typer.BadParameter):
    """A value refused while the command line is read: ``problem`` says why, and the error line
    names the option and shows ``value`` (:func:`error_line`); or ``line`` is the whole line."""

    def __init__(self, problem: str, value: Any = None, *, line: str | None = None) -> None:
        super().__init__(line or problem)
        self.problem = problem
        self.value = value
        self.line = line


def _figure(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


@dataclasses.dataclass(frozen=True)
class Number:
    """The rule of a number option, and its parser (typer's ``parser=``): a value in
    ``[low, high]`` (``open_low``/``open_high``: the bound itself excluded), ``whole`` an integer,
    in ``unit`` (``seconds``, ``megabytes``; empty for a count); ``note`` says what ``high`` is."""

    low: float
    high: float
    unit: str = ""
    whole: bool = False
    open_low: bool = False
    open_high: bool = False
    note: str = ""

    def __call__(self, value: Any) -> Any:
        """The number ``value`` (text from the command line, or the option's default) names.

        Raises:
          OptionRefused: not a number of this kind (``inf``, ``nan``, ``1.5`` for a whole number,
            a non-ASCII digit, more than 40 characters), or outside the range.
        """
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str):
            text = value.strip()
            if len(text) <= _MAX_NUMBER_CHARS and text.isascii():
                if self.whole and _WHOLE.fullmatch(text):
                    number = int(text)
                elif not self.whole and _DECIMAL.fullmatch(text):
                    number = float(text)
        if number is None or (self.whole and not isinstance(number, int)) or not math.isfinite(number):
            raise OptionRefused(f"must be {self.describe()}", value)
        below = number <= self.low if self.open_low else number < self.low
        above = number >= self.high if self.open_high else number > self.high
        if below or above:
            raise OptionRefused(f"must be {self.describe()}", value)
        return int(number) if self.whole else float(number)

    def describe(self) -> str:
        """``a finite number of seconds from 1 to 31,536,000 (365 days)``: what the option takes."""
        kind = "a whole number" if self.whole else "a finite number"
        unit = f" of {self.unit}" if self.unit else ""
        note = f" ({self.note})" if self.note else ""
        low, high = _figure(self.low), _figure(self.high)
        if not (self.open_low or self.open_high):
            return f"{kind}{unit} from {low} to {high}{note}"
        lower = f"greater than {low}" if self.open_low else f"at least {low}"
        upper = f"less than {high}" if self.open_high else f"at most {high}"
        return f"{kind}{unit} {lower} and {upper}{note}"

    def range_text(self) -> str:
        """The range as ``--help`` shows it: ``1<=x<=31,536,000``."""
        lower = "<" if self.open_low else "<="
        upper = "<" if self.open_high else "<="
        return f"{_figure(self.low)}{lower}x{upper}{_figure(self.high)}"


def seconds(low: float, high: float = MAX_SECONDS, *, whole: bool = False, note: str | None = None) -> Number:
    """The rule of a seconds option: at least ``low``, at most ``high`` (:data:`MAX_SECONDS`,
    365 days, unless given; ``note`` says what ``high`` is)."""
    if note is None:
        note = "365 days" if high == MAX_SECONDS else ""
    return Number(low, high, "seconds", whole=whole, note=note)


#: The rules several commands share. A slice: a queued resource holds at most 256
#: (:data:`infra.accelerators.MAX_SLICES`); a worker: the catalog's largest slice has 2,304 VMs; a
#: step: ``training.steps`` is at most 100,000,000 (:data:`training.config.MAX_STEPS`). Each
#: command then checks the stack's own slices, workers and steps. tests/cli/test_option_refusals.py
#: keeps these figures in step with their sources.
SLICE = Number(0, 255, whole=True, note="a stack has at most 256 slices")
WORKER = Number(0, 2303, whole=True, note="the largest slice has 2,304 VMs")
STEP = Number(1, 99_999_999, whole=True, note="training.steps is at most 100,000,000")
PORT = Number(1, 65_535, whole=True)


@dataclasses.dataclass(frozen=True)
class PathValue:
    """The parser of a path option: a :class:`~pathlib.Path` the system can name."""

    def __call__(self, value: Any) -> Path:
        """``value`` as a path.

        Raises:
          OptionRefused: empty, holding a NUL, not encodable as a file name, or past
            :data:`PATH_MAX` bytes (a name in it past :data:`NAME_MAX`).
        """
        text = str(value)
        if not text:
            raise OptionRefused("is empty: give a path", value)
        if "\x00" in text:
            raise OptionRefused("holds a NUL character, which no path can", value)
        try:
            encoded = os.fsencode(text)
        except UnicodeEncodeError:
            raise OptionRefused("is not a name this system's file names can hold", value) from None
        if len(encoded) > PATH_MAX:
            raise OptionRefused(f"is {len(encoded):,} bytes, longer than a path may be ({PATH_MAX:,} bytes)", value)
        if (longest := max(len(name) for name in encoded.split(b"/"))) > NAME_MAX:
            raise OptionRefused(
                f"has a name of {longest:,} bytes, longer than a file name may be ({NAME_MAX} bytes)", value
            )
        return Path(text)


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    """The parser of ``--kill``/``--preempt``/``--crash`` (``SLICE@STEP``) and ``--withhold`` (``SLICE:DURATION`` or
    ``SLICE:until-step-STEP``): the value, once its form is checked (:func:`infra.local.faults.fault_shape`,
    :func:`infra.local.withholds.withhold_shape`)."""

    kind: str

    def __call__(self, value: Any) -> str:
        """``value``, unchanged.

        Raises:
          OptionRefused: it is malformed (the line names the option and the form).
        """
        from infra.local import faults, withholds

        try:
            if self.kind == "withhold":
                withholds.withhold_shape(str(value))
            else:
                faults.fault_shape(cast("faults.FaultKind", self.kind), str(value))
        except faults.FaultSpecError as err:
            raise OptionRefused(str(err), value, line=str(err)) from None
        return str(value)


#: The parsers of the path and fault-spec options (one instance each: an option's default is declared once).
PATH = PathValue()
KILL = FaultSpec("kill")
PREEMPT = FaultSpec("preempt")
CRASH = FaultSpec("crash")
WITHHOLD = FaultSpec("withhold")


def distinct_withholds(value: list[str]) -> list[str]:
    """``--withhold``'s callback: the values, when no slice is withheld twice.

    Raises:
      OptionRefused: a second ``--withhold`` of a slice (naming the slice and both values).
    """
    from infra.local import faults, withholds

    try:
        withholds.check_withholds(value)
    except faults.FaultSpecError as err:
        raise OptionRefused(str(err), line=str(err)) from None
    return value


@dataclasses.dataclass(frozen=True)
class Since:
    """The parser of ``--since``: the value, once it names a time (:func:`infra.logs.lines.parse_since`)."""

    def __call__(self, value: Any) -> str:
        """``value``, unchanged.

        Raises:
          OptionRefused: neither a duration nor an RFC 3339 time with its offset, or one that
            reaches back before the year 1.
        """
        from infra.logs.lines import SinceError, parse_since

        try:
            parse_since(str(value))
        except SinceError as err:
            raise OptionRefused(str(err), value, line=str(err)) from None
        except OverflowError:  # past what timedelta or datetime holds (10**5000 seconds: inf)
            raise OptionRefused(
                "reaches back before the year 1; give a shorter duration (30s, 10m, 2h, 1d) "
                "or an RFC 3339 time (2026-11-30T17:00:00Z)",
                value,
            ) from None
        return str(value)


#: The options that name a command's stack: one of them, never both.
STACK_SOURCES = ("stack", "config_file")


def one_stack_source(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """The callback of ``--stack`` and ``--config-file``: ``value``, unless both were given.

    Raises:
      OptionRefused: both were given (the line names both and their values).
    """
    given = {
        name: value if name == param.name else ctx.params.get(name)
        for name in STACK_SOURCES
        if _source(ctx, name) in ("COMMANDLINE", "ENVIRONMENT")
    }
    if len(given) == len(STACK_SOURCES):
        stack, path = given["stack"], given["config_file"]
        raise OptionRefused(
            "both name the stack",
            line=f"--stack {shown(str(stack))} and --config-file {shown(str(path))} both name the stack: give one "
            "(--config-file takes the stack's name from its file name, Pulumi.<stack>.yaml)",
        )
    return value


def _source(ctx: Any, name: str) -> str | None:
    """Where the parameter ``name`` of ``ctx``'s command got its value (``COMMANDLINE``,
    ``ENVIRONMENT``, ``DEFAULT``), or None before it is read."""
    source = ctx.get_parameter_source(name)
    return None if source is None else source.name


def parsed(info: OptionInfo, parser: Any) -> Any:
    """A copy of the option ``info`` (declared elsewhere: the trainer's command line shares it)
    whose value ``parser`` reads, in place of typer's own type and range (``Any``, as
    ``typer.Option`` is typed: a parameter's default)."""
    copied = copy.copy(info)
    copied.parser = parser
    copied.min = copied.max = None
    return copied


def shown(value: str) -> str:
    """A value as an error line quotes it: its repr, cut short past 40 characters."""
    return repr(value) if len(value) <= 40 else f"{value[:20]!r}… ({len(value):,} characters)"


def error_line(error: Exception) -> str:
    """The one line (without ``error:``) that says why the command line was refused: the option,
    the value and the rule for an :class:`OptionRefused`; typer's own message otherwise, on one
    line, with where the options are listed."""
    if isinstance(error, OptionRefused):
        if error.line is not None:
            return _one_line(error.line)
        named = _named(error)
        return _one_line(f"{named} {shown(str(error.value))}: {error.problem}" if error.value is not None else named)
    if type(error) is typer.BadParameter:  # a check of typer's own (a choice, a path that must exist)
        return _one_line(f"{_named(error)}: {error.message}")
    ctx = getattr(error, "ctx", None)
    where = f"; {ctx.command_path} --help lists what it takes" if ctx is not None else ""
    return _one_line(getattr(error, "format_message", error.__str__)()).rstrip(".") + where


def _named(error: typer.BadParameter) -> str:
    """The option (or argument, or environment variable) ``error`` refused a value of."""
    param = error.param
    if param is None:
        return str(error.param_hint or "a value")
    opts = [opt for opt in param.opts if opt.startswith("-")]
    name = max(opts, key=len) if opts else str(param.name).upper()
    envvar = getattr(param, "envvar", None)
    if envvar and error.ctx is not None and param.name and _source(error.ctx, param.name) == "ENVIRONMENT":
        return f"{envvar} ({name})"
    return name


def _one_line(text: str, limit: int = 600) -> str:
    """``text`` on one line: its whitespace runs one space, control characters escaped, cut past ``limit``."""
    text = " ".join(text.split())
    text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return text if len(text) <= limit else f"{text[: limit - 30]}… ({len(text):,} characters)"


def _ranges_in_help() -> None:
    """``--help`` shows a :class:`Number` option's range as typer shows its own (``[1<=x<=65,535]``)."""
    from typer.core import TyperOption

    shown_range = TyperOption._get_number_range_help_str

    def range_help(self):
        rule = self.type_descriptor.parameter_info.parser
        return rule.range_text() if isinstance(rule, Number) else shown_range(self)

    TyperOption._get_number_range_help_str = range_help


_ranges_in_help()
