"""infra/vm_contract.py: the names ``pulumi up`` and a TPU VM agree on are declared once.

Each name a shell template (infra/startup/*.sh, *.sh.in) spells is one the contract declares,
and each one the contract declares for the scripts is spelled where a template uses it; the
trainer (training/, which never imports infra/) spells the names it reads the same way; and no
module of infra/ spells a contract value outside the contract."""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path

import pytest

from infra import vm_contract as contract
from infra.backends.registry import SPECS
from infra.backends.spec import IDENTITY_SOURCES
from infra.startup import boot as boot_module, templates

ROOT = Path(__file__).resolve().parents[2]
STARTUP = ROOT / "infra" / "startup"
TEMPLATES = (
    templates.TEMPLATE_RESOURCE,
    templates.BOOT_RESOURCE,
    templates.TRAINER_RESOURCE,
    templates.DELETE_ON_COMPLETE_RESOURCE,
    templates.RELEASE_WATCH_RESOURCE,
)
#: Each backend's identity phase of the boot (``identity.sh`` of a release, which boot.sh sources).
IDENTITY_PHASES = {
    spec.name: Path(str(resources.files(type(spec).__module__.rpartition(".")[0]).joinpath(spec.boot_identity)))
    for spec in SPECS.values()
}
#: The backends' slice watches (``BackendSpec.slice_watch``), templates of the release too.
SLICE_WATCHES = [
    path
    for spec in SPECS.values()
    if (
        path := Path(str(resources.files(type(spec).__module__.rpartition(".")[0]).joinpath("slice_watch.sh")))
    ).is_file()
]
#: Environment variable names as the templates spell them (ours, and the two Google ones).
ENV_NAME = re.compile(r"\b(MULTISLICE_[A-Z0-9_]+|GCE_METADATA_IP|STORAGE_EMULATOR_HOST)\b")
#: The bootstrap's quoted heredoc delimiter: a word of bash, not an environment variable.
HEREDOC_DELIMITER = "MULTISLICE_RELEASE"


def template_text(name: str) -> str:
    """A template's whole text (both files of boot.sh.in: templates.JOINED)."""
    return templates.template(name)


def every_template_text() -> list[str]:
    """The startup templates', the backends' identity phases' and their slice watches' text."""
    return [template_text(t) for t in TEMPLATES] + [
        path.read_text(encoding="utf-8") for path in [*IDENTITY_PHASES.values(), *SLICE_WATCHES]
    ]


def training_source() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "training").glob("*.py")))


def test_every_environment_name_a_template_uses_is_declared_and_each_declared_one_is_used():
    spelled = {name for text in every_template_text() for name in ENV_NAME.findall(text)} - {HEREDOC_DELIMITER}
    declared = set(contract.SCRIPT_ENV) | set(contract.SCRIPT_INTERNAL_ENV)
    assert spelled == declared


@pytest.mark.parametrize(
    ("name", "default", "template"),
    [
        (contract.STORAGE_ENDPOINT_ENV, contract.DEFAULT_STORAGE_ENDPOINT, templates.BOOT_RESOURCE),
        (contract.METADATA_HOST_ENV, contract.DEFAULT_METADATA_HOST, templates.DELETE_ON_COMPLETE_RESOURCE),
        (contract.TPU_API_ENDPOINT_ENV, contract.DEFAULT_TPU_API_ENDPOINT, templates.DELETE_ON_COMPLETE_RESOURCE),
        (contract.METADATA_HOST_ENV, "@@DEFAULT_METADATA_HOST@@", templates.BOOT_RESOURCE),  # filled from the contract
    ],
)
def test_endpoint_defaults_are_the_contracts(name, default, template):
    assert f"${{{name}:-{default}}}" in template_text(template)


def test_metadata_keys_the_templates_read_are_the_contracts():
    read = {key for text in every_template_text() for key in re.findall(r"attributes/([A-Za-z0-9@_-]+)", text)}
    assert read == {
        contract.WORKER_NUMBER_KEY,
        contract.TPU_ENV_KEY,
        "@@RUN_DIR_ATTRIBUTE@@",
        contract.DELETE_QUEUED_RESOURCE_KEY,
        # The compute-engine backend's (boot.sh finds the VM's place from them).
        contract.BACKEND_KEY,
        contract.SLICE_ID_KEY,
        contract.INSTANCE_GROUPS_KEY,
        contract.WORKERS_PER_SLICE_KEY,
        contract.COMPUTE_ENGINE_TPU_ENV_KEY,
        # Cloud TPU's, which the compute-engine identity phase checks where Compute Engine sets them.
        contract.WORKER_ENDPOINTS_KEY,
    }
    assert boot_module.RUN_DIR_ATTRIBUTE == contract.RUN_DIR_KEY  # what fills the placeholder
    assert f"attributes/{contract.DELETE_QUEUED_RESOURCE_KEY}" in template_text(templates.DELETE_ON_COMPLETE_RESOURCE)


def test_boot_exports_the_compute_engine_identity_the_contract_names():
    """On the compute-engine backend the boot writes the identity into the unit's environment, under
    the names the contract declares (and training/cluster.py reads: the test above)."""
    boot = template_text(templates.BOOT_RESOURCE)
    phase = IDENTITY_PHASES[contract.COMPUTE_ENGINE_BACKEND].read_text(encoding="utf-8")
    assert f"[[ $backend == {contract.COMPUTE_ENGINE_BACKEND} ]]" in phase
    assignments = "\n".join(re.findall(r"identity_env\+?=(.*)", phase))
    exported = set(re.findall(r"\b([A-Z][A-Z_]+)=\$", assignments))
    assert exported == set(contract.COMPUTE_ENGINE_IDENTITY_ENV)
    assert "${identity_env:+Environment=$identity_env}" in boot
    assert f"${{{contract.COMPUTE_API_ENDPOINT_ENV}:-@@DEFAULT_COMPUTE_API_ENDPOINT@@}}" in phase
    # What fills the placeholder.
    assert boot_module.ENDPOINT_DEFAULTS["DEFAULT_COMPUTE_API_ENDPOINT"] == contract.DEFAULT_COMPUTE_API_ENDPOINT


def test_what_a_backend_tells_the_trainer_is_what_the_trainer_reads():
    """The unit's MULTISLICE_IDENTITY and MULTISLICE_LOG_RESOURCE (boot.sh, from the spec) take the
    values training/cluster.py and training/log_shipping.py act on."""
    from training import cluster, log_shipping

    boot = template_text(templates.BOOT_RESOURCE)
    assert (
        f"Environment={contract.IDENTITY_ENV}=@@IDENTITY_SOURCE@@ {contract.LOG_RESOURCE_ENV}=@@LOG_RESOURCE@@"
    ) in boot
    assert (cluster.IDENTITY_ENV, log_shipping.LOG_RESOURCE_ENV) == (contract.IDENTITY_ENV, contract.LOG_RESOURCE_ENV)
    assert IDENTITY_SOURCES == cluster.IDENTITY_SOURCES
    for spec in SPECS.values():
        assert spec.identity_source in cluster.IDENTITY_SOURCES, spec.name
        assert spec.log_resource in (log_shipping.TPU_WORKER, log_shipping.GCE_INSTANCE, log_shipping.K8S_CONTAINER)


def test_the_release_record_fields_boot_reads_are_the_ones_the_record_has():
    boot = template_text(templates.BOOT_RESOURCE)
    read = set(re.findall(r'\\"([A-Za-z]+)\\":\[\[:space:\]\]\*', boot))
    assert read == set(contract.RECORD_FIELDS_READ)
    record = contract.release_record(stack="dev", release_id="a" * 64, run_dir="gs://b/runs/dev")
    assert set(contract.RECORD_FIELDS_READ) <= set(record)
    assert record["payload"] == contract.release_object("dev", "a" * 64) and record["format"] == contract.RECORD_FORMAT


def test_the_trainer_unit_is_the_contracts():
    assert f"readonly UNIT={contract.TRAINER_UNIT}\n" in template_text(templates.TRAINER_RESOURCE)
    assert boot_module.TRAINER_UNIT == contract.TRAINER_UNIT  # fills boot.sh's @@UNIT@@
    assert boot_module.RELEASE_WATCH_UNIT == contract.RELEASE_WATCH_UNIT  # fills boot.sh's @@WATCH_UNIT@@


def test_the_release_watch_numbers_are_the_scripts():
    """trainer.sh's status for a superseded release is the one the unit does not restart, and the
    watch's default poll is the one boot.sh announces (both fill boot.sh from infra/startup/boot.py)."""
    assert re.findall(r"^  exit (\d+)$", template_text(templates.TRAINER_RESOURCE), re.M) == [
        str(boot_module.RELEASE_SUPERSEDED_STATUS)
    ]
    assert "RestartPreventExitStatus=@@CONFIG_ERROR_STATUS@@ @@RELEASE_SUPERSEDED_STATUS@@" in template_text(
        templates.BOOT_RESOURCE
    )
    assert f"${{{contract.RELEASE_POLL_ENV}:-{boot_module.RELEASE_POLL_S}}}" in template_text(
        templates.RELEASE_WATCH_RESOURCE
    )


def test_the_trainer_spells_the_names_it_reads_as_the_contract_declares():
    source = training_source()
    for name in contract.TRAINER_ENV:
        assert f'"{name}"' in source, name
    for key in (contract.WORKER_NUMBER_KEY, contract.WORKER_ENDPOINTS_KEY, contract.TPU_ENV_KEY):
        assert f'"{key}"' in source, key  # training/cluster.py: the identity JAX's cluster code reads too
    assert f'"{contract.METADATA_HOST_ENV}", "{contract.DEFAULT_METADATA_HOST}"' in source
    # Compute Engine: the identity boot.sh exports (training/cluster.py reads it as JAX's GkeTpuCluster
    # does), and the program's keys the trainer reads there (cluster.py, log_shipping.py).
    for name in contract.COMPUTE_ENGINE_IDENTITY_ENV:
        assert f'"{name}"' in source, name
    for key in (contract.COMPUTE_ENGINE_ACCELERATOR_KEY, contract.BACKEND_KEY):
        assert f'"{key}"' in source or f"attributes/{key}" in source, key
    assert re.search(rf'^LOG_NAME = "{contract.TRAINER_LOG}"$', source, re.M)  # training/log_shipping.py
    assert re.search(rf'^COMPLETE_MARKER = "{contract.COMPLETE_MARKER}"$', source, re.M)  # training/workload.py


def test_the_workload_launcher_spells_the_contracts_names():
    source = (ROOT / "training" / "workload.py").read_text(encoding="utf-8")
    for name in contract.WORKLOAD_ENV:
        assert f'"{name}"' in source, name
    assert '"MEGASCALE_"' in source  # every MEGASCALE_* value of tpu-env is passed on
    assert all(name.startswith("MEGASCALE_") for name in contract.MEGASCALE_ENV)


def test_the_contract_imports_nothing():
    tree = ast.parse((ROOT / "infra" / "vm_contract.py").read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [getattr(node, "module", None) for node in imports] == ["__future__"]


#: Literals equal to a contract value that mean something else: google-auth's own look-up of
#: the metadata host (credentials.py), the file an emulated VM keeps its script in (vm.py), a
#: state word of a figure title (plot.py), the CLI module another change moves, and the key JAX's
#: GceTpuCluster asks the metadata server (the emulated VM's sitecustomize.py runs in any Python
#: and imports nothing of infra/).
ELSEWHERE = {
    ("infra/emulated/vm_site/sitecustomize.py", "agent-worker-number"),
    # The VM's local disk, where it keeps the emulated chips' lock; tests/emulated/test_vm_site.py
    # checks it equals contract.HOME_ENV.
    ("infra/emulated/vm_site/sitecustomize.py", "MULTISLICE_HOME"),
    ("infra/credentials.py", "GCE_METADATA_IP"),
    ("infra/emulated/vm.py", "startup-script"),
    ("infra/status/plot.py", "COMPLETE"),
    # The Cloud Storage emulator's variable (google-cloud-storage's own name), read at preview by
    # the config layer, which sits below infra.startup (tests/test_import_graph.py); a test in
    # tests/config/test_dataset.py checks it equals contract.STORAGE_ENDPOINT_ENV.
    ("infra/config/dataset.py", "STORAGE_EMULATOR_HOST"),
}


def test_backend_value_is_the_config_value():
    from infra.config import BACKENDS

    assert contract.COMPUTE_ENGINE_BACKEND in BACKENDS


def _literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def test_no_module_of_infra_spells_a_contract_value_outside_the_contract():
    # multislice:backend's values are the config's own (the VMs' metadata repeats one:
    # test_backend_value_is_the_config_value), spelled wherever a command tells the backends apart.
    from infra.config import BACKENDS

    values = {value for name, value in vars(contract).items() if name.isupper() and isinstance(value, str)} - set(
        BACKENDS
    )
    found = {
        (str(path.relative_to(ROOT)), literal)
        for path in sorted((ROOT / "infra").rglob("*.py"))
        if path.name != "vm_contract.py"
        for literal in _literals(path) & values
    }
    assert found <= ELSEWHERE
