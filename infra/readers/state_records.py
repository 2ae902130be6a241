"""The records a local run keeps in its state directory, read from their bytes: what the emulator
wrote (``emulator.json``), the deleted queued resource (``deleted.json``) and the stack file a run
was started from (``stack-file``). Where they live and who writes them: :mod:`infra.emulated.state`.

Each reader takes the bytes (or the path, read with :func:`infra.readers.files.read_bounded`: a
special file or one over the record's size is never read) and checks them against what the writer
writes: a record that is not gives :class:`DamagedRecord` with the reason in words, or None where an
unreadable record means "none".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.readers.files import UnreadableFile, read_bounded

#: The most bytes read of ``emulator.json`` (a few hundred per VM), of ``deleted.json`` and of the
#: ``stack-file`` record (a path: PATH_MAX is 4,096 bytes on Linux).
STATE_BYTES = 1 << 20
DELETION_BYTES = 1 << 16
STACK_FILE_RECORD_BYTES = 4096


class DamagedRecord(ValueError):
    """A record that is not what its writer writes; ``why`` says how, in words."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def emulator_state(data: bytes) -> dict[str, Any]:
    """``emulator.json`` (:func:`infra.emulated.state.write_state`) from its bytes.

    Raises:
      DamagedRecord: not UTF-8 JSON, or not an object of the fields and types the writer writes
        (:func:`state_damage`).
    """
    try:
        state = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise DamagedRecord("not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise DamagedRecord(f"not JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except (ValueError, RecursionError):  # an integer past 4,300 digits; nesting past the recursion limit
        raise DamagedRecord("not JSON this code reads") from None
    why = state_damage(state)
    if why is not None:
        raise DamagedRecord(why)
    return state


def deletion_record(path: Path) -> dict[str, Any] | None:
    """``deleted.json`` (:func:`infra.emulated.state.record_deletion`), or None: absent, or not a
    UTF-8 JSON object (the queued resource then counts as not deleted)."""
    try:
        record = json.loads(read_bounded(path, DELETION_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # absent, unreadable, or not UTF-8 JSON
        return None
    return record if isinstance(record, dict) else None


def recorded_stack_file(path: Path) -> Path | None:
    """The stack file named by the ``stack-file`` record at ``path`` (written by ``local up
    --config-file``): None when there is no record, or it names a file that no longer exists.

    Raises:
      DamagedRecord: the record cannot be read (a special file, over 4,096 bytes, the OS's refusal)
        or is not an absolute path in UTF-8 (its reason in words).
    """
    try:
        data = read_bounded(path, STACK_FILE_RECORD_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except UnreadableFile as err:
        raise DamagedRecord(err.why) from None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise DamagedRecord("not UTF-8 text") from None
    if "\0" in text or "\n" in text or not text.startswith("/"):
        raise DamagedRecord(f"{_shown(text)} is not an absolute path")
    recorded = Path(text)
    try:
        return recorded if recorded.is_file() else None
    except OSError as err:  # a name too long, a loop of links
        raise DamagedRecord(f"it names {_shown(text)}, which cannot be looked up: {err.strerror or err}") from None


def _shown(value: Any) -> str:
    """``value`` as a message shows it: its repr, cut after 40 characters (json.loads reads no
    integer past 4,300 digits, so the repr exists)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def _count(value: Any) -> bool:
    """An integer in [0, 2**31), as a pid or an index is recorded (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


def state_damage(state: Any) -> str | None:
    """Why ``state`` (``emulator.json`` as parsed) is not what :func:`write_state` writes, or None."""
    if not isinstance(state, dict):
        return f"a JSON {type(state).__name__}, not an object"
    for key in ("pid", "pgid"):
        if key in state and not _count(state[key]):
            return f"its {key} is {_shown(state[key])}, not a process id"
    start = state.get("pid_start")
    if start is not None and (isinstance(start, bool) or not isinstance(start, (int, float))):
        return f"its pid_start is {_shown(start)}, not a number"
    for key in ("stack", "emulation_id", "storage_url", "tpu_api_url"):
        if state.get(key) is not None and not isinstance(state[key], str):
            return f"its {key} is {_shown(state[key])}, not a string"
    vms = state.get("vms") or []
    if not isinstance(vms, list):
        return f"its vms are {_shown(vms)}, not a list"
    for vm in vms:
        if not isinstance(vm, dict) or not all(_count(vm.get(key)) for key in ("slice", "worker")):
            return f"its vms hold {_shown(vm)}, not a VM's record"
        if vm.get("pgid") is not None and not _count(vm["pgid"]):
            return f"its vms hold a pgid {_shown(vm['pgid'])}, not a process id"
    return None
