"""Run a Pulumi Python program the way the Python language host does, against mocks.

``pulumi preview``/``up`` start ``pulumi-language-python-exec`` (the Pulumi CLI's script,
https://github.com/pulumi/pulumi/blob/master/sdk/python/cmd/pulumi-language-python-exec):
it reads the stack's config from the ``PULUMI_CONFIG`` environment variable, runs the program
with ``runpy.run_path(PROGRAM, run_name="__main__")`` inside ``pulumi.runtime.run_in_stack``
and reports how it ended:

* a ``pulumi.RunError``: ``pulumi.log.error(str(e))`` — the message alone — exit status 1;
* any other exception: ``pulumi.log.error("Program failed with an unhandled exception:\\n" +
  traceback)``, exit status 32.

This module does the same with the engine and resource monitor replaced by the mocks of
:mod:`tests.fakes.pulumi_program`; the engine's log messages go to stderr as
``<severity>: <message>`` (the CLI prints them under "Diagnostics"). The script itself ships
with the Pulumi CLI, which cannot be installed here, so its handling of the two cases is
restated above rather than imported.

Usage: ``python -m tests.fakes.language_host --stack dev [--dry_run true] infra/`` with
``PULUMI_CONFIG`` set to the config map as JSON (``tests.fakes.pulumi_program.engine_config``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import runpy
import sys
import traceback

import pulumi
import pulumi.runtime
from pulumi.runtime import settings

from tests.fakes.pulumi_program import Mocks, RecordingMonitor, World

#: The exit status the language host uses after showing an unhandled exception.
UNHANDLED_EXCEPTION_EXIT = 32


def _engine_logger() -> logging.Logger:
    logger = logging.getLogger("tests.fakes.language_host.engine")
    logger.propagate = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)  # the CLI shows debug messages only with -v
    for level in (logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG):
        logging.addLevelName(level, logging.getLevelName(level).lower())
    return logger


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", default="multislice")
    parser.add_argument("--stack", required=True)
    parser.add_argument("--dry_run", default="false")
    parser.add_argument("PROGRAM")
    args = parser.parse_args(argv)

    loop = asyncio.new_event_loop()  # before the mocks: their settings live on this loop
    asyncio.set_event_loop(loop)
    pulumi.runtime.set_all_config(pulumi.runtime.get_config_env(), pulumi.runtime.get_config_secret_keys_env())
    mocks = Mocks(World())
    pulumi.runtime.set_mocks(
        mocks,
        project=args.project,
        stack=args.stack,
        preview=args.dry_run == "true",
        logger=_engine_logger(),
        monitor=RecordingMonitor(mocks),
    )
    settings.ROOT.set(None)  # run_in_stack creates the root stack, as under the real host

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    exit_code = 1
    try:
        loop.run_until_complete(pulumi.runtime.run_in_stack(lambda: runpy.run_path(args.PROGRAM, run_name="__main__")))
        exit_code = 0
    except pulumi.RunError as err:
        pulumi.log.error(str(err))
    except Exception:
        pulumi.log.error("Program failed with an unhandled exception:\n" + traceback.format_exc())
        exit_code = UNHANDLED_EXCEPTION_EXIT
    finally:
        loop.close()
        sys.stdout.flush()
        sys.stderr.flush()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
