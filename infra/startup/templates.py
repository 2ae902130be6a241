"""The startup script's templates, package data of :mod:`infra.startup`, and how they are filled.

Each template is literal bash but for its ``@@NAME@@`` placeholders (:func:`fill`): ``startup.sh.in``
(the bootstrap that carries the release: :mod:`infra.startup.script`), ``boot.sh.in`` and
``boot_venv.sh.in`` and ``boot_units.sh.in`` (the release's boot logic, one script in three files, :data:`JOINED`:
:mod:`infra.startup.boot`), ``trainer.sh`` (the trainer unit's launcher),
``delete_on_complete.sh`` and ``release_watch.sh`` (docs/vm-boot.md). A backend's own scripts
(``boot_identity.sh``, ``slice_watch.sh``) are package data of its package and filled the same way.
"""

from __future__ import annotations

import re
from importlib import resources

#: Package data of :mod:`infra.startup`: the bootstrap, the boot logic and the unit's launcher.
TEMPLATE_RESOURCE = "startup.sh.in"
BOOT_RESOURCE = "boot.sh.in"
#: The middle of ``boot.sh`` (phase 3: the virtualenvs, and a Pod's node cache of them).
BOOT_VENV_RESOURCE = "boot_venv.sh.in"
#: The last part of ``boot.sh`` (phases 4 and 5: the trainer's service, the release watch).
BOOT_UNITS_RESOURCE = "boot_units.sh.in"
TRAINER_RESOURCE = "trainer.sh"
#: ``delete-on-complete.sh`` of the release: deletes the queued resource once the run is
#: complete (``multislice:queuedResource.deleteOnComplete``; run by trainer.sh).
DELETE_ON_COMPLETE_RESOURCE = "delete_on_complete.sh"
#: ``release-watch.sh`` of the release: on the compute-engine backend, reads the release record
#: and boots a new release on a running VM (``multislice-release-watch.service``).
RELEASE_WATCH_RESOURCE = "release_watch.sh"

#: Templates kept in more than one file, each under 450 lines: :func:`template` joins the parts in
#: order. A part after the first starts with lines (a shebang, a comment, shellcheck directives for
#: the variables the first part sets) that let shellcheck read it alone; the join drops them, up to
#: and including the first empty line.
JOINED: dict[str, tuple[str, ...]] = {BOOT_RESOURCE: (BOOT_RESOURCE, BOOT_VENV_RESOURCE, BOOT_UNITS_RESOURCE)}

#: A placeholder of a template: ``@@NAME@@``, NAME in capitals, digits and underscores.
PLACEHOLDER = re.compile(r"@@([A-Z0-9_]+)@@")


def template(resource: str = TEMPLATE_RESOURCE) -> str:
    """A template of the script, placeholders unfilled (package data of :mod:`infra.startup`).

    Everything but the ``@@NAME@@`` placeholders is literal bash. A payload placeholder has a
    line of its own, followed by the line that ends its quoted heredoc, so that the template
    itself is a well-formed script that shellcheck can lint. A template of :data:`JOINED` comes
    back whole, its parts joined.
    """
    first, *rest = JOINED.get(resource, (resource,))
    text = _part(first)
    for part in rest:
        text += "\n" + _part(part).split("\n\n", 1)[1]
    return text


def _part(resource: str) -> str:
    return resources.files("infra.startup").joinpath(resource).read_text(encoding="utf-8")


def fill(text: str, values: dict[str, str], name: str = TEMPLATE_RESOURCE) -> str:
    """``text`` with every ``@@NAME@@`` replaced by ``values[NAME]``, in one pass (a value
    that happens to contain ``@@NAME@@`` is never substituted again).

    Raises:
      ValueError: a placeholder has no value, or a value has no placeholder (the template
        ``name`` and the renderer disagree; the message names them).
    """
    used = set(PLACEHOLDER.findall(text))
    if used != set(values):
        missing, unused = sorted(used - set(values)), sorted(set(values) - used)
        raise ValueError(
            f"{name} and its renderer (infra/startup/) disagree: placeholders without a value {missing}, "
            f"values without a placeholder {unused}"
        )
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)
