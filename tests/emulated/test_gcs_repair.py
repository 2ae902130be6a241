"""A fake-gcs-server killed mid-upload: what it leaves (infra.emulated.gcs_repair's docstring cites
the server's source) is set aside before the next server starts, and the run's checkpoints stay
listed: without that, one file without metadata made Orbax list no step, and a resumed run
started over from step 0."""

from __future__ import annotations

import os
from pathlib import Path

from orbax.checkpoint import path as ocp_path

from infra.emulated import gcs_clients
from infra.emulated.gcs import GcsServer
from infra.emulated.gcs_repair import SIDECAR_SUFFIX, XATTR, set_aside, unacknowledged, uses_xattrs
from training.run_dir import RunDir

BUCKET = "bkt-1"
RUN = f"gs://{BUCKET}/runs/r"


def test_a_killed_servers_half_written_uploads_do_not_hide_the_runs_checkpoints(tmp_path, capfd):
    root, log = tmp_path / "gcs", tmp_path / "server.log"
    with GcsServer(root, log) as first:
        first.create_bucket(BUCKET)
        restore = gcs_clients.point_clients_at(first.url)
        try:
            run = RunDir(RUN)
            for name in ("checkpoints/6/commit_success.txt", "checkpoints/6/default/manifest.ocdbt"):
                run.write(name, b"x")
        finally:
            restore()
    # What fs.go's CreateObject leaves when the server dies between its two steps: renameio's
    # temporary file (content not yet renamed into place), and an object renamed into place
    # whose metadata was not yet written.
    step_12 = root / BUCKET / "runs" / "r" / "checkpoints" / "12"
    step_12.mkdir(parents=True)
    (step_12 / ".commit_success.txt4081239764").write_bytes(b"x")
    (step_12 / "manifest.ocdbt").write_bytes(b"x")
    capfd.readouterr()
    with GcsServer(root, log) as second, gcs_clients.clients_pointed_at(root, log, second.url):
        assert ocp_path.step.checkpoint_steps(f"{RUN}/checkpoints") == [6]
        assert RunDir(RUN).read("checkpoints/6/commit_success.txt") == b"x"
    (batch,) = (tmp_path / "gcs-unacknowledged").iterdir()
    aside = batch / BUCKET / "runs" / "r" / "checkpoints" / "12"
    assert sorted(p.name for p in aside.iterdir()) == [".commit_success.txt4081239764", "manifest.ocdbt"]
    said = capfd.readouterr().err
    assert "set aside 2 upload(s) that a killed server never finished" in said
    assert f"{BUCKET}/runs/r/checkpoints/12/manifest.ocdbt" in said


def test_only_files_without_object_metadata_are_unacknowledged(tmp_path):
    root = tmp_path / "gcs"
    objects = root / BUCKET / "dir"
    objects.mkdir(parents=True)
    (root / f"{BUCKET}.bucketMetadata").write_text("{}")  # the bucket's own, beside its directory
    assert uses_xattrs(root)  # as the server decides: this root takes user xattrs
    with_xattr = objects / "a"
    with_xattr.write_bytes(b"a")
    os.setxattr(with_xattr, XATTR, b'{"name": "dir/a"}')
    named_like_a_sidecar = objects / f"a{SIDECAR_SUFFIX}"  # an object of its own where xattrs are used
    named_like_a_sidecar.write_bytes(b"x")
    bare = objects / "c"
    bare.write_bytes(b"c")
    assert unacknowledged(root) == [named_like_a_sidecar, bare]
    assert unacknowledged(tmp_path / "absent") == []


def test_where_the_server_uses_metadata_files_those_are_its_own(tmp_path, monkeypatch):
    from infra.emulated import gcs_repair

    monkeypatch.setattr(gcs_repair, "uses_xattrs", lambda root: False)  # a root without user xattrs
    objects = tmp_path / "gcs" / BUCKET
    objects.mkdir(parents=True)
    (objects / "b").write_bytes(b"b")
    (objects / f"b{SIDECAR_SUFFIX}").write_text("{}")
    (objects / f".c{SIDECAR_SUFFIX}4081239764").write_text("{}")  # renameio's temporary file
    (objects / "c").write_bytes(b"c")  # its metadata file never renamed into place
    assert unacknowledged(tmp_path / "gcs") == [objects / f".c{SIDECAR_SUFFIX}4081239764", objects / "c"]


def test_each_set_aside_keeps_its_own_directory(tmp_path):
    root, into = tmp_path / "gcs", tmp_path / "aside"
    (root / BUCKET).mkdir(parents=True)
    (root / BUCKET / "ckpt").write_bytes(b"first")
    first, first_names = set_aside(root, into)
    (root / BUCKET / "ckpt" / "7").mkdir(parents=True)  # the same name, now a directory's
    (root / BUCKET / "ckpt" / "7" / "x").write_bytes(b"second")
    second, second_names = set_aside(root, into)
    assert first_names == [Path(BUCKET, "ckpt")] and second_names == [Path(BUCKET, "ckpt", "7", "x")]
    assert first != second and first.parent == second.parent == into
    assert (first / BUCKET / "ckpt").read_bytes() == b"first"
    assert (second / BUCKET / "ckpt" / "7" / "x").read_bytes() == b"second"
    assert unacknowledged(root) == [] and set_aside(root, into) == (None, [])
