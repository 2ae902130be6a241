"""The pre-commit hooks (.pre-commit-config.yaml) run what .ci/lint runs, through
``uv run --frozen`` (the tools at the versions uv.lock pins), on the files .ci/lint checks."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
UV_RUN = ["uv", "run", "--frozen"]


def lint_commands(script: str) -> list[list[str]]:
    """The tools .ci/lint runs: the words after ``"$uv" run --frozen`` of each ``run NAME ...``
    line, without its paths (``.``, ``"${scripts[@]}"``)."""
    commands = []
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["run"] and words[2:5] == ["$uv", *UV_RUN[1:]]:
            commands.append([w for w in words[5:] if w != "." and not w.startswith("$")])
    return commands


def hooks(config: str) -> list[dict]:
    return [hook for repo in yaml.safe_load(config)["repos"] for hook in repo["hooks"]]


def uncovered(config: str, script: str) -> list[str]:
    """The tools of ``script`` (.ci/lint) that no hook of ``config`` runs; a hook that is not a
    ``repo: local`` hook of ``language: system`` run through ``uv run --frozen`` is named too."""
    repos = yaml.safe_load(config)["repos"]
    problems = [f"repo {r['repo']!r} is not local" for r in repos if r["repo"] != "local"]
    entries = []
    for hook in hooks(config):
        entry = shlex.split(hook["entry"])
        if hook.get("language") != "system" or entry[: len(UV_RUN)] != UV_RUN:
            problems.append(f"hook {hook['id']!r}: {hook.get('language')} {hook['entry']!r}")
        entries.append(entry[len(UV_RUN) :])
    for command in lint_commands(script):
        if not any(entry[: len(command)] == command for entry in entries):
            problems.append(f"no hook runs {shlex.join(command)!r}")
    return problems


def test_the_hooks_run_what_ci_lint_runs_through_uv():
    script = (ROOT / ".ci" / "lint").read_text()
    commands = lint_commands(script)
    assert {c[0] for c in commands} >= {"ruff", "basedpyright", "shellcheck"}, commands  # the parse found them
    assert ["ruff", "format", "--check"] in commands
    assert uncovered((ROOT / ".pre-commit-config.yaml").read_text(), script) == []


def test_a_lint_tool_without_a_hook_is_named():
    script = (ROOT / ".ci" / "lint").read_text()
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    without_basedpyright = yaml.safe_dump(
        {"repos": [{"repo": "local", "hooks": [h for h in hooks(config) if h["id"] != "basedpyright"]}]}
    )
    assert uncovered(without_basedpyright, script) == ["no hook runs 'basedpyright'"]
    bare = config.replace("entry: uv run --frozen ruff check", "entry: ruff check")
    assert uncovered(bare, script) == [
        "hook 'ruff-check': system 'ruff check --force-exclude'",
        "no hook runs 'ruff check'",
    ]


def test_the_shellcheck_hook_selects_the_scripts_ci_lint_checks():
    (shellcheck,) = [h for h in hooks((ROOT / ".pre-commit-config.yaml").read_text()) if "shellcheck" in h["entry"]]
    listed = subprocess.run(
        ["git", "ls-files", "*.sh", "*.sh.in", ".ci/*"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert listed  # the scripts .ci/lint checks
    assert [p for p in listed if not re.search(shellcheck["files"], p)] == []
    assert not re.search(shellcheck["files"], "infra/vm_contract.py")
