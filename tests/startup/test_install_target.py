"""infra/startup/install_target.py: the TPU VM as an install target (CPython of .python-version
on glibc 2.35 Linux x86_64): its Python version, PEP 508 markers and accepted wheel tags."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.tags import Tag

from infra.startup.install_target import TARGET_GLIBC, InstallTarget, read_python_version
from infra.startup.uv_lock import LockfileError

ROOT = Path(__file__).resolve().parents[2]


def test_python_version_from_file(tmp_path):
    assert read_python_version(ROOT) == (ROOT / ".python-version").read_text().strip()
    (tmp_path / ".python-version").write_text("# comment\n3.12.4\n")
    assert read_python_version(tmp_path) == "3.12.4"
    (tmp_path / ".python-version").write_text("pypy3.10\n")
    with pytest.raises(LockfileError, match="not a CPython version"):
        read_python_version(tmp_path)
    with pytest.raises(LockfileError, match="does not exist"):
        read_python_version(tmp_path / "nowhere")


def test_patch_dependent_marker_is_an_error():
    target = InstallTarget("3.11")
    assert target.evaluate("python_full_version < '3.12'", context="x")
    with pytest.raises(LockfileError, match="patch release"):
        target.evaluate("python_full_version < '3.11.4'", context="pkg → dep")
    assert InstallTarget("3.11.9").evaluate("python_full_version >= '3.11.4'", context="x")


def test_marker_values_of_a_minor_version_span_its_patch_releases():
    mappings = InstallTarget("3.11").marker_values()
    assert [e["python_full_version"] for e in mappings] == ["3.11.0", "3.11.99"]
    assert {e["python_version"] for e in mappings} == {"3.11"}
    assert all(e["sys_platform"] == "linux" and e["platform_machine"] == "x86_64" for e in mappings)
    (values,) = InstallTarget("3.12.4").marker_values()
    assert values["python_full_version"] == "3.12.4" and values["python_version"] == "3.12"
    assert InstallTarget("3.11").evaluate("sys_platform == 'darwin'", context="x") is False
    assert InstallTarget("3.11").evaluate(None, context="x") is True
    with pytest.raises(LockfileError, match="pkg → dep: invalid marker"):
        InstallTarget("3.11").evaluate("python_version >>> '3'", context="pkg → dep")


def test_platforms_descend_from_the_target_glibc():
    platforms = InstallTarget("3.11").platforms
    assert TARGET_GLIBC == (2, 35)
    assert platforms[0] == "manylinux_2_35_x86_64" and platforms[-1] == "linux_x86_64"
    assert platforms.index("manylinux_2_17_x86_64") + 1 == platforms.index("manylinux2014_x86_64")
    assert "manylinux_2_36_x86_64" not in platforms and "manylinux1_x86_64" in platforms
    assert InstallTarget("3.11", glibc=(2, 17)).platforms[0] == "manylinux_2_17_x86_64"


def test_wheel_rank_prefers_the_most_specific_installable_wheel():
    target = InstallTarget("3.11")
    assert target.tags[0] == Tag("cp311", "cp311", "manylinux_2_35_x86_64")
    cp311 = target.wheel_rank("numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
    abi3 = target.wheel_rank("cryptography-46.0.0-cp311-abi3-manylinux_2_34_x86_64.whl")
    pure = target.wheel_rank("six-1.17.0-py2.py3-none-any.whl")
    assert cp311 is not None and abi3 is not None and pure is not None
    assert cp311 < pure and abi3 < pure
    for filename in (
        "numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.whl",  # another Python
        "numpy-2.4.6-cp311-cp311-manylinux_2_39_x86_64.whl",  # newer glibc than the VM's
        "numpy-2.4.6-cp311-cp311-musllinux_1_2_x86_64.whl",
        "numpy-2.4.6-cp311-cp311-manylinux_2_27_aarch64.whl",
        "numpy-2.4.6-cp311-cp311-macosx_14_0_arm64.whl",
        "numpy-2.4.6.tar.gz",  # not a wheel name
    ):
        assert target.wheel_rank(filename) is None, filename


@pytest.mark.parametrize(
    "marker",
    [
        "python_full_version == '3.11.3'",  # holds on the VM only if uv installs 3.11.3: 3.11.0 and 3.11.99 miss it
        'python_full_version == "3.11.3"',
        "python_full_version != '3.11.3'",
        "python_full_version in '3.11.3, 3.11.4'",  # in: a substring test (PEP 508)
        "python_full_version in '3.11.10'",  # holds for 3.11.1 and 3.11.10
        "'3.11.3' in python_full_version",
        "python_full_version < '3.11.4'",
        "implementation_version == '3.11.3'",
        "python_full_version === '3.11.3'",
        "sys_platform == 'linux' and python_full_version == '3.11.12'",
    ],
)
def test_a_marker_on_a_patch_release_the_target_does_not_pin_is_refused(marker):
    with pytest.raises(LockfileError) as err:
        InstallTarget("3.11").evaluate(marker, context="line 2: numpy==2.0.0")
    assert str(err.value) == (
        f"line 2: numpy==2.0.0: marker {marker!r} depends on the patch release of Python 3.11, which .python-version "
        "does not pin (the VMs run the 3.11 release `uv python install 3.11` picks); write the marker on "
        "python_version, or pin a full version (e.g. 3.11.9) in .python-version"
    )


def test_a_marker_on_a_patch_release_is_evaluated_on_a_pinned_full_version():
    assert InstallTarget("3.11.3").evaluate("python_full_version == '3.11.3'", context="x") is True
    assert InstallTarget("3.11.9").evaluate("python_full_version == '3.11.3'", context="x") is False
    assert InstallTarget("3.11.9").evaluate("python_full_version != '3.11.3'", context="x") is True
    assert InstallTarget("3.11.10").evaluate("python_full_version in '3.11.1'", context="x") is False


@pytest.mark.parametrize(
    ("marker", "holds"),
    [
        ("python_full_version < '3.12'", True),
        ("python_full_version >= '3.11'", True),
        ("python_full_version == '3.12.1'", False),  # another minor release: no 3.11 patch matches
        ("python_full_version == '3.11.*'", True),
        ("python_version == '3.11'", True),
        ("python_full_version in '3.12.11'", False),
    ],
)
def test_a_marker_that_no_patch_release_changes_is_decided(marker, holds):
    assert InstallTarget("3.11").evaluate(marker, context="x") is holds


def test_the_patch_releases_tried_are_those_a_marker_names_and_their_neighbours():
    target = InstallTarget("3.11")
    assert target.patch_releases() == [0, 99]
    assert target.patch_releases("python_full_version == '3.11.3'") == [0, 2, 3, 4, 99]
    assert target.patch_releases("python_full_version in '3.11.10'") == [0, 1, 2, 9, 10, 11, 99]
    assert [v["python_full_version"] for v in target.marker_values("python_full_version < '3.11.4'")] == [
        "3.11.0",
        "3.11.3",
        "3.11.4",
        "3.11.5",
        "3.11.99",
    ]
    many = " or ".join(f"python_full_version == '3.11.{n}'" for n in range(100, 200, 3))
    with pytest.raises(LockfileError, match="^x: marker names more than 64 Python patch releases$"):
        target.evaluate(many, context="x")
