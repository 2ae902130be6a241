"""A stand-in ``gcloud`` for the tests of ``multislice exec``: :func:`install` puts an executable
``gcloud`` on a ``PATH`` directory; each call appends its argument list (and when it started and
ended) to a JSON-lines file and answers from a plan:

* ``compute tpus queued-resources describe <id> …``: ``plan["describe"]`` = ``{"exit": 0,
  "stdout": <JSON value printed>, "stderr": "<text>"}``;
* ``alpha compute tpus tpu-vm ssh <node> … --worker=W …``: ``plan["ssh"]["<node>/<W>"]`` =
  ``{"lines": [...], "delay": seconds before each line, "first_delay": seconds before the
  first, "exit": status}`` (default: one line naming the node and worker, exit 0); with
  ``"run": true`` it runs the ``--command`` line with ``bash -c`` instead, as the VM's shell would.

Anything else exits 2 with gcloud's own kind of message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

PLAN_ENV = "FAKE_GCLOUD_PLAN"
CALLS_ENV = "FAKE_GCLOUD_CALLS"


def install(directory: Path, plan: dict) -> dict[str, str]:
    """Write ``directory/bin/gcloud`` and the plan; the environment variables to run it with
    (``PATH`` first)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "gcloud"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    script.chmod(0o755)
    plan_path = directory / "gcloud-plan.json"
    plan_path.write_text(json.dumps(plan))
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PLAN_ENV: str(plan_path),
        CALLS_ENV: str(directory / "gcloud-calls.jsonl"),
    }


def calls(directory: Path) -> list[dict]:
    """Every call recorded: ``{"argv", "start", "end", "pid"}`` (``time.time()`` seconds)."""
    path = directory / "gcloud-calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _flag(argv: list[str], name: str) -> str | None:
    for arg in argv:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def _serve(argv: list[str], plan: dict) -> int:
    if argv[:4] == ["compute", "tpus", "queued-resources", "describe"]:
        answer = plan.get("describe") or {}
        if "stdout" in answer:
            print(json.dumps(answer["stdout"]))
        if answer.get("stderr"):
            print(answer["stderr"], file=sys.stderr)
        return int(answer.get("exit", 0))
    if argv[:5] == ["alpha", "compute", "tpus", "tpu-vm", "ssh"]:
        node, worker = argv[5], _flag(argv, "worker")
        answer = (plan.get("ssh") or {}).get(f"{node}/{worker}") or {}
        if answer.get("run"):
            return subprocess.call(["bash", "-c", _flag(argv, "command") or ""])
        time.sleep(float(answer.get("first_delay", 0)))
        for line in answer.get("lines", [f"hello from {node} worker {worker}"]):
            time.sleep(float(answer.get("delay", 0)))
            print(line, flush=True)
        return int(answer.get("exit", 0))
    print(f"ERROR: (gcloud) Invalid choice: {' '.join(argv[:5])!r}.", file=sys.stderr)
    return 2


def main() -> int:
    argv = sys.argv[1:]
    plan = json.loads(Path(os.environ[PLAN_ENV]).read_text())
    start = time.time()
    code = _serve(argv, plan)
    with open(os.environ[CALLS_ENV], "a") as f:
        f.write(json.dumps({"argv": argv, "start": start, "end": time.time(), "pid": os.getpid()}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
