"""The README and the docs pages its sections moved to stay true: the set-up commands use real
options, the configuration reference (docs/configuration.md) names every key, the command lines
run here as documented (those that can without the cloud or the Pulumi CLI; the others each say
why not) with options the CLI has, the day-one stack file and its data lines are what the
commands make, and the download figures (docs/development.md) are the lock's."""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from infra.cli import app
from infra.config import CAPACITY_TYPES, StackConfig, load_stack, load_stack_file
from infra.queued_resource import QueuedResourceProvider
from tests.fakes.clock import clock  # noqa: F401 (fixture)
from tests.fakes.queued_resource import dev, no_ambient_credentials, props  # noqa: F401 (fixtures)
from tests.fakes.tpu_api import FakeTpuApi
from tests.helpers.readme import (
    CONFIGURATION,
    DEPLOYING,
    DEVELOPMENT,
    EMULATION,
    README,
    REVIEW,
    ROOT,
    day_one,
    readme_commands,
    section,
)
from training.config import TrainConfig

REFERENCE = CONFIGURATION


def tables(text: str) -> list[list[list[str]]]:
    """Markdown tables in ``text``: rows of stripped cells, header and rule rows dropped."""
    found, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("- ") and cells[0] != "key":
                rows.append(cells)
        elif rows:
            found.append(rows)
            rows = []
    return found


STACK_TABLE, TRAINING_TABLE, *_ = tables(REFERENCE)  # then the stack-file reading's table


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def documented_paths(cell: str) -> list[str]:
    """Key paths a training-table key cell names: ``a.b``, ``c`` (→ ``a.c``), ``a.{x,y}``."""
    paths, prefix = [], ""
    for item in ticked(cell):
        if "." in item:
            prefix = item.rsplit(".", 1)[0] + "."
        name = item.rsplit(".", 1)[-1]
        expanded = name[1:-1].split(",") if name.startswith("{") else [name]
        paths += [prefix + part for part in expanded]
    return paths


def leaf_paths(model: type[BaseModel], prefix: str = "") -> dict[str, object]:
    """Every leaf key path of ``model`` → its default."""
    leaves: dict[str, object] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves |= leaf_paths(annotation, f"{prefix}{name}.")
        else:
            leaves[prefix + name] = field.default
    return leaves


def nested_model(field) -> type[BaseModel] | None:
    annotation = field.annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def test_every_stack_key_is_documented():
    # One row per key of the stack table, naming exactly the keys StackConfig reads.
    rows = [ticked(row[0]) for row in STACK_TABLE]
    assert all(len(keys) == 1 for keys in rows), rows
    documented = [keys[0] for keys in rows]
    keys = [field.alias for field in StackConfig.model_fields.values() if field.alias]
    assert sorted(documented) == sorted(keys)


def test_every_key_of_an_environment_object_is_in_its_row():
    rows = {ticked(row[0])[0]: row for row in STACK_TABLE}
    for field in StackConfig.model_fields.values():
        model = nested_model(field)
        if model is None or model is TrainConfig:
            continue
        meaning = ticked(rows[field.alias][2])
        missing = [sub.alias or name for name, sub in model.model_fields.items() if (sub.alias or name) not in meaning]
        assert missing == [], (field.alias, missing)


def test_stack_table_defaults_and_allowed_capacities_are_the_schemas():
    rows = {ticked(row[0])[0]: row for row in STACK_TABLE}
    for field in StackConfig.model_fields.values():
        if isinstance(field.default, (str, int)) and field.alias:
            shown = str(field.default).lower() if isinstance(field.default, bool) else str(field.default)
            assert rows[field.alias][1].strip("`") == shown, field.alias
    assert ticked(rows["multislice:capacity"][2].split("(")[0]) == list(CAPACITY_TYPES)


def test_every_training_key_is_documented():
    # In the training table's key column, as a full key path, and nothing that is not a key.
    documented = [path for row in TRAINING_TABLE for path in documented_paths(row[0])]
    assert len(documented) == len(set(documented))
    assert sorted(documented) == sorted(leaf_paths(TrainConfig))


def _shown(default: object) -> str | None:
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, (int, float)):
        return repr(float(default))
    if isinstance(default, str):
        return default
    return None


def test_training_table_defaults_are_the_models():
    defaults = leaf_paths(TrainConfig)
    checked = 0
    for row in TRAINING_TABLE:
        paths = documented_paths(row[0])
        cells = [cell.strip().strip("`") for cell in row[1].split(",")]
        if len(cells) == 1:
            cells = cells * len(paths)
        assert len(cells) == len(paths), row
        for path, cell in zip(paths, cells, strict=True):
            expected = _shown(defaults[path])
            if expected is None:
                continue  # e.g. d_ff: null means 4·d_model
            try:
                shown = repr(float(cell))
            except ValueError:
                shown = cell
            assert shown == expected, (path, cell, defaults[path])
            checked += 1
    unset = [path for path, value in defaults.items() if _shown(value) is None]  # d_ff, peak_flops_per_chip
    assert checked == len(defaults) - len(unset)


#: How the README's two set-up commands start: uv in a virtual environment of its own, which a
#: Debian/Ubuntu system Python allows (PEP 668 refuses `pip install` outside one).
SET_UP = "python3 -m venv .venv-uv && .venv-uv/bin/pip install uv && .venv-uv/bin/uv run --frozen "
TEST_COMMAND = SET_UP + "pytest"


def test_set_up_commands_use_existing_options():
    commands = re.findall(rf"^{re.escape(SET_UP)}(.+)$", README, flags=re.M)
    assert len(commands) == 2 and commands[1] == "pytest"
    words = commands[0].split()
    assert words[:3] == ["multislice", "local", "up"]
    help_text = CliRunner().invoke(app, ["local", "up", "--help"], env={"COLUMNS": "200"}).output
    for option in (w for w in words if w.startswith("--")):
        assert option in help_text


def test_ci_runs_the_readme_test_command():
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert TEST_COMMAND in ci.splitlines()


def test_ci_fails_on_a_stale_lock_before_testing():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    check = next(i for i, line in enumerate(lines) if line.startswith(".venv-uv/bin/uv lock --check"))
    tests = lines.index(TEST_COMMAND)
    assert check < tests
    # `set -e` stops the script when the check fails; the check itself exits non-zero.
    assert "set -euo pipefail" in lines and "|| {" in lines[check] and lines[check].endswith("exit 1; }")


def test_ci_runs_the_linters_the_readme_names():
    linters = section(DEVELOPMENT, "## Linters and type checker")
    assert "```bash\n.ci/lint\n```" in linters
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ".ci/lint || lint_status=$?" in ci and ci[-1] == 'exit "$lint_status"'
    lint = (ROOT / ".ci" / "lint").read_text()
    for tool in ("ruff check .", "ruff format --check .", "basedpyright", "shellcheck"):
        assert f"run --frozen {tool}" in lint and f"`{tool}" in linters, tool


def test_readme_states_the_minimum_pulumi_cli():
    # 3.145.0: dynamic providers use the uv toolchain's virtualenv; 3.146.0: their output is shown.
    match = re.search(r"Pulumi CLI\]\([^)]*\)\s+\*\*(\d+)\.(\d+)\.(\d+) or later\*\*", DEPLOYING)
    assert match and tuple(map(int, match.groups())) >= (3, 146, 0)


def test_no_file_cites_the_internal_notes():
    # Facts the code relies on cite public sources or docs/ pages of this repository.
    internal = ["DESIGN" + ".md", "SEED" + "-NOTES", "seed " + "notes", "seed " + "doc"]
    offenders = []
    for folder in ("infra", "training", "tests", "benchmarks", "docs", "stacks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".in", ".md", ".yaml") and path.is_file():
                text = path.read_text(encoding="utf-8").lower()
                offenders += [f"{path.relative_to(ROOT)}: {word}" for word in internal if word.lower() in text]
    readme = README.lower()
    offenders += [f"README.md: {word}" for word in internal if word.lower() in readme]
    assert offenders == []


def readme_example_pattern(example: str, qr_id: str) -> re.Pattern[str]:
    """A README example as a pattern: its stack's queued resource id becomes ``qr_id``, each
    duration (``3m07s``) any duration, and an elided ``(…)`` any parenthesis."""
    pattern = re.escape(example.replace("multislice-staging", qr_id))
    pattern = re.sub(r"\d+m\d\ds", lambda _m: r"(?:\d+m\d\ds|\d+s)", pattern)
    return re.compile(pattern.replace(re.escape("(…)"), r"\(.+?\)"))


def test_readme_shows_what_pulumi_up_prints_while_a_qr_waits(clock, props, capsys):
    # A create that never leaves the queue, with the provider's own defaults (poll schedule,
    # progress period, printing to stderr as the Pulumi CLI shows it) on a virtual clock.
    text = " ".join(DEPLOYING.split())
    progress = re.search(r"`(\[multislice queued-resource\] [^`]+)`", text)[1]
    timed_out = re.search(r"`(queued resource 'multislice-staging' is still [^`]+)`", text)[1]
    with FakeTpuApi(["CREATING", "WAITING_FOR_RESOURCES"]) as fake:
        outs = QueuedResourceProvider(api_endpoint=fake.endpoint).create({**props, "createTimeoutSeconds": 1800}).outs
    printed = capsys.readouterr().err.replace("`", "").splitlines()
    qr_id = props["queuedResourceId"]
    waiting = [line for line in printed if readme_example_pattern(progress, qr_id).fullmatch(line)]
    assert len(waiting) >= 1800 // 60 - 1, printed  # "a line when the state changes, and every minute"
    assert outs["ready"] is False
    assert readme_example_pattern(timed_out, qr_id).fullmatch(outs["statusMessage"].replace("`", "")), outs


def test_docs_pages_the_code_cites_exist_with_their_sections():
    # `docs/<page>.md` (optionally followed by `, "Section"`) in code, tests and README.
    cited = re.compile(r'docs/([a-z0-9-]+\.md)(?:,\s+"([^"]+)")?')
    seen = []
    paths = [ROOT / "README.md"] + [
        p
        for folder in ("infra", "training", "tests", "benchmarks", "docs")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".in", ".md", ".sh")
    ]
    for path in (p for p in paths if p.name != "test_readme.py"):  # this file's patterns are no citations
        for cited_page, heading in cited.findall(path.read_text(encoding="utf-8")):
            doc = ROOT / "docs" / cited_page
            assert doc.is_file(), f"{path.relative_to(ROOT)} cites docs/{cited_page}"
            headings = [line.lstrip("#").strip() for line in doc.read_text().splitlines() if line.startswith("#")]
            assert not heading or any(h.startswith(heading) for h in headings), (
                path.relative_to(ROOT),
                cited_page,
                heading,
            )
            seen.append((cited_page, heading))
    assert {"cloud-tpu.md", "jax-on-cpu.md", "deploying.md"} <= {name for name, _ in seen}
    assert any(heading for _, heading in seen)
    # Every page says where its facts come from.
    for doc in (ROOT / "docs").glob("*.md"):
        assert "https://" in doc.read_text(), doc.name


def test_source_paths_the_readme_and_docs_cite_exist():
    # A module or template moved (infra/startup/, infra/components/, ...) is cited by its new path.
    cited = re.compile(
        r"\b((?:infra|training|tests|benchmarks)/[A-Za-z0-9_/.-]*?(?:\.py|\.sh\.in|\.sh|/))(?![A-Za-z0-9_.-])"
    )
    texts = {"README.md": README} | {
        f"docs/{doc.name}": doc.read_text(encoding="utf-8") for doc in (ROOT / "docs").glob("*.md")
    }
    found = [(name, path) for name, text in texts.items() for path in cited.findall(text)]
    assert len(found) > 20  # the pattern still matches what the pages cite
    assert [(name, path) for name, path in found if not (ROOT / path).exists()] == []


def test_every_local_up_option_is_in_the_readme_table():
    help_text = CliRunner().invoke(app, ["local", "up", "--help"], env={"COLUMNS": "200"}).output
    listed = set(re.findall(r"│ (--[a-z][a-z-]*)", help_text)) - {"--help"}
    assert {"--kill", "--preempt", "--fresh", "--stack"} <= listed  # the help was parsed
    options = section(EMULATION, "## `multislice local up` options")
    documented = {
        option for table in tables(options) for row in table for option in re.findall(r"`(--[a-z][a-z-]*)", row[0])
    }
    assert listed - documented == set(), "options `local up --help` lists that docs/emulation.md's table omits"
    assert documented - listed == set(), "options docs/emulation.md's table names that `local up` does not have"


# The README's command lines, run against the repository ----------------------------------------


#: The README's uv prefix: the set-up's `.venv-uv/bin/uv` or the `uv` the examples write.
UV_RUN = re.compile(r"^(?:\.venv-uv/bin/)?uv run(?: --frozen)?(?: --project \S+)? ")
#: Commands run here: offline, without credentials or the Pulumi CLI, in seconds.
RUN = re.compile(r"^multislice (check|render|plan|diff) ")
#: Commands not run here, each with the reason (first match wins).
NOT_RUN = {
    r"^python3 -m venv \.venv-uv$": "the set-up's first step: CI runs the set-up (.ci/run)",
    r"^\.venv-uv/bin/pip install uv$": "the set-up's second step: CI runs the set-up (.ci/run)",
    r"^alias uv=": "a shell alias: test_the_uv_alias_names_what_the_set_up_installs",
    r"^pytest$": "the whole suite: CI runs it (test_ci_runs_the_readme_test_command)",
    r"^multislice \S+ --config-file ~/": "a stack file a page's example writes in ~ first: "
    "tests/local/test_day_one.py and tests/local/test_compute_engine_example.py run these lines as written",
    r"^multislice local up ": "emulates a stack for minutes: tests/local/ run it",
    r"^multislice local (status|logs) ": "reads the run `local up` left in .multislice/: tests/local/, tests/status/",
    r"^multislice (status|logs) ": "reads Cloud TPU, Cloud Storage or Cloud Logging with credentials",
    r"^multislice (exec|reset) ": "acts on a deployed stack's VMs: tests/cli/test_exec.py and "
    "tests/backends/queued_resource/test_reset.py run them against a stand-in gcloud and the TPU API fake",
    r"^multislice local (exec|reset) ": "acts on a running local up: tests/local/test_reset_emulation.py",
    r"^multislice local down ": "stops a running local up: tests/local/test_emulation.py, tests/cli/test_local_down.py",
    r"^sed 's/steps: ": "writes the day-one stack file: "
    "test_the_day_one_stack_is_the_dev_stack_with_more_steps and tests/local/test_day_one.py run it",
    r"^(sed -e 's/v4-8/v5p-8/' |echo ' multislice:backend: compute-engine' >> )": "writes the compute-engine "
    "example's stack file: tests/local/test_compute_engine_example.py runs it",
    r"^multislice bench shardings ": "measures JAX meshes for tens of seconds: tests/training/ run it",
    r"^python3? benchmarks/": "a benchmark: measures for minutes",
    r"^multislice data prepare .* --emulated\b": "tokenizes into a stack's emulated bucket for a minute: "
    "tests/local/test_day_one.py runs the README's as written, tests/local/test_faults_emulation.py another; "
    "test_emulated_datasets_go_to_the_stacks_bucket checks the bucket",
    r"^multislice data prepare \S+ /": "tokenizes into a local directory for a minute: tests/cli/test_data.py runs the "
    "command on local text",
    r"^multislice data prepare ": "writes to a real bucket: tests/cli/test_data.py runs the command on local text",
    r"^pulumi ": "needs the Pulumi CLI and cloud credentials",
    r"^\.ci/lint$": "the linters: CI runs them (test_ci_runs_the_linters_the_readme_names)",
}


def runnable(command: str) -> str | None:
    """The arguments of ``multislice`` for a README command run here, else None."""
    words = UV_RUN.sub("", command)
    return words if RUN.match(words) and " ~/" not in words else None


def test_every_readme_command_is_run_or_says_why_not():
    commands = readme_commands()
    unclassified = [
        c for c in commands if runnable(c) is None and not any(re.search(p, UV_RUN.sub("", c)) for p in NOT_RUN)
    ]
    assert unclassified == []
    assert len([c for c in commands if runnable(c)]) >= 5  # check, diff, render, plan × 2


def readme_arguments(command: str, tmp_path: Path) -> list[str]:
    """``multislice``'s arguments for a README command: an optional ``[...]`` part included, the
    placeholder ``path/to/Pulumi.mystack.yaml`` a copy of the dev stack, and ``origin/main``
    this checkout's HEAD when the clone has no such branch."""
    text = re.sub(r"\[([^\]]+)\]", r"\1", runnable(command) or "")
    if "path/to/" in text:
        (tmp_path / "path" / "to").mkdir(parents=True)
        shutil.copy(ROOT / "stacks" / "Pulumi.dev.yaml", tmp_path / "path" / "to" / "Pulumi.mystack.yaml")
        text = text.replace("path/to/", f"{tmp_path}/path/to/")
    has_origin = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "-q", "--verify", "origin/main"], capture_output=True
    )
    if "origin/main" in text and has_origin.returncode != 0:
        text = text.replace("origin/main", "HEAD")
    return shlex.split(text)[1:]


@pytest.mark.parametrize("command", [c for c in readme_commands() if runnable(c)])
def test_the_readme_commands_run_as_documented(command, tmp_path, monkeypatch):
    # In the repository, as the README says to run them; no emulated Cloud Storage or metadata
    # server from other tests (the prod stack's gs:// data source is then not listed).
    for name in ("STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST", "GCE_METADATA_IP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)
    arguments = readme_arguments(command, tmp_path)
    result = CliRunner().invoke(app, arguments, env={"COLUMNS": "200"}, color=False)
    assert result.exit_code == 0, (arguments, result.output)  # check: no mandatory violation
    assert result.output.strip()
    if arguments[0] == "check":
        assert re.search(r"\b0 mandatory\b", result.output), result.output


def test_the_policy_files_the_readme_names_exist():
    named = set(re.findall(r"\bstacks/policy\.[a-z0-9-]+\.json\b", REVIEW))
    assert named and all((ROOT / path).is_file() for path in named), named
    assert any(f"--policy-config {path}" in REVIEW for path in named)  # and a command runs with it


CLI = typer.main.get_command(app)


def multislice_words(command: str) -> list[str] | None:
    """A ``multislice`` command's words after the program name, an optional ``[...]`` part
    included; None for another program."""
    words = shlex.split(re.sub(r"\[([^\]]+)\]", r"\1", UV_RUN.sub("", command)))
    return words[1:] if words[:1] == ["multislice"] else None


def test_the_readme_commands_use_existing_options():
    # Every multislice command of the README and its pages, run here or not, names a command
    # and options the CLI has (up to a bare `--`, after which the words are the command's).
    checked = []
    for command in readme_commands():
        words = multislice_words(command)
        if words is None:
            continue
        cli = CLI  # a group has `commands` (typer's own click: no click.Group to test against)
        while words and words[0] in getattr(cli, "commands", {}):
            cli, words = cli.commands[words[0]], words[1:]
        assert not hasattr(cli, "commands"), command  # a command, not a group
        known = {option for param in cli.params for option in (*param.opts, *param.secondary_opts)}
        own = words[: words.index("--")] if "--" in words else words
        given = {word.split("=", 1)[0] for word in own if word.startswith("-")}
        assert given <= known, (command, given - known)
        checked += sorted(given)
    assert len(checked) >= 60  # the pattern still finds the commands and their options


def day_one_stack(home: Path) -> Path:
    """Run the README's ``sed`` line as a shell would, in the repository with ``home`` as
    ``~``; the stack file it wrote."""
    (line,) = [c for c in readme_commands() if c.startswith("sed 's/steps: ")]
    assert line in " ".join(day_one().split())
    subprocess.run(["bash", "-c", line], cwd=ROOT, env=os.environ | {"HOME": str(home)}, check=True, timeout=60)
    target = re.fullmatch(r".* > (\S+)", line)
    assert target and target[1].startswith("~/"), line
    return home / target[1].removeprefix("~/")


def stack_of(words: list[str], home: Path) -> StackConfig:
    """The stack a command's ``--config-file`` (``~`` is ``home``) or ``--stack`` names."""
    if "--config-file" in words:
        return load_stack_file(Path(words[words.index("--config-file") + 1].replace("~", str(home), 1)))
    return load_stack(words[words.index("--stack") + 1])


def test_the_day_one_stack_is_the_dev_stack_with_more_steps(tmp_path):
    path = day_one_stack(tmp_path)
    dev, long = load_stack("dev"), load_stack_file(path)
    # Longer than the quick start's run, outside stacks/ (in ~), and nothing else changed.
    assert long.training.steps >= 5 * dev.training.steps
    assert f"{long.training.steps:,} steps instead of {dev.training.steps}" in " ".join(day_one().split())
    changed = yaml.safe_load(path.read_text())
    changed["config"]["multislice:training"]["steps"] = dev.training.steps
    assert changed == yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    # Every day-one command acts on that file's stack: its path, or its name.
    assert f"name, `{long.stack}`, comes from the file's name" in " ".join(day_one().split())
    commands = [c for c in readme_commands() if c in " ".join(day_one().split()) and multislice_words(c)]
    assert len(commands) >= 9
    for command in commands:
        words = multislice_words(command) or []
        if "--config-file" in words:
            assert stack_of(words, tmp_path).stack == long.stack, command
        else:  # a local run's name (every command resolves it to the file its local up ran from)
            assert words[words.index("--stack") + 1] == long.stack, command


def test_the_day_one_data_lines_point_the_stack_at_the_prepared_dataset(tmp_path):
    path = day_one_stack(tmp_path)
    (prepare,) = [c for c in readme_commands() if c in " ".join(day_one().split()) and " data prepare " in c]
    words = multislice_words(prepare) or []
    output = words[3]
    assert (
        words[:2] == ["data", "prepare"]
        and "--emulated" in words
        and stack_of(words, tmp_path) == load_stack_file(path)
    )
    # The YAML lines, put where the README says, make a stack that trains on that dataset.
    (lines,) = re.findall(r"```yaml\n(.*?)```", day_one(), flags=re.S)
    anchor = "  multislice:training:\n"
    assert "right under `multislice:training:`" in " ".join(day_one().split())
    text = path.read_text()
    assert text.count(anchor) == 1
    path.write_text(text.replace(anchor, anchor + lines))
    config = load_stack_file(path)
    assert config.training.data.source == output
    assert output.startswith(f"gs://{config.bucket_name}/datasets/")
    assert config.training.model.vocab_size is None  # the model takes the manifest's vocabulary
    assert "`<project>-<stack>-ckpt`" in day_one() and config.bucket_name == f"{config.project}-{config.stack}-ckpt"


def test_emulated_datasets_go_to_the_stacks_bucket(tmp_path):
    # `data prepare --emulated` writes only the stack's bucket (infra/cli/data.py refuses another).
    day_one_stack(tmp_path)
    checked = 0
    for command in readme_commands():
        words = multislice_words(command)
        if words is None or words[:2] != ["data", "prepare"] or "--emulated" not in words:
            continue
        assert words[3].startswith(f"gs://{stack_of(words, tmp_path).bucket_name}/"), command
        checked += 1
    assert checked >= 2  # the README's day one and docs/data.md


def test_the_uv_alias_names_what_the_set_up_installs():
    alias = next(c for c in readme_commands() if c.startswith("alias uv="))
    assert alias == 'alias uv="$PWD/.venv-uv/bin/uv"'
    assert ".venv-uv/bin/pip install uv" in readme_commands()


def uv_binary() -> str | None:
    pinned = Path(sys.prefix) / "bin" / "uv"  # uv.lock pins uv: the project's .venv has it
    return str(pinned) if pinned.is_file() else shutil.which("uv")


@pytest.mark.skipif(uv_binary() is None, reason="no uv here")
def test_uv_run_needs_the_repository_or_its_path(tmp_path):
    # Outside the repository (a plain shell: no activated virtualenv), `uv run multislice`
    # cannot find the command; `--project` names the repository and it runs.
    uv = uv_binary() or ""
    venv_bins = {str(Path(sys.prefix) / "bin"), str(ROOT / ".venv" / "bin")}
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p not in venv_bins)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PATH": path}
    text = " ".join(README.split())
    said = re.search(r"anywhere else uv says `([^`]+)`", text)
    assert said and "--project" in text
    plan = ["multislice", "plan", "--stack", "prod", "--json"]

    def run(*options: str) -> subprocess.CompletedProcess[str]:
        command = [uv, "run", "--frozen", "--offline", *options, *plan]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    outside = run()
    assert outside.returncode != 0 and said[1] in outside.stderr, outside.stderr
    named = run("--project", str(ROOT))
    assert named.returncode == 0, named.stderr
    assert '"dcn_bound"' in named.stdout


def pinned_wheels() -> dict[str, int]:
    """What ``uv run --frozen`` installs on this machine: each package's best wheel for this
    interpreter (``packaging.tags``) among those uv.lock records, name → size in bytes."""
    from packaging.requirements import Requirement
    from packaging.tags import sys_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename

    export = [uv_binary() or "uv", "export", "--frozen", "--no-emit-project", "--no-hashes", "--no-header"]
    lines = subprocess.run(export, cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout
    lock = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    by_pin = {(canonicalize_name(p["name"]), p["version"]): p for p in lock}
    rank = {tag: i for i, tag in enumerate(sys_tags())}
    sizes = {}
    for line in (raw.strip() for raw in lines.splitlines()):
        if not line or line.startswith("#"):
            continue
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonicalize_name(requirement.name)
        wheels = by_pin[(name, str(requirement.specifier).removeprefix("=="))]["wheels"]

        def fit(wheel: dict) -> int:
            tags = parse_wheel_filename(wheel["url"].rsplit("/", 1)[1])[3]
            return min((rank[tag] for tag in tags if tag in rank), default=len(rank))

        sizes[name] = min(wheels, key=fit)["size"]
    return sizes


@pytest.mark.skipif(
    (sys.platform, platform.machine(), sys.version_info[:2]) != ("linux", "x86_64", (3, 11)) or uv_binary() is None,
    reason="the README's figures are for Linux x86_64 and Python 3.11, read with uv",
)
def test_the_readme_download_figures_are_the_locks():
    sizes = pinned_wheels()
    text = " ".join(DEVELOPMENT.split())
    count = re.search(r"the (\d+) wheels `uv.lock` pins for Linux x86_64", text)
    total = re.search(r"; (\d+) MB in all, jaxlib alone (\d+) MB\)", text)
    assert count and total
    mb = round(sum(sizes.values()) / 1e6)
    assert (int(count[1]), int(total[1]), int(total[2])) == (len(sizes), mb, round(sizes["jaxlib"] / 1e6))


def test_the_docs_commands_run_uv_alike_and_write_over_no_tracked_file():
    """Every ``uv run`` in a command block is ``uv run --frozen`` (the lock, never a re-resolve), and no
    command writes its plot, summary or output over a file the repository tracks."""
    tracked = set(
        subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    )
    unfrozen, overwritten = [], []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```[a-z]*\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in block.splitlines():
                where = f"{page.relative_to(ROOT)}: {line.strip()}"
                if re.search(r"\buv run\b", line) and not re.search(r"\buv run (--project \S+ )?--frozen\b", line):
                    unfrozen.append(where)
                for target in re.findall(r"(?:--(?:plot|summary-json|out|output)[ =]|>>?\s*)([^\s;&|]+)", line):
                    if target.lstrip("./") in tracked:
                        overwritten.append(where)
    assert unfrozen == [] and overwritten == [], (unfrozen, overwritten)
