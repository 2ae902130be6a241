"""The TPU VMs' Python and platform, as a requirements file must be written for them.

Every VM runs CPython of the checkout's ``.python-version`` (``boot.sh`` installs it with ``uv python
install``) on the Ubuntu 22.04 of the Cloud TPU images: glibc :data:`VM_GLIBC`, x86_64.
:func:`compile_command` is the ``uv pip compile`` line that writes a hash-pinned requirements file for
them (docs/workloads.md gives the same line): every hint about ``multislice:workload.requirements``
(:mod:`infra.config.workload` at load, :mod:`infra.startup.workload` at render) gives it whole, since
a file compiled without ``--python-version`` and ``--python-platform`` pins the wheels of the machine
that compiled it. :mod:`infra.startup.install_target` builds the VM as an install target from the
same two facts.
"""

from __future__ import annotations

from pathlib import Path

#: Highest glibc of the VMs: Cloud TPU VM base images are Ubuntu 22.04 (glibc 2.35).
VM_GLIBC: tuple[int, int] = (2, 35)
#: The checkout this module lives in (holds ``.python-version``).
CHECKOUT = Path(__file__).resolve().parents[2]


def read_python_version(project_root: Path) -> str:
    """The Python version the project pins in ``.python-version`` (e.g. ``"3.11"``).

    Raises:
      ValueError: the file is missing or holds no ``X.Y`` / ``X.Y.Z`` version.
    """
    path = Path(project_root) / ".python-version"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist; it names the Python version of the TPU VMs") from None
    for line in lines:
        value = line.split("#", 1)[0].strip()
        if not value:
            continue
        parts = value.split(".")
        if not (2 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
            raise ValueError(f"{path}: {value!r} is not a CPython version like '3.11' or '3.11.9'")
        return value
    raise ValueError(f"{path} is empty; write a CPython version like '3.11'")


def python_platform(glibc: tuple[int, int] = VM_GLIBC) -> str:
    """``uv pip compile --python-platform``'s name of the VMs' platform (``x86_64-manylinux_2_35``)."""
    return f"x86_64-manylinux_{glibc[0]}_{glibc[1]}"


def compile_command(python_version: str | None = None, glibc: tuple[int, int] = VM_GLIBC) -> str:
    """The ``uv pip compile`` line that writes a hash-pinned requirements file for the VMs (Python
    ``python_version``, by default the checkout's ``.python-version``, on ``glibc`` x86_64)."""
    if python_version is None:
        try:
            python_version = read_python_version(CHECKOUT)
        except ValueError:  # the render refuses the checkout with its own message; the hint stays whole
            python_version = "$(cat .python-version)"
    return (
        f"uv pip compile requirements.in --generate-hashes --python-version {python_version} "
        f"--python-platform {python_platform(glibc)} -o requirements-vm.txt"
    )
