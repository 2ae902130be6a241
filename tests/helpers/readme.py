"""The README and the docs pages whose ``bash`` blocks hold commands, read as the tests read
them: a page's text, a section under a heading, every command line of the blocks
(tests/test_readme.py checks them; tests/local/test_day_one.py runs the README's day one)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def page(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The part of ``text`` under the heading line that starts with ``heading``, up to the next
    level-2 heading."""
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


#: The README's former sections, now docs pages (the README links them): the same checks read
#: them there.
CONFIGURATION = page("configuration.md")  # "Stack configuration reference"
EMULATION = page("emulation.md")  # "The local emulation"
DEPLOYING = page("deploying.md")  # "Deploying for real": its first section
REVIEW = page("review.md")  # plan, bench shardings, the review workflow
DEVELOPMENT = page("development.md")  # set-up in detail, layout, linters
#: The pages whose ``bash`` blocks hold the README's former commands (with the pages' own).
COMMAND_PAGES = {
    name: page(name)
    for name in (
        "emulation.md",
        "review.md",
        "deploying.md",
        "status-and-logs.md",
        "exec-and-reset.md",
        "data.md",
        "development.md",
        "compute-engine.md",
    )
}


def without_comment(line: str) -> str:
    """``line`` less a trailing shell comment: from the first ``#`` that starts a word outside
    quotes."""
    for found in re.finditer(r"(?:^|\s)#", line):
        head = line[: found.start()]
        try:
            shlex.split(head)
        except ValueError:  # the ``#`` is inside quotes
            continue
        return head.rstrip()
    return line.rstrip()


def bash_lines(text: str) -> list[str]:
    """The command lines of ``text``'s ``bash`` blocks, in order, as written: continuation lines
    joined, a trailing comment and surrounding whitespace dropped, nothing else (what
    tests/local/test_day_one.py runs; :func:`readme_commands` collapses whitespace to compare)."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ").splitlines()  # continuation lines joined
        lines += [line for line in (without_comment(raw).strip() for raw in joined) if line]
    return lines


def readme_commands() -> list[str]:
    """Every command of the ``bash`` blocks of the README and of ``COMMAND_PAGES``, in order
    (:func:`bash_lines`), ``a && b`` split into ``a`` and ``b``, whitespace collapsed."""
    return [
        " ".join(part.split())
        for text in (README, *COMMAND_PAGES.values())
        for line in bash_lines(text)
        for part in line.split(" && ")
        if part.strip()
    ]


def day_one() -> str:
    return section(README, "## Day one")
