"""``multislice:reservationName``: the forms each backend takes (:func:`check_form`) and the place a path
names (:func:`place_problem`), both pure.

Each backend hands the value to another API, and each API takes its own form:

* queued-resource: the Cloud TPU API's ``QueuedResource.reservationName``, "Format:
  projects/{project}/locations/{zone}/reservations/{reservation}" (its discovery document; no
  ``organizations/`` or ``folders/`` form exists there), or a name, which the backend writes as that path
  (``infra.backends.queued_resource.program.reservation_path``);
* compute-engine: the instance template's ``reservationAffinity``, whose ``values`` are "either a name to a
  reservation in the same project or "projects/different-project/reservations/some-reservation-name" to
  target a shared reservation in the same zone but in a different project" (the Compute Engine API's
  ``ReservationAffinity``; Google's Cluster Toolkit ``modules/compute/vm-instance`` takes
  "projects/PROJECT_ID/reservations/RESERVATION_NAME" or "RESERVATION_NAME"); the backend sends the
  name (``infra.backends.compute_engine.scheduling``), so it also reads the queued-resource backend's path;
* gke: a node pool's ``reservationAffinity``, sent as written (``infra.backends.gke.node_pools``), the
  Compute Engine form again (Cluster Toolkit's ``modules/compute/gke-node-pool`` builds
  "projects/${project}/reservations/${name}"); the Cloud TPU API's path is no value GKE takes.

A reservation's own resource path, ``projects/<p>/zones/<zone>/reservations/<name>`` (its ``selfLink``), is
none of these: it is refused with the path the stack's backend takes written out.

A path names the stack's own project (and zone, where it names one): every backend creates the VMs in
``gcp:project`` and ``gcp:zone`` and sends the path, or its name, for them.
"""

from __future__ import annotations

import re

from training.redaction import redacted

_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
#: The Cloud TPU API's path (``-``: any reservation of the project in the zone, as gcloud sends it).
TPU_PATH = re.compile(rf"^projects/[A-Za-z0-9-]+/locations/[a-z0-9-]+/reservations/(?:{_NAME}|-)$")
#: Compute Engine's ``reservationAffinity`` path (a shared reservation of a project).
COMPUTE_PATH = re.compile(rf"^projects/[A-Za-z0-9-]+/reservations/{_NAME}$")
#: A reservation's resource path (its ``selfLink`` without the API's prefix): groups project, zone, name.
RESOURCE_PATH = re.compile(rf"^projects/([A-Za-z0-9-]+)/zones/([a-z0-9-]+)/reservations/({_NAME})$")
#: Each form of :data:`infra.backends.spec.RESERVATION_FORMS`: its pattern, how a message writes it, and
#: whose form it is.
FORMS = {
    "tpu": (TPU_PATH, "projects/<project>/locations/<zone>/reservations/<name>", "the Cloud TPU API's"),
    "compute": (COMPUTE_PATH, "projects/<project>/reservations/<name>", "Compute Engine's reservationAffinity"),
}
_NAMED = "a reservation name (lowercase letters, digits, hyphens)"


def check_form(value: str, backend: str, forms: tuple[str, ...], name: re.Pattern[str], zone: str | None) -> str:
    """``value`` if it is a reservation ``name`` (the GCE name pattern) or a path of one of ``forms`` (the
    ``reservation_forms`` of ``backend``'s spec, the one its API takes first); ``zone`` (the stack's, None where
    it is not known) fills a path to write that names one.

    Raises:
      ValueError: any other value, saying what the backend takes (and the path to write, for a reservation's
        resource path or another API's path), the value shown without secrets.
    """
    if name.fullmatch(value) or any(FORMS[form][0].fullmatch(value) for form in forms):
        return value
    shown = redacted(value)[:200]
    first = forms[0]
    takes = f"{_NAMED} or a {FORMS[first][1]} path ({FORMS[first][2]} form)"
    if first == "tpu" and len(forms) == 1:
        takes = f"{_NAMED} or a {FORMS[first][1]} path (the TPU API's only form)"
    takes += "".join(f"; it also reads {FORMS[form][2]} {FORMS[form][1]}" for form in forms[1:])
    resource = RESOURCE_PATH.fullmatch(value)
    if resource is not None:
        project, its_zone, reservation = resource.groups()
        raise ValueError(
            f"{shown!r} is the reservation's resource path; the {backend} backend takes {takes}: write "
            f"{_written(first, project, its_zone, reservation)}"
        )
    other = next((form for form in FORMS if form not in forms and FORMS[form][0].fullmatch(value)), None)
    if other is not None:
        parts = value.split("/")  # projects/<p>[/locations/<zone>]/reservations/<name>
        zone = parts[3] if parts[2] == "locations" else zone or "<zone>"
        written = (
            "no name (any reservation of the project)"
            if parts[-1] == "-"
            else _written(first, parts[1], zone, parts[-1])
        )
        raise ValueError(
            f"{shown!r} is {FORMS[other][2]} path, which the {backend} backend does not send; it takes {takes}: "
            f"write {written}"
        )
    raise ValueError(f"{shown!r} is not {takes}")


def _written(form: str, project: str, zone: str, reservation: str) -> str:
    """The reservation's path in ``form``."""
    return FORMS[form][1].replace("<project>", project).replace("<zone>", zone).replace("<name>", reservation)


def place_problem(path: str, project: str, zone: str) -> str | None:
    """Why the reservation ``path`` (a form :func:`check_form` took) is not one of the stack's ``project``
    and ``zone`` (None: it is, or it is a bare name)."""
    if "/" not in path:
        return None
    parts = path.split("/")  # projects/<p>[/locations/<zone>]/reservations/<name>
    where = parts[3] if parts[2] == "locations" else None
    if parts[1] == project and where in (None, zone):
        return None
    names = f"{parts[0]}/{parts[1]}" + (f" in {where}" if where else "")
    return (
        f"{redacted(path)!r} names {names}, but the stack's VMs are in project {project!r}, zone {zone!r} "
        "(gcp:project, gcp:zone): name a reservation there, or give its name alone"
    )
