"""``python -m training.log_shipping RUN_DIR < lines``: each line to stdout, prefixed, and on a
TPU VM to Cloud Logging (labels slice, worker, run); never blocks the writer. docs/vm-boot.md."""

from __future__ import annotations

import os
import queue
import re
import signal
import sys
import threading
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime

LOG_NAME = "multislice-trainer"
FLUSH_AT_EXIT_S = 10.0
#: The longest line read at once: a longer one goes on in pieces of this size, each a line of its own
#: (Cloud Logging takes entries of up to 256 KB; a trainer's line is under 1 KB), so that one line
#: without an end never holds more than this in memory.
MAX_LINE_BYTES = 64 << 10
_LEVEL = re.compile(r"^\S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def metadata(path: str) -> str | None:
    host = os.environ.get("GCE_METADATA_IP", "metadata.google.internal")
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.read().decode()
    except (OSError, ValueError):
        return None


#: A shipping target: (monitored resource type, its labels, the entries' labels).
Target = tuple[str, dict[str, str], dict[str, str]]


#: Where the lines go, as the boot wrote it into the trainer's unit from the stack's backend: the
#: Cloud Logging monitored resource type of the VM (``tpu_worker`` or ``gce_instance``), or of a
#: GKE container (``k8s_container``), whose output GKE's own logging agent collects: nothing is
#: shipped from it.
LOG_RESOURCE_ENV = "MULTISLICE_LOG_RESOURCE"
TPU_WORKER, GCE_INSTANCE, K8S_CONTAINER = "tpu_worker", "gce_instance", "k8s_container"


def target(
    slice_id: str,
    worker: str,
    run: str,
    get: Callable[[str], str | None] = metadata,
    resource: str | None = None,
) -> Target | None:
    """Where this VM's lines go; None unless the metadata names a project, a zone and the VM's
    place (never in the local emulation, whose VMs do not ship).

    ``resource`` (default ``$MULTISLICE_LOG_RESOURCE``, which the boot writes from the stack's
    backend) is the VM's monitored resource type:

    * ``tpu_worker`` (a queued resource's VM), with its node (``tpu-env``'s ``NODE_ID``);
    * ``gce_instance`` (a Compute Engine TPU VM), whose labels are ``project_id``, ``instance_id``
      (the metadata server's ``instance/id``) and ``zone``
      (https://cloud.google.com/logging/docs/api/v2/resource-list); ``multislice logs`` finds the
      stack's lines by the entries' labels (infra/logs/filter.py).

    A trainer started without it (by hand) takes ``tpu_worker`` when ``tpu-env`` names a node,
    else ``gce_instance`` when the program's ``multislice-backend`` metadata key is set. Another
    value ships nothing (``k8s_container``: GKE collects the container's output itself). The
    entries' labels are ``slice``, ``worker`` and ``run`` on both.
    """
    project, zone = get("project/project-id"), get("instance/zone")
    if not (project and zone):
        return None
    zone = zone.rsplit("/", 1)[-1]
    labels = {"slice": slice_id, "worker": worker, "run": run}
    node = re.search(r"^NODE_ID:\s*'?([^'\s]+)", get("instance/attributes/tpu-env") or "", re.M)
    instance_id = (get("instance/id") or "").strip()
    kind = resource or os.environ.get(LOG_RESOURCE_ENV, "").strip()
    if not kind:
        kind = (
            TPU_WORKER
            if node
            else GCE_INSTANCE
            if (get("instance/attributes/multislice-backend") or "").strip()
            else ""
        )
    if kind == TPU_WORKER and node:
        return kind, {"project_id": project, "zone": zone, "node_id": node[1], "worker_id": worker}, labels
    if kind == GCE_INSTANCE and instance_id.isdigit():
        return kind, {"project_id": project, "instance_id": instance_id, "zone": zone}, labels
    return None


def ship(lines: queue.Queue, found: Target, say: Callable[[str], None]) -> None:
    """Write ``(time, text)`` items of ``lines`` in batches until None; failures are dropped."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.logging_v2 import Client, Resource

    endpoint = os.environ.get("MULTISLICE_LOGGING_ENDPOINT")  # a loopback fake in tests
    kind, resource_labels, entry_labels = found
    client = Client(
        project=resource_labels["project_id"],
        credentials=AnonymousCredentials() if endpoint else None,
        client_options={"api_endpoint": endpoint} if endpoint else None,
        _use_grpc=False,
    )
    logger, resource = client.logger(LOG_NAME, labels=entry_labels), Resource(type=kind, labels=resource_labels)
    place = (
        f"node {resource_labels['node_id']}"
        if kind == "tpu_worker"
        else f"instance {resource_labels['instance_id']}, slice {entry_labels['slice']}"
    )
    say(f"log shipping: to Cloud Logging, log {LOG_NAME}, {place} worker {entry_labels['worker']}")
    failed, item = 0, ()
    while item is not None:
        batch = logger.batch()
        while len(batch.entries) < 200:
            try:
                item = lines.get(timeout=1 if batch.entries else None)
            except queue.Empty:
                break
            if item is None:
                break
            level = _LEVEL.match(item[1])
            batch.log_text(item[1], timestamp=item[0], severity=level[1] if level else "DEFAULT", resource=resource)
        try:
            if batch.entries:
                batch.commit()
        except Exception as err:
            if not failed:
                say(
                    f"log shipping: a Cloud Logging write failed ({type(err).__name__}: {err}); "
                    "lines stay in the journal"
                )
            failed += len(batch.entries)
    if failed:
        say(f"log shipping: {failed} line(s) not written to Cloud Logging")


def main(argv: list[str]) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the last lines of a stopping trainer still come out
    slice_id, worker = os.environ.get("MULTISLICE_SLICE", "?"), os.environ.get("MULTISLICE_WORKER", "?")
    prefix = f"[slice {slice_id} worker {worker}] "
    lines, state = queue.Queue(10000), {"on": True, "dropped": 0}

    def say(text: str) -> None:
        sys.stderr.write(f"{prefix}{text}\n")
        sys.stderr.flush()

    def work() -> None:
        try:
            # The local emulation's VMs keep their lines on their consoles: a compute-engine
            # backend VM there has a project and zone in its metadata (its boot.sh asks the
            # emulated Compute API with them), and nothing of the emulation may reach Google.
            run = os.path.basename(argv[0].rstrip("/")) if argv else ""
            found = None if os.environ.get("MULTISLICE_EMULATED_TPU") else target(slice_id, worker, run)
            if found:
                return ship(lines, found, say)
        except Exception as err:  # the trainer goes on; its lines stay in the journal
            say(f"log shipping: off ({type(err).__name__}: {err})")
        state["on"] = False

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    for raw in iter(lambda: sys.stdin.buffer.readline(MAX_LINE_BYTES), b""):
        line = raw.rstrip(b"\r\n")
        try:
            sys.stdout.buffer.write(prefix.encode() + line + b"\n")
            sys.stdout.buffer.flush()
        except OSError:  # no console: keep reading, so that the writer never blocks
            pass
        if state["on"]:
            try:
                lines.put_nowait((datetime.now(UTC), line.decode("utf-8", "replace")))
            except queue.Full:
                state["dropped"] += 1
    if state["dropped"]:
        say(f"log shipping: {state['dropped']} line(s) dropped (queue full)")
    try:
        if thread.is_alive():
            lines.put(None, timeout=FLUSH_AT_EXIT_S)
    except queue.Full:
        pass
    thread.join(FLUSH_AT_EXIT_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
