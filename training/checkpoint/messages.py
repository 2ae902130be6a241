"""How every message and error about a checkpoint names it (:func:`describe`: its step and
path) and quotes an error (:func:`error_text`: one line, without TensorStore's spec dumps or
Python object reprs); used by training.checkpoint.manager."""

from __future__ import annotations

import re

from etils import epath

from training.checkpoint.orbax_import import ocp

#: TensorStore appends the full JSON spec of the array it failed on to its errors, as
#: ``[tensorstore_spec='{...}']`` (and ``[tensorstore_spec[1]='...']``): kilobytes of driver
#: options that say nothing a reader of the log needs; the path is in the message before it.
#: (Quotes may come escaped, as in a KeyError's message, which is its key's repr.)
_TENSORSTORE_SPEC = re.compile(r"\s*\[tensorstore_spec(?:\[\d+\])?=\\?'.*?\\?'\]")
#: Longest error text a checkpoint message quotes (characters); a longer one keeps its start
#: (the error's kind) and its end (TensorStore's innermost cause), joined by " … ".
ERROR_TEXT_LIMIT = 400


def step_path(manager: ocp.CheckpointManager, step: int) -> str:
    """The directory of checkpoint ``step`` (``<run_dir>/checkpoints/<step>``), as text."""
    return str(epath.Path(manager.directory) / str(step))


def describe(step: int, path: str) -> str:
    """How every log message and error names a checkpoint: ``step 12 (<path>)``."""
    return f"step {step} ({path})"


def _without_reprs(text: str) -> str:
    """``text`` with Python object reprs (``<bound method TensorStore.read of <...>>``,
    ``<tensorstore.Future object at 0x7f...>``) replaced by the name they stand for
    (``TensorStore.read``, ``tensorstore.Future``); other ``<``/``>`` stay as they are."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "<":
            out.append(text[i])
            i += 1
            continue
        depth, j = 0, i
        while j < len(text):
            depth += {"<": 1, ">": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        segment = text[i : j + 1]
        bound = re.match(r"<bound method ([\w.]+) of ", segment)
        obj = re.match(r"<([\w.]+) object at 0x[0-9a-fA-F]+>$", segment)
        match = bound or obj
        if j < len(text) and match:
            out.append(match.group(1))
            i = j + 1
        else:
            out.append("<")
            i += 1
    return "".join(out)


def error_text(err: BaseException, limit: int = ERROR_TEXT_LIMIT) -> str:
    """One line about ``err`` for a checkpoint message: ``Type: first line of the message``,
    without TensorStore's spec annotations or object reprs, at most ``limit`` characters (a
    longer line keeps its start and its end, joined by `` … ``)."""
    message = str(err).strip()
    first = message.splitlines()[0] if message else ""
    text = f"{type(err).__name__}: {_without_reprs(_TENSORSTORE_SPEC.sub('', first)).strip()}".rstrip(": .")
    if len(text) <= limit:
        return text
    keep = (limit - 3) // 2
    return f"{text[:keep]} … {text[-keep:]}"
