"""``multislice local up`` trains on a prepared dataset in the stack's emulated bucket, end to end:
``multislice data prepare --emulated`` writes a BPE dataset (512 tokens) into the bucket, the
emulated VMs read their rows of it by ranged reads with the manifest's vocabulary, slice 1 is
killed at step 8, and the run resumes and completes: every recomputed step bit-identical to its
first computation, every step within float32 reduction-order noise of an uninterrupted run in
one process (1 × 8 devices instead of 2 × 4, as tests/local/test_faults_emulation.py compares).

One emulation (about a minute on 2 cores)."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import load_stack_file
from infra.local import gcs
from tests.local.test_faults_emulation import STACK, local_up, state_dir  # noqa: F401 (the fixture)
from tests.training.test_prepare import corpus
from training import train
from training.cluster import ClusterIdentity
from training.run_dir import RunDir
from training.run_log import read_records


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two boots of two VMs; a loaded 2-core machine takes minutes per boot
def test_local_up_trains_on_a_prepared_dataset_through_a_kill(state_dir, tmp_path_factory, monkeypatch):  # noqa: F811
    stack_file = state_dir / "Pulumi.emutokens.yaml"
    document = yaml.safe_load(STACK.read_text())
    bucket = f"{document['config']['gcp:project']}-emutokens-ckpt"
    dataset = f"gs://{bucket}/datasets/stdlib-bpe512"
    document["config"]["multislice:training"]["data"] = {"source": dataset}
    stack_file.write_text(yaml.safe_dump(document))
    config = load_stack_file(stack_file)
    assert config.bucket_name == bucket and config.training.model.vocab_size is None

    monkeypatch.setenv("MULTISLICE_STATE_DIR", str(state_dir))
    text = corpus(tmp_path_factory.mktemp("text"), files=40)
    prepared = CliRunner().invoke(
        app,
        ["data", "prepare", text, dataset, "--tokenizer", "bpe", "--vocab-size", "512", "--shard-mb", "0.2"]
        + ["--emulated", "--config-file", str(stack_file)],
        env={"COLUMNS": "250"},
    )
    assert prepared.exit_code == 0, prepared.output

    summary, stdout = local_up(state_dir, "--kill", "1@8", stack=stack_file)
    assert summary["complete"] is True and summary["restarts"] == 1, stdout
    console = "".join(p.read_text() for p in (state_dir / "emutokens" / "logs").glob("slice-*-worker-*.log"))
    assert console.count(f"data {dataset}: prepared dataset, tokenizer bpe (512 ids, uint16)") >= 4  # 2 VMs × 2 boots

    paths = (state_dir / "emutokens" / "gcs", state_dir / "reader.log")
    with gcs.clients_pointed_at(*paths) as stored:
        assert stored
        records = [(r["step"], r["loss"]) for r in read_records(RunDir(config.run_dir), "metrics") if "loss" in r]
        reference_config = type(config.training).model_validate(
            {
                **config.training.model_dump(),
                "parallelism": {"ici": {"data": 2, "fsdp": 4, "tensor": 1}, "dcn": {"data": 1, "fsdp": 1, "tensor": 1}},
            }
        )
        reference_dir = tmp_path_factory.mktemp("reference") / "run"
        result = train.run(reference_config, str(reference_dir), ClusterIdentity.single_process())
        assert result.exit_code == train.EXIT_COMPLETE
    reference = {r["step"]: r["loss"] for r in read_records(RunDir(str(reference_dir)), "metrics") if "loss" in r}
    assert {step for step, _ in records} == set(range(1, 25))
    by_step: dict[int, set[float]] = {}
    for step, loss in records:
        by_step.setdefault(step, set()).add(loss)
    assert all(len(losses) == 1 for losses in by_step.values()), by_step  # recomputed steps: bit-identical
    assert all(loss == pytest.approx(reference[step], rel=1e-5) for step, loss in records)
