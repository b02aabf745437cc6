"""The operator image without an engine: the Dockerfile's shape, its hash locks against pyproject,
and the wheel its builder stage makes, installed into a fresh virtualenv the way the image
installs it (and alone, as the thin CLI install). The image itself is built and checked by
`make image-test` (tests/image/, hack/build-image.sh)."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
PACKAGE = ROOT / "operator" / "multislice_operator"
LOCK = ROOT / "image" / "requirements.lock"
BUILD_LOCK = ROOT / "image" / "build-requirements.lock"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pyproject_pins() -> dict[str, str]:
    """The operator extra: {package: version}, every one pinned with ==."""
    pins = {}
    for dep in project()["optional-dependencies"]["operator"]:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", dep.strip())
        assert match, f"operator dependency {dep!r} is not pinned with =="
        pins[_norm(match.group(1))] = match.group(2)
    return pins


def lock_entries(path: Path) -> dict[str, tuple[str, str, list[str]]]:
    """A `uv pip compile --generate-hashes` file: {package: (version, marker, hashes)}."""
    entries = {}
    text = re.sub(r"\s*\\\n\s*", " ", path.read_text())  # join continuation lines
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([a-z0-9._-]+)==(\S+)\s*(?:;\s*(.*?))?((?:\s*--hash=\S+)*)", line)
        assert match, f"{path.name}: not a pinned, hashed requirement: {line!r}"
        name, version, marker, hashes = match.groups()
        entries[_norm(name)] = (
            version,
            (marker or "").strip(),
            re.findall(r"--hash=(\S+)", hashes),
        )
    return entries


def closure(requirements: list[str]) -> dict[str, str]:
    """What installing `requirements` pulls in on this platform, read from the installed
    distributions' metadata: {package: installed version}."""
    env = default_environment()
    todo = [(Requirement(r), "") for r in requirements]
    seen: dict[str, str] = {}
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = _norm(req.name)
        dist = metadata.distribution(name)
        for want in sorted(req.extras) or [""]:
            key = f"{name}[{want}]"
            if key in seen:
                continue
            seen[key] = dist.version
            todo += [(Requirement(r), want) for r in dist.requires or []]
    return {k.split("[")[0]: v for k, v in seen.items()}


def stages() -> list[str]:
    """The Dockerfile split at each FROM (index 0: the global ARGs, 1: builder, -1: runtime)."""
    return re.split(r"^(?=FROM )", DOCKERFILE.read_text(), flags=re.MULTILINE)


def builder_copy_sources() -> list[str]:
    """What the builder stage COPYs from the build context (the wheel's sources, the locks)."""
    return copy_sources(stages()[1])


def copy_sources(stage: str) -> list[str]:
    sources = []
    for line in stage.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources += line.split()[1:-1]
    return sources


def shell_lines(stage: str) -> str:
    """A stage's RUN commands as one string (continuations joined)."""
    return re.sub(r"\s*\\\n\s*", " ", stage)


# ---------------------------------------------------------------- the locks


def test_lock_matches_pyproject_pins() -> None:
    pins = pyproject_pins()
    assert "kopf" in pins
    # Local tooling, not runtime: the Kubernetes client (the operator rides on kopf's own
    # async client; ~30 MiB less resident).
    assert not {"cryptography", "kubernetes"} & pins.keys()
    lock = lock_entries(LOCK)
    assert {name: lock[name][0] for name in pins if name in lock} == pins, "make lock"
    # The CLI's ranged base dependencies are all inside the operator's pins.
    base = {_norm(Requirement(r).name) for r in project()["dependencies"]}
    assert base <= pins.keys()


def test_lock_is_the_closure_of_the_pins_and_every_file_is_hashed() -> None:
    lock = lock_entries(LOCK)
    env = default_environment()
    here = {
        name: version
        for name, (version, marker, _) in lock.items()
        if not marker or Requirement(f"x; {marker}").marker.evaluate(env)  # type: ignore[union-attr]
    }
    # `make install` installs the lock first, so the dev environment is what the image ships:
    # the pins' closure, read from the installed metadata, is the lock (nothing missing, nothing
    # extra such as pytest or kubernetes), at the lock's versions.
    assert closure([f"{n}=={v}" for n, v in pyproject_pins().items()]) == here
    for name, (_, _, hashes) in lock.items():
        assert hashes and all(h.startswith("sha256:") for h in hashes), name


def test_build_lock_holds_the_build_backend_and_the_sbom_tool() -> None:
    lock = lock_entries(BUILD_LOCK)
    assert {"pip", "setuptools", "wheel", "cyclonedx-bom"} <= lock.keys()
    for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"][
        "requires"
    ]:
        req = Requirement(requirement)
        assert req.specifier.contains(lock[_norm(req.name)][0]), requirement
    assert all(hashes for _, _, hashes in lock.values())
    # Nothing of the runtime lock's is built by a different version in the builder.
    runtime = lock_entries(LOCK)
    assert {n: runtime[n][0] for n in runtime.keys() & lock.keys()} == {
        n: lock[n][0] for n in runtime.keys() & lock.keys()
    }


# ---------------------------------------------------------------- the Dockerfile, statically


def test_base_is_pinned_by_digest_and_both_stages_share_it() -> None:
    head = stages()[0]
    args = dict(re.findall(r"^ARG (PYTHON_IMAGE|BUILDER_IMAGE)=(\S+)$", head, re.MULTILINE))
    assert args.keys() == {"PYTHON_IMAGE", "BUILDER_IMAGE"}
    assert re.fullmatch(
        r"docker\.io/library/python:3\.11-slim@sha256:[0-9a-f]{64}", args["PYTHON_IMAGE"]
    )
    assert args["BUILDER_IMAGE"] == args["PYTHON_IMAGE"]
    assert stages()[1].startswith("FROM ${BUILDER_IMAGE} AS builder")
    assert stages()[-1].startswith("FROM ${PYTHON_IMAGE}\n")


def test_every_install_is_hash_checked_binary_only_and_in_the_builder() -> None:
    builder, runtime = shell_lines(stages()[1]), shell_lines(stages()[-1])
    installs = re.findall(r"pip (?:--python \S+ )?install ([^&]*)", builder)
    from_locks = [i for i in installs if " -r " in f" {i}"]
    assert len(from_locks) == 2, installs
    for args in from_locks:
        assert "--require-hashes" in args and "--only-binary=:all:" in args and "--no-deps" in args
    assert {re.search(r"-r (\S+)", a).group(1) for a in from_locks} == {  # type: ignore[union-attr]
        "image/build-requirements.lock",
        "image/requirements.lock",
    }
    # The wheel: built without isolation (the locked setuptools), installed offline.
    assert "wheel --no-deps --no-build-isolation" in builder
    assert re.search(r"install --no-deps --no-index /wheels/\*\.whl", builder)
    assert "pip check" in builder
    # The runtime stage installs nothing and removes what the base brought.
    runs = " ".join(re.findall(r"^RUN (.*)$", runtime, re.MULTILINE))
    assert "pip install" not in runs and "apt-get" not in runs
    assert "pip uninstall --yes --no-input pip setuptools wheel" in runtime
    assert "ensurepip/_bundled" in runtime


def test_runtime_stage_is_non_root_labelled_and_carries_the_sbom() -> None:
    text, runtime = DOCKERFILE.read_text(), stages()[-1]
    copies = re.findall(r"^COPY (.*)$", runtime, re.MULTILINE)
    assert all(c.startswith(("--from=builder ", "--from=agent ")) for c in copies), copies
    # JobSet's in-place restart agent, where JobSet's own agent image has it.
    assert "--from=agent /in-place-restart-agent /in-place-restart-agent" in copies
    assert any("/opt/multislice-operator /opt/multislice-operator" in c for c in copies)
    assert any(c.endswith("/usr/share/doc/multislice-operator/sbom.cdx.json") for c in copies)
    assert "cyclonedx-py environment" in stages()[1]
    labels = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", runtime))
    assert {
        f"org.opencontainers.image.{k}"
        for k in ("title", "version", "revision", "created", "source", "licenses", "base.name")
    } <= labels
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

    for source in [s for stage in stages()[1:] for s in copy_sources(stage)]:
        assert (ROOT / source).exists(), f"the image build COPYs {source}, which is missing"
        assert included(source), f".dockerignore excludes {source}, which the build COPYs"
    assert not included("tests/unit/test_cli.py")
    assert not included(".venv/bin/python")
    assert not included("image/build-requirements.in")


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
        dst.parent.mkdir(parents=True, exist_ok=True)
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


def test_wheel_requires_ranges_and_the_operator_extra_the_pins(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    base = {_norm(r.name): r for r in requires if r.marker is None}
    # The CLI alone: bounded ranges (a floor and the next major), which the pins satisfy.
    assert base.keys() == {"pydantic", "pyyaml"}
    for name, req in base.items():
        ops = {s.operator for s in req.specifier}
        assert ops == {">=", "<"}, req
        assert req.specifier.contains(pyproject_pins()[name]), req
    operator = {
        _norm(r.name): str(r.specifier)
        for r in requires
        if r.marker is not None
        and r.marker.evaluate({"extra": "operator"})
        and not r.marker.evaluate({"extra": ""})
    }
    assert operator == {n: f"=={v}" for n, v in pyproject_pins().items()}


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


# ---------------------------------------------------------------- the CLI alone (thin install)

THIN = ("pydantic", "pyyaml")  # the base dependencies; their closure is all a thin venv gets


def _link_distribution(name: str, site: Path) -> None:
    """Symlink one installed distribution (its files and metadata) into `site`."""
    dist = metadata.distribution(name)
    root = Path(str(dist.locate_file("")))
    tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    for top in tops:
        src, dst = root / top, site / top
        if src.exists() and not dst.exists() and top != "__pycache__":
            dst.symlink_to(src)


@pytest.fixture(scope="module")
def thin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install multislice-operator` with nothing else: the wheel and the closure of its
    base dependencies (from the dev venv, offline), no kopf, no Google client libraries."""
    venv = tmp_path_factory.mktemp("thin")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    for name in closure(list(THIN)):
        _link_distribution(name, site)
    subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "--python", str(python), "install", "--quiet"),
            *("--no-deps", "--no-index", str(wheel)),
        ],
        check=True,
        timeout=120,
    )
    check = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout  # the base dependencies are complete
    return venv


def test_thin_install_has_no_operator_dependencies(thin: Path) -> None:
    code = (
        "import importlib.util\n"
        "print([m for m in ('kopf', 'google.cloud', 'grpc', 'prometheus_client', "
        "'multislice_local') if importlib.util.find_spec(m.split('.')[0]) is not None])"
    )
    result = _run(thin, str(thin / "bin" / "python"), "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_thin_install_runs_every_client_verb(thin: Path) -> None:
    exe = str(thin / "bin" / "kubectl-msj")
    example = str(ROOT / "examples" / "v5e-16x2-fsdp.yaml")
    for argv in (["validate", "-f", example], ["plan", "-f", example], ["render", "-f", example]):
        result = _run(thin, exe, *argv)
        assert result.returncode == 0, (argv, result.stderr)
    assert "kind: JobSet" in _run(thin, exe, "render", "-f", example).stdout
    crd = _run(thin, exe, "crd")
    assert crd.stdout == (ROOT / "crds" / "multislice.dev_multislicejobs.yaml").read_text()
    helped = _run(thin, exe, "--help")
    for verb in ("list", "logs", "events", "suspend", "resume", "checkpoint", "delete", "status"):
        assert verb in helped.stdout
        assert _run(thin, exe, verb, "--help").returncode == 0, verb


def test_thin_install_says_what_run_needs(thin: Path) -> None:
    for argv in (
        ["run"],
        ["render", "--gke-requests", "-f", str(ROOT / "examples" / "v5e-16x2-fsdp.yaml")],
    ):
        result = _run(thin, str(thin / "bin" / "multislice-operator"), *argv)
        assert result.returncode == 2, (argv, result.stderr)
        assert "pip install 'multislice-operator[operator]'" in result.stderr
        assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- the krew plugin


def _manifest(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def test_krew_manifest_is_what_krew_accepts() -> None:
    path = ROOT / "plugins" / "msj.yaml"
    m = _manifest(path)
    assert m["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert m["kind"] == "Plugin"
    # krew: the name is the file's, lowercase words and hyphens; the version semver with a v.
    assert m["metadata"]["name"] == path.stem and re.fullmatch(r"[a-z]+(-[a-z]+)*", path.stem)
    assert m["spec"]["version"] == f"v{project()['version']}"
    assert m["spec"]["shortDescription"] and m["spec"]["homepage"].startswith("https://")
    for platform in m["spec"]["platforms"]:
        assert platform["selector"]["matchExpressions"]
        assert platform["uri"].startswith("https://") and platform["uri"].endswith(".tar.gz")
        assert f"/v{project()['version']}/" in platform["uri"]
        assert re.fullmatch(r"[0-9a-f]{64}", platform["sha256"])
        assert platform["bin"] == f"kubectl-{path.stem}"  # kubectl msj runs kubectl-msj
        assert {f["from"] for f in platform["files"]} == {
            "kubectl-msj",
            "multislice_operator-*.whl",
            "LICENSE",  # krew's pre-submit checklist: the license is extracted too
        }


@pytest.fixture(scope="module")
def krew_archive(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("krew")
    manifest = out / "msj.yaml"
    shutil.copy(ROOT / "plugins" / "msj.yaml", manifest)
    result = subprocess.run(
        [
            str(ROOT / "hack" / "krew-archive.sh"),
            *("--out", str(out), "--manifest", str(manifest), "--wheel", str(wheel)),
        ],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (archive,) = out.glob("kubectl-msj-v*.tar.gz")
    return archive, manifest


def test_krew_archive_holds_the_launcher_and_the_wheel(krew_archive: tuple[Path, Path]) -> None:
    archive, manifest = krew_archive
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members.keys() == {
        "LICENSE",
        "kubectl-msj",
        f"multislice_operator-{project()['version']}-py3-none-any.whl",
    }
    assert members["kubectl-msj"].mode & 0o111 and members["kubectl-msj"].uid == 0
    (platform,) = _manifest(manifest)["spec"]["platforms"]
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert platform["uri"].endswith(f"/v{project()['version']}/{archive.name}")


def test_krew_launcher_runs_through_krews_symlink(
    krew_archive: tuple[Path, Path], thin: Path, tmp_path: Path
) -> None:
    """krew unpacks into its store and links bin/kubectl-msj there; the launcher finds the
    wheel beside its target and runs the CLI from its virtualenv (here: the thin install)."""
    store, bin_dir = tmp_path / "store" / "msj" / "v0", tmp_path / "bin"
    store.mkdir(parents=True)
    bin_dir.mkdir()
    with tarfile.open(krew_archive[0]) as tar:
        tar.extractall(store, filter="data")
    (bin_dir / "kubectl-msj").symlink_to(store / "kubectl-msj")
    env = {**os.environ, "KUBECTL_MSJ_VENV": str(thin)}
    ran = subprocess.run(
        [str(bin_dir / "kubectl-msj"), "--help"], capture_output=True, text=True, env=env,
        timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage: kubectl msj") and "checkpoint" in ran.stdout
    (store / next(p.name for p in store.glob("*.whl"))).unlink()
    broken = subprocess.run(
        [str(bin_dir / "kubectl-msj"), "--help"], capture_output=True, text=True, env=env,
        timeout=60, check=False,
    )  # fmt: skip
    assert broken.returncode == 1 and "no multislice_operator wheel in" in broken.stderr
