"""A stand-in ``gcloud`` for the tests of ``multislice exec``: :func:`install` puts an executable
``gcloud`` on a ``PATH`` directory, with stand-ins for OpenSSH's ``ssh``, ``scp`` and
``ssh-keygen``, and a ``HOME`` of its own; each call appends its argument list (and when it
started and ended) to a JSON-lines file and answers from a plan:

* ``compute tpus queued-resources describe <id> …``: ``plan["describe"]`` = ``{"exit": 0,
  "stdout": <JSON value printed>, "stderr": "<text>"}``;
* ``alpha compute tpus tpu-vm ssh <node> … --worker=W …``: first what gcloud 528's
  ``PrepareNodeForSSH`` does with the key (``lib/googlecloudsdk/command_lib/compute/tpus/
  tpu_vm/ssh.py``): ``ssh-keygen -N '' -t rsa -f ~/.ssh/google_compute_engine`` when neither
  file of the pair exists (a broken pair fails, as with ``--quiet``), then an "UpdateNode" that
  adds the public key to ``<dir>/nodes/<node>.ssh-keys`` unless it is there, taking
  ``plan["update_node_s"]`` seconds (recorded in the call as ``update_node``: [start, end]).
  Then gcloud's ``AttemptRunWithRetries``: up to 10 attempts, each announced on stderr with
  ``SSH: Attempting to connect to worker W...``; an attempt whose "ssh" exits 255 is retried
  (after ``plan["retry_s"]`` seconds, default 0). ``plan["ssh"]["<node>/<W>"]`` = ``{"lines":
  [...], "delay": seconds before each line, "first_delay": seconds before the first, "exit":
  status}`` (default: one line naming the node and worker, exit 0); a line may be ``{"text": ...,
  "after": [log file name, line]}``: printed once the fan-out's log file of that name under
  ``answer["log_dir"]`` holds that line (the fan-out logs a line after showing it), and
  ``"after_connections": n`` holds every line until n distinct workers have connected (at most
  :data:`WAIT_LIMIT_S` either way); with ``"run": true`` it runs
  the ``--command`` line with ``bash -c`` instead, as the VM's shell would, in
  ``<dir>/vms/<node>-<W>`` (its home); ``"unreachable": n``: the first n attempts fail to
  connect (255, the command not run); ``"drops": n``: the next n attempts run the command and
  then lose the connection (255).

The compute-engine backend's calls (gcloud 528's ``lib/surface/compute/instance_groups/managed/
list_instances.py`` and ``lib/surface/compute/ssh.py``):

* ``compute instance-groups managed list-instances <group> … --format=json``:
  ``plan["groups"][<group>]`` = a list of ``ManagedInstance`` objects printed as JSON, or
  ``{"exit", "stdout", "stderr"}``; a group not in the plan fails as gcloud does for a missing
  one (``Could not fetch resource:`` / `` - The resource '…' was not found``);
* ``compute ssh <instance> …``: the key pair as above, then ``EnsureSSHKeyIsInProject``: unless
  the public key is in ``<dir>/project.ssh-keys`` already, ``Updating project ssh metadata...``,
  ``plan["update_project_s"]`` seconds, the key appended (recorded as ``update_project``:
  [start, end]), ``Waiting for SSH key to propagate.``; then one connection, no retry:
  ``plan["ssh"]["<instance>"]`` as above (``lines``/``exit``/``run``; ``"drops": 1``: the
  command runs and the connection is lost, exit 255).

The stand-in ``ssh-keygen`` appends its arguments to ``<dir>/keygen-calls.txt``; when its
``-f`` file exists it asks "Overwrite (y/n)?" and, with no answer on its standard input, exits
1, as OpenSSH's does; else it writes the private key, waits ``plan["keygen_s"]`` seconds, and
writes the public key (a key of its own process id).

Anything else exits 2 with gcloud's own kind of message.

What the plan scripts gcloud to print is judged, when it is installed, by the schema the API answers
it in (tests/fakes/discovery.py: the discovery document and the fields Google always returns): a
group's list as the Compute API's ``ManagedInstance`` objects, a ``describe`` answer that is an object
as Cloud TPU's ``QueuedResource``; so this fake and the emulated APIs cannot disagree. A plan that
scripts an answer Google would not give, on purpose (how the product meets a malformed one), says so
with ``"unlike_google": true``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PLAN_ENV = "FAKE_GCLOUD_PLAN"
CALLS_ENV = "FAKE_GCLOUD_CALLS"


KEYGEN = """#!/bin/sh
echo "$*" >> "$FAKE_KEYGEN_CALLS"
while [ $# -gt 0 ]; do
  case "$1" in -f) key=$2; shift ;; esac
  shift
done
if [ -e "$key" ]; then
  echo "$key already exists."
  printf 'Overwrite (y/n)? '
  read -r answer || exit 1
  [ "$answer" = y ] || exit 1
fi
printf '%s\\n' '-----BEGIN OPENSSH PRIVATE KEY-----' "stand-in $$" '-----END OPENSSH PRIVATE KEY-----' > "$key"
sleep "${FAKE_KEYGEN_SECONDS:-0}"
echo "ssh-rsa AAAAstandin$$ stand-in@workstation" > "$key.pub"
"""


def install(directory: Path, plan: dict, tools: tuple[str, ...] = ("ssh", "scp", "ssh-keygen")) -> dict[str, str]:
    """Write ``directory/bin/gcloud``, the stand-ins of ``tools`` and the plan; the environment
    variables to run them with (``PATH`` first, ``HOME`` = ``directory/home``)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "gcloud"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    script.chmod(0o755)
    for tool in tools:
        stand_in = bin_dir / tool
        stand_in.write_text(KEYGEN if tool == "ssh-keygen" else f"#!/bin/sh\necho '{tool}: a stand-in' >&2\nexit 255\n")
        stand_in.chmod(0o755)
    if not plan.get("unlike_google"):
        problems = scripted_answer_problems(plan)
        assert not problems, "the gcloud plan scripts answers Google would not give:\n  " + "\n  ".join(problems)
    plan_path = directory / "gcloud-plan.json"
    plan_path.write_text(json.dumps(plan))
    (directory / "home").mkdir(exist_ok=True)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(directory / "home"),
        PLAN_ENV: str(plan_path),
        CALLS_ENV: str(directory / "gcloud-calls.jsonl"),
        "FAKE_KEYGEN_CALLS": str(directory / "keygen-calls.txt"),
        "FAKE_KEYGEN_SECONDS": str(plan.get("keygen_s", 0)),
    }


def keygen_calls(directory: Path) -> list[str]:
    """The stand-in ``ssh-keygen``'s argument lists, one string each."""
    path = directory / "keygen-calls.txt"
    return path.read_text().splitlines() if path.exists() else []


def calls(directory: Path) -> list[dict]:
    """Every call recorded: ``{"argv", "start", "end", "pid"}`` (``time.time()`` seconds), and for
    an ssh ``attempts``, ``update_node`` ([start, end]) and ``keygen`` (its exit status) when
    they happened."""
    path = directory / "gcloud-calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _flag(argv: list[str], name: str) -> str | None:
    for arg in argv:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def scripted_answer_problems(plan: dict) -> list[str]:
    """What the discovery documents refuse in the plan's scripted answers (the module docstring)."""
    from tests.fakes import discovery

    compute, tpu = discovery.document("compute", "v1"), discovery.document("tpu", "v2")
    problems = []
    for group, answer in (plan.get("groups") or {}).items():
        if isinstance(answer, list):
            for i, item in enumerate(answer):
                where = f"groups[{group!r}][{i}]"
                problems += discovery.check_value(compute, {"$ref": "ManagedInstance"}, item, where, None)
    described = (plan.get("describe") or {}).get("stdout")
    if isinstance(described, dict):
        problems += discovery.check_value(tpu, {"$ref": "QueuedResource"}, described, "describe", None)
    return problems


def _serve(argv: list[str], plan: dict, record: dict) -> int:
    if argv[:4] == ["compute", "tpus", "queued-resources", "describe"]:
        answer = plan.get("describe") or {}
        if "stdout" in answer:
            print(json.dumps(answer["stdout"]))
        if answer.get("stderr"):
            print(answer["stderr"], file=sys.stderr)
        return int(answer.get("exit", 0))
    if argv[:5] == ["alpha", "compute", "tpus", "tpu-vm", "ssh"]:
        node, worker = argv[5], _flag(argv, "worker")
        directory = Path(os.environ[PLAN_ENV]).parent
        prepared = _prepare_node(node, plan, directory, record)
        if prepared:
            return prepared
        answer = (plan.get("ssh") or {}).get(f"{node}/{worker}") or {}
        unreachable, drops = int(answer.get("unreachable", 0)), int(answer.get("drops", 0))
        for attempt in range(10):
            print(f"SSH: Attempting to connect to worker {worker}...", file=sys.stderr, flush=True)
            if attempt < unreachable:
                print(
                    f"ssh: connect to host {node}-{worker} port 22: Connection timed out", file=sys.stderr, flush=True
                )
                code = 255
            else:
                code = _remote(node, worker, argv, answer, directory)
                if attempt < unreachable + drops:
                    print(f"Connection to {node}-{worker} closed by remote host.", file=sys.stderr, flush=True)
                    code = 255
            record["attempts"] = attempt + 1
            if code != 255:
                return code
            if attempt < 9:
                print("Retrying: SSH command error: [/usr/bin/ssh] exited with return code [255].", file=sys.stderr)
                time.sleep(float(plan.get("retry_s", 0)))
        print(
            "ERROR: (gcloud.alpha.compute.tpus.tpu-vm.ssh) [/usr/bin/ssh] exited with return code [255].",
            file=sys.stderr,
        )
        return 255
    if argv[:4] == ["compute", "instance-groups", "managed", "list-instances"]:
        group = argv[4]
        answer = (plan.get("groups") or {}).get(group)
        if answer is None:
            print(
                "ERROR: (gcloud.compute.instance-groups.managed.list-instances) Could not fetch resource:",
                file=sys.stderr,
            )
            print(
                f" - The resource 'projects/{_flag(argv, 'project')}/zones/{_flag(argv, 'zone')}/"
                f"instanceGroupManagers/{group}' was not found",
                file=sys.stderr,
            )
            return 1
        reply: dict = {"stdout": answer} if isinstance(answer, list) else answer
        if "stdout" in reply:
            print(json.dumps(reply["stdout"]))
        if reply.get("stderr"):
            print(reply["stderr"], file=sys.stderr)
        return int(reply.get("exit", 0))
    if argv[:2] == ["compute", "ssh"] and len(argv) > 2:
        instance = argv[2]
        directory = Path(os.environ[PLAN_ENV]).parent
        prepared = _prepare_key(plan, directory / "project.ssh-keys", "update_project", "compute.ssh", record)
        if prepared:
            return prepared
        answer = (plan.get("ssh") or {}).get(instance) or {}
        code = _remote(instance, None, argv, answer, directory)
        if answer.get("drops"):
            print(f"Connection to {instance} closed by remote host.", file=sys.stderr, flush=True)
            print("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].", file=sys.stderr)
            return 255
        return code
    print(f"ERROR: (gcloud) Invalid choice: {' '.join(argv[:5])!r}.", file=sys.stderr)
    return 2


def _prepare_node(node: str, plan: dict, directory: Path, record: dict) -> int:
    """gcloud's ``Keys.EnsureKeysExist`` and ``AddSSHKeyIfNeeded`` (see the module docstring):
    0, or gcloud's exit status when it fails."""
    return _prepare_key(
        plan, directory / "nodes" / f"{node}.ssh-keys", "update_node", "alpha.compute.tpus.tpu-vm.ssh", record
    )


def _prepare_key(plan: dict, metadata: Path, update: str, command: str, record: dict) -> int:
    """The key pair made when missing, then the public key added to ``metadata`` unless there
    (``plan["<update>_s"]`` seconds, recorded as ``record[update]``); 0, or gcloud's exit status."""
    key = Path(os.environ["HOME"]) / ".ssh" / "google_compute_engine"
    public = key.with_name(key.name + ".pub")
    present = [path.exists() and bool(path.read_text().strip()) for path in (key, public)]
    if present == [False, False] and not key.exists() and not public.exists():
        print("WARNING: You do not have an SSH key for gcloud.", file=sys.stderr)
        key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        code = subprocess.call(["ssh-keygen", "-N", "", "-t", "rsa", "-f", str(key)], stdin=subprocess.DEVNULL)
        record["keygen"] = code
        if code:
            print(
                f"ERROR: (gcloud.{command}) [ssh-keygen] exited with return code [{code}].",
                file=sys.stderr,
            )
            return 1
    elif present != [True, True]:
        print(f"ERROR: (gcloud.{command}) Your SSH key files are broken.", file=sys.stderr)
        print("Operation aborted.", file=sys.stderr)
        return 1
    entry = " ".join(public.read_text().split()[:2])
    if entry not in (metadata.read_text() if metadata.exists() else ""):
        start = time.time()
        if update == "update_project":
            print("Updating project ssh metadata...", end="", file=sys.stderr, flush=True)
        time.sleep(float(plan.get(f"{update}_s", 0)))
        metadata.parent.mkdir(exist_ok=True)
        with open(metadata, "a") as f:
            f.write(entry + "\n")
        record[update] = [start, time.time()]
        if update == "update_project":
            print("done.", file=sys.stderr, flush=True)
            print("Waiting for SSH key to propagate.", file=sys.stderr, flush=True)
    return 0


def _remote(node: str, worker: str | None, argv: list[str], answer: dict, directory: Path) -> int:
    """One connection's remote side: the plan's lines, or the ``--command`` line run."""
    if answer.get("run"):
        home = directory / "vms" / (node if worker is None else f"{node}-{worker}")
        home.mkdir(parents=True, exist_ok=True)
        command = _flag(argv, "command") or ""
        return subprocess.call(["bash", "-c", command], cwd=home, env={**os.environ, "HOME": str(home)})
    with open(directory / "connected", "a") as f:
        f.write(f"{node}/{worker}\n")
    time.sleep(float(answer.get("first_delay", 0)))
    if "after_connections" in answer:  # every one of that many workers has connected
        _wait_for(lambda: len(set((directory / "connected").read_text().split())) >= answer["after_connections"])
    greeting = f"hello from {node}" if worker is None else f"hello from {node} worker {worker}"
    for line in answer.get("lines", [greeting]):
        if isinstance(line, dict):  # {"text": ..., "after": [log file name, line]}
            name, shown = line["after"]
            _wait_for(lambda name=name, shown=shown: _logged(Path(answer["log_dir"]), name, shown))
            line = line["text"]
        time.sleep(float(answer.get("delay", 0)))
        print(line, flush=True)
    return int(answer.get("exit", 0))


#: Seconds a line that waits for an event waits at most (then it is printed anyway, and the test's
#: assertion on the order says what went wrong).
WAIT_LIMIT_S = 120.0


def _wait_for(event: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not event() and time.monotonic() < deadline:
        time.sleep(0.01)


def _logged(log_dir: Path, name: str, line: str) -> bool:
    """Whether a log file ``name`` under ``log_dir`` (the fan-out's, which logs a line once it has
    shown it) holds ``line``."""
    return any(line in path.read_text().splitlines() for path in log_dir.rglob(name))


def main() -> int:
    argv = sys.argv[1:]
    plan = json.loads(Path(os.environ[PLAN_ENV]).read_text())
    start = time.time()
    record: dict = {}
    code = _serve(argv, plan, record)
    with open(os.environ[CALLS_ENV], "a") as f:
        f.write(json.dumps({"argv": argv, "start": start, "end": time.time(), "pid": os.getpid(), **record}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
