"""The dynamic provider's own process, as Pulumi runs it, watched for imports and network use.

Pulumi serves a dynamic provider from ``python -m pulumi.dynamic`` (a gRPC server that prints
its port, unpickles the provider from each request's ``__provider`` property and calls its
methods). :class:`ProviderProcess` starts exactly that module, behind a PEP 578 audit hook
installed first (``python -m tests.fakes.provider_process REPORT``), and plays the engine:
:meth:`~ProviderProcess.check` and :meth:`~ProviderProcess.diff` send the protobuf requests the
engine sends. The hook refuses every network operation of Python code (connect, DNS lookup,
sendto: the Google clients' HTTP and auth stacks), and records it and every import of a Google
API client or HTTP module; :meth:`~ProviderProcess.stop` ends the process (it closes the
process's stdin: a thread waiting for that end of input writes the record and exits at once) and
returns that record. Not SIGINT: CPython runs a signal's handler in the main thread only, and a
signal the kernel hands to one of the gRPC server's threads leaves the main thread asleep in
``Event().wait()`` (a CI run once waited 120 s for it; ``signal.pthread_kill`` to a thread shows
it); the end of a pipe wakes the one thread reading it, however the threads are scheduled.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

#: Audit events of network use (https://docs.python.org/3/library/audit_events.html).
NETWORK_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.sendto",
        "socket.sendmsg",
    }
)
#: Module prefixes of the Google API client stack (tpu_v2, api_core transports, auth, HTTP).
CLIENT_MODULES = ("google.cloud", "google.api_core", "google.auth", "requests", "urllib3")

ROOT = Path(__file__).resolve().parents[2]
URN = "urn:pulumi:stack::multislice::pulumi-python:dynamic/tpu:QueuedResource::queued-resource"
PROVIDER_KEY = "__provider"


class ProviderProcess:
    """``python -m pulumi.dynamic`` under the audit hook, and a gRPC client to it.

    Args:
      provider: ``pulumi.dynamic.dynamic.serialize_provider`` text of the provider.
      env: extra environment of the process.
      timeout_s: limit of each request.
      process: a provider process started otherwise (as the Pulumi CLI starts it:
        tests/fakes/pulumi_cli.py), with its stdout a pipe; it has no audit hook, and
        :meth:`stop` returns no record.
    """

    def __init__(
        self,
        provider: str,
        *,
        env: dict[str, str] | None = None,
        timeout_s: float = 120.0,
        process: subprocess.Popen[bytes] | None = None,
    ):
        import grpc
        from pulumi.runtime.proto import provider_pb2_grpc

        self.provider, self.timeout_s, self._audited = provider, timeout_s, process is None
        self._report = Path(tempfile.mkdtemp()) / "report.json"
        self._proc = process or subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.provider_process", str(self._report)],
            cwd=ROOT,
            stdin=subprocess.PIPE if process is None else None,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )
        assert self._proc.stdout is not None
        port = self._proc.stdout.readline().decode().strip()
        if not port.isdigit():
            self._proc.kill()
            _, stderr = self._proc.communicate()
            said = f": {stderr.decode(errors='replace').strip()}" if stderr else ""
            raise RuntimeError(f"the provider process printed {port!r} instead of its port{said}")
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self._stub = provider_pb2_grpc.ResourceProviderStub(self._channel)

    def _struct(self, props: dict[str, Any]) -> Any:
        from pulumi.runtime import rpc

        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(rpc.serialize_properties({**props, PROVIDER_KEY: self.provider}, {}))
        finally:
            loop.close()

    def plugin_info(self) -> str:
        """``GetPluginInfo`` (the engine's first call after starting a provider): the version."""
        from google.protobuf import empty_pb2

        return self._stub.GetPluginInfo(empty_pb2.Empty(), timeout=self.timeout_s).version

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
        """``Check``: the failures as ``"property: reason"``."""
        from pulumi.runtime import proto

        response = self._stub.Check(
            proto.CheckRequest(urn=URN, olds=self._struct(olds), news=self._struct(news)), timeout=self.timeout_s
        )
        return [f"{f.property}: {f.reason}" for f in response.failures]

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> tuple[str, list[str]]:
        """``Diff``: (``DIFF_NONE``/``DIFF_SOME``/``DIFF_UNKNOWN``, replaced properties)."""
        from pulumi.runtime import proto

        request = proto.DiffRequest(id=id_, urn=URN, olds=self._struct(olds), news=self._struct(news))
        response = self._stub.Diff(request, timeout=self.timeout_s)
        return proto.DiffResponse.DiffChanges.Name(response.changes), list(response.replaces)

    def read(self, id_: str, props: dict[str, Any]) -> str:
        """``Read`` (a refresh): the error the process answered, or "" on success."""
        import grpc
        from pulumi.runtime import proto

        try:
            self._stub.Read(proto.ReadRequest(id=id_, urn=URN, properties=self._struct(props)), timeout=self.timeout_s)
        except grpc.RpcError as err:
            return str(err.details())
        return ""

    def stop(self) -> dict[str, list[str]]:
        """End the process; its record: ``{"network": [...], "client_modules": [...]}`` (``{}``
        for a process started without the audit hook)."""
        self._channel.close()
        if self._audited:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the watcher thread writes the record and leaves
        else:  # no record to write: end it as the engine ends a plugin it is done with
            self._proc.kill()
        try:
            # Generous: a loaded machine (two spinning processes beside the suite) once took
            # over 30 s to stop the gRPC server; the audited process now skips that stop.
            self._proc.wait(timeout=120)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
        return json.loads(self._report.read_text()) if self._report.exists() else {}

    def __enter__(self) -> ProviderProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def _serve_under_audit(report: Path) -> None:
    """Run ``pulumi.dynamic`` as ``__main__`` behind the hook; write the record at exit."""
    network: list[str] = []
    imported: set[str] = set()

    def hook(event: str, args: tuple) -> None:
        if event == "import" and str(args[0]).startswith(CLIENT_MODULES):
            imported.add(str(args[0]))
        elif event in NETWORK_EVENTS:
            network.append(f"{event} {args!r}")
            raise OSError(f"network access refused in the provider process: {event} {args!r}")

    def write_report() -> None:
        # One C-level copy of each (list() holds the GIL): the server's threads may be importing,
        # or recording, while this runs, and iterating a live dict or set would raise.
        modules, seen = list(sys.modules), list(imported)
        found = sorted({*seen, *(m for m in modules if m.startswith(CLIENT_MODULES))})
        report.write_text(json.dumps({"network": list(network), "client_modules": found}))

    def stop_at_end_of_input() -> None:
        # The record is all a test needs: once stdin ends, write it and leave without the gRPC
        # server's shutdown and thread joins, which once took over 30 s on a loaded machine.
        # Leave whatever happens: an exception here would end only this thread.
        try:
            while os.read(0, 4096):
                pass
            write_report()
        finally:
            os._exit(0)

    sys.addaudithook(hook)
    atexit.register(write_report)
    threading.Thread(target=stop_at_end_of_input, name="stop-at-end-of-input", daemon=True).start()
    import runpy

    runpy.run_module("pulumi.dynamic", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _serve_under_audit(Path(sys.argv[1]))
