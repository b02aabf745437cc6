"""The operator image without Docker: the Dockerfile's shape and pins, and the wheel its builder
stage makes, installed into a fresh virtualenv the way the runtime stage installs it."""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
PACKAGE = ROOT / "operator" / "multislice_operator"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", dep.strip())
        assert match, f"runtime dependency {dep!r} is not pinned with =="
        pins[_norm(match.group(1))] = match.group(2)
    return pins


def dockerfile_pins() -> dict[str, str]:
    """ARG <PACKAGE>_VERSION=x.y.z -> {package: x.y.z} (GOOGLE_CLOUD_TPU -> google-cloud-tpu)."""
    text = DOCKERFILE.read_text()
    return {
        _norm(name): version
        for name, version in re.findall(r"^ARG ([A-Z0-9_]+)_VERSION=(\S+)$", text, re.MULTILINE)
    }


def stages() -> list[str]:
    """The Dockerfile split at each FROM (index 0: builder, -1: runtime)."""
    text = DOCKERFILE.read_text()
    return re.split(r"^(?=FROM )", text, flags=re.MULTILINE)[1:]


def builder_copy_sources() -> list[str]:
    sources = []
    for line in stages()[0].splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources += line.split()[1:-1]
    return sources


# ---------------------------------------------------------------- the Dockerfile, statically


def test_dockerfile_pins_match_pyproject() -> None:
    pins = pyproject_pins()
    assert "kopf" in pins
    # Local tooling, not runtime: certificates for the local control plane, and the Kubernetes
    # client (the operator rides on kopf's own async client; ~30 MiB less resident).
    assert not {"cryptography", "kubernetes"} & pins.keys()
    assert dockerfile_pins() == pins


def test_every_pinned_version_is_installed() -> None:
    runtime = stages()[-1]
    for package in dockerfile_pins():
        variable = package.upper().replace("-", "_") + "_VERSION"
        assert f"==${{{variable}}}" in runtime, f"{variable} is declared but not installed"


def test_image_is_multistage_slim_non_root_and_read_only_friendly() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", text, re.MULTILINE)
    builder, runtime = stages()[0], stages()[-1]
    assert len(stages()) == 2 and " AS builder" in builder
    assert "pip wheel" in builder and "pip wheel" not in runtime
    # No build tools in the runtime stage: binary wheels only, no compiler packages.
    assert "--only-binary=:all:" in runtime
    assert not re.search(r"apt-get|build-essential|gcc", runtime)
    assert "PYTHONDONTWRITEBYTECODE=1" in runtime
    assert re.findall(r"^USER (\S+)$", runtime, re.MULTILINE) == ["65532:65532"]
    assert 'ENTRYPOINT ["multislice-operator", "run"]' in runtime
    assert "http://0.0.0.0:8080/healthz" in text  # the liveness endpoint is documented


def test_build_context_files_exist_and_pass_dockerignore() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            pat = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
                keep = negate
        return keep

    for source in builder_copy_sources():
        assert (ROOT / source).exists(), f"the image build COPYs {source}, which is missing"
        assert included(source), f".dockerignore excludes {source}, which the build COPYs"
    assert not included("tests/unit/test_cli.py")
    assert not included(".venv/bin/python")


# ---------------------------------------------------------------- the wheel


def _build_isolation_args() -> list[str]:
    """Offline when the current environment can build the wheel itself, else pip's isolation."""
    import setuptools

    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    has_bdist_wheel = importlib.util.find_spec("wheel") is not None or (major, minor) >= (70, 1)
    return ["--no-build-isolation"] if major >= 61 and has_bdist_wheel else []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel --no-deps` on a copy of exactly what the builder stage COPYs."""
    context = tmp_path_factory.mktemp("context")
    for source in builder_copy_sources():
        src, dst = ROOT / source, context / source
        if src.is_dir():
            shutil.copytree(
                src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            )
        elif src.exists():
            shutil.copy2(src, dst)
        else:  # reported by test_build_context_files_exist_and_pass_dockerignore
            dst.write_text("placeholder\n")
    out = tmp_path_factory.mktemp("wheels")
    result = subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out)),
            *_build_isolation_args(),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (built,) = out.glob("multislice_operator-*.whl")
    return built


def test_wheel_holds_every_module_and_the_package_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        p.relative_to(PACKAGE.parent).as_posix()
        for p in PACKAGE.rglob("*")
        if p.suffix in (".py", ".yaml", ".typed") and "__pycache__" not in p.parts
    }
    assert sources - names == set()
    assert "multislice_operator/py.typed" in names
    # The product ships the product: local tooling (control plane, simulator, demo) stays out.
    assert not any(n.startswith(("tests/", "workload/", "multislice_local/")) for n in names)


def test_wheel_requires_exactly_the_pins(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
    runtime = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    required = {}
    for req in runtime:
        name, version = req.split("==")
        required[_norm(name)] = version.strip()
    assert required == pyproject_pins()


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel (no deps); the pinned deps come from the dev venv via a .pth,
    which does not run the dev venv's own .pth files (so its editable install stays out)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "zz-dev-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "--python", str(python), "install", "--quiet"),
            *("--no-deps", "--no-index", str(wheel)),
        ],
        check=True,
        timeout=120,
    )
    return venv


def _run(venv: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KUBECONFIG")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=venv, timeout=120, check=False
    )


def test_entrypoint_runs_from_the_installed_wheel(installed: Path) -> None:
    result = _run(installed, str(installed / "bin" / "multislice-operator"), "run", "--help")
    assert result.returncode == 0, result.stderr
    assert "--health-port" in result.stdout and "--leader-elect" in result.stdout
    crd = _run(installed, str(installed / "bin" / "multislice-operator"), "crd")
    assert crd.returncode == 0, crd.stderr
    assert crd.stdout == (ROOT / "crds" / "multislice.dev_multislicejobs.yaml").read_text()


def test_installed_package_imports_its_runtime_and_data(installed: Path) -> None:
    code = (
        "import multislice_operator, multislice_operator.controller.handlers, "
        "multislice_operator.provisioning.gke\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('multislice_local') is None, 'local tooling shipped'\n"
        "print(multislice_operator.__file__)"
    )
    before = set(installed.rglob("*"))
    result = _run(installed, str(installed / "bin" / "python"), "-c", code)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(installed), "imported the dev checkout"
    # PYTHONDONTWRITEBYTECODE (pip compiled at install time): running writes nothing there, as a
    # read-only root filesystem requires.
    assert set(installed.rglob("*")) == before
