"""infra/bucket_location.py: every TPU zone of the catalog has a Cloud Storage location."""

from __future__ import annotations

import pytest

from infra import accelerators, bucket_location
from infra.bucket_location import STORAGE_REGIONS, bucket_location as location_of, region_of


def test_every_catalog_zone_maps_to_a_storage_location():
    # Walks the catalog: a zone added to infra/accelerators/catalog.py without a known bucket location fails here.
    walked = set()
    for gen in accelerators.GENERATIONS.values():
        for zone in (*gen.zones, *gen.compute_engine_zones):
            location = location_of(region_of(zone))
            assert location in STORAGE_REGIONS, (gen.name, zone, location)
            walked.add(zone)
    assert {"us-central2-b", "us-east5-a", "europe-west4-a", "us-central1-ai1a"} <= walked


def test_the_v4_region_is_not_a_storage_location():
    # us-central2 (dev and staging) is missing from Cloud Storage's US regions
    # (https://cloud.google.com/storage/docs/regional-endpoints lists US-CENTRAL1, US-EAST1,
    # US-EAST4, US-EAST5, US-SOUTH1 and US-WEST1..4): its bucket goes to US-CENTRAL1.
    assert "US-CENTRAL2" not in STORAGE_REGIONS
    assert location_of("us-central2") == "US-CENTRAL1"
    assert bucket_location.NOT_STORAGE_REGIONS == {"us-central2": "US-CENTRAL1"}


@pytest.mark.parametrize(
    "region, expected",
    [("us-east5", "US-EAST5"), ("europe-west4", "EUROPE-WEST4"), ("us-central1", "US-CENTRAL1"), ("mars-north1", None)],
)
def test_a_storage_region_is_its_own_location(region, expected):
    assert location_of(region) == expected


@pytest.mark.parametrize("zone, region", [("us-central2-b", "us-central2"), ("us-central1-ai1a", "us-central1")])
def test_region_of_a_zone(zone, region):
    assert region_of(zone) == region
