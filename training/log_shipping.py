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
_LEVEL = re.compile(r"^\S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def metadata(path: str) -> str | None:
    host = os.environ.get("GCE_METADATA_IP", "metadata.google.internal")
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.read().decode()
    except (OSError, ValueError):
        return None


def target(
    slice_id: str, worker: str, run: str, get: Callable[[str], str | None] = metadata
) -> tuple[dict[str, str], dict[str, str]] | None:
    """(tpu_worker resource labels, entry labels); None unless the metadata names a project,
    zone and TPU node (not in the local emulation).

    The node is ``tpu-env``'s ``NODE_ID`` on a queued resource's VM; a Compute Engine TPU VM
    has no ``tpu-env``, and its node is its slice's managed instance group (the metadata key
    ``multislice-instance-groups`` lists them in slice order; the groups are named as the
    queued resource's nodes are, so ``multislice logs`` filters both alike).
    """
    project, zone = get("project/project-id"), get("instance/zone")
    found = re.search(r"^NODE_ID:\s*'?([^'\s]+)", get("instance/attributes/tpu-env") or "", re.M)
    node = found[1] if found else compute_engine_node(slice_id, get)
    if project and zone and node:
        resource = {"project_id": project, "zone": zone.rsplit("/", 1)[-1], "node_id": node, "worker_id": worker}
        return resource, {"slice": slice_id, "worker": worker, "run": run}
    return None


def compute_engine_node(slice_id: str, get: Callable[[str], str | None] = metadata) -> str | None:
    """The managed instance group of slice ``slice_id`` on a Compute Engine TPU VM, else None."""
    groups = (get("instance/attributes/multislice-instance-groups") or "").split(",")
    if not slice_id.isdigit() or int(slice_id) >= len(groups):
        return None
    return groups[int(slice_id)].strip() or None


def ship(lines: queue.Queue, found: tuple[dict[str, str], dict[str, str]], say: Callable[[str], None]) -> None:
    """Write ``(time, text)`` items of ``lines`` in batches until None; failures are dropped."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.logging_v2 import Client, Resource

    endpoint = os.environ.get("MULTISLICE_LOGGING_ENDPOINT")  # a loopback fake in tests
    client = Client(
        project=found[0]["project_id"],
        credentials=AnonymousCredentials() if endpoint else None,
        client_options={"api_endpoint": endpoint} if endpoint else None,
        _use_grpc=False,
    )
    logger, resource = client.logger(LOG_NAME, labels=found[1]), Resource(type="tpu_worker", labels=found[0])
    say(f"log shipping: to Cloud Logging, log {LOG_NAME}, node {found[0]['node_id']} worker {found[0]['worker_id']}")
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
    for raw in sys.stdin.buffer:
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
