"""How a warning is worded: what happened, then whether its reader must act. The one way every
warning of the project is made (:func:`act`, :func:`no_action`) and handed on (:func:`emit`).

Every warning ends with exactly one of:

* ``; action needed: <what to do>``: the reader must act (set a named key, run a named command);
* ``; action needed if <condition>: <what to do>``: only in that case;
* ``; no action needed: <why>``: nothing to do, and why not.

So a reader never has to guess whether a warning is theirs to fix. The ``multislice`` commands print
warnings as ``warning: <text>`` lines (:data:`PREFIX`, :func:`as_line`), once per command run
(``infra.cli.options.print_warning``); the Pulumi program hands them to ``pulumi.log.warn``
(``pulumi preview``/``up`` print them, ``multislice check`` and ``diff`` too); the trainer logs
them at level WARNING. The VMs' shell scripts write the same endings by hand.
tests/training/test_warning_text.py holds every warning of the code to this.

A warning is a :class:`WarningText`; only :func:`act` and :func:`no_action` make one, and the emitting
functions take nothing else (``basedpyright`` says so where one is given a plain ``str``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: What a printed warning line starts with (``warning: <text>``).
PREFIX = "warning:"
#: The endings, as they appear in a warning's text.
ACTION_NEEDED = "action needed"
NO_ACTION_NEEDED = "no action needed"
#: A text that says whether to act: one of the endings, after "; ", followed by its reason or action.
_ENDING = re.compile(rf"; (?:{NO_ACTION_NEEDED}|{ACTION_NEEDED}(?: if [^:]+)?): \S")


class WarningText(str):
    """A warning worded by :func:`act` or :func:`no_action` (the only ways to make one)."""

    __slots__ = ()


def _checked(what: str, **parts: str | None) -> None:
    for name, text in {"what": what, **parts}.items():
        if text is not None and not text.strip():
            raise ValueError(f"a warning's {name} is empty")
    if says_whether_to_act(what):
        raise ValueError(f"the warning already says whether to act: {what!r}")


def act(what: str, action: str, *, when: str | None = None) -> WarningText:
    """The warning that ``what`` happened and that its reader must do ``action`` (an imperative that
    names the key to set or the command to run), or only ``when`` that is so.

    Raises:
      ValueError: a part is empty, or ``what`` already says whether to act.
    """
    _checked(what, action=action, when=when)
    need = ACTION_NEEDED if when is None else f"{ACTION_NEEDED} if {when}"
    return WarningText(f"{what}; {need}: {action}")


def no_action(what: str, why: str) -> WarningText:
    """The warning that ``what`` happened and that its reader need not act, ``why`` not.

    Raises:
      ValueError: a part is empty, or ``what`` already says whether to act.
    """
    _checked(what, why=why)
    return WarningText(f"{what}; {NO_ACTION_NEEDED}: {why}")


def says_whether_to_act(text: str) -> bool:
    """Whether ``text`` has one of the endings (a :class:`WarningText`, or a warning that came back as
    plain text: a log record, a VM's line)."""
    return _ENDING.search(text) is not None


def as_line(warning: WarningText) -> str:
    """The printed line of ``warning``: ``warning: <text>``."""
    return f"{PREFIX} {warning}"


def emit(warning: WarningText, to: Callable[[str], object]) -> None:
    """Hand ``warning`` to ``to``: ``pulumi.log.warn``, a logger's ``warning``, a reporter of lines
    (given :func:`as_line`'s), the one way the code emits a warning."""
    to(warning)
