"""OCI image-layout archives written with the standard library: images with no registry.

The real nodes (:mod:`multislice_local.realnodes`) import such an archive into each node's
containerd (``ctr images import``, namespace ``k8s.io``), and the kubelet runs pods from it with
``imagePullPolicy: IfNotPresent`` or ``Never``. The archive is a tar of an OCI image layout
(image-spec ``image-layout.md``): ``oci-layout``, ``index.json`` and ``blobs/sha256/<hex>``,
holding one manifest, its config (os, architecture, the runtime config, ``rootfs.diff_ids``) and
its layers, uncompressed (``application/vnd.oci.image.layer.v1.tar``: nothing to gain from gzip
on one machine, and the diff_id is then the layer's own digest).

Everything is reproducible: the same layers, config and reference give the same bytes (sorted
tar entries, fixed mtimes, owners 0:0, JSON with sorted keys), so the manifest digest names the
content.

API::

    layer = files_layer({"pause": (binary, 0o755)})            # or dir_layer(root, out_path)
    image = write_oci_archive(path, [layer], {"Entrypoint": ["/pause"]}, "msj.local/pause:1")
    image.ref, image.digest                                     # normalized name, manifest digest
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# A layer: an uncompressed tar, as a file or as its bytes.
Layer = Path | bytes

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
# The name containerd gives an imported image (core/images: AnnotationImageName), and the OCI
# reference annotation (image-spec annotations.md) other tools read.
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
# Reproducible timestamps: the epoch, as SOURCE_DATE_EPOCH=0 builds use.
EPOCH_ISO = "1970-01-01T00:00:00Z"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Image:
    """An archive written by :func:`write_oci_archive`."""

    path: Path
    ref: str  # normalized, as the kubelet and containerd name it (docker.io/library/x:latest)
    digest: str  # the manifest's, sha256:<hex>
    config_digest: str  # the image ID containerd and crictl show


_NAME = re.compile(
    r"[a-zA-Z0-9.-]+(:[0-9]+)?(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)+(:\w[\w.-]{0,127})?"
)


def normalize_ref(ref: str) -> str:
    """The fully qualified name containerd stores and the kubelet asks for, as
    github.com/distribution/reference's ParseNormalizedNamed gives it: ``pause`` ->
    ``docker.io/library/pause:latest``, ``msj.local/probe:1`` unchanged. A pod's ``image:`` in
    either form finds the image. Digests are not accepted: the archive names its own."""
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        name = ref
    else:
        name = f"docker.io/{ref}" if rest else f"docker.io/library/{ref}"
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"image reference {ref!r}: give lower-case path components and an optional :tag, "
            "e.g. msj.local/probe:1"
        )
    return name


# ------------------------------------------------------------------------------------ layers


def _tarinfo(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def files_layer(files: Mapping[str, bytes | tuple[bytes, int]]) -> bytes:
    """A layer of regular files: path in the image -> content, or (content, mode). Parent
    directories are added (0755); entries are sorted, owners 0:0, mtimes 0."""
    entries: dict[str, tuple[bytes, int]] = {}
    for raw_path, value in files.items():
        path = raw_path.strip("/")
        if not path or ".." in path.split("/"):
            raise ValueError(f"layer path {raw_path!r}: give a path inside the image, e.g. bin/x")
        data, mode = value if isinstance(value, tuple) else (value, 0o644)
        entries[path] = (data, mode)
    dirs = {"/".join(p.split("/")[:i]) for p in entries for i in range(1, p.count("/") + 1)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(dirs | set(entries)):
            if name in entries:
                data, mode = entries[name]
                tar.addfile(_tarinfo(name, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))
            else:
                tar.addfile(_tarinfo(name, tarfile.DIRTYPE, 0o755))
    return buf.getvalue()


def dir_layer(root: Path, out: Path) -> Path:
    """Write a reproducible layer of the tree under ``root`` (its contents at ``/``) to ``out``:
    regular files, directories and symlinks with their modes, sorted, owners 0:0, mtimes 0.
    Hard links are stored as copies; devices, sockets and fifos are refused."""
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _walk(root):
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                tar.addfile(_tarinfo(rel, tarfile.SYMTYPE, 0o777, link=os.readlink(path)))
            elif stat.S_ISDIR(st.st_mode):
                tar.addfile(_tarinfo(rel, tarfile.DIRTYPE, mode))
            elif stat.S_ISREG(st.st_mode):
                with path.open("rb") as data:
                    tar.addfile(_tarinfo(rel, tarfile.REGTYPE, mode, st.st_size), data)
            else:
                raise ValueError(f"{path}: only files, directories and symlinks go in a layer")
    return out


def _walk(root: Path) -> Iterator[Path]:
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        yield entry
        if entry.is_dir() and not entry.is_symlink():
            yield from _walk(entry)


# ---------------------------------------------------------------------------------- archive


def _digest_of(layer: Layer) -> tuple[str, int]:
    if isinstance(layer, bytes):
        return "sha256:" + hashlib.sha256(layer).hexdigest(), len(layer)
    sha, size = hashlib.sha256(), 0
    with layer.open("rb") as src:
        while chunk := src.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return "sha256:" + sha.hexdigest(), size


def _json_blob(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media: str, digest: str, size: int, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media, "digest": digest, "size": size, **extra}


def write_oci_archive(
    path: Path,
    layers: list[Layer],
    config: Mapping[str, Any],
    ref: str,
    *,
    architecture: str = "amd64",
    os_name: str = "linux",
) -> Image:
    """Write an OCI image-layout tar at ``path`` holding one image named ``ref``.

    ``layers``: uncompressed tars, bottom first (a file path or bytes). ``config``: the image
    config's runtime ``config`` object (``Entrypoint``, ``Cmd``, ``Env``, ``User``,
    ``WorkingDir``, ``Labels``, ...; image-spec config.md). The image config adds ``os``,
    ``architecture``, ``created`` (the epoch), ``rootfs.diff_ids`` and one history entry per layer.
    """
    if not layers:
        raise ValueError("an image needs at least one layer")
    name = normalize_ref(ref)
    layer_descs = [_descriptor(MEDIA_LAYER, *_digest_of(layer)) for layer in layers]
    image_config = {
        "created": EPOCH_ISO,
        "architecture": architecture,
        "os": os_name,
        "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in layer_descs]},
        "history": [{"created": EPOCH_ISO, "created_by": "multislice_local.oci"} for _ in layers],
    }
    config_blob = _json_blob(image_config)
    config_digest = "sha256:" + hashlib.sha256(config_blob).hexdigest()
    manifest_blob = _json_blob(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": _descriptor(MEDIA_CONFIG, config_digest, len(config_blob)),
            "layers": layer_descs,
        }
    )
    manifest_digest = "sha256:" + hashlib.sha256(manifest_blob).hexdigest()
    # As containerd's own export writes them: the full name, and the tag as the OCI ref name.
    annotations = {ANNOTATION_CONTAINERD_NAME: name, ANNOTATION_REF_NAME: name.rsplit(":", 1)[1]}
    platform = {"architecture": architecture, "os": os_name}
    index_blob = _json_blob(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                _descriptor(
                    MEDIA_MANIFEST,
                    manifest_digest,
                    len(manifest_blob),
                    annotations=annotations,
                    platform=platform,
                )
            ],
        }
    )
    blobs: dict[str, Layer] = {config_digest: config_blob, manifest_digest: manifest_blob}
    for desc, layer in zip(layer_descs, layers, strict=True):
        blobs.setdefault(desc["digest"], layer)  # two identical layers are one blob
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirname in ("blobs", "blobs/sha256"):
            tar.addfile(_tarinfo(dirname, tarfile.DIRTYPE, 0o755))
        for digest in sorted(blobs):
            _add_blob(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}", blobs[digest])
        _add_blob(tar, "index.json", index_blob)
        _add_blob(tar, "oci-layout", _json_blob({"imageLayoutVersion": "1.0.0"}))
    tmp.replace(path)  # a half-written archive never looks done
    return Image(path, name, manifest_digest, config_digest)


def _add_blob(tar: tarfile.TarFile, name: str, blob: Layer) -> None:
    if isinstance(blob, bytes):
        tar.addfile(_tarinfo(name, tarfile.REGTYPE, 0o644, len(blob)), io.BytesIO(blob))
        return
    with blob.open("rb") as src:
        size = os.fstat(src.fileno()).st_size
        tar.addfile(_tarinfo(name, tarfile.REGTYPE, 0o644, size), src)


# ----------------------------------------------------------------------------------- reading


def read_oci_archive(path: Path) -> dict[str, Any]:
    """The index, the manifest and the config of a one-image archive (for tests and checks):
    ``{"index": ..., "manifest": ..., "config": ..., "layers": [digest, ...]}``. Every blob's
    digest and size are checked against its descriptor (ValueError on a mismatch)."""
    with tarfile.open(path) as tar:
        index = json.loads(_member(tar, "index.json").read())
        (desc,) = index["manifests"]
        manifest = json.loads(_verified(tar, desc))
        config = json.loads(_verified(tar, manifest["config"]))
        for layer in manifest["layers"]:
            _verified(tar, layer, keep=False)
    layers = [layer["digest"] for layer in manifest["layers"]]
    return {"index": index, "manifest": manifest, "config": config, "layers": layers}


def image_name(path: Path) -> str:
    """The name containerd gives the one image of an archive (its index's
    ``io.containerd.image.name``), read from ``index.json`` alone."""
    with tarfile.open(path) as tar:
        manifests = json.loads(_member(tar, "index.json").read())["manifests"]
    names = [(m.get("annotations") or {}).get(ANNOTATION_CONTAINERD_NAME) for m in manifests]
    if len(names) != 1 or not names[0]:
        raise ValueError(
            f"{path}: one image named by {ANNOTATION_CONTAINERD_NAME} expected, found {names} "
            "(write it with multislice_local.oci.write_oci_archive)"
        )
    return str(names[0])


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    fileobj = tar.extractfile(name)
    if fileobj is None:
        raise ValueError(f"{name} is not a file in the archive")
    return fileobj


def _verified(tar: tarfile.TarFile, desc: Mapping[str, Any], keep: bool = True) -> bytes:
    """The blob of `desc` (b"" unless `keep`), its digest and size checked while read."""
    src = _member(tar, f"blobs/sha256/{desc['digest'].removeprefix('sha256:')}")
    sha, size, kept = hashlib.sha256(), 0, io.BytesIO()
    while chunk := src.read(_CHUNK):
        sha.update(chunk)
        size += len(chunk)
        if keep:
            kept.write(chunk)
    actual = "sha256:" + sha.hexdigest()
    if actual != desc["digest"] or size != desc["size"]:
        raise ValueError(f"blob {desc['digest']} ({desc['size']} bytes): read {actual}, {size}")
    return kept.getvalue()
