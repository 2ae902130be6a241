"""What ``pulumi preview --diff`` shows of the queued resource for a one-line trainer change:
the release's changed file and hashes, never the startup script's base64 (issue: readable
preview diffs). The program is evaluated as the engine receives it (program_mocks records each
RegisterResource request, hide_diffs included); the engine prints the changed input properties
less the hidden paths, each leaf as ``old => new``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from infra import startup
from infra.config import load_stack
from infra.queued_resource import QueuedResourceProvider
from infra.review.program_mocks import QR_TYPE, evaluate
from infra.startup.shipped_source import strip_documentation

ROOT = Path(__file__).resolve().parents[3]


def changed_leaves(olds: Any, news: Any, path: str = "") -> dict[str, tuple[Any, Any]]:
    """Every leaf path where ``olds`` and ``news`` differ, in the engine's property-path syntax
    (``a.b``, ``a["k"]``)."""
    if isinstance(olds, dict) and isinstance(news, dict):
        found: dict[str, tuple[Any, Any]] = {}
        for key in sorted(set(olds) | set(news)):
            sub = f'{path}["{key}"]' if path and not str(key).isidentifier() else (f"{path}.{key}" if path else key)
            found |= changed_leaves(olds.get(key), news.get(key), sub)
        return found
    return {} if olds == news else {path: (olds, news)}


def hidden(path: str, hide_diffs: list[str]) -> bool:
    return any(path == h or path.startswith(h + ".") or path.startswith(h + "[") for h in hide_diffs)


def test_a_one_line_trainer_change_previews_as_the_changed_file(tmp_path):
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "training", root / "training", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "uv.lock", ".python-version"):
        shutil.copy(ROOT / name, root / name)
    config = load_stack("dev")
    before_script = startup.render(config, project_root=root)
    model_py = root / "training" / "model" / "transformer.py"
    model_py.write_text(model_py.read_text().replace('"""', '"""Reworded docs, same lines. ', 1))
    assert startup.render(config, project_root=root) == before_script  # documentation does not ship
    with open(root / "training" / "model" / "transformer.py", "a") as f:
        f.write("MODEL_REVISION = 2\n")  # a one-line code change
    after_script = startup.render(config, project_root=root)

    before = evaluate("dev", script=before_script).one(QR_TYPE)
    after = evaluate("dev", script=after_script).one(QR_TYPE)
    assert after.hide_diffs == ['metadata["startup-script"]']

    shown = {p: v for p, v in changed_leaves(before.inputs, after.inputs).items() if not hidden(p, after.hide_diffs)}
    shipped_model = strip_documentation((root / "training" / "model" / "transformer.py").read_bytes())
    model_digest = startup.file_digests({"m": shipped_model})["m"]
    assert shown['releaseFiles["training/model/transformer.py"]'][1] == model_digest
    assert [p for p in shown if p.startswith("releaseFiles")] == ['releaseFiles["training/model/transformer.py"]']
    # The script's size is shown when it changed. The release is xz-compressed, and xz pads
    # each block to a multiple of 4 bytes (https://tukaani.org/xz/xz-file-format.txt, 3.3
    # "Block Padding"), so a one-line change may leave the script's size as it was.
    resized = {"startupScriptBytes"} if len(before_script.text.encode()) != len(after_script.text.encode()) else set()
    assert (
        set(shown) == {'releaseFiles["training/model/transformer.py"]', "bundleSha256", "startupScriptSha256"} | resized
    )
    assert all(len(str(value)) <= 64 for pair in shown.values() for value in pair)  # no wall of base64
    # ... and the provider's own rule: an update in place (no replacement of the capacity).
    diff = QueuedResourceProvider().diff("qr", before.inputs, after.inputs)
    assert diff.changes is True and diff.replaces == []
