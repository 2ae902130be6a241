"""infra.planner: the plan of a stack, its ``--json`` document, and ``multislice plan``."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra import planner
from infra.cli import app
from infra.config import load_stack, load_stack_file, validate_stack
from infra.planner import result
from tests.fakes.pulumi_program import stack_map
from tests.helpers.datasets import VOCAB, prepared
from tests.planner.stacks import STACKS, stack
from training.model.transformer import param_count


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_shipped_stacks_plan(name):
    config = load_stack(name, STACKS)
    p = planner.plan(config)
    assert p.chips == config.slices * config.accelerator.chips
    assert p.hosts == config.total_workers
    assert p.memory.fits
    assert p.dcn.tokens_per_replica == config.training.global_batch_tokens / config.training.parallelism.dcn.data
    assert p.recommendations[0].startswith("dcn tensor parallelism is 1")
    assert (len(planner.advisories(config)) > 0) == p.dcn.dcn_bound


def test_plan_describes_the_stack():
    config = stack(
        "v4-16",
        slices=4,
        training={
            "global_batch_size": 64,
            "parallelism": {"ici": {"fsdp": 4, "tensor": 2}, "dcn": {"data": 2, "fsdp": 2}},
        },
    )
    p = planner.plan(config)
    assert (p.stack, p.accelerator_type, p.generation) == ("t", "v4-16", "v4")
    assert (p.slices, p.chips_per_slice, p.chips, p.hosts_per_slice, p.hosts, p.chips_per_host) == (4, 8, 32, 2, 8, 4)
    assert p.mesh == {
        "data": {"dcn": 2, "ici": 1, "size": 2},
        "fsdp": {"dcn": 2, "ici": 4, "size": 8},
        "tensor": {"dcn": 1, "ici": 2, "size": 2},
    }
    assert p.parameters == param_count(config.training.model, config.training.vocab_size)
    assert (p.sequence_length, p.global_batch_size, p.global_batch_tokens) == (1024, 64, 64 * 1024)
    assert p.memory == planner.memory_per_chip(config.training, 32 * 2**30)
    assert p.dcn == planner.dcn_check(config.accelerator, config.training.parallelism, 64 * 1024)
    assert all(
        planner.MULTISLICE_OVERVIEW in p.sources[key] for key in ("arithmetic_intensity", "parallelism_guidance")
    )
    assert "arXiv:2205.05198" in p.sources["activations"]


def reference_json(p: planner.Plan) -> dict:
    """The ``--json`` document written out by hand (it was, before it was made from the
    dataclass fields): every key and value must stay. Token counts say per replica or global
    and the HBM estimate and capacity have distinct keys."""
    dcn, mem = p.dcn, p.memory
    return {
        "stack": p.stack,
        "accelerator_type": p.accelerator_type,
        "generation": p.generation,
        "slices": p.slices,
        "chips_per_slice": p.chips_per_slice,
        "chips": p.chips,
        "hosts_per_slice": p.hosts_per_slice,
        "hosts": p.hosts,
        "chips_per_host": p.chips_per_host,
        "mesh": {
            axis: {
                "dcn": getattr(p.parallelism.dcn, axis),
                "ici": getattr(p.parallelism.ici, axis),
                "size": getattr(p.parallelism.dcn, axis) * getattr(p.parallelism.ici, axis),
            }
            for axis in ("data", "fsdp", "tensor")
        },
        "parameters": p.parameters,
        "sequence_length": p.sequence_length,
        "global_batch_size": p.global_batch_size,
        "global_batch_tokens": p.global_batch_tokens,
        "dcn_replicas": dcn.replicas,
        "tokens_per_replica": dcn.tokens_per_replica,
        "arithmetic_intensity": dcn.arithmetic_intensity,
        "peak_flops_per_chip": dcn.peak_flops_per_chip,
        "dcn_bits_per_second_per_host": dcn.dcn_bits_per_second_per_host,
        "dcn_bits_per_parameter": dcn.bits_per_parameter,
        "operational_intensity": dcn.operational_intensity,
        "min_tokens_per_replica": dcn.min_tokens_per_replica,
        "recommended_tokens_per_replica": dcn.recommended_tokens_per_replica,
        "min_global_batch_tokens": None if dcn.replicas < 2 else dcn.min_tokens_per_replica * dcn.replicas,
        "recommended_global_batch_tokens": None
        if dcn.replicas < 2
        else dcn.recommended_tokens_per_replica * dcn.replicas,
        "safety_margin": planner.SAFETY_MARGIN,
        "dcn_bound": dcn.dcn_bound,
        "meets_dcn_margin": dcn.meets_margin,
        "hbm_estimated_bytes_per_chip": mem.parameters + mem.gradients + mem.optimizer_state + mem.activations,
        "hbm_capacity_bytes_per_chip": mem.capacity,
        "hbm_fraction": mem.total / mem.capacity,
        "fits_in_hbm": mem.total <= mem.capacity,
        "memory_bytes_per_chip": {
            "parameters": mem.parameters,
            "gradients": mem.gradients,
            "optimizer_state": mem.optimizer_state,
            "activations": mem.activations,
        },
        "recommendations": list(p.recommendations),
        "sources": dict(p.sources),
        "dcn_min_batch_in_hbm": None if p.dcn_batch is None else dcn_batch_json(p.dcn_batch),
        "capacity_plan": p.capacity,
        "apis": list(p.apis),
        "elastic": None if p.elastic is None else elastic_json(p.elastic),
    }


def elastic_json(plan) -> dict:
    return {
        "counts": [
            {
                "slices": c.slices,
                "dcn_data": c.dcn_data,
                "microbatches": c.microbatches,
                "microbatch_rows": c.microbatch_rows,
                "chips": c.chips,
                "peak_tokens_per_s": c.peak_tokens_per_s,
            }
            for c in plan.counts
        ],
        "shrink_after_s": plan.shrink_after_s,
        "grow_after_s": plan.grow_after_s,
        "min_slices": plan.min_slices,
    }


def dcn_batch_json(fit) -> dict:
    def option(o) -> dict:
        return {
            "remat": o.remat,
            "microbatches": o.microbatches,
            "estimate_bytes_per_chip": o.estimate_bytes_per_chip,
            "fits": o.fits,
        }

    return {
        "global_batch_size": fit.global_batch_size,
        "per_replica_batch": fit.per_replica_batch,
        "at_stack_settings": option(fit.at_stack_settings),
        "options": [option(o) for o in fit.options],
        "choice": None if fit.choice is None else option(fit.choice),
    }


@pytest.mark.parametrize(
    "config",
    [
        load_stack("dev", STACKS),
        load_stack("prod", STACKS),
        stack(slices=1),
        stack(
            slices=4,
            training={"global_batch_size": 400, "parallelism": {"ici": {"fsdp": 4}, "dcn": {"data": 2, "fsdp": 2}}},
        ),
    ],
    ids=["dev", "prod", "one-slice", "dcn-fsdp"],
)
def test_json_keeps_every_key_and_value(config):
    p = planner.plan(config)
    document = p.to_json()
    assert document == reference_json(p)
    assert json.loads(json.dumps(document)) == document  # JSON-ready: no tuples, no models


def test_json_is_made_from_the_dataclass_fields():
    """A field added to a plan's dataclass appears in ``--json`` under its metadata key,
    nested by a dotted key; a field mapped to None stays out."""

    @dataclasses.dataclass(frozen=True)
    class Extra:
        a: int
        b: int = dataclasses.field(metadata={"json": "group.b"})
        c: int = dataclasses.field(metadata={"json": None})

    @dataclasses.dataclass(frozen=True)
    class Outer:
        x: str
        nested: Extra = dataclasses.field(metadata={"json": ""})
        inner: Extra = dataclasses.field(metadata={"json": "inner"})
        items: tuple[int, ...] = ()

    document = result._json_document(Outer("x", Extra(1, 2, 3), Extra(4, 5, 6), (7, 8)))
    assert document == {"x": "x", "a": 1, "group": {"b": 2}, "inner": {"a": 4, "group": {"b": 5}}, "items": [7, 8]}

    @dataclasses.dataclass(frozen=True)
    class Clash:
        a: int
        nested: Extra = dataclasses.field(metadata={"json": ""})

    with pytest.raises(ValueError, match="'a'"):
        result._json_document(Clash(0, Extra(1, 2, 3)))


# --- the command -----------------------------------------------------------------------------

runner = CliRunner()


def write_stack(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load((STACKS / "Pulumi.dev.yaml").read_text())
    config = copy.deepcopy(data["config"])
    edit(config)
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda c: c.update({"multislice:acceleratorType": "v4-12"}), "multislice:acceleratorType"),
        (lambda c: c["multislice:training"]["parallelism"]["ici"].update({"fsdp": 2}), "parallelism.ici"),
        (lambda c: c.update({"multislice:slices": 3}), "parallelism.dcn"),
        (lambda c: c["multislice:training"].update({"global_batch_size": 12}), "global_batch_size"),
        (lambda c: c["multislice:training"].update({"sequence_length": 0}), "sequence_length"),
        (lambda c: c["multislice:training"]["parallelism"]["ici"].update({"data": -1}), "parallelism.ici.data"),
        (lambda c: c.update({"multislice:slices": 0}), "multislice:slices"),
        (lambda c: c["multislice:training"]["model"].update({"preset": "llama-9b"}), "model.preset"),
        (lambda c: c["multislice:training"]["model"].update({"n_kv_heads": 3}), "model.n_kv_heads"),
        (lambda c: c["multislice:training"]["model"].update({"attention": "splash"}), "model.attention"),
        (lambda c: c["multislice:training"]["model"].update({"attention": "cudnn"}), "model.attention"),
        (lambda c: c["multislice:training"].update({"microbatches": 3}), "multislice:training.microbatches"),
        (lambda c: c["multislice:training"]["model"].update({"vocab_size": 100}), "model.vocab_size"),
    ],
)
def test_cli_bad_stack_is_one_clear_error_naming_the_key(tmp_path, edit, key):
    result = runner.invoke(app, ["plan", "--config-file", str(write_stack(tmp_path, edit))])
    assert result.exit_code == 2
    assert "error:" in result.output and key in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # typer.Exit, not a crash


def test_cli_plan_json_has_the_documented_keys():
    result = runner.invoke(app, ["plan", "--stack", "staging", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key, kind in {
        "dcn_bound": bool,
        "min_tokens_per_replica": float,
        "min_global_batch_tokens": float,
        "operational_intensity": float,
        "arithmetic_intensity": float,
        "hbm_estimated_bytes_per_chip": int,
        "hbm_capacity_bytes_per_chip": int,
        "fits_in_hbm": bool,
        "global_batch_tokens": int,
    }.items():
        assert isinstance(data[key], kind), key
    assert data["mesh"]["fsdp"] == {"dcn": 1, "ici": 16, "size": 16}
    assert (data["chips"], data["hosts"], data["slices"]) == (32, 8, 2)
    assert data["arithmetic_intensity"] == pytest.approx(22_000)
    assert data == planner.plan(load_stack("staging", STACKS)).to_json()


def test_cli_plan_human_output(tmp_path):
    result = runner.invoke(app, ["plan", "--config-file", str(STACKS / "Pulumi.dev.yaml")])
    assert result.exit_code == 0, result.output
    for text in ("stack dev", "mesh", "memory per chip", "22,000 FLOP/bit", "DCN-bound", "recommendations", "sources"):
        assert text in result.output


def test_dev_json_names_each_quantity_once_with_its_own_source():
    """dev (2 × v4-8, 16 sequences × 128 tokens): each token count is per replica or global
    and has one key; the HBM estimate and the HBM capacity have separate keys and sources
    (the estimate's is the memory model, not the catalog's capacity row). Values from the
    overview's arithmetic: AI = 4 × 275e12 / 50e9, minimum = AI × 32 / 4 per replica."""
    result = runner.invoke(app, ["plan", "--stack", "dev", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (
        "hbm_bytes_per_chip" not in data
        and "hbm_capacity_bytes" not in data
        and "min_batch_tokens" not in data
        and "hbm_bytes_per_chip" not in data["sources"]
    )
    for key in data:
        if "tokens" in key:
            assert key.endswith("_per_replica") or "global" in key, key
    minimum = 4 * 275e12 / 50e9 * 32 / 4
    assert data["min_tokens_per_replica"] == pytest.approx(minimum)
    assert data["min_global_batch_tokens"] == pytest.approx(2 * minimum)
    assert data["recommended_tokens_per_replica"] == pytest.approx(2 * minimum)
    assert data["recommended_global_batch_tokens"] == pytest.approx(4 * minimum)
    assert (data["global_batch_tokens"], data["tokens_per_replica"]) == (16 * 128, 16 * 128 / 2)
    parts = data["memory_bytes_per_chip"]
    assert data["hbm_estimated_bytes_per_chip"] == sum(parts.values())
    assert data["hbm_capacity_bytes_per_chip"] == 32 * 2**30
    sources = data["sources"]
    v4 = load_stack("dev", STACKS).accelerator.generation
    assert sources["hbm_capacity_bytes_per_chip"] == v4.sources["hbm_bytes_per_chip"]
    assert "HBM" in sources["hbm_capacity_bytes_per_chip"]
    estimate = sources["hbm_estimated_bytes_per_chip"]
    assert "capacity" not in estimate and "cloud.google.com/tpu/docs/v4" not in estimate
    assert "infra/planner/memory.py" in estimate and "optax" in estimate


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_cli_plan_of_a_command_stack_says_the_trainer_checks_do_not_apply(extra):
    """The plan models the bundled trainer; a stack running its own command gets no trainer numbers."""
    stack = Path(__file__).parents[1] / "stacks" / "Pulumi.emu-command.yaml"
    result = runner.invoke(app, ["plan", "--config-file", str(stack), *extra])
    assert result.exit_code == 0, result.output
    assert "runs its own command (multislice:workload)" in " ".join(result.output.split())
    assert "parameters" not in result.output and "memory per chip" not in result.output


# --- a prepared dataset's vocabulary (infra.config.dataset) ------------------------------------


@pytest.fixture(scope="module")
def bpe_dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("dataset")
    return prepared(str(root / "bpe"), root / "text")


def on_dataset(source: str, **model):
    def edit(config):
        config["multislice:training"]["data"] = {"source": source}
        config["multislice:training"]["model"].update(model)

    return edit


def test_cli_plan_prices_the_vocabulary_of_the_stacks_dataset(tmp_path, bpe_dataset):
    path = write_stack(tmp_path, on_dataset(bpe_dataset))
    result = runner.invoke(app, ["plan", "--config-file", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    model = load_stack_file(path, "dev").training.model
    assert model.vocab_size is None
    assert data["parameters"] == param_count(model, VOCAB) != param_count(model, 256)  # the manifest's, not bytes'
    assert data["sources"]["vocab_size"].startswith(f"{VOCAB} ids: {bpe_dataset}/manifest.json")
    human = runner.invoke(app, ["plan", "--config-file", str(path)])
    assert human.exit_code == 0 and f"{param_count(model, VOCAB):,} parameters" in human.output


def test_cli_plan_refuses_a_vocabulary_smaller_than_the_datasets(tmp_path, bpe_dataset):
    result = runner.invoke(
        app, ["plan", "--config-file", str(write_stack(tmp_path, on_dataset(bpe_dataset, vocab_size=256)))]
    )
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    text = " ".join(result.output.split())
    assert "error:" in text and "multislice:training.model.vocab_size: 256 is smaller than" in text
    assert f"({VOCAB} ids in its manifest.json)" in text and "Traceback" not in text


def test_cli_plan_warns_once_when_the_datasets_manifest_cannot_be_read(tmp_path):
    source = str(tmp_path / "not-yet")
    result = runner.invoke(app, ["plan", "--config-file", str(write_stack(tmp_path, on_dataset(source))), "--json"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"multislice:training.data.source {source}" in warnings[0], result.stderr
    assert "vocab_size" not in json.loads(result.stdout)["sources"]


def test_the_plan_names_the_apis_each_backend_enables():
    # Every stack's APIs, then its backend's: the Cloud TPU API for a queued resource, the GKE API for
    # a cluster, none more on Compute Engine (GKE's TPU pages: "Enable the Google Kubernetes Engine API").
    from tests.helpers.compute_engine import ce_map

    common = ["compute", "storage", "iam", "cloudresourcemanager", "logging", "monitoring"]
    dev = validate_stack("dev", stack_map("dev"), "test")
    compute_engine = validate_stack("dev", ce_map("v5p-16"), "test")
    gke = validate_stack("dev", ce_map("v5p-16") | {"multislice:backend": "gke"}, "test")
    for config, own in ((dev, ["tpu"]), (compute_engine, []), (gke, ["container"])):
        assert [api.removesuffix(".googleapis.com") for api in planner.plan(config).apis] == common + own
