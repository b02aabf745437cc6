"""The product's images as the offline builder makes them (multislice_local.images): the OCI
archives read back blob by blob, their configs against the Dockerfiles, the same bytes from a
rebuild, a new digest from a changed input, a warm build that touches nothing, and the images'
programs run from their root filesystems as their users, with the root read-only and /tmp an
empty tmpfs (as the chart's Deployment and a pod run them), but without containerd.

The builds go to the image cache (session fixtures `operator_image` and `workload_image`,
tests/conftest.py): cold, a few minutes (Debian packages, locked wheels from PyPI); warm, seconds.
The runs need root (a mount namespace, chroot): elsewhere they skip and say so.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from multislice_local import dockerfile, images, oci
from multislice_local.images import BuiltImage

ROOT = Path(__file__).resolve().parents[2]

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="running an image's programs needs root and unshare (a mount namespace, chroot): "
    "run these tests as root (CI does)",
)


def _read(archive: Path, name: str) -> bytes:
    with tarfile.open(archive) as tar:
        member = tar.extractfile(name)
        assert member is not None, name
        return member.read()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ the archive


@pytest.mark.parametrize("which", ["operator_image", "workload_image"])
def test_archive_is_an_oci_layout_whose_digests_and_diff_ids_hold(
    which: str, request: pytest.FixtureRequest
) -> None:
    image: BuiltImage = request.getfixturevalue(which)
    archive = image.archive
    assert json.loads(_read(archive, "oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(_read(archive, "index.json"))
    (entry,) = index["manifests"]
    assert entry["mediaType"] == oci.MEDIA_MANIFEST
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert entry["annotations"][oci.ANNOTATION_CONTAINERD_NAME] == image.ref
    manifest_blob = _read(archive, f"blobs/sha256/{entry['digest'][7:]}")
    assert (_sha(manifest_blob), len(manifest_blob)) == (entry["digest"], entry["size"])
    assert entry["digest"] == image.digest
    manifest = json.loads(manifest_blob)
    config_blob = _read(archive, f"blobs/sha256/{manifest['config']['digest'][7:]}")
    assert _sha(config_blob) == manifest["config"]["digest"] == image.config_digest
    assert len(config_blob) == manifest["config"]["size"]
    config = json.loads(config_blob)
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    diff_ids = config["rootfs"]["diff_ids"]
    assert len(diff_ids) == len(manifest["layers"]) == 3  # base, dependencies, application
    with tarfile.open(archive) as outer:
        for layer, diff_id in zip(manifest["layers"], diff_ids, strict=True):
            assert layer["mediaType"] == oci.MEDIA_LAYER  # uncompressed: digest == diff_id
            name = f"blobs/sha256/{layer['digest'][7:]}"
            sha, size = hashlib.sha256(), 0
            blob = outer.extractfile(name)
            assert blob is not None
            while chunk := blob.read(1 << 20):
                sha.update(chunk)
                size += len(chunk)
            assert ("sha256:" + sha.hexdigest(), size) == (layer["digest"], layer["size"])
            assert "sha256:" + sha.hexdigest() == diff_id  # uncompressed: the diff_id is the digest
            with tarfile.open(fileobj=outer.extractfile(name), mode="r|") as tar:
                members = [(m.name, m.uid, m.gid, m.mtime) for m in tar]
            siblings: dict[str, list[str]] = {}
            for path, *_ in members:
                parent, _, leaf = path.rpartition("/")
                siblings.setdefault(parent, []).append(leaf)
            assert all(names == sorted(names) for names in siblings.values()), "sorted entries"
            assert {m[1:] for m in members} == {(0, 0, 0)}
    assert list(image.layers) == [layer["digest"] for layer in manifest["layers"]]


def test_both_images_share_one_base_layer(
    operator_image: BuiltImage, workload_image: BuiltImage
) -> None:
    assert operator_image.layers[0] == workload_image.layers[0]
    assert operator_image.layers[1:] != workload_image.layers[1:]


@pytest.mark.parametrize(
    ("which", "path", "args"),
    [
        ("operator_image", "Dockerfile", {"VERSION": images._version(ROOT), "PYTHON_IMAGE": ""}),
        ("workload_image", "workload/Dockerfile", {"JAX_EXTRA": ""}),
    ],
    ids=["operator", "workload"],
)
def test_config_is_what_the_dockerfile_says(
    which: str, path: str, args: dict[str, str], request: pytest.FixtureRequest
) -> None:
    image: BuiltImage = request.getfixturevalue(which)
    config = oci.read_oci_archive(image.archive)["config"]["config"]
    expected = dockerfile.runtime_config(dockerfile.parse(ROOT / path), args, images.BASE_ENV)
    expected["Labels"] = {k: v for k, v in expected.get("Labels", {}).items() if v}
    if not expected["Labels"]:
        del expected["Labels"]
    assert config == expected


# ------------------------------------------------------------------ the cache


def _seeded_cache(tmp_path: Path, layers: list[str]) -> Path:
    """A cache of its own with the session cache's downloads (apt lists and packages copied,
    wheels hard-linked, the build tools' virtualenv linked) and these of its layers."""
    real, cache = images.cache_root(), tmp_path / "cache"
    cache.mkdir()
    shutil.copytree(real / "apt", cache / "apt", ignore=shutil.ignore_patterns("*.bin", "lock*"))
    shutil.copytree(real / "wheels", cache / "wheels", copy_function=os.link)
    (cache / "tools").symlink_to(real / "tools")
    (cache / "layers").mkdir()
    for name in layers:
        os.link(real / "layers" / name, cache / "layers" / name)
    return cache


def _changed_root(tmp_path: Path) -> Path:
    """A copy of what the operator image is made of, one source file changed."""
    root = tmp_path / "repo"
    root.mkdir()
    for rel in ["pyproject.toml", "README.md", "Dockerfile"]:
        shutil.copy2(ROOT / rel, root / rel)
    for rel in ["image", "hack"]:
        shutil.copytree(ROOT / rel, root / rel, symlinks=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "operator", root / "operator", ignore=ignore)
    init = root / "operator" / "multislice_operator" / "__init__.py"
    init.write_text(init.read_text() + "\n# a change\n")
    return root


def test_the_same_inputs_give_the_same_bytes_and_a_change_only_its_layer(
    operator_image: BuiltImage, tmp_path: Path
) -> None:
    """The base and the operator layers made again in another cache (the dependencies layer,
    the slowest to make, reused): the same digest. Then one source file changed: a new
    operator layer, the other two the same."""
    meta = json.loads(operator_image.archive.with_suffix(".json").read_text())
    deps = meta["layer_files"][1]
    cache = _seeded_cache(tmp_path, [deps])
    out = io.StringIO()
    again = images.build_image("operator", cache=cache, out=out)
    log = out.getvalue()
    assert "[2/5] base layer building" in log and "[4/5] operator layer building" in log
    assert again.layers == operator_image.layers
    assert again.digest == operator_image.digest
    out = io.StringIO()
    changed = images.build_image("operator", root=_changed_root(tmp_path), cache=cache, out=out)
    log = out.getvalue()
    assert "[2/5] base layer up to date" in log
    assert "[3/5] operator dependencies layer up to date" in log
    assert changed.layers[:2] == operator_image.layers[:2]
    assert changed.layers[2] != operator_image.layers[2]
    assert changed.digest != operator_image.digest and changed.ref != operator_image.ref


def test_a_warm_build_rewrites_nothing(operator_image: BuiltImage) -> None:
    cache = images.cache_root()
    before = {
        p: p.stat().st_ino for p in [*(cache / "layers").glob("*.tar"), operator_image.archive]
    }
    out = io.StringIO()
    again = images.build_image("operator", out=out)
    assert again == operator_image
    assert f"{operator_image.ref} up to date" in out.getvalue()
    assert {p: p.stat().st_ino for p in before} == before


# ------------------------------------------------------------------ running the images


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Unpacked images, by fixture name (made on first use)."""
    made: dict[str, Path] = {}
    yield made
    for path in made.values():
        shutil.rmtree(path, ignore_errors=True)


def _unpacked(image: BuiltImage, made: dict[str, Path], tmp: Path) -> tuple[Path, dict[str, Any]]:
    if image.name not in made:
        made[image.name] = images.unpack(image.archive, tmp / image.name)
    return made[image.name], oci.read_oci_archive(image.archive)["config"]["config"]


@pytest.fixture(scope="module")
def operator_fs(
    operator_image: BuiltImage, rootfs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    return _unpacked(operator_image, rootfs, tmp_path_factory.mktemp("fs"))


@pytest.fixture(scope="module")
def workload_fs(
    workload_image: BuiltImage, rootfs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    return _unpacked(workload_image, rootfs, tmp_path_factory.mktemp("fs"))


def _python(fs: Path, config: dict[str, Any], python: str, code: str) -> list[str]:
    """What `python -c code` prints in the image, run as its config says."""
    ran = images.run_in_rootfs(fs, [python, "-c", code], config)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.splitlines()


@needs_root
def test_operator_runs_as_its_user_with_a_read_only_root(
    operator_fs: tuple[Path, dict[str, Any]],
) -> None:
    fs, config = operator_fs
    helped = images.run_in_rootfs(fs, [*config["Entrypoint"], "--help"], config)
    assert helped.returncode == 0, helped.stderr
    assert "--health-port" in helped.stdout and "--leader-elect" in helped.stdout
    crd = images.run_in_rootfs(fs, ["multislice-operator", "crd"], config)
    assert crd.stdout == (ROOT / "crds" / "multislice.dev_multislicejobs.yaml").read_text()
    code = (
        "import os, sys, errno, importlib.util as u\n"
        "import multislice_operator.controller.handlers, multislice_operator.provisioning.gke\n"
        "import google.cloud.container_v1, kopf\n"
        "print(os.getuid(), os.getgid(), os.getcwd(), multislice_operator.__file__)\n"
        "print('libjemalloc.so.2' in open('/proc/self/maps').read(), os.environ['PYTHONMALLOC'])\n"
        "print([m for m in ('pip', 'setuptools', 'wheel', 'multislice_local') if u.find_spec(m)])\n"
        "open('/tmp/scratch', 'w').write('ok')\n"
        "try:\n    open('/opt/x', 'w')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
    )
    assert _python(fs, config, "python3", code) == [
        "65532 65532 /tmp /opt/multislice-operator/lib/python3.11/site-packages/"
        "multislice_operator/__init__.py",
        "True malloc",  # every Python object in jemalloc
        "[]",  # no pip, setuptools, wheel or local tooling
        "EROFS",  # the root filesystem is read-only; /tmp (an emptyDir in the chart) is not
    ]


@needs_root
def test_the_in_place_restart_agent_runs_from_the_operator_image(
    operator_fs: tuple[Path, dict[str, Any]],
) -> None:
    """JobSet's agent, as a pod's agent sidecar starts it (command: [/in-place-restart-agent]):
    without a service account token it stops at once, naming the file it reads."""
    fs, config = operator_fs
    ran = images.run_in_rootfs(fs, [images.AGENT_PATH], config)
    assert ran.returncode == 1, ran.stderr
    assert "unable to read namespace file" in ran.stderr
    assert "/var/run/secrets/kubernetes.io/serviceaccount/namespace" in ran.stderr


def test_operator_image_carries_the_sbom_of_its_virtualenv_and_its_packages(
    operator_fs: tuple[Path, dict[str, Any]],
) -> None:
    fs, config = operator_fs
    sbom = json.loads((fs / images.SBOM.lstrip("/")).read_text())
    assert config["Labels"]["dev.multislice.sbom"] == images.SBOM
    assert sbom["bomFormat"] == "CycloneDX"
    assert sbom["metadata"]["component"]["name"] == "multislice-operator"
    listed = {c["name"].lower().replace("_", "-"): c["version"] for c in sbom["components"]}
    site = fs / images.VENV_SITE.lstrip("/")
    installed = {}
    for info in site.glob("*.dist-info"):
        meta = (info / "METADATA").read_text()
        name = re.search(r"^Name: (.+)$", meta, re.M).group(1)  # type: ignore[union-attr]
        installed[re.sub(r"[-_.]+", "-", name).lower()] = re.search(  # type: ignore[union-attr]
            r"^Version: (.+)$", meta, re.M
        ).group(1)
    assert installed.pop("multislice-operator") == sbom["metadata"]["component"]["version"]
    assert listed == installed
    lock = images.lock_entries(ROOT / "image" / "requirements.lock")
    assert installed == {name: version for name, (version, _) in lock.items()}
    # The Debian packages, for scanners: dpkg's status lists them as installed.
    status = (fs / "var" / "lib" / "dpkg" / "status").read_text()
    assert re.search(r"^Package: python3\.11\nStatus: install ok installed$", status, re.M)
    assert (fs / images.JEMALLOC.lstrip("/")).is_file()


@needs_root
def test_workload_runs_jax_as_its_user_with_a_read_only_root(
    workload_fs: tuple[Path, dict[str, Any]],
) -> None:
    fs, config = workload_fs
    code = (
        "import os, jax, jax.numpy as jnp, optax, orbax.checkpoint, grain, array_record, "
        "pyarrow, tokenizers, sentencepiece, gcsfs, ssl\n"
        "print(os.getuid(), os.getcwd(), jax.__version__, float(jnp.arange(10).sum()))\n"
        "print(len(ssl.create_default_context().get_ca_certs()) > 100)\n"
    )
    assert _python(fs, config, "python", code) == ["10001 /app 0.10.2 45.0", "True"]
    helped = images.run_in_rootfs(fs, [*config["Entrypoint"], "--help"], config)
    assert helped.returncode == 0, helped.stderr
    assert "train" in helped.stdout and "prepare" in helped.stdout
    # The built-in corpus `train --dataset` reads, prepared at build time.
    corpus = fs / images.CORPUS.lstrip("/")
    manifest = json.loads((corpus / "dataset.json").read_text())
    assert manifest["vocab_size"] > 0 and set(manifest["splits"]) == {"train", "eval"}
    assert (corpus / "tokenizer.json").is_file()
