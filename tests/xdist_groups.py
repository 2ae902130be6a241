"""pytest plugin: under pytest-xdist's ``--dist loadgroup`` (pyproject.toml's addopts), the
tests that use a module-scoped fixture of their module (a training run or an emulation that
several tests read, tens of seconds each) run on one worker, so that the fixture runs once;
the other tests are spread one by one.

It marks those tests ``xdist_group(<module path>)``. pytest-xdist reads the mark in its own
``pytest_collection_modifyitems`` on each worker, which runs before a conftest's or plugin's
hook of the same name unless that hook is ``tryfirst`` (pluggy calls later-registered plugins
first, and xdist registers its worker plugin after them). pytest-xdist 3.8 groups by appending
``@<group>`` to the node id, which pytest 9.2 no longer lets it change
(https://github.com/pytest-dev/pytest-xdist/issues/1386): pyproject.toml keeps pytest below
9.2. tests/test_xdist_groups.py fails if either stops the grouping.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        infos = getattr(item, "_fixtureinfo", None)
        if infos is None:
            continue
        module = item.nodeid.split("::", 1)[0]
        shared = any(
            definition.scope in ("module", "package")
            for definitions in infos.name2fixturedefs.values()
            for definition in definitions
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(module))
