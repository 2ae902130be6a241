"""``multislice:workload.env``: the environment variables a command may not set, and why.

:data:`REFUSED_ENV` is the one list of refused names and name prefixes, each group with the reason its
message gives; :func:`refused_env` asks it and :mod:`infra.config.workload` raises what it says, as
``multislice:workload.env.<NAME>: …``. docs/workloads.md's ``env`` row lists every name and prefix here
(tests/config/test_workload_env.py holds the two together). The groups:

* the contract's own variables (docs/workloads.md, "The contract"; ``training.workload.command_environment``
  sets them, and ``GCE_METADATA…`` / ``STORAGE_EMULATOR…`` say where the VM's metadata server and Cloud
  Storage are: ``infra.vm_contract``'s ``METADATA_HOST_ENV`` and ``STORAGE_ENDPOINT_ENV``);
* the variables through which JAX finds the job, its coordinator and this process's place in it
  (jax/_src/distributed.py, jax/_src/clusters/cloud_tpu_cluster.py and cluster.py, jax 0.10.2);
* the variables that move where Python imports from
  (https://docs.python.org/3/using/cmdline.html#environment-variables): ``PYTHONPATH``
  (``command_environment`` replaces the launcher's value with it, which drops ``infra/emulated/vm_site``
  in the emulation, and its folders come before the virtualenv's packages), ``PYTHONHOME`` and
  ``PYTHONPLATLIBDIR`` (another standard library prefix or ``lib`` folder: the virtualenv's Python
  stops at start-up, "Fatal Python error: init_fs_encoding … No module named 'encodings'"), and
  ``PYTHONSAFEPATH`` (3.11: the working directory leaves ``sys.path``, so ``python3 -m pkg`` no
  longer imports the shipped ``source``). Not refused: ``PYTHONNOUSERSITE`` and ``PYTHONUSERBASE``
  (the command runs in a virtualenv, where ``site`` turns the user site off anyway), ``PYTHONSTARTUP``
  (read by interactive sessions only), and the tuning ones (``PYTHONWARNINGS``, ``PYTHONHASHSEED``, …);
* the variables whose presence makes JAX's cluster detection take the job for another launcher's
  (jax 0.10.2): ``jax.distributed.initialize()`` asks each ``ClusterEnv`` in the order they are
  defined and takes the first whose ``is_env_present`` holds (jax/_src/clusters/cluster.py:39-41
  and 65), and jax/_src/clusters/__init__.py:17-28 defines Open MPI's and Slurm's before the Cloud
  TPU ones. Refused are exactly the names an ``is_env_present`` checks: ``OMPI_MCA_orte_hnp_uri``
  (ompi_cluster.py:21-22, 32-33), ``SLURM_JOB_ID``, ``SLURM_STEP_NODELIST``, ``SLURM_NTASKS``,
  ``SLURM_PROCID``, ``SLURM_LOCALID`` (slurm_cluster.py:20-24, 32-34: all five together select
  Slurm) and ``KUBERNETES_SERVICE_HOST`` (k8s_cluster.py:71-72: asked after the TPU clusters, so it
  wins only where the VM's TPU metadata cannot be read, and then, with the ``kubernetes`` package
  installed, the job fails asking for a Kubernetes API the VM does not have, hiding the real cause).
  The names a detected cluster reads afterwards (``OMPI_COMM_WORLD_*``, ``SLURM_STEP_NUM_NODES``,
  ``JOB_COMPLETION_INDEX``) change nothing without these; MPI4py's cluster is opt-in
  (``opt_in_only_method``, mpi4py_cluster.py:27, 30-33: chosen only by
  ``initialize(cluster_detection_method="mpi4py")``), so no variable selects it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RefusedEnv:
    """A group of refused environment names: ``names`` exactly, and every name starting with one of
    ``prefixes``; ``why`` is the message that follows the key path (``multislice:workload.env.<NAME>: ``)."""

    why: str
    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    def refuses(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


_CONTRACT = "is set by the workload contract (docs/workloads.md) and cannot be overridden"
_CLUSTER = (
    "makes JAX's cluster detection treat this job as launched by {launcher} ({check} in "
    "jax/_src/clusters/{file}, which jax.distributed.initialize() asks {order}), and the processes would look for "
    "their coordinator and ids where {launcher} keeps them; the VMs' job is found through the TPU metadata "
    "(docs/workloads.md): remove it from env"
)

#: Every refused name and prefix (module docstring), most specific reason first.
REFUSED_ENV: tuple[RefusedEnv, ...] = (
    # JAX's job identity: jax/_src/distributed.py (JAX_COORDINATOR_*, JAX_PARTITION_INDEX, JAX_SLICE_INDEX,
    # JAX_LOCAL_DEVICE_IDS), jax/_src/clusters/cloud_tpu_cluster.py (TPU_*, MEGASCALE_*), cluster.py:74 (the port).
    RefusedEnv(
        why=f"{_CONTRACT}: it tells JAX where the run's coordinator is and which slice and process this is, which "
        "the VM's metadata gives every process alike; remove it from env",
        names=frozenset(
            {
                "JAX_COORDINATOR_ADDRESS",
                "JAX_COORDINATOR_PORT",
                "JAX_COORDINATOR_BIND_ADDRESS",
                "JAX_PARTITION_INDEX",
                "JAX_SLICE_INDEX",
                "JAX_LOCAL_DEVICE_IDS",
                "TPU_WORKER_ID",
                "TPU_WORKER_HOSTNAMES",
                "TPU_PROCESS_ADDRESSES",
                "TPU_SKIP_MDS_QUERY",
            }
        ),
        prefixes=("MEGASCALE_",),
    ),
    # The launcher's own: training/workload.py command_environment, infra/vm_contract.py.
    RefusedEnv(
        why=f"{_CONTRACT}; the launcher sets PATH, VIRTUAL_ENV, PYTHONUNBUFFERED and the names starting with "
        "MULTISLICE_, GCE_METADATA and STORAGE_EMULATOR",
        names=frozenset({"PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED"}),
        prefixes=("MULTISLICE_", "GCE_METADATA", "STORAGE_EMULATOR"),
    ),
    # Python's imports: https://docs.python.org/3/using/cmdline.html#environment-variables.
    RefusedEnv(
        why="would replace the PYTHONPATH the launcher sets (in the local emulation it holds infra/emulated/vm_site, "
        "through which jax.distributed.initialize() finds the job) and put its folders before the virtualenv's "
        "packages; the command runs in its source directory, so `python3 -m pkg` imports from there: point source "
        "at the folder to import from, or extend the path in the command, "
        "[bash, -c, 'PYTHONPATH=lib${PYTHONPATH:+:$PYTHONPATH} exec python3 …']",
        names=frozenset({"PYTHONPATH"}),
    ),
    RefusedEnv(
        why="moves where Python finds its standard library (https://docs.python.org/3/using/cmdline.html): the "
        "virtualenv's Python would stop at start-up (\"No module named 'encodings'\"); remove it",
        names=frozenset({"PYTHONHOME", "PYTHONPLATLIBDIR"}),
    ),
    RefusedEnv(
        why="takes the working directory out of sys.path (Python 3.11), so `python3 -m pkg` run in the shipped "
        "source directory would no longer import it; remove it from env",
        names=frozenset({"PYTHONSAFEPATH"}),
    ),
    # Another launcher's cluster (jax 0.10.2): ompi_cluster.py:22+33 (_ORTE_URI), slurm_cluster.py:20-24+32-34,
    # k8s_cluster.py:71-72; jax/_src/clusters/__init__.py:17-28 orders them, cluster.py:65 takes the first present.
    RefusedEnv(
        why=_CLUSTER.format(
            launcher="Open MPI", check="OmpiCluster.is_env_present", file="ompi_cluster.py", order="before the TPU ones"
        ),
        names=frozenset({"OMPI_MCA_orte_hnp_uri"}),
    ),
    RefusedEnv(
        why=_CLUSTER.format(
            launcher="Slurm",
            check="SlurmCluster.is_env_present, with the other SLURM_ names it checks",
            file="slurm_cluster.py",
            order="before the TPU ones",
        ),
        names=frozenset({"SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"}),
    ),
    RefusedEnv(
        why=_CLUSTER.format(
            launcher="Kubernetes",
            check="K8sCluster.is_env_present",
            file="k8s_cluster.py",
            order="after the TPU ones: wherever the TPU metadata cannot be read",
        ),
        names=frozenset({"KUBERNETES_SERVICE_HOST"}),
    ),
)
#: Every refused prefix and name (as docs/workloads.md lists them).
RESERVED_PREFIXES: tuple[str, ...] = tuple(prefix for group in REFUSED_ENV for prefix in group.prefixes)
RESERVED_NAMES: frozenset[str] = frozenset(name for group in REFUSED_ENV for name in group.names)


def refused_env(name: str) -> str | None:
    """Why ``env`` may not set ``name`` (the first group of :data:`REFUSED_ENV` that refuses it), or None."""
    return next((group.why for group in REFUSED_ENV if group.refuses(name)), None)
