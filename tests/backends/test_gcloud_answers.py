"""gcloud's JSON answers the backends read (a managed instance group's listing, a queued resource's
description) are decoded by ``training.run_objects.json_record``: an answer nested past the parser
or over its 64 MiB is the command's one-line RemoteError, never a RecursionError traceback."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.backends.compute_engine.instance_groups import list_group
from infra.backends.queued_resource.ssh import check_deployed
from infra.remote.selection import RemoteError

CONFIG = SimpleNamespace(stack="dev", project="acme-ml-dev", zone="us-central2-b", queued_resource_id="dev-qr")


def gcloud_answering(tmp_path: Path, answer: bytes) -> str:
    """A stand-in gcloud that prints ``answer`` and exits 0, whatever it is asked."""
    (tmp_path / "answer.json").write_bytes(answer)
    script = tmp_path / "gcloud"
    script.write_text(f"#!/bin/sh\ncat '{tmp_path / 'answer.json'}'\n")
    script.chmod(0o755)
    return str(script)


NESTED = b"[" * 100_000  # nested past the parser: a RecursionError escapes `except ValueError`, were it raised


def test_an_instance_group_listing_nested_past_the_parser_is_one_line(tmp_path):
    with pytest.raises(RemoteError) as raised:
        list_group(gcloud_answering(tmp_path, NESTED), CONFIG, "multislice-dev-0")
    assert str(raised.value).startswith("gcloud listed instance group multislice-dev-0 in a form not understood: '[[[")
    assert "\n" not in str(raised.value) and raised.value.exit_code == 1
    listed = b'[{"name": "vm-b", "instanceStatus": "RUNNING"}, {"name": "vm-a"}]'
    assert [vm.name for vm in list_group(gcloud_answering(tmp_path, listed), CONFIG, "g") or []] == ["vm-a", "vm-b"]


def test_a_queued_resource_description_nested_past_the_parser_is_one_line(tmp_path):
    with pytest.raises(RemoteError) as raised:
        check_deployed(gcloud_answering(tmp_path, b'{"state": ' + NESTED), CONFIG)
    assert str(raised.value).startswith("gcloud described queued resource dev-qr in a form not understood: ")
    assert "\n" not in str(raised.value) and raised.value.exit_code == 1
    active = b'{"state": {"state": "ACTIVE"}}'
    assert check_deployed(gcloud_answering(tmp_path, active), CONFIG) == {"state": {"state": "ACTIVE"}}
