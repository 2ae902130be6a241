"""The error of a stack that cannot be used (its file or its values)."""

from __future__ import annotations


class StackConfigError(ValueError):
    """A stack file that cannot be used; ``lines`` holds one ``key path: problem`` each."""

    def __init__(self, summary: str, lines: list[str] | None = None):
        self.summary = summary
        self.lines = list(lines or [])
        text = summary if not self.lines else summary + "\n" + "\n".join(f"  {line}" for line in self.lines)
        super().__init__(text)
