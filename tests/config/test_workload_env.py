"""multislice:workload.env (infra/config/workload_env.py): the names a command may not set, each
refused as one line ``multislice:workload.env.<NAME>: <why>``; why each is refused, shown on the
real thing (the installed jax's cluster detection, this machine's Python, the launcher's environment);
and docs/workloads.md's ``env`` row naming every one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfigError, load_stack_file
from infra.config.workload_env import REFUSED_ENV, RESERVED_NAMES, RESERVED_PREFIXES, refused_env
from training import workload as launcher
from training.cluster import ClusterIdentity

ROOT = Path(__file__).resolve().parents[2]
BASE = {"gcp:project": "my-project-123", "gcp:zone": "us-central2-b", "multislice:acceleratorType": "v4-8"}
runner = CliRunner()

#: Variables that move where Python imports from (https://docs.python.org/3/using/cmdline.html#environment-variables).
PYTHON_IMPORTS = ("PYTHONPATH", "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONSAFEPATH")
#: The names the installed jax's ``is_env_present`` checks, per cluster: jax/_src/clusters/ompi_cluster.py
#: (``_ORTE_URI``), slurm_cluster.py (the five of ``SlurmCluster.is_env_present``), k8s_cluster.py.
OPEN_MPI = ("OMPI_MCA_orte_hnp_uri",)
SLURM = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
KUBERNETES = ("KUBERNETES_SERVICE_HOST",)


def stack_file(tmp_path: Path, env: dict) -> Path:
    path = tmp_path / "stacks" / "Pulumi.wl.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    workload = {"command": ["python3", "-m", "pkg"], "steps": 1, "env": env}
    path.write_text(yaml.safe_dump({"config": {**BASE, "multislice:workload": workload}}))
    return path


def error_lines(tmp_path: Path, env: dict) -> list[str]:
    with pytest.raises(StackConfigError) as err:
        load_stack_file(stack_file(tmp_path, env))
    return err.value.lines


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("PYTHONPATH", "would replace the PYTHONPATH the launcher sets"),
        ("PYTHONHOME", "moves where Python finds its standard library"),
        ("PYTHONPLATLIBDIR", "moves where Python finds its standard library"),
        ("PYTHONSAFEPATH", "takes the working directory out of sys.path"),
        *((name, "treat this job as launched by Open MPI (OmpiCluster.is_env_present in") for name in OPEN_MPI),
        *((name, "treat this job as launched by Slurm (SlurmCluster.is_env_present") for name in SLURM),
        *((name, "treat this job as launched by Kubernetes (K8sCluster.is_env_present in") for name in KUBERNETES),
    ],
)
def test_a_variable_that_breaks_the_job_is_one_line_naming_it(tmp_path, name, why):
    assert error_lines(tmp_path, {"XLA_FLAGS": "--xla_dump_to=/tmp/d", name: "x"}) == [
        f"multislice:workload.env.{name}: {refused_env(name)}"
    ]
    assert why in (refused_env(name) or "")


def test_cli_plan_refuses_pythonpath_and_an_open_mpi_variable_with_exit_2(tmp_path):
    for name in ("PYTHONPATH", "OMPI_MCA_orte_hnp_uri"):
        path = stack_file(tmp_path, {name: "/opt/lib"})
        result = runner.invoke(app, ["plan", "--config-file", str(path)])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
        assert result.output.splitlines() == [
            f"error: stack 'wl' ({path}) is invalid:",
            f"  multislice:workload.env.{name}: {refused_env(name)}",
        ]
        assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "name",
    [
        "PYTHONNOUSERSITE",  # the user site is off in a virtualenv anyway (site.venv)
        "PYTHONUSERBASE",
        "PYTHONSTARTUP",  # read by interactive sessions only
        "PYTHONWARNINGS",
        "PYTHONHASHSEED",
        "XLA_FLAGS",
        "LIBTPU_INIT_ARGS",
        "OMPI_COMM_WORLD_RANK",  # read by OmpiCluster only once OMPI_MCA_orte_hnp_uri selected it
        "SLURM_STEP_NUM_NODES",  # not one of SlurmCluster.is_env_present's five
        "JOB_COMPLETION_INDEX",  # read by K8sCluster only once selected
    ],
)
def test_variables_that_leave_imports_and_cluster_detection_alone_are_accepted(tmp_path, name):
    config = load_stack_file(stack_file(tmp_path, {name: "1"}))
    assert config.workload is not None and config.workload.env == {name: "1"}
    assert refused_env(name) is None


def test_the_refused_names_are_one_list():
    assert set(PYTHON_IMPORTS) | set(OPEN_MPI) | set(SLURM) | set(KUBERNETES) <= RESERVED_NAMES
    assert {"PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "JAX_COORDINATOR_ADDRESS", "TPU_WORKER_ID"} <= RESERVED_NAMES
    assert set(RESERVED_PREFIXES) == {"MULTISLICE_", "MEGASCALE_", "GCE_METADATA", "STORAGE_EMULATOR"}
    for group in REFUSED_ENV:  # every name and prefix of the list is refused with its group's reason
        for name in [*group.names, *(prefix + "X" for prefix in group.prefixes)]:
            assert refused_env(name) == group.why, name


# Why: each reason, on the real thing ------------------------------------------------------------


def test_jax_asks_open_mpi_and_slurm_before_the_tpu_clusters_and_kubernetes_after(monkeypatch):
    """jax/_src/clusters/cluster.py: ``ClusterEnv.__init_subclass__`` appends each cluster to
    ``_cluster_types`` and ``auto_detect_unset_distributed_params`` takes the first present."""
    from jax._src import clusters

    order = [cluster.__name__ for cluster in clusters.ClusterEnv._cluster_types]
    assert order.index("OmpiCluster") < order.index("GceTpuCluster")
    assert order.index("SlurmCluster") < order.index("GkeTpuCluster")
    assert order.index("K8sCluster") > order.index("GceTpuCluster")
    for name in [*OPEN_MPI, *SLURM, *KUBERNETES, "TPU_SKIP_MDS_QUERY"]:
        monkeypatch.delenv(name, raising=False)
    assert not clusters.OmpiCluster.is_env_present() and not clusters.SlurmCluster.is_env_present()
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "1531576320.0;tcp://10.0.0.1:34911")
    assert clusters.OmpiCluster.is_env_present()
    for name in SLURM:
        assert not clusters.SlurmCluster.is_env_present()  # all five together select Slurm
        monkeypatch.setenv(name, "1")
    assert clusters.SlurmCluster.is_env_present()
    # The names the two read once selected are not what selects them.
    monkeypatch.delenv("OMPI_MCA_orte_hnp_uri")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert not clusters.OmpiCluster.is_env_present()


def test_kubernetes_detection_reads_kubernetes_service_host(monkeypatch):
    from jax._src.clusters import k8s_cluster

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert k8s_cluster.K8sCluster.is_env_present() is False
    source = Path(k8s_cluster.__file__).read_text()
    body = source[source.index("def is_env_present") : source.index("def _handle_api_exception")]
    assert "'KUBERNETES_SERVICE_HOST' in os.environ" in body


def test_a_user_pythonpath_replaces_the_launchers(tmp_path):
    """training/workload.py's ``command_environment``: the user's env is applied last, so the
    emulation's ``infra/emulated/vm_site`` (on the unit's PYTHONPATH) would be gone."""
    identity = ClusterIdentity(worker=0, workers_per_slice=1, slice_id=0, num_slices=1, coordinator_address="h:8482")
    base = {"PYTHONPATH": str(ROOT / "infra" / "local" / "vm_site"), "PATH": "/usr/bin"}
    env = launcher.command_environment(
        base, identity, {}, run_dir="gs://b/runs/r", steps=1, release="/release", user_env={"PYTHONPATH": "/opt"}
    )
    assert env["PYTHONPATH"] == "/opt"


def run_python(tmp_path: Path, name: str, value: str) -> subprocess.CompletedProcess[str]:
    """``python -m pkg`` in a folder that holds ``pkg``, as a command runs in its ``source``."""
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "__main__.py").write_text("print('imported the source')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {name: value}
    return subprocess.run([sys.executable, "-m", "pkg"], cwd=tmp_path, env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("name", "value", "refused"),
    [
        ("PYTHONSAFEPATH", "1", "No module named pkg"),
        ("PYTHONHOME", "/nonexistent", "Fatal Python error"),
        ("PYTHONPLATLIBDIR", "nonexistent", "Fatal Python error"),
        ("PYTHONNOUSERSITE", "1", None),
        ("PYTHONSTARTUP", "/nonexistent.py", None),
    ],
)
def test_what_each_python_variable_does_to_a_command(tmp_path, name, value, refused):
    result = run_python(tmp_path, name, value)
    if refused is None:
        assert result.returncode == 0 and result.stdout == "imported the source\n", result.stderr
        assert refused_env(name) is None
    else:
        assert result.returncode != 0 and refused in result.stderr, result.stderr
        assert refused_env(name) is not None


def test_the_docs_env_row_names_every_refused_variable():
    row = next(line for line in (ROOT / "docs" / "workloads.md").read_text().splitlines() if line.startswith("| `env`"))
    missing = [name for name in [*RESERVED_NAMES, *RESERVED_PREFIXES] if f"`{name}`" not in row]
    assert missing == []
