"""training.checkpoint.manager: every message about a checkpoint names its step and path and quotes
the error without object reprs or TensorStore spec dumps. A real damaged
checkpoint (two steps of a tiny array tree, the newer one's OCDBT manifest overwritten) and a
stand-in manager whose error carries a bound-method repr."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.helpers.checkpoint_errors import REPR, StandInManager
from training.checkpoint import manager as checkpointing
from training.config import TrainConfig
from training.run_dir import RunDir

# A failed orbax read leaves asyncio tasks whose exceptions nobody retrieves (see tests/training/test_train.py).
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
logging.getLogger("asyncio").disabled = True


class Store:
    def read(self):  # a method whose bound repr ends up in an error message
        return None


def test_error_text_drops_reprs_and_tensorstore_specs():
    err = ValueError(
        f"DATA_LOSS: reading via {Store().read} from {Store()}: bad manifest "
        '[tensorstore_spec=\'{"driver":"zarr","path":"w/"}\'] [tensorstore_spec[1]=\'{"driver":"cast"}\']\nmore'
    )
    assert checkpointing.error_text(err) == (
        f"ValueError: DATA_LOSS: reading via Store.read from {__name__}.Store: bad manifest"
    )


def test_error_text_keeps_other_angle_brackets_and_empty_messages():
    assert checkpointing.error_text(ValueError("size 3 < 4 and 5 > 2")) == "ValueError: size 3 < 4 and 5 > 2"
    assert checkpointing.error_text(ValueError("<unknown> field")) == "ValueError: <unknown> field"
    assert checkpointing.error_text(TimeoutError()) == "TimeoutError"


def test_error_text_keeps_the_start_and_the_innermost_cause_of_a_long_line():
    err = ValueError("DATA_LOSS: " + "Error opening driver: " * 40 + "Error decoding manifest: bad magic")
    text = checkpointing.error_text(err, limit=120)
    assert len(text) <= 120
    assert text.startswith("ValueError: DATA_LOSS: ") and text.endswith("Error decoding manifest: bad magic")
    assert " … " in text


@pytest.fixture
def damaged(tmp_path) -> tuple[object, object, Path]:
    """A manager over checkpoints of steps 1 and 2 of a tiny tree, step 2's manifest
    overwritten; the abstract tree to restore onto; the checkpoints directory."""
    import jax
    import jax.numpy as jnp

    config = TrainConfig.model_validate({"checkpoint": {"interval_steps": 1, "keep": 3, "async_save": False}})
    manager = checkpointing.make_manager(RunDir(str(tmp_path / "run")), config)
    tree = {"w": jnp.arange(8.0), "b": jnp.ones((2, 2))}
    for step in (1, 2):
        checkpointing.save(manager, step, jax.tree.map(lambda x, s=step: x + s, tree))
    manager.wait_until_finished()
    directory = tmp_path / "run" / "checkpoints"
    manifests = [p for p in (directory / "2").rglob("manifest.ocdbt")]
    assert manifests
    for path in manifests:
        path.write_bytes(b"x" * 40)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
    return manager, abstract, directory


def checkpoint_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == checkpointing.__name__]


def test_a_damaged_checkpoint_is_named_by_step_and_path(damaged, caplog):
    manager, abstract, directory = damaged
    caplog.set_level(logging.WARNING, logger=checkpointing.__name__)
    step, _ = checkpointing.restore(manager, abstract, is_writer=True, attempts=1)
    assert step == 1
    messages = checkpoint_messages(caplog)
    newest, older = f"step 2 ({directory / '2'})", f"step 1 ({directory / '1'})"
    (failed,) = [m for m in messages if m.startswith("restoring checkpoint")]
    assert failed.startswith(f"restoring checkpoint {newest} failed (attempt 1/1): ValueError: ")
    (fell_back,) = [m for m in messages if m.startswith("fell back")]
    assert fell_back.startswith(f"fell back to checkpoint {older}: the newer {newest} could not be restored (step 2: ")
    (moved,) = [m for m in messages if m.startswith("moving")]
    assert moved == (
        f"moving unreadable checkpoint {newest} to {directory / '2.unreadable'}; no action needed: kept there for "
        "inspection, out of the run's way"
    )
    assert all(not REPR.search(m) and len(m) < 1200 for m in messages), messages


def test_the_fallback_message_has_no_bound_method_repr(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=checkpointing.__name__)
    manager = StandInManager(tmp_path / "checkpoints", fail={12})
    assert checkpointing.restore(manager, None, is_writer=False, attempts=1) == (8, {"step": 8})
    (fell_back,) = [m for m in checkpoint_messages(caplog) if m.startswith("fell back")]
    assert fell_back == (
        f"fell back to checkpoint step 8 ({tmp_path / 'checkpoints' / '8'}): the newer step 12 "
        f"({tmp_path / 'checkpoints' / '12'}) could not be restored (step 12: KeyError: 'Store.read'); no action "
        "needed: training goes on from it; the newer ones are set aside as <step>.unreadable"
    )
    assert not any(REPR.search(m) for m in checkpoint_messages(caplog))


def test_no_restorable_checkpoint_names_each_step_and_path(tmp_path):
    manager = StandInManager(tmp_path / "checkpoints", fail={8, 12})
    with pytest.raises(checkpointing.CheckpointRestoreError) as err:
        checkpointing.restore(manager, None, is_writer=False, attempts=1)
    message = str(err.value)
    for step in (12, 8):
        assert f"step {step} ({tmp_path / 'checkpoints' / str(step)}): KeyError: 'Store.read'" in message
    assert not REPR.search(message)
