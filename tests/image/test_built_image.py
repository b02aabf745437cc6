"""The operator image as built (`make image-test`: hack/build-image.sh, then these tests).

Not part of `make test`: building takes minutes (debootstrap, every locked wheel downloaded) and
needs root and buildah, so pytest does not recurse here (pyproject `norecursedirs`) and this
module runs only when named. It installs nothing and skips nothing: without buildah or without
the image it fails and says which command makes them.

The image is read two ways: its files through `buildah mount` (what is in it at all), and its
commands through `buildah run --isolation chroot` as the image's own user (what it does).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("MSJ_IMAGE", "")
VENV = "opt/multislice-operator"
SBOM = "usr/share/doc/multislice-operator/sbom.cdx.json"
UID = "65532"


def buildah(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=300, check=check
    )


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("buildah") is None:
        pytest.fail("buildah is not installed: make image-test (hack/image-deps.sh installs it)")
    if not IMAGE:
        pytest.fail("MSJ_IMAGE is not set: make image-test builds the image and sets it")
    if buildah("inspect", "--type", "image", IMAGE, check=False).returncode != 0:
        pytest.fail(f"no image {IMAGE}: make image-test builds it")
    return IMAGE


@pytest.fixture(scope="module")
def config(image: str) -> dict:  # type: ignore[type-arg]
    data: dict = json.loads(buildah("inspect", "--type", "image", image).stdout)  # type: ignore[type-arg]
    return data


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    name = buildah("from", "--quiet", image).stdout.strip()
    try:
        yield name
    finally:
        buildah("rm", name, check=False)


@pytest.fixture(scope="module")
def rootfs(container: str) -> Iterator[Path]:
    path = Path(buildah("mount", container).stdout.strip())
    try:
        yield path
    finally:
        buildah("umount", container, check=False)


def run(container: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """A command in the image, as the image's USER (no --user: what the config says)."""
    return buildah("run", "--isolation", "chroot", container, "--", *argv, check=False)


def test_runs_its_commands_as_a_non_root_user(container: str, config: dict) -> None:  # type: ignore[type-arg]
    assert config["OCIv1"]["config"]["User"] == f"{UID}:{UID}"
    assert run(container, "python3", "-c", "import os; print(os.getuid(), os.getgid())").stdout == (
        f"{UID} {UID}\n"
    )
    helped = run(container, "multislice-operator", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "validate" in helped.stdout and "run" in helped.stdout
    run_help = run(container, "multislice-operator", "run", "--help")
    assert run_help.returncode == 0, run_help.stderr
    assert "--health-port" in run_help.stdout and "--leader-elect" in run_help.stdout
    crd = run(container, "multislice-operator", "crd")
    assert crd.stdout == (ROOT / "crds" / "multislice.dev_multislicejobs.yaml").read_text()
    assert config["OCIv1"]["config"]["Entrypoint"] == ["multislice-operator", "run"]


def test_imports_the_operator_and_its_gke_adapter(container: str) -> None:
    code = (
        "import multislice_operator.controller.handlers, multislice_operator.provisioning.gke\n"
        "import google.cloud.container_v1, kopf\n"
        "print(multislice_operator.__file__)"
    )
    result = run(container, "python3", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"/{VENV}/lib/python3.11/site-packages/multislice_operator/")


def test_every_python_object_is_in_jemalloc(container: str) -> None:
    """The image's allocator is loaded (LD_PRELOAD) and Python's own arenas are off."""
    code = (
        "import sys\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('libjemalloc.so.2' in maps, sys._xoptions, end=' ')\n"
        "import os; print(os.environ.get('PYTHONMALLOC'))"
    )
    result = run(container, "python3", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "True" and result.stdout.split()[-1] == "malloc"


def test_holds_no_pip_no_compiler_no_local_tooling(container: str, rootfs: Path) -> None:
    for module in ("pip", "setuptools", "wheel", "multislice_local"):
        code = f"import importlib.util as u, sys; sys.exit(u.find_spec({module!r}) is not None)"
        assert run(container, "python3", "-c", code).returncode == 0, f"{module} is in the image"
    packages = re.compile(r"pip|pip-[0-9.]+\.dist-info|setuptools|multislice_local")
    files = re.compile(
        r"pip[0-9.]*|gcc(-[0-9]+)?|cc|c\+\+|g\+\+|clang|tcc|cc1|as|ld|kwok|kwokctl|gke_sim\.py|"
        r"kube-apiserver|etcd|(pip|setuptools|wheel)-.*\.whl"  # ensurepip's bundled wheels too
    )
    found = []
    for dirpath, dirnames, filenames in os.walk(rootfs):
        rel = Path(dirpath).relative_to(rootfs)
        if rel.parts[:1] in (("proc",), ("sys",), ("dev",)):
            dirnames[:] = []
            continue
        found += [str(rel / n) for n in dirnames if packages.fullmatch(n)]
        found += [str(rel / n) for n in filenames if files.fullmatch(n)]
    assert found == []


def test_the_sbom_lists_exactly_what_the_virtualenv_holds(rootfs: Path) -> None:
    sbom = json.loads((rootfs / SBOM).read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    assert sbom["metadata"]["component"]["name"] == "multislice-operator"
    listed = {c["name"].lower().replace("_", "-"): c["version"] for c in sbom["components"]}
    site = rootfs / VENV / "lib" / "python3.11" / "site-packages"
    installed = {}
    for info in site.glob("*.dist-info"):
        meta = (info / "METADATA").read_text()
        name = re.search(r"^Name: (.+)$", meta, re.MULTILINE).group(1)  # type: ignore[union-attr]
        version = re.search(r"^Version: (.+)$", meta, re.MULTILINE).group(1)  # type: ignore[union-attr]
        installed[re.sub(r"[-_.]+", "-", name).lower()] = version
    assert installed.pop("multislice-operator") == sbom["metadata"]["component"]["version"]
    assert listed == installed
    # ... which is the lock, version for version.
    lock = dict(
        re.findall(
            r"^([a-z0-9._-]+)==(\S+)", (ROOT / "image" / "requirements.lock").read_text(), re.M
        )
    )
    assert installed == {re.sub(r"[-_.]+", "-", k): v for k, v in lock.items()}


def test_labels_say_what_and_from_what(config: dict) -> None:  # type: ignore[type-arg]
    labels = config["OCIv1"]["config"]["Labels"]
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert labels["org.opencontainers.image.version"] == version.group(1)  # type: ignore[union-attr]
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert labels["org.opencontainers.image.revision"] in (head, f"{head}-dirty")
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels["org.opencontainers.image.created"]
    )
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.base.name"]  # the base it was built on
    assert labels["dev.multislice.sbom"] == f"/{SBOM}"


def test_the_build_hosts_ca_bundle_is_not_in_the_image(config: dict, rootfs: Path) -> None:  # type: ignore[type-arg]
    """hack/build-image.sh mounts the host's CA bundle over the build container's for downloads
    (a TLS-intercepting proxy): the image keeps its base's bundle."""
    base = config["OCIv1"]["config"]["Labels"]["org.opencontainers.image.base.name"]
    name = buildah("from", "--quiet", base).stdout.strip()
    try:
        base_root = Path(buildah("mount", name).stdout.strip())
        bundle = "etc/ssl/certs/ca-certificates.crt"
        assert (rootfs / bundle).read_bytes() == (base_root / bundle).read_bytes()
    finally:
        buildah("umount", name, check=False)
        buildah("rm", name, check=False)


def test_size(image: str, rootfs: Path) -> None:
    """The figures (printed for `make image-test -s`); the virtualenv's share is bounded: the
    build tools and the SBOM generator stay in the builder stage."""
    images = json.loads(buildah("images", "--json", image).stdout)
    venv = sum(p.stat().st_size for p in (rootfs / VENV).rglob("*") if p.is_file())
    print(f"\nimage {image}: {images[0]['size']}, virtualenv {venv / 2**20:.1f} MiB")
    # 169 MiB on 2026-12-04, 69 MiB of it google-cloud-compute (the workload policies of
    # dynamic slicing need its resource_policies client; the package ships every compute API).
    assert venv < 200 * 2**20
