"""Where a stack's checkpoint bucket lives: a Cloud Storage location for the TPU zone's region.

Cloud Storage does not offer a bucket location in every Compute Engine region. In particular
``us-central2``, the only region with TPU v4 (``us-central2-b``, the zone of the ``dev`` and
``staging`` stacks), is not a Cloud Storage location: creating a bucket with location
``US-CENTRAL2`` fails, after the network and service account already exist. So the bucket's
location is looked up here for the zone's region instead of being the region itself, and
``multislice:bucket.location`` overrides it.

:data:`STORAGE_REGIONS` holds regional bucket locations of the published list
(https://cloud.google.com/storage/docs/locations), each with how it was checked:

* ``US-CENTRAL1``, ``US-EAST1``, ``US-EAST4``, ``US-EAST5``, ``US-SOUTH1``, ``US-WEST1`` …
  ``US-WEST4``: the United States regions listed on the regional-endpoints page, which names
  the bucket locations that have a regional endpoint
  (https://cloud.google.com/storage/docs/regional-endpoints: Iowa US-CENTRAL1, South Carolina
  US-EAST1, Northern Virginia US-EAST4, Columbus US-EAST5, Dallas US-SOUTH1, Oregon US-WEST1,
  Los Angeles US-WEST2, Salt Lake City US-WEST3, Las Vegas US-WEST4); ``us-central2`` is not
  among them;
* ``EUROPE-WEST4`` (Netherlands): a region of the locations page's Europe table; the stored
  copy of that page read while writing this module was cut off before its tables, so this
  row is *not* verified here.

:func:`bucket_location` maps every region of a zone in the accelerator catalog
(``infra.accelerators.Generation.zones``) to a location (``tests/config/test_bucket_location.py``
walks the catalog): a region that is a storage location maps to itself; ``us-central2`` maps to
``US-CENTRAL1``, the other central-US region (not a measured choice: checkpoints then cross
regions, which Cloud Storage bills as network transfer between regions,
https://cloud.google.com/storage/pricing#network-pricing; pick another with
``multislice:bucket.location``).
"""

from __future__ import annotations

#: Regional Cloud Storage locations this program knows (see the module docstring for sources).
STORAGE_REGIONS: frozenset[str] = frozenset(
    {
        "US-CENTRAL1",
        "US-EAST1",
        "US-EAST4",
        "US-EAST5",
        "US-SOUTH1",
        "US-WEST1",
        "US-WEST2",
        "US-WEST3",
        "US-WEST4",
        "EUROPE-WEST4",
    }
)

#: Compute Engine regions that are not Cloud Storage locations → the location used instead.
NOT_STORAGE_REGIONS: dict[str, str] = {"us-central2": "US-CENTRAL1"}


def region_of(zone: str) -> str:
    """The region of a zone: ``us-central2-b`` → ``us-central2``, ``us-central1-ai1a`` → ``us-central1``."""
    return zone.rsplit("-", 1)[0]


def bucket_location(region: str) -> str | None:
    """The bucket location for a TPU region (upper case, as Cloud Storage spells it), or None
    when this module does not know one (then ``multislice:bucket.location`` must say it)."""
    if region in NOT_STORAGE_REGIONS:
        return NOT_STORAGE_REGIONS[region]
    location = region.upper()
    return location if location in STORAGE_REGIONS else None
