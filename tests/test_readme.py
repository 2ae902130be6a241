"""The README stays true: its set-up commands use real options, its reference names every key."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel
from typer.testing import CliRunner

from infra.cli import app
from infra.config import CAPACITY_TYPES, StackConfig
from infra.queued_resource import QueuedResourceProvider
from tests.fakes.clock import clock  # noqa: F401 (fixture)
from tests.fakes.queued_resource import dev, no_ambient_credentials, props  # noqa: F401 (fixtures)
from tests.fakes.tpu_api import FakeTpuApi
from training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


REFERENCE = README.split("## Stack configuration reference", 1)[1].split("\n## ", 1)[0]


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


STACK_TABLE, TRAINING_TABLE = tables(REFERENCE)


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
            assert rows[field.alias][1].strip("`") == str(field.default), field.alias
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
    section = README.split("## Development: linters and type checker", 1)[1].split("\n## ", 1)[0]
    assert "```bash\n.ci/lint\n```" in section
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ".ci/lint || lint_status=$?" in ci and ci[-1] == 'exit "$lint_status"'
    lint = (ROOT / ".ci" / "lint").read_text()
    for tool in ("ruff check .", "ruff format --check .", "basedpyright", "shellcheck"):
        assert f"run --frozen {tool}" in lint and f"`{tool}" in section, tool


def test_readme_states_the_minimum_pulumi_cli():
    # 3.145.0: dynamic providers use the uv toolchain's virtualenv; 3.146.0: their output is shown.
    match = re.search(r"Pulumi CLI\]\([^)]*\)\s+\*\*(\d+)\.(\d+)\.(\d+) or later\*\*", README)
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
    text = " ".join(README.split())
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
        for page, section in cited.findall(path.read_text(encoding="utf-8")):
            doc = ROOT / "docs" / page
            assert doc.is_file(), f"{path.relative_to(ROOT)} cites docs/{page}"
            headings = [line.lstrip("#").strip() for line in doc.read_text().splitlines() if line.startswith("#")]
            assert not section or any(h.startswith(section) for h in headings), (path.relative_to(ROOT), page, section)
            seen.append((page, section))
    assert {"cloud-tpu.md", "jax-on-cpu.md", "deploying.md"} <= {page for page, _ in seen}
    assert any(section for _, section in seen)
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
    section = README.split("## The local emulation", 1)[1].split("\n## ", 1)[0]
    documented = {
        option for table in tables(section) for row in table for option in re.findall(r"`(--[a-z][a-z-]*)", row[0])
    }
    assert listed - documented == set(), "options `local up --help` lists that the README's table omits"
    assert documented - listed == set(), "options the README's table names that `local up` does not have"
