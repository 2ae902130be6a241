"""The emulated VM's ``systemctl`` (``python -m infra.emulated.systemctl ARGS...``, the command the
``systemctl`` on an emulated VM's ``PATH`` runs): sends its arguments to the VM's manager
(:func:`infra.emulated.systemd.boot`, at :data:`ADDRESS_ENV` with the key :data:`AUTHKEY_ENV`) over a
loopback connection, prints the answer and exits with its status.

A boot calls it several times, every trainer start once more, so it imports only what a call
needs: the manager's modules stay in the manager (what that saves: docs/development.md, "Measured").
"""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Client

#: ``host:port`` of the VM's manager.
ADDRESS_ENV = "MULTISLICE_SYSTEMD_ADDRESS"
#: The manager's connection key, hex.
AUTHKEY_ENV = "MULTISLICE_SYSTEMD_AUTHKEY"


def main(argv: list[str]) -> int:
    """``systemctl ARGS``: send them to the VM's manager, print its answer; its exit status."""
    address, key = os.environ.get(ADDRESS_ENV), os.environ.get(AUTHKEY_ENV)
    if not address or not key:
        print("emulated systemctl: not running inside an emulated VM (no manager address)", file=sys.stderr)
        return 1
    host, port = address.rsplit(":", 1)
    with Client((host, int(port)), authkey=bytes.fromhex(key)) as conn:
        conn.send(argv)
        code, output = conn.recv()
    (sys.stdout if code == 0 else sys.stderr).write(output)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
