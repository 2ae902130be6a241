"""infra.remote.tpu_in_use: a worker's "The TPU is already in use" traceback as one line, every
other line and traceback as it came."""

from __future__ import annotations

from infra.remote.tpu_in_use import TracebackFold

IN_USE = (
    "RuntimeError: Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid 4242. "
    "Not attempting to load libtpu.so in this process."
)


def traceback(prefix: str, last: str) -> list[str]:
    return [
        f"{prefix} Traceback (most recent call last):",
        f'{prefix}   File "<string>", line 1, in <module>',
        f'{prefix}   File "/venv/lib/python3.11/site-packages/jax/_src/xla_bridge.py", line 1120, in devices',
        f"{prefix}     return get_backend(backend).devices()",
        f"{prefix}            ^^^^^^^^^^^^^^^^^^^^",
        f"{prefix} {last}",
    ]


def test_each_worker_s_tpu_in_use_traceback_is_its_exception_line_alone():
    shown: list[str] = []
    fold = TracebackFold(shown.append)
    first, second = traceback("[slice 0 worker 0]", IN_USE), traceback("[slice 1 worker 0]", IN_USE)
    fold("[slice 0 worker 0] starting")
    for a, b in zip(first, second, strict=True):  # the workers' lines interleave
        fold(a)
        fold(b)
    fold.flush()
    assert shown == [
        "[slice 0 worker 0] starting",
        f"[slice 0 worker 0] {IN_USE} (its traceback: this worker's log)",
        f"[slice 1 worker 0] {IN_USE} (its traceback: this worker's log)",
    ]


def test_a_chained_traceback_is_folded_whole_and_a_line_after_it_is_shown():
    shown: list[str] = []
    fold = TracebackFold(shown.append)
    w = "[slice 0 worker 0]"
    lines = [
        *traceback(w, "OSError: [Errno 11] Resource temporarily unavailable"),
        f"{w} ",
        f"{w} During handling of the above exception, another exception occurred:",
        f"{w} ",
        *traceback(w, IN_USE),
    ]
    for line in lines:
        fold(line)
    fold(f"{w} the command goes on")
    assert shown == [f"{w} {IN_USE} (its traceback: this worker's log)", f"{w} the command goes on"]


def test_any_other_traceback_is_shown_as_it_came():
    shown: list[str] = []
    fold = TracebackFold(shown.append)
    lines = traceback("[slice 0 worker 0]", "ZeroDivisionError: division by zero")
    for line in lines:
        fold(line)
    fold.flush()
    assert shown == lines


def test_two_commands_refused_one_after_the_other_are_two_lines():
    shown: list[str] = []
    fold = TracebackFold(shown.append)
    w = "[slice 0 worker 0]"
    for line in [*traceback(w, IN_USE), f"{w} ", *traceback(w, IN_USE), f"{w} done"]:
        fold(line)
    fold.flush()
    assert shown == [f"{w} {IN_USE} (its traceback: this worker's log)"] * 2 + [f"{w} done"]
