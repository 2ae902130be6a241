"""Every JobSet the program can make is one JobSet v0.10.1's CRD accepts whole: its
``openAPIV3Schema`` (tests/data/jobset-v0.10.1, with its source and licence) judges each field, as the
API server would before pruning what it does not know (tests/helpers/openapi_schema.py).

The stacks cover each capacity mode, one slice and several, TPU7x, and a workload command with its
own environment. A copy with one field misspelt, one enum value JobSet does not have, and one rule
without its required name each fail.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from infra import startup
from infra.backends.gke.program import run_jobset
from infra.config import validate_stack
from tests.helpers.compute_engine import ce_map
from tests.helpers.gke import gke_map
from tests.helpers.openapi_schema import problems

SCHEMA = json.loads((Path(__file__).parents[2] / "data" / "jobset-v0.10.1" / "openapi-v3-schema.json").read_text())


def gke(values: dict[str, Any]) -> dict[str, Any]:
    return values | {"multislice:backend": "gke"}


#: Stacks whose JobSets differ: capacity, slices, generation, a command's environment.
STACKS: dict[str, dict[str, Any]] = {
    "spot, 2 slices": gke_map(2, "spot"),
    "on-demand, 1 slice": gke_map(1, "on-demand"),
    "reserved, 3 slices": gke_map(3, "reserved", **{"multislice:reservationName": "tpu-v4-pool"}),
    "flex-start, 1 slice": gke(ce_map("v5p-16", slices=1, capacity="flex-start"))
    | {"multislice:gke": {"maxRunDuration": "3d"}},
    "tpu7x, 2 slices": gke(ce_map("tpu7x-16")),
    "with its own env": {key: value for key, value in gke_map(2, "spot").items() if key != "multislice:training"}
    | {
        "multislice:workload": {
            "command": ["python", "-c", "pass"],
            "steps": 100,
            "env": {"XLA_FLAGS": "--xla_dump_to=/tmp/d"},
        }
    },
}


@pytest.fixture(scope="module")
def jobsets() -> dict[str, dict[str, Any]]:
    made = {}
    for name, values in STACKS.items():
        config = validate_stack("dev", values, "test")
        made[name] = run_jobset(config, startup.render(config))
    return made


@pytest.mark.parametrize("name", list(STACKS))
def test_every_jobset_the_program_makes_is_one_jobset_accepts(jobsets, name):
    assert problems(SCHEMA, jobsets[name]) == []


def test_the_stacks_reach_what_differs(jobsets):
    jobs = {name: made["spec"]["replicatedJobs"][0] for name, made in jobsets.items()}
    assert {job["replicas"] for job in jobs.values()} == {1, 2, 3}
    assert jobs["tpu7x, 2 slices"]["template"]["spec"]["parallelism"] == 2
    env = jobs["with its own env"]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "XLA_FLAGS", "value": "--xla_dump_to=/tmp/d"} in env


def test_a_broken_copy_fails(jobsets):
    made = jobsets["spot, 2 slices"]
    misspelt = copy.deepcopy(made)
    misspelt["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["toleration"] = []
    assert problems(SCHEMA, misspelt) == [
        "spec.replicatedJobs[0].template.spec.template.spec.toleration: unknown field (the API server would prune it)"
    ]
    unknown_action = copy.deepcopy(made)
    unknown_action["spec"]["failurePolicy"]["rules"][0]["action"] = "FailJob"
    (problem,) = problems(SCHEMA, unknown_action)
    assert problem.startswith("spec.failurePolicy.rules[0].action: 'FailJob' is not one of ['FailJobSet'")
    nameless = copy.deepcopy(made)
    del nameless["spec"]["failurePolicy"]["rules"][0]["name"]
    assert problems(SCHEMA, nameless) == ["spec.failurePolicy.rules[0]: required field 'name' missing"]
    wrong_type = copy.deepcopy(made)
    wrong_type["spec"]["replicatedJobs"][0]["replicas"] = "2"
    assert problems(SCHEMA, wrong_type) == ["spec.replicatedJobs[0].replicas: expected an integer, got '2'"]
