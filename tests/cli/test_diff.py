"""``multislice diff --stack S --against REV`` on a temporary git repository holding the project's
stacks, trainer and lock: a one-line trainer change, a slice-count change, and bad input."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from infra.cli import app
from infra.review.revision_diff import DiffError, config_changes, diff_stack
from infra.startup.bundle import build_bundle

ROOT = Path(__file__).resolve().parents[2]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=60
    ).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "project"
    shutil.copytree(ROOT / "stacks", repo / "stacks")
    shutil.copytree(ROOT / "training", repo / "training", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("uv.lock", "pyproject.toml", ".python-version", "Pulumi.yaml"):
        shutil.copy(ROOT / name, repo / name)
    (repo / ".gitignore").write_text(".multislice/\n")
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
    return repo


def bundle_sha(training: Path) -> str:
    return hashlib.sha256(build_bundle(training)).hexdigest()


def test_a_one_line_trainer_change_updates_in_place(repo, monkeypatch):
    before = bundle_sha(repo / "training")
    with open(repo / "training" / "model" / "transformer.py", "a") as f:
        f.write("# a one-line change\n")
    after = bundle_sha(repo / "training")
    assert before != after

    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(repo / "stacks"))
    result = CliRunner().invoke(
        app, ["diff", "--stack", "dev", "--against", "HEAD"], env={"COLUMNS": "250"}, color=False
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "config: unchanged" in lines
    assert f"trainer bundle: {before[:12]} -> {after[:12]}" in lines
    assert "  modified training/model/transformer.py" in lines
    changed = [line for line in lines if line.startswith("  update ") or line.startswith("  replace")]
    assert len(changed) == 1 and "queued-resource" in changed[0] and "in place" in changed[0], lines
    assert "bundleSha256" in changed[0] and "metadata" in changed[0]
    assert "base64" not in result.output and len(result.output) < 2000  # no wall of script text
    # The dev stack is predicted DCN-bound on both sides: the program's warning is said once, not per side,
    # as a warning line that says whether to act.
    (warning,) = [line for line in result.stderr.splitlines() if "predicted DCN-bound" in line]
    assert warning.startswith("warning: stack dev: predicted DCN-bound: ") and "; no action needed: " in warning


def test_more_slices_replace_the_queued_resource(repo):
    path = repo / "stacks" / "Pulumi.dev.yaml"
    document = yaml.safe_load(path.read_text())
    document["config"]["multislice:slices"] = 4
    document["config"]["multislice:training"]["parallelism"]["dcn"]["data"] = 4
    path.write_text(yaml.safe_dump(document))

    result = diff_stack("dev", "HEAD", repo)
    assert result.config_changes == [
        ("multislice:slices", 2, 4),
        ("multislice:training.parallelism.dcn.data", 2, 4),
    ]
    assert result.trainer_files == [] and result.bundle_sha256[0] == result.bundle_sha256[1]
    qr = [c for c in result.resources if c.name == "queued-resource"]
    assert len(qr) == 1 and qr[0].action == "replace" and "slices" in qr[0].replace_keys
    assert result.replaces


def test_no_change_is_no_change(repo):
    result = diff_stack("staging", "HEAD", repo)
    assert (result.config_changes, result.trainer_files, result.resources) == ([], [], [])


def test_bad_revision_and_missing_stack_are_one_line(repo):
    with pytest.raises(DiffError, match=r"--against 'no-such-rev': no such commit"):
        diff_stack("dev", "no-such-rev", repo)
    shutil.copy(repo / "stacks" / "Pulumi.dev.yaml", repo / "stacks" / "Pulumi.fresh.yaml")
    with pytest.raises(DiffError, match=r"stack 'fresh' does not exist at HEAD \([0-9a-f]{12}\)"):
        diff_stack("fresh", "HEAD", repo)
    with pytest.raises(DiffError, match=r"stack 'gone' does not exist in the working tree"):
        diff_stack("gone", "HEAD", repo)


def test_config_changes_cover_added_and_removed_keys():
    old = {"a": 1, "t": {"x": 1, "y": {"z": 2}}}
    new = {"t": {"x": 1, "y": {"z": 3}}, "b": "s"}
    assert config_changes(old, new) == [("a", 1, None), ("b", None, "s"), ("t.y.z", 2, 3)]


def test_a_stack_file_that_does_not_validate_names_the_side(repo):
    path = repo / "stacks" / "Pulumi.dev.yaml"
    path.write_text(path.read_text().replace("multislice:slices: 2", "multislice:slices: 0"))
    with pytest.raises(DiffError, match=r"^stack 'dev' in the working tree: .*multislice:slices"):
        diff_stack("dev", "HEAD", repo)


def diff_after_a_trainer_change(repo: Path, monkeypatch, edits) -> Result:
    """``multislice diff`` of the dev stack, rewritten by ``edits`` (old, new) and committed, after a
    one-line trainer change."""
    path = repo / "stacks" / "Pulumi.dev.yaml"
    text = path.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-am", "another backend")
    with open(repo / "training" / "model" / "transformer.py", "a") as f:
        f.write("# a one-line change\n")
    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(repo / "stacks"))
    return CliRunner().invoke(app, ["diff", "--stack", "dev", "--against", "HEAD"], env={"COLUMNS": "300"}, color=False)


def test_a_trainer_change_on_the_compute_engine_backend_replaces_the_template_only(repo, monkeypatch):
    """The dev stack on the compute-engine backend: a one-line trainer change replaces the instance
    template and updates each group in place, with what that means for the VMs."""
    result = diff_after_a_trainer_change(
        repo,
        monkeypatch,
        (
            ("multislice:acceleratorType: v4-8", "multislice:acceleratorType: v5p-8"),
            ("gcp:zone: us-central2-b", "gcp:zone: us-east5-a"),
            ("  multislice:capacity: spot\n", "  multislice:capacity: spot\n  multislice:backend: compute-engine\n"),
        ),
    )
    assert result.exit_code == 0, result.output
    changed = {
        line.split()[1]: line for line in result.output.splitlines() if line.startswith("  ") and "(gcp:" in line
    }
    assert changed["slices-template"].split()[0] == "replace"
    assert "(replaced because of: metadata); a new template is made first" in changed["slices-template"]
    for group in ("slices-0", "slices-1"):
        assert changed[group].split()[0] == "update", changed[group]
        assert "versions (in place; no capacity given up); the group points at the new template" in changed[group]
    assert not [
        name
        for name, line in changed.items()
        if "InstanceGroupManager" in line and name not in ("slices-0", "slices-1")
    ]


def test_a_workload_source_outside_the_repository_is_read_on_both_sides(repo, tmp_path):
    """MaxText's layout (docs/workloads.md): the source sits beside the repository, named relative
    to stacks/. It is not versioned, so the revision's side reads the same folder as the working
    tree's, not one relative to the revision's temporary checkout."""
    source = tmp_path / "maxtext" / "src"
    source.mkdir(parents=True)
    (source / "train.py").write_text("print('training')\n")
    document = yaml.safe_load((ROOT / "tests" / "stacks" / "Pulumi.emu-command.yaml").read_text())
    document["config"]["multislice:workload"]["source"] = "../../maxtext/src"
    (repo / "stacks" / "Pulumi.cmd.yaml").write_text(yaml.safe_dump(document))
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "a command stack")
    result = diff_stack("cmd", "HEAD", repo)
    assert (result.config_changes, result.resources) == ([], [])


def test_a_stack_file_outside_the_repository_shows_the_trainer_change(repo, tmp_path, monkeypatch):
    """``--config-file`` for a file git does not version: both sides read it, the output says so,
    and the trainer change is the whole difference."""
    mine = tmp_path / "mine" / "Pulumi.long.yaml"
    mine.parent.mkdir()
    shutil.copy(repo / "stacks" / "Pulumi.dev.yaml", mine)
    before = bundle_sha(repo / "training")
    with open(repo / "training" / "model" / "transformer.py", "a") as f:
        f.write("# a one-line change\n")
    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(repo / "stacks"))
    result = CliRunner().invoke(
        app, ["diff", "--config-file", str(mine), "--against", "HEAD"], env={"COLUMNS": "250"}, color=False
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()  # stderr has the program's warning (the stack is predicted DCN-bound)
    assert lines[0].startswith("stack long: working tree against HEAD (")
    assert f"stack file {mine}: not versioned in this repository, the same on both sides" in lines[1]
    assert "config: unchanged" in lines
    assert f"trainer bundle: {before[:12]} -> {bundle_sha(repo / 'training')[:12]}" in lines
    assert any(line.startswith("  update ") and "queued-resource" in line for line in lines), lines


def test_a_tracked_stack_file_given_by_path_is_read_at_the_revision(repo, monkeypatch):
    """A stack file the repository versions outside ``stacks/``: its change at the revision shows,
    as ``--stack`` shows a change to ``stacks/``."""
    mine = repo / "envs" / "Pulumi.team.yaml"
    mine.parent.mkdir()
    shutil.copy(repo / "stacks" / "Pulumi.dev.yaml", mine)
    git(repo, "add", "envs")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "team stack")
    document = yaml.safe_load(mine.read_text())
    document["config"]["multislice:slices"] = 4
    document["config"]["multislice:training"]["parallelism"]["dcn"]["data"] = 4
    mine.write_text(yaml.safe_dump(document))
    result = diff_stack("team", "HEAD", repo, mine)
    assert result.stack_file_versioned
    assert [key for key, *_ in result.config_changes] == [
        "multislice:slices",
        "multislice:training.parallelism.dcn.data",
    ]
    assert result.replaces
    # Not yet committed at the revision before it: named as missing there, one line.
    with pytest.raises(DiffError, match=r"stack 'team' does not exist at HEAD~1 \([0-9a-f]{12}\): no envs/Pulumi.team"):
        diff_stack("team", "HEAD~1", repo, mine)
    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(repo / "stacks"))
    result = CliRunner().invoke(
        app, ["diff", "--config-file", str(repo / "nope" / "Pulumi.x.yaml"), "--against", "HEAD"]
    )
    assert result.exit_code == 2 and "stack file" in result.stderr and "does not exist" in result.stderr


def test_a_trainer_change_on_the_gke_backend_says_what_it_does_to_the_running_pods(repo, monkeypatch):
    """The dev stack on the gke backend (v4-16: multi-host slices): a one-line trainer change is a new
    ConfigMap and a replaced JobSet, worded as what it does to the running Pods."""
    result = diff_after_a_trainer_change(
        repo,
        monkeypatch,
        (
            ("multislice:acceleratorType: v4-8", "multislice:acceleratorType: v4-16"),
            ("  multislice:capacity: spot\n", "  multislice:capacity: spot\n  multislice:backend: gke\n"),
            ("ici: {data: 1, fsdp: 4, tensor: 1}", "ici: {data: 1, fsdp: 8, tensor: 1}"),
        ),
    )
    assert result.exit_code == 0, result.output
    changed = {line.split()[1]: line for line in result.output.splitlines() if "(kubernetes:" in line}
    assert changed["jobset"].split()[0] == "replace", changed
    assert "every running Pod gets SIGTERM (15 s to save) and stops" in changed["jobset"]
    assert "ConfigMap" in changed["startup"] and "data, metadata" in changed["startup"]  # the new release's script


@pytest.mark.parametrize("confirmed", [False, True])
def test_a_change_of_backend_says_whether_pulumi_up_will_carry_it_out(repo, monkeypatch, confirmed):
    """The dev stack moved to the compute-engine backend in the working tree: the diff lists the
    creates and deletes and says that pulumi up refuses the change without
    multislice:allowBackendChange, or that the key confirms it (infra/backends/change.py)."""
    path = repo / "stacks" / "Pulumi.dev.yaml"
    text = path.read_text()
    for old, new in (
        ("multislice:acceleratorType: v4-8", "multislice:acceleratorType: v5p-8"),
        ("gcp:zone: us-central2-b", "gcp:zone: us-east5-a"),
        ("  multislice:capacity: spot\n", "  multislice:capacity: spot\n  multislice:backend: compute-engine\n"),
    ):
        text = text.replace(old, new)
    if confirmed:
        text = text.replace(
            "  multislice:backend: compute-engine\n",
            "  multislice:backend: compute-engine\n  multislice:allowBackendChange: true\n",
        )
    path.write_text(text)
    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(repo / "stacks"))
    result = CliRunner().invoke(app, ["diff", "--stack", "dev", "--against", "HEAD"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    note = " ".join(line for line in result.output.splitlines() if "note:" in line)
    assert "multislice:backend queued-resource -> compute-engine replaces every TPU VM of the stack" in note
    if confirmed:
        assert "multislice:allowBackendChange: true confirms it, so pulumi up carries it out" in note
    else:
        assert "pulumi up refuses it unless the stack sets multislice:allowBackendChange: true" in note


def test_the_programs_warnings_go_to_the_commands_printer_while_it_evaluates(caplog):
    # Pulumi's mock engine logs the program's warnings on PROGRAM_LOG; diff (and check) hand them to the
    # printer of the command's own warnings, which prints each once per command run.
    import logging

    from infra.review.program_warnings import PROGRAM_LOG, printed_as_warnings

    said: list[str] = []
    with caplog.at_level(logging.INFO), printed_as_warnings(said.append):
        for message in ("stack dev: predicted DCN-bound", "stack dev: predicted DCN-bound", "another"):
            PROGRAM_LOG.warning(message)
        PROGRAM_LOG.info("an engine note")  # not a warning: not printed as one
    assert said == ["stack dev: predicted DCN-bound", "stack dev: predicted DCN-bound", "another"]
    assert caplog.records == []  # and nowhere else
    PROGRAM_LOG.warning("another")  # once the evaluation is over, nothing is taken
    assert [r.getMessage() for r in caplog.records] == ["another"]


def test_the_revision_is_rendered_with_the_working_trees_cache(repo, monkeypatch):
    """Both sides' bundle, pins and compressed release are kept in the working tree's content cache
    (keyed by content): a second diff computes none of them again, where the revision's temporary
    checkout would start with an empty cache every time."""
    from infra.startup import bundle, lockfile

    with open(repo / "training" / "model" / "transformer.py", "a") as f:
        f.write("# a one-line change\n")
    diff_stack("dev", "HEAD", repo)
    calls: list[str] = []
    real_pins, real_compress, real_strip = lockfile.pinned_requirements, bundle.compress, bundle.strip_documentation
    monkeypatch.setattr(lockfile, "pinned_requirements", lambda *a, **k: calls.append("pins") or real_pins(*a, **k))
    monkeypatch.setattr(bundle, "compress", lambda *a: calls.append("xz") or real_compress(*a))
    monkeypatch.setattr(bundle, "strip_documentation", lambda source: calls.append("strip") or real_strip(source))
    again = diff_stack("dev", "HEAD", repo)
    assert calls == []
    assert again.trainer_files == [("training/model/transformer.py", "modified")]
    assert (repo / ".multislice" / "cache").is_dir()
