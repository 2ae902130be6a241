"""A worker whose peer died says so in one line (training/peer_loss.py, training.train.main): the
collective's error is the expected consequence, its traceback kept at DEBUG; any other error is a
failure with its traceback, as before."""

from __future__ import annotations

import logging

import pytest

from training import peer_loss, train
from training.cluster import ClusterIdentity
from training.config import TrainConfig

GLOO = (
    "INTERNAL: Gloo AllReduce failed: [external/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[127.0.0.1]:47311\nmore lines of the C++ stack"
)


@pytest.mark.parametrize(
    ("message", "peer"),
    [
        (GLOO, True),
        ("[gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:5000: Connection reset by peer", True),
        ("UNAVAILABLE: The coordination service has shut down", True),
        ("DEADLINE_EXCEEDED: task /job:jax_worker/replica:0/task:1 heartbeat timeout", True),
        ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2 GiB", False),
        ("division by zero", False),
    ],
)
def test_a_peer_s_end_is_told_from_a_fault_of_this_process(message, peer):
    assert peer_loss.is_peer_loss(RuntimeError(message)) is peer


def test_the_cause_chain_is_read():
    try:
        try:
            raise RuntimeError(GLOO)
        except RuntimeError as inner:
            raise ValueError("the step failed") from inner
    except ValueError as outer:
        assert peer_loss.is_peer_loss(outer)


def _identity(processes: int) -> ClusterIdentity:
    return ClusterIdentity(
        worker=0, workers_per_slice=processes, slice_id=0, num_slices=1, coordinator_address="127.0.0.1:1"
    )


@pytest.mark.parametrize(("message", "one_line"), [(GLOO, True), ("division by zero", False)])
def test_main_logs_a_peer_s_end_in_one_line_without_a_traceback(monkeypatch, caplog, message, one_line):
    def run(*_args):
        raise RuntimeError(message)

    monkeypatch.setattr(train, "run", run)
    monkeypatch.setattr(train, "exit_process", lambda code: code)  # main would end the process here
    caplog.set_level(logging.DEBUG, logger="training")
    assert train.main(TrainConfig(), "/nowhere", _identity(2)) == (
        train.EXIT_PEER_LOST if one_line else train.EXIT_FAILED
    )
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    if one_line:  # the peer's end is this process's warning, not its error: the peer's log says why
        assert errors == []
        [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert warning.exc_info is None and "\n" not in warning.getMessage()
        assert warning.getMessage() == (
            "training stopped: another process of the job is gone (INTERNAL: Gloo AllReduce failed: "
            "[external/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:47311); "
            "exiting to restart; no action needed: the job restarts and resumes from its last checkpoint; the peer's "
            "own log says why it ended"
        )
        assert any(r.levelno == logging.DEBUG and r.exc_info for r in caplog.records)  # kept, below WARNING
    else:
        assert len(errors) == 1
        assert errors[0].getMessage() == "training failed" and errors[0].exc_info is not None
