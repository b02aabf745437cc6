"""multislice_local.oci: OCI image-layout archives written with the standard library."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from multislice_local import oci


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


@pytest.mark.parametrize(
    ("ref", "normalized"),
    [
        ("pause", "docker.io/library/pause:latest"),
        ("pause:3.10", "docker.io/library/pause:3.10"),
        ("team/app:1", "docker.io/team/app:1"),
        ("msj.local/probe:1", "msj.local/probe:1"),
        ("localhost/probe", "localhost/probe:latest"),
        ("registry:5000/a/b:v1.2", "registry:5000/a/b:v1.2"),
    ],
)
def test_references_are_normalized_as_containerd_names_them(ref: str, normalized: str) -> None:
    assert oci.normalize_ref(ref) == normalized


@pytest.mark.parametrize("ref", ["", "Upper/case", "a b", "msj.local/x:", "msj.local/x@sha256:ab"])
def test_bad_references_are_refused_with_an_example(ref: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. msj\.local/probe:1"):
        oci.normalize_ref(ref)


def test_files_layer_adds_parents_sorted_with_fixed_owner_and_time() -> None:
    layer = oci.files_layer({"/usr/bin/tool": (b"#!x", 0o755), "etc/hosts": b"127.0.0.1 x\n"})
    members = _members(layer)
    assert list(members) == ["etc", "etc/hosts", "usr", "usr/bin", "usr/bin/tool"]
    assert members["usr/bin/tool"].mode == 0o755 and members["etc/hosts"].mode == 0o644
    assert members["usr"].isdir() and members["usr"].mode == 0o755
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        tool = tar.extractfile("usr/bin/tool")
        assert tool is not None and tool.read() == b"#!x"


@pytest.mark.parametrize("path", ["", "/", "a/../../etc/passwd"])
def test_files_layer_refuses_paths_outside_the_image(path: str) -> None:
    with pytest.raises(ValueError, match="inside the image"):
        oci.files_layer({path: b""})


def test_dir_layer_keeps_modes_and_symlinks_and_drops_owners(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "sh").write_bytes(b"shell")
    (root / "bin" / "sh").chmod(0o750)
    (root / "lib").symlink_to("usr/lib")
    os.utime(root / "bin" / "sh", (1e9, 1e9))
    members = _members(oci.dir_layer(root, tmp_path / "layer.tar").read_bytes())
    assert list(members) == ["bin", "bin/sh", "lib"]
    assert members["bin/sh"].mode == 0o750 and members["bin/sh"].mtime == 0
    assert members["lib"].issym() and members["lib"].linkname == "usr/lib"
    again = oci.dir_layer(root, tmp_path / "again.tar")
    assert again.read_bytes() == (tmp_path / "layer.tar").read_bytes()


def test_dir_layer_refuses_a_fifo(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "pipe")
    with pytest.raises(ValueError, match="only files, directories and symlinks"):
        oci.dir_layer(root, tmp_path / "layer.tar")


def test_archive_is_an_oci_layout_whose_digests_and_diff_ids_hold(tmp_path: Path) -> None:
    base = oci.files_layer({"bin/probe": (b"\x7fELF...", 0o755)})
    top_file = tmp_path / "top.tar"
    top_file.write_bytes(oci.files_layer({"etc/motd": b"hi\n"}))
    runtime = {"Entrypoint": ["/bin/probe"], "User": "65532:65532", "Env": ["A=1"]}
    image = oci.write_oci_archive(tmp_path / "img.tar", [base, top_file], runtime, "probe:1")

    assert image.ref == "docker.io/library/probe:1"
    read = oci.read_oci_archive(image.path)
    (desc,) = read["index"]["manifests"]
    assert desc["digest"] == image.digest
    assert desc["annotations"] == {
        "io.containerd.image.name": "docker.io/library/probe:1",
        "org.opencontainers.image.ref.name": "1",
    }
    assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
    layer_digests = [_sha(base), _sha(top_file.read_bytes())]
    assert read["layers"] == layer_digests
    assert [layer["mediaType"] for layer in read["manifest"]["layers"]] == [oci.MEDIA_LAYER] * 2
    assert read["config"]["rootfs"] == {"type": "layers", "diff_ids": layer_digests}
    assert read["config"]["config"] == runtime
    assert (read["config"]["os"], read["config"]["architecture"]) == ("linux", "amd64")
    assert read["manifest"]["config"]["digest"] == image.config_digest
    assert oci.image_name(image.path) == "docker.io/library/probe:1"

    names = list(_members(image.path.read_bytes()))
    assert {"oci-layout", "index.json"} <= set(names)
    with tarfile.open(image.path) as tar:
        layout = tar.extractfile("oci-layout")
        assert layout is not None and json.loads(layout.read()) == {"imageLayoutVersion": "1.0.0"}
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_same_inputs_give_the_same_bytes_and_a_change_a_new_digest(tmp_path: Path) -> None:
    def build(name: str, motd: bytes) -> oci.Image:
        layer = oci.files_layer({"etc/motd": motd})
        return oci.write_oci_archive(tmp_path / name, [layer], {"Cmd": ["x"]}, "msj.local/m:1")

    one, two, other = build("1.tar", b"a"), build("2.tar", b"a"), build("3.tar", b"b")
    assert one.path.read_bytes() == two.path.read_bytes()
    assert one.digest == two.digest
    assert other.digest != one.digest and other.config_digest != one.config_digest


def test_a_corrupted_blob_is_found(tmp_path: Path) -> None:
    layer = oci.files_layer({"a": b"x" * 100})
    image = oci.write_oci_archive(tmp_path / "img.tar", [layer], {}, "msj.local/c:1")
    data = bytearray(image.path.read_bytes())
    at = data.index(b"x" * 100)
    data[at] = ord("y")
    image.path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=_sha(layer)):
        oci.read_oci_archive(image.path)


def test_an_image_needs_a_layer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one layer"):
        oci.write_oci_archive(tmp_path / "img.tar", [], {}, "msj.local/e:1")


def test_image_name_refuses_an_archive_without_containerds_name(tmp_path: Path) -> None:
    index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": "sha256:00", "size": 1}]})
    path = tmp_path / "other.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("index.json")
        info.size = len(index)
        tar.addfile(info, io.BytesIO(index.encode()))
    with pytest.raises(ValueError, match=r"io\.containerd\.image\.name expected"):
        oci.image_name(path)
