"""The emulated VM's ``systemctl`` (``python -m infra.emulated.systemctl ARGS...``, the command the
``systemctl`` on an emulated VM's ``PATH`` runs): sends its arguments to the VM's manager
(:func:`infra.emulated.systemd.boot`, at :data:`ADDRESS_ENV`, with the key :data:`AUTHKEY_ENV`) over a
loopback connection, prints the answer and exits with its status.

A boot calls it several times, every trainer start once more, and a real ``systemctl`` is a small
binary, so a call imports only the standard library's socket and json: the request is one JSON line
``{"key": HEX, "argv": [...]}``, the answer one line ``[STATUS, OUTPUT]`` (:func:`request_line`,
:func:`answer_of`; the manager's side: ``infra.emulated.systemd``). (``multiprocessing.connection``,
used before, cost each call about 65 ms more CPU: docs/development.md, "Measured".)
"""

from __future__ import annotations

import json
import os
import socket
import sys

#: ``host:port`` of the VM's manager.
ADDRESS_ENV = "MULTISLICE_SYSTEMD_ADDRESS"
#: The manager's connection key, hex.
AUTHKEY_ENV = "MULTISLICE_SYSTEMD_AUTHKEY"
#: The longest line either side reads (a request's arguments, an answer's output).
LINE_LIMIT = 1 << 20


def request_line(key: str, argv: list[str]) -> bytes:
    """The request: one JSON line with the key and the arguments."""
    return (json.dumps({"key": key, "argv": argv}) + "\n").encode()


def answer_of(line: bytes) -> tuple[int, str]:
    """``(status, output)`` from the manager's answer line.

    Raises:
      ValueError: no complete line (the manager closed early or the line passed :data:`LINE_LIMIT`),
        or not ``[int, str]``.
    """
    if not line.endswith(b"\n"):
        raise ValueError("no answer from the VM's manager")
    answer = json.loads(line)
    if not (
        isinstance(answer, list)
        and len(answer) == 2
        and isinstance(answer[0], int)
        and not isinstance(answer[0], bool)
        and isinstance(answer[1], str)
    ):
        raise ValueError(f"the VM's manager answered {line[:200]!r}")
    return answer[0], answer[1]


def main(argv: list[str]) -> int:
    """``systemctl ARGS``: send them to the VM's manager, print its answer; its exit status."""
    address, key = os.environ.get(ADDRESS_ENV), os.environ.get(AUTHKEY_ENV)
    if not address or not key:
        print("emulated systemctl: not running inside an emulated VM (no manager address)", file=sys.stderr)
        return 1
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port))) as conn:  # as systemctl, it waits for the job
            conn.sendall(request_line(key, argv))
            code, output = answer_of(conn.makefile("rb").readline(LINE_LIMIT))
    except (OSError, ValueError) as err:
        print(f"emulated systemctl: {err}", file=sys.stderr)
        return 1
    (sys.stdout if code == 0 else sys.stderr).write(output)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
