"""The product's images built offline, with no Docker, no registry and no base image: the operator
image from the root ``Dockerfile`` and the workload image (CPU) from ``workload/Dockerfile``, as
OCI archives that ``ctr -n k8s.io images import`` loads into a node's containerd.

    multislice-local image build operator|workload [--force] [--json]
    build_operator_image() -> BuiltImage    # .archive (Path), .ref, .digest, .layers
    build_workload_image() -> BuiltImage
    unpack(archive, dest) -> dest           # the image's root filesystem, to look inside
    run_in_rootfs(rootfs, argv, config)     # one of its programs as its config says (root)

What goes in, layer by layer (each a reproducible tar: sorted entries, owners 0:0, mtimes 0):

1. **base**: Debian bookworm's python3.11, ca-certificates, base-files, base-passwd and
   libstdc++6 with their dependency closure, from .deb packages (:mod:`multislice_local.debian`),
   the standard library compiled to .pyc, ``python``/``python3`` in /usr/local/bin as
   python:3.11-slim has them. Both images share it (one blob).
2. **dependencies**: the image's hash lock (``image/requirements.lock``; for the workload
   ``image/workload-requirements.lock``, ``make lock``), binary wheels for CPython 3.11 on
   manylinux x86_64 downloaded by pip with ``--require-hashes``, installed by ``installer``
   (the operator: into a virtualenv at /opt/multislice-operator, no pip; the workload: into the
   system site, /usr/local/lib/python3.11/dist-packages, as ``pip install`` in python:3.11-slim),
   compiled to .pyc.
3. **application**: the package (a wheel built from the repo), what the Dockerfile's other steps
   make (the SBOM, jemalloc, the users, the prepared corpus) and, in the operator image, JobSet's
   in-place restart agent at ``/in-place-restart-agent`` (where JobSet's own agent image has it).

The runtime config (Env, Labels, User, WorkingDir, Entrypoint, Cmd, ExposedPorts) is read from
the Dockerfile itself; :data:`OPERATOR_STEPS` and :data:`WORKLOAD_STEPS` say which function
reproduces each RUN/COPY instruction (tests/unit/test_images.py fails when the Dockerfile has one
they do not list).

Everything is cached by content hash under ``$MULTISLICE_IMAGE_CACHE`` (default
``~/.cache/multislice-operator/images``): the .deb packages and wheels as downloaded, each layer
by the hash of what goes into it (package versions and hashes, lock files, source files, the agent
binary, this builder's own code), each archive by its layers and config. A warm build reads the
keys and returns; any change rebuilds what it touches.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from multislice_local import debian, dockerfile, oci

ROOT = Path(__file__).resolve().parents[2]
CACHE_ENV = "MULTISLICE_IMAGE_CACHE"
PYTHON = "python3.11"
# libstdc++6: python:3.11-slim has it (apt needs it), manylinux wheels link it as a system
# library (PEP 599) and Debian's libjemalloc2 needs it.
BASE_PACKAGES = ("python3.11", "ca-certificates", "base-files", "base-passwd", "libstdc++6")
# The base image's environment (python:3.11-slim's PATH and LANG); Dockerfile ENV lines go on top.
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
VENV = "/opt/multislice-operator"
VENV_SITE = f"{VENV}/lib/python3.11/site-packages"
SYSTEM_SITE = "/usr/local/lib/python3.11/dist-packages"  # Debian's site for local installs
AGENT_PATH = "/in-place-restart-agent"  # JobSet's cmd/in-place-restart-agent/Dockerfile
AGENT_COMPONENT = "in-place-restart-agent"  # hack/build-bins.sh
JEMALLOC = "/usr/local/lib/libjemalloc.so.2"
JEMALLOC_PACKAGE = "libjemalloc2"
SBOM = "/usr/share/doc/multislice-operator/sbom.cdx.json"
CORPUS = "/opt/multislice/corpus"
KEEP_ARCHIVES = 2  # per image: the newest ones stay, older archives and their layers go
# Expected seconds of each step on a cold image cache (pip's cache warm, as after `make install`),
# measured on 2 cores with little else running (hack/README.md, "Images"), for the progress lines.
COLD_SECONDS = {
    "debian packages": 10,
    "base layer": 15,
    "operator dependencies layer": 35,
    "operator layer": 45,
    "workload dependencies layer": 90,
    "workload layer": 20,
    "archive": 5,
}
STEPS = {
    "operator": ["debian packages", "base layer", "operator dependencies layer", "operator layer",
                 "archive"],
    "workload": ["debian packages", "base layer", "workload dependencies layer", "workload layer",
                 "archive"],
}  # fmt: skip

# Every RUN/COPY instruction of the Dockerfiles, by its fingerprint (instruction_id), with what
# reproduces it here. tests/unit/test_images.py fails when the Dockerfiles and these disagree.
OPERATOR_STEPS = {
    "4cd559cf8dda": "builder: COPY the build lock -> _tools_venv()",
    "0e401519288c": "builder: the build tools' virtualenv -> _tools_venv()",
    "17fa7d21d038": "builder: COPY the lock -> _fill_operator_deps()",
    "93df481a73d8": "builder: the runtime virtualenv from the lock -> _fill_operator_deps()",
    "d8ff4f9e783f": "builder: COPY pyproject.toml README.md -> _build_wheel()",
    "cf8e9c50ff5f": "builder: COPY operator -> _build_wheel()",
    "2ee7ad35d2ca": "builder: the wheel, installed, pip check -> _fill_operator()",
    "97171c27fd00": "builder: libjemalloc2 from Debian -> _copy_jemalloc()",
    "c85e31527ff6": "builder: the SBOM -> _write_sbom()",
    "8896db67fd0c": "agent: COPY the JobSet tools module -> hack/build-bins.sh",
    "7c03fc3e538d": "agent: go build -> hack/build-bins.sh --only in-place-restart-agent",
    "ade09b59514c": "runtime: no pip, setuptools, wheel -> the base has none (Debian's python3.11)",
    "65a1f9b38654": "runtime: COPY the virtualenv -> _fill_operator_deps(), _fill_operator()",
    "9d6a13814758": "runtime: COPY the SBOM -> _write_sbom()",
    "e39d16e65485": "runtime: COPY libjemalloc.so.2 -> _copy_jemalloc()",
    "51d979887eb5": "runtime: COPY jemalloc's copyright -> _copy_jemalloc()",
    "96f3176c7cfb": "runtime: COPY the agent -> _fill_operator()",
    "d7cb1daa3562": "runtime: groupadd, useradd -> _users(), from the Dockerfile's arguments",
}
WORKLOAD_STEPS = {
    "49fdbbb557a7": "pip install the pins -> _fill_workload_deps() (the workload lock)",
    "d8ff4f9e783f": "COPY pyproject.toml README.md -> _fill_workload() (/app)",
    "4828b5bb3186": "COPY multislice_workload -> _fill_workload() (/app)",
    "6ceb2f567f4b": "pip install --no-deps ., pip check -> _fill_workload(), _check_requires()",
    "d39036caa492": "prepare the corpus -> _fill_workload() (this venv's Python, same pins)",
    "d556e06743be": "useradd -> _users(), from the Dockerfile's arguments",
}


class ImageBuildError(RuntimeError):
    """The build could not be done; the message names what is missing and how to get it."""


@dataclass(frozen=True)
class BuiltImage:
    """An image archive in the cache."""

    name: str  # "operator" or "workload"
    ref: str  # the name containerd gives it on import (localhost/multislice-operator:0.1.0-<key>)
    archive: Path  # the OCI archive (`ctr -n k8s.io images import <archive>`)
    digest: str  # the manifest's digest
    config_digest: str  # the image ID
    key: str  # the content key the cache names it by
    layers: tuple[str, ...]  # the layers' digests, base first
    size: int  # the archive's bytes (uncompressed layers)


def instruction_id(text: str) -> str:
    """A Dockerfile instruction's fingerprint (its logical line, whitespace-normalized)."""
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------ progress


class Progress:
    """One line per step, with how far along the expected total the build is (cold seconds of
    the steps that run), so that a first build does not look stuck."""

    def __init__(self, image: str, out: TextIO) -> None:
        self.image = image
        self.steps = STEPS[image]
        self.todo_s = sum(COLD_SECONDS[name] for name in self.steps)  # until expect() knows more
        self.done_s = 0
        self.out = out

    def expect(self, cached: Sequence[str]) -> None:
        """These steps will be skipped: the expected total is the others'."""
        self.todo_s = self.done_s + sum(
            COLD_SECONDS[n] for n in self.steps[self.steps.index("debian packages") + 1 :]
            if n not in cached
        )  # fmt: skip

    def _tag(self, name: str) -> str:
        return f"image {self.image}: [{self.steps.index(name) + 1}/{len(self.steps)}] {name}"

    def cached(self, name: str) -> None:
        print(f"{self._tag(name)} up to date", file=self.out, flush=True)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        print(
            f"{self._tag(name)} building, about {_minutes(self.done_s)} of "
            f"{_minutes(self.todo_s)} min done ...",
            file=self.out,
            flush=True,
        )
        start = time.monotonic()
        yield
        self.done_s += COLD_SECONDS[name]
        print(f"{self._tag(name)} built in {time.monotonic() - start:.0f}s", file=self.out,
              flush=True)  # fmt: skip


def _minutes(seconds: int) -> int:
    return (seconds + 30) // 60


# ------------------------------------------------------------------------------ the cache


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "multislice-operator" / "images"


@contextlib.contextmanager
def _locked(cache: Path, out: TextIO) -> Iterator[None]:
    """One build at a time per cache (another process's build of the same image is then warm)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"image: waiting for another build in {cache} ...", file=out, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    """Modes of what the build writes do not depend on the caller's umask."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def tree_hash(root: Path, paths: Sequence[str]) -> str:
    """The content of these files and directories (relative to `root`): names, bytes and the
    executable bit, with caches and build leftovers left out (.dockerignore's patterns)."""
    sha = hashlib.sha256()
    for rel in paths:
        top = root / rel
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            parts = path.relative_to(root).parts
            if (
                "__pycache__" in parts
                or path.suffix == ".pyc"
                or any(p.endswith(".egg-info") for p in parts)
            ):
                continue
            sha.update(f"{'/'.join(parts)}\0{os.access(path, os.X_OK)}\0".encode())
            sha.update(debian.file_sha256(path).encode())
    return sha.hexdigest()


@functools.cache
def _builder_hash() -> str:
    """This builder's own code: a change to how images are made rebuilds them (read once: the
    code this process runs)."""
    here = Path(__file__).parent
    return tree_hash(here, ["images.py", "debian.py", "dockerfile.py", "oci.py"])


@dataclass
class Layer:
    key: str
    path: Path  # cache/layers/<key>.tar

    @property
    def cached(self) -> bool:
        return self.path.is_file()


def _layer(cache: Path, key: str) -> Layer:
    return Layer(key, cache / "layers" / f"{key}.tar")


def _make_layer(layer: Layer, cache: Path, fill: Callable[[Path], None]) -> None:
    """Fill a staging tree, then write it as the layer (atomically: a half-written layer never
    looks cached)."""
    layer.path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".stage-") as tmp:
        stage = Path(tmp) / "root"
        stage.mkdir()
        fill(stage)
        part = Path(tmp) / "layer.tar"
        oci.dir_layer(stage, part)
        part.replace(layer.path)


# ------------------------------------------------------------------------------ python bits


def _run(argv: Sequence[str], what: str, **kwargs: Any) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, check=False, timeout=1800, **kwargs
    )
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).splitlines()[-20:])
        raise ImageBuildError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return str(done.stdout)


def _check_host_python() -> None:
    """The .pyc files are compiled here, so this must be the image's Python minor version."""
    if sys.version_info[:2] != (3, 11):
        here = sys.version.split()[0]
        raise ImageBuildError(
            f"the image builder runs on Python 3.11 (the images' Python), not {here}: use the "
            "project's virtualenv (make install)"
        )


def _compile(tree: Path, inside: str) -> None:
    """.pyc files for every module under `tree` (which is `inside` in the image), as pip and
    Debian's py3compile make them; unchecked-hash pycs: reproducible, and never rewritten (the
    root filesystem is read-only). One process, one worker: the bytes depend on nothing else."""
    if not tree.is_dir():
        return
    _run(
        [sys.executable, "-I", "-m", "compileall", "-q", "-j", "1",
         "--invalidation-mode", "unchecked-hash", "-d", inside, str(tree)],
        f"compiling {inside}",
    )  # fmt: skip


def _platforms(glibc_minor: int) -> list[str]:
    """pip's --platform values for a manylinux x86_64 system with glibc 2.<glibc_minor>: pip
    matches each tag exactly, so every older one is named too."""
    tags = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor, 4, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def _download_wheels(lock: Path, dest: Path, glibc_minor: int) -> list[Path]:
    """Every wheel the lock names, for CPython 3.11 on this glibc, hashes checked by pip (its
    HTTP cache makes a second download free)."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in _platforms(glibc_minor) for arg in ("--platform", p)]
    _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
         "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
         "--abi", "cp311", *platforms, "--disable-pip-version-check", "-r", str(lock),
         "-d", str(dest)],
        f"pip download -r {lock.name} (PyPI)",
    )  # fmt: skip
    wheels = _locked_wheels(lock, dest)
    for other in set(dest.glob("*.whl")) - set(wheels):  # an older lock's
        other.unlink()
    return wheels


# The environment the images' markers are evaluated in: Debian's CPython 3.11 on Linux x86_64.
TARGET_ENV = {
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
    "python_version": "3.11", "python_full_version": "3.11.2", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "os_name": "posix",
}  # fmt: skip


def lock_entries(lock: Path) -> dict[str, tuple[str, set[str]]]:
    """A hash lock's entries for the target: {name: (version, sha256 hashes)}, entries whose
    marker does not hold on the target left out."""
    import re

    from packaging.markers import Marker
    from packaging.utils import canonicalize_name

    text = re.sub(r"\\\s*\n\s*", " ", lock.read_text())  # continuation lines joined
    entries: dict[str, tuple[str, set[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, marker = line.partition(";")
        name, _, version = spec.split()[0].partition("==")
        marker_text = marker.split("--hash")[0].strip()
        if marker_text and not Marker(marker_text).evaluate(TARGET_ENV):
            continue
        hashes = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
        entries[canonicalize_name(name)] = (version, hashes)
    return entries


def _locked_wheels(lock: Path, dest: Path) -> list[Path]:
    """The files in `dest` that are the lock's wheels, found by their hashes (one per entry)."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    entries = lock_entries(lock)
    found: dict[str, Path] = {}
    for wheel in sorted(dest.glob("*.whl")):
        name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        if name in entries and debian.file_sha256(wheel) in entries[name][1]:
            found[name] = wheel
    missing = sorted(entries.keys() - found.keys())
    if missing:
        raise ImageBuildError(f"pip download left no wheel of {missing} from {lock.name}")
    return [found[n] for n in sorted(found)]


def _install_wheels(
    wheels: Sequence[Path], stage: Path, scheme: Mapping[str, str], interpreter: str
) -> None:
    """Install wheels into `stage` at the image's paths in `scheme`, as pip would: console
    scripts with `interpreter` in their #! line, a RECORD, no direct_url."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    destination = SchemeDictionaryDestination(
        dict(scheme), interpreter=interpreter, script_kind="posix", destdir=str(stage),
        overwrite_existing=True,
    )  # fmt: skip
    for wheel in sorted(wheels):
        with WheelFile.open(wheel) as source:
            install(source, destination, {"INSTALLER": b"multislice-local\n"})


def _scheme(prefix: str, site: str) -> dict[str, str]:
    return {
        "purelib": site,
        "platlib": site,
        "headers": f"{prefix}/include/site/python3.11",
        "scripts": f"{prefix}/bin",
        "data": prefix,
    }


def _check_requires(sites: Sequence[Path], extras: Mapping[str, Sequence[str]]) -> None:
    """`pip check` for the distributions in `sites`: each one's requirements (and those of the
    extras named for it) are installed at versions they accept, for Linux x86_64 CPython 3.11."""
    from importlib.metadata import distributions

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    env = TARGET_ENV
    dists = {
        canonicalize_name(d.metadata["Name"]): d
        for d in distributions(path=[str(s) for s in sites])
    }
    problems = []
    for name, dist in sorted(dists.items()):
        for raw in dist.requires or []:
            req = Requirement(raw)
            wanted = ["", *extras.get(name, ())]
            if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in wanted):
                continue
            have = dists.get(canonicalize_name(req.name))
            if have is None:
                problems.append(f"{name} requires {req}, which is not installed")
            elif not req.specifier.contains(have.version, prereleases=True):
                problems.append(f"{name} requires {req}, but {have.version} is installed")
    if problems:
        raise ImageBuildError(
            "the image's packages do not fit together (the lock drifted: make lock):\n  "
            + "\n  ".join(problems)
        )


# ------------------------------------------------------------------------------ inputs


@dataclass
class Inputs:
    """What the keys are made of, gathered before anything is built."""

    root: Path
    cache: Path
    base_packages: list[debian.Package] = field(default_factory=list)
    jemalloc: debian.Package | None = None  # the operator's libjemalloc2 (not in the base)
    python_version: str = ""  # Debian's python3.11 upstream version, e.g. 3.11.2
    glibc_minor: int = 0

    def packages_key(self) -> list[tuple[str, str, str]]:
        return [(p.name, p.version, p.sha256) for p in self.base_packages]


def _gather_packages(inputs: Inputs, out: TextIO) -> None:
    """The base's packages and libjemalloc2, resolved together (one apt run: a warm build's
    main cost). Whatever else libjemalloc2 needs is in the base (libc6, libstdc++6)."""
    apt = debian.Apt(inputs.cache / "apt")
    message = apt.update()
    if message.startswith("WARNING"):
        print(f"image: {message}", file=out, flush=True)
    packages = apt.download([*BASE_PACKAGES, JEMALLOC_PACKAGE])
    inputs.base_packages = [p for p in packages if p.name != JEMALLOC_PACKAGE]
    inputs.jemalloc = next(p for p in packages if p.name == JEMALLOC_PACKAGE)
    versions = {p.name: p.version for p in inputs.base_packages}
    inputs.python_version = versions["python3.11"].split("-")[0]
    inputs.glibc_minor = int(versions["libc6"].split("-")[0].split(".")[1])


# ------------------------------------------------------------------------------ the base layer


def _base_key(inputs: Inputs) -> str:
    return _key("base", _builder_hash(), inputs.packages_key())


def _fill_base(inputs: Inputs, stage: Path) -> None:
    debian.unpack(inputs.base_packages, stage)
    _compile(stage / "usr" / "lib" / "python3.11", "/usr/lib/python3.11")
    local_bin = stage / "usr" / "local" / "bin"
    local_bin.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):  # as python:3.11-slim has them on PATH
        (local_bin / name).symlink_to(f"/usr/bin/{PYTHON}")


# ------------------------------------------------------------------------------ the operator


def _tools_venv(inputs: Inputs) -> Path:
    """The Dockerfile's /opt/build: pip, setuptools, wheel and cyclonedx-bom from their hash
    lock, in a virtualenv of the cache (kept; made again when the lock changes)."""
    lock = inputs.root / "image" / "build-requirements.lock"
    venv = inputs.cache / "tools" / _key("tools", debian.file_sha256(lock), sys.version)[:16]
    python = venv / "bin" / "python"
    if (venv / ".done").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)], "python -m venv (build tools)")
    _run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--require-hashes", "--no-deps", "--only-binary=:all:", "-r", str(lock)],
        "pip install -r image/build-requirements.lock",
    )  # fmt: skip
    (venv / ".done").touch()
    return venv


OPERATOR_SOURCES = ["pyproject.toml", "README.md", "operator"]  # the builder stage's COPYs


def _copy_sources(src_root: Path, paths: Sequence[str], dest: Path) -> None:
    """COPY: these files and trees, without caches and build leftovers (.dockerignore's)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for rel in paths:
        src, dst = src_root / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore)
        else:
            shutil.copyfile(src, dst)


def _build_wheel(
    inputs: Inputs, tools: Path, out_dir: Path, sub: str, paths: Sequence[str]
) -> Path:
    """`pip wheel --no-deps --no-build-isolation` on a copy of exactly what the Dockerfile
    COPYs, with the locked setuptools (nothing unlocked is fetched)."""
    context = out_dir / "context"
    _copy_sources(inputs.root / sub, paths, context)
    _run(
        [str(tools / "bin" / "pip"), "wheel", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-build-isolation", "--wheel-dir", str(out_dir), str(context)],
        f"pip wheel ({sub or 'operator'} package)",
    )  # fmt: skip
    (wheel,) = out_dir.glob("*.whl")
    return wheel


def _agent_binary(root: Path) -> Path:
    """JobSet's agent from the binary cache, built there first when missing (seconds with
    JobSet's build cache warm, a few minutes without)."""
    script = root / "hack" / "build-bins.sh"
    bin_dir = Path(_run([str(script), "--print-dir"], "hack/build-bins.sh --print-dir").strip())
    agent = bin_dir / AGENT_COMPONENT
    if not agent.is_file():
        _run(
            [str(script), "--only", AGENT_COMPONENT], f"hack/build-bins.sh --only {AGENT_COMPONENT}"
        )
    return agent


def _users(path: Path) -> tuple[list[str], list[str]]:
    """The passwd and group lines the Dockerfile's groupadd/useradd make, from their arguments."""
    passwd, group = [], []
    gids: dict[str, str] = {}
    for text in dockerfile.parse(path).stage("").texts("RUN"):
        for command in text.removeprefix("RUN ").split("&&"):
            argv = shlex.split(command)
            if argv[:1] == ["groupadd"]:
                opts = _options(argv[1:])
                gids[opts["name"]] = opts["--gid"]
                group.append(f"{opts['name']}:x:{opts['--gid']}:")
            elif argv[:1] == ["useradd"]:
                opts = _options(argv[1:])
                uid, name = opts["--uid"], opts["name"]
                gid = opts.get("--gid") or gids.get(name) or uid  # USERGROUPS_ENAB: own group
                if not opts.get("--gid"):
                    group.append(f"{name}:x:{gid}:")
                home = opts.get("--home-dir", f"/home/{name}")
                passwd.append(f"{name}:x:{uid}:{gid}::{home}:{opts.get('--shell', '/bin/sh')}")
    return passwd, group


def _options(argv: Sequence[str]) -> dict[str, str]:
    """groupadd/useradd arguments: --opt value pairs, flags, and the name last."""
    opts: dict[str, str] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--no-create-home", "-M", "--system", "-r"):
            opts[arg] = ""
        elif arg.startswith("-"):
            opts[arg] = args.pop(0)
        else:
            opts["name"] = arg
    return opts


def _add_users(stage: Path, base: Layer, dockerfile_path: Path) -> None:
    """/etc/passwd and /etc/group: the base's, plus the Dockerfile's users."""
    passwd, group = _users(dockerfile_path)
    etc = stage / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    for name, lines in (("passwd", passwd), ("group", group)):
        text = _read_from_layer(base.path, f"etc/{name}")
        (etc / name).write_text(text + "".join(f"{line}\n" for line in lines))


def _read_from_layer(layer: Path, name: str) -> str:
    with tarfile.open(layer) as tar:
        member = tar.extractfile(name)
        if member is None:
            raise ImageBuildError(f"{name} is not a file in {layer}")
        return member.read().decode()


def _venv_skeleton(stage: Path, python_version: str) -> Path:
    """What `python3.11 -m venv --without-pip /opt/multislice-operator` makes (no activate
    scripts); returns the site-packages directory in the stage."""
    venv = stage / VENV.lstrip("/")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "include" / "python3.11").mkdir(parents=True)
    (venv / "lib64").symlink_to("lib")
    bin_dir = venv / "bin"
    bin_dir.mkdir()
    (bin_dir / PYTHON).symlink_to(f"/usr/bin/{PYTHON}")
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(PYTHON)
    python = f"/usr/bin/{PYTHON}"
    (venv / "pyvenv.cfg").write_text(
        f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {python_version}\n"
        f"executable = {python}\ncommand = {python} -m venv --without-pip {VENV}\n"
    )
    return site


def _operator_deps_key(inputs: Inputs) -> str:
    lock = inputs.root / "image" / "requirements.lock"
    return _key("operator-deps", _builder_hash(), debian.file_sha256(lock), inputs.python_version,
                inputs.glibc_minor)  # fmt: skip


def _fill_operator_deps(inputs: Inputs, stage: Path) -> None:
    site = _venv_skeleton(stage, inputs.python_version)
    lock = inputs.root / "image" / "requirements.lock"
    wheels = _download_wheels(lock, inputs.cache / "wheels" / "operator", inputs.glibc_minor)
    _install_wheels(wheels, stage, _scheme(VENV, VENV_SITE), f"{VENV}/bin/python")
    _compile(site, VENV_SITE)


def _operator_key(inputs: Inputs, deps: Layer, jemalloc: debian.Package, agent: Path) -> str:
    return _key(
        "operator", _builder_hash(), deps.key,
        tree_hash(inputs.root, [*OPERATOR_SOURCES, "Dockerfile",
                                "image/build-requirements.lock"]),
        jemalloc.sha256, debian.file_sha256(agent),
    )  # fmt: skip


def _fill_operator(
    inputs: Inputs, stage: Path, base: Layer, deps: Layer, jemalloc: debian.Package, agent: Path
) -> None:
    tools = _tools_venv(inputs)
    work = stage.parent / "work"
    wheel = _build_wheel(inputs, tools, work / "wheel", "", OPERATOR_SOURCES)
    site_rel = VENV_SITE
    _install_wheels([wheel], stage, _scheme(VENV, site_rel), f"{VENV}/bin/python")
    _compile(stage / site_rel.lstrip("/"), site_rel)
    # pip check and the SBOM see the whole virtualenv: the dependencies layer unpacked beside.
    deps_root = work / "deps"
    with tarfile.open(deps.path) as tar:
        tar.extractall(deps_root, filter="tar")
    sites = [deps_root / site_rel.lstrip("/"), stage / site_rel.lstrip("/")]
    _check_requires(sites, {"multislice-operator": ["operator"]})
    _write_sbom(inputs, tools, sites, stage / SBOM.lstrip("/"), work)
    _copy_jemalloc(jemalloc, stage, work)
    (stage / AGENT_PATH.lstrip("/")).write_bytes(agent.read_bytes())
    (stage / AGENT_PATH.lstrip("/")).chmod(0o755)
    _add_users(stage, base, inputs.root / "Dockerfile")


def _write_sbom(inputs: Inputs, tools: Path, sites: Sequence[Path], out: Path, work: Path) -> None:
    """The Dockerfile's `cyclonedx-py environment --output-reproducible` over the virtualenv:
    cyclonedx-py asks the interpreter it is given for its sys.path, and the image's interpreter
    does not run here, so it is given one that answers with the virtualenv's site-packages."""
    interpreter = work / "image-python"
    paths = [str(s) for s in sites]
    interpreter.write_text(
        f"#!{sys.executable} -I\nimport json, sys\njson.dump({paths!r}, sys.stdout)\n"
    )
    interpreter.chmod(0o755)
    out.parent.mkdir(parents=True, exist_ok=True)
    _run(
        [str(tools / "bin" / "cyclonedx-py"), "environment", "--output-format", "JSON",
         "--output-reproducible", "--mc-type", "application",
         "--pyproject", str(inputs.root / "pyproject.toml"), "--output-file", str(out),
         str(interpreter)],
        "cyclonedx-py environment (the SBOM)",
    )  # fmt: skip
    out.chmod(0o644)


def _copy_jemalloc(package: debian.Package, stage: Path, work: Path) -> None:
    """The Dockerfile's builder installs libjemalloc2 and copies the library and its licence."""
    unpacked = work / "jemalloc"
    _run(["dpkg-deb", "-x", str(package.path), str(unpacked)], "dpkg-deb -x libjemalloc2")
    (lib,) = unpacked.glob("usr/lib/*/libjemalloc.so.2")
    target = stage / JEMALLOC.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lib.resolve(), target)
    target.chmod(0o644)
    doc = stage / "usr" / "share" / "doc" / "libjemalloc2"
    doc.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(
        unpacked / "usr" / "share" / "doc" / "libjemalloc2" / "copyright", doc / "copyright"
    )


# ------------------------------------------------------------------------------ the workload


def _workload_deps_key(inputs: Inputs) -> str:
    lock = inputs.root / "image" / "workload-requirements.lock"
    return _key("workload-deps", _builder_hash(), debian.file_sha256(lock), inputs.python_version,
                inputs.glibc_minor)  # fmt: skip


def _fill_workload_deps(inputs: Inputs, stage: Path) -> None:
    lock = inputs.root / "image" / "workload-requirements.lock"
    wheels = _download_wheels(lock, inputs.cache / "wheels" / "workload", inputs.glibc_minor)
    _install_wheels(wheels, stage, _scheme("/usr/local", SYSTEM_SITE), f"/usr/bin/{PYTHON}")
    _compile(stage / SYSTEM_SITE.lstrip("/"), SYSTEM_SITE)


WORKLOAD_SOURCES = ["pyproject.toml", "README.md", "multislice_workload"]  # under workload/


def _workload_key(inputs: Inputs, deps: Layer) -> str:
    # The corpus is prepared by this Python (its pydoc topics are the text): its version counts.
    return _key("workload", _builder_hash(), deps.key, sys.version,
                tree_hash(inputs.root / "workload", [*WORKLOAD_SOURCES, "Dockerfile"]))  # fmt: skip


def _fill_workload(inputs: Inputs, stage: Path, base: Layer, deps: Layer) -> None:
    work = stage.parent / "work"
    _copy_sources(inputs.root / "workload", WORKLOAD_SOURCES, stage / "app")  # WORKDIR /app, COPY
    wheel = _build_wheel(inputs, _tools_venv(inputs), work / "wheel", "workload", WORKLOAD_SOURCES)
    _install_wheels([wheel], stage, _scheme("/usr/local", SYSTEM_SITE), f"/usr/bin/{PYTHON}")
    _compile(stage / SYSTEM_SITE.lstrip("/"), SYSTEM_SITE)
    deps_root = work / "deps"
    with tarfile.open(deps.path) as tar:
        tar.extractall(deps_root, filter="tar")
    _check_requires([deps_root / SYSTEM_SITE.lstrip("/"), stage / SYSTEM_SITE.lstrip("/")], {})
    corpus = stage / CORPUS.lstrip("/")
    _run(
        [sys.executable, "-m", "multislice_workload", "prepare", "--output", str(corpus)],
        "multislice_workload prepare (the built-in corpus)",
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    _add_users(stage, base, inputs.root / "workload" / "Dockerfile")


# ------------------------------------------------------------------------------ assembling


def _config(path: Path, build_args: Mapping[str, str]) -> dict[str, Any]:
    config = dockerfile.runtime_config(dockerfile.parse(path), build_args, BASE_ENV)
    labels = {k: v for k, v in config.get("Labels", {}).items() if v}  # no base image to name
    if labels:
        config["Labels"] = labels
    return config


def _version(root: Path) -> str:
    import tomllib

    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


@dataclass
class _Plan:
    """One image: its layers (base first) with how to fill each, its config and its name."""

    name: str
    repository: str
    version: str
    config: dict[str, Any]
    layers: list[tuple[str, Layer, Callable[[Path], None]]]  # (step name, layer, fill)


def _operator_plan(inputs: Inputs, revision: str, created: str) -> _Plan:
    jemalloc = inputs.jemalloc
    assert jemalloc is not None
    agent = _agent_binary(inputs.root)
    base = _layer(inputs.cache, _base_key(inputs))
    deps = _layer(inputs.cache, _operator_deps_key(inputs))
    app = _layer(inputs.cache, _operator_key(inputs, deps, jemalloc, agent))
    version = _version(inputs.root)
    args = {"VERSION": version, "REVISION": revision, "CREATED": created, "PYTHON_IMAGE": ""}
    return _Plan(
        "operator", "localhost/multislice-operator", version,
        _config(inputs.root / "Dockerfile", args),
        [("base layer", base, lambda s: _fill_base(inputs, s)),
         ("operator dependencies layer", deps, lambda s: _fill_operator_deps(inputs, s)),
         ("operator layer", app, lambda s: _fill_operator(inputs, s, base, deps, jemalloc, agent))],
    )  # fmt: skip


def _workload_plan(inputs: Inputs) -> _Plan:
    base = _layer(inputs.cache, _base_key(inputs))
    deps = _layer(inputs.cache, _workload_deps_key(inputs))
    app = _layer(inputs.cache, _workload_key(inputs, deps))
    version = _version(inputs.root / "workload")
    return _Plan(
        "workload", "localhost/multislice-workload", version,
        _config(inputs.root / "workload" / "Dockerfile", {"JAX_EXTRA": ""}),
        [("base layer", base, lambda s: _fill_base(inputs, s)),
         ("workload dependencies layer", deps, lambda s: _fill_workload_deps(inputs, s)),
         ("workload layer", app, lambda s: _fill_workload(inputs, s, base, deps))],
    )  # fmt: skip


def _archive(plan: _Plan, cache: Path) -> tuple[str, Path, str]:
    key = _key(plan.name, [layer.key for _, layer, _ in plan.layers], plan.config, plan.version)
    ref = f"{plan.repository}:{plan.version}-{key[:12]}"
    return key, cache / "archives" / f"{plan.name}-{key[:16]}.tar", ref


def build_image(
    name: str,
    *,
    root: Path = ROOT,
    cache: Path | None = None,
    force: bool = False,
    revision: str = "unknown",
    created: str = "unknown",
    out: TextIO | None = None,
) -> BuiltImage:
    """Build (or find in the cache) the `name` image ("operator" or "workload"); progress goes to
    `out` (stderr by default). `revision`/`created` fill the operator's OCI labels (the
    Dockerfile's defaults: "unknown"; a value that changes every commit rebuilds every commit)."""
    if name not in STEPS:
        raise ImageBuildError(f"no image {name!r}: operator or workload")
    _check_host_python()
    out = out or sys.stderr
    inputs = Inputs(root=root, cache=cache or cache_root())
    progress = Progress(name, out)
    with _locked(inputs.cache, out), _umask(0o022):
        start = time.monotonic()
        with progress.step("debian packages"):
            _gather_packages(inputs, out)
            plan = (
                _operator_plan(inputs, revision, created) if name == "operator"
                else _workload_plan(inputs)
            )  # fmt: skip
        key, archive, ref = _archive(plan, inputs.cache)
        meta = archive.with_suffix(".json")
        if not force and meta.is_file() and archive.is_file():
            os.utime(archive)  # recently used: kept by the pruning
            built = _load(meta)
            print(f"image {name}: {built.ref} up to date ({archive})", file=out, flush=True)
            return built
        progress.expect([step for step, layer, _ in plan.layers if not force and layer.cached])
        built = _assemble(plan, key, archive, ref, inputs.cache, force, progress)
        print(f"image {name}: {built.ref} built in {time.monotonic() - start:.0f}s "
              f"({built.size / 2**20:.0f} MiB, {archive})", file=out, flush=True)  # fmt: skip
        _prune(inputs.cache, name)
        return built


def _load(meta: Path) -> BuiltImage:
    record = json.loads(meta.read_text())
    return BuiltImage(
        record["name"], record["ref"], meta.with_suffix(".tar"), record["digest"],
        record["config_digest"], record["key"], tuple(record["layers"]), record["size"],
    )  # fmt: skip


def _assemble(
    plan: _Plan, key: str, archive: Path, ref: str, cache: Path, force: bool, progress: Progress
) -> BuiltImage:
    for step, layer, fill in plan.layers:
        if not force and layer.cached:
            progress.cached(step)
            continue
        with progress.step(step):
            _make_layer(layer, cache, fill)
    with progress.step("archive"):
        image = oci.write_oci_archive(archive, [layer.path for _, layer, _ in plan.layers],
                                      plan.config, ref)  # fmt: skip
        layers = tuple(oci.read_oci_archive(archive)["layers"])
    built = BuiltImage(plan.name, image.ref, archive, image.digest, image.config_digest, key,
                       layers, archive.stat().st_size)  # fmt: skip
    record = {**asdict(built), "archive": str(archive),
              "layer_files": [layer.path.name for _, layer, _ in plan.layers]}  # fmt: skip
    archive.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    return built


def _prune(cache: Path, name: str) -> None:
    """Keep the newest archives of this image; drop the layers only the dropped ones used."""
    archives = sorted((cache / "archives").glob(f"{name}-*.tar"), key=lambda p: p.stat().st_mtime)
    dropped: set[str] = set()
    for old in archives[:-KEEP_ARCHIVES]:
        meta = old.with_suffix(".json")
        if meta.is_file():
            dropped |= set(json.loads(meta.read_text()).get("layer_files", []))
        old.unlink(missing_ok=True)
        meta.unlink(missing_ok=True)
    for meta in (cache / "archives").glob("*.json"):
        dropped -= set(json.loads(meta.read_text()).get("layer_files", []))
    for layer in dropped:
        (cache / "layers" / layer).unlink(missing_ok=True)


def build_operator_image(**kwargs: Any) -> BuiltImage:
    """The operator image (root Dockerfile): see build_image."""
    return build_image("operator", **kwargs)


def build_workload_image(**kwargs: Any) -> BuiltImage:
    """The workload image, CPU variant (workload/Dockerfile): see build_image."""
    return build_image("workload", **kwargs)


# ------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="image_command", required=True, metavar="COMMAND")
    build = sub.add_parser("build", help="build an image into the cache (a warm build is a no-op)")
    build.add_argument("images", nargs="+", choices=["operator", "workload"])
    build.add_argument("--force", action="store_true", help="rebuild every layer")
    build.add_argument("--json", action="store_true", help="print what was built as JSON lines")
    build.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    for name in args.images:
        try:
            built = build_image(name, force=args.force)
        except (ImageBuildError, debian.DebianError) as exc:
            print(f"image {name}: {exc}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps({**asdict(built), "archive": str(built.archive)}))
        else:
            print(f"{built.ref} {built.digest} {built.archive}")
    return 0


def unpack(archive: Path, dest: Path) -> Path:
    """The image's root filesystem: its layers applied in order into `dest` (as a runtime's
    snapshotter does; these images have no whiteouts). For looking inside and chroot checks."""
    info = oci.read_oci_archive(archive)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as outer:
        for digest in info["layers"]:
            blob = outer.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            if blob is None:
                raise ImageBuildError(f"{archive}: layer {digest} is missing")
            with tarfile.open(fileobj=blob, mode="r|") as layer:
                layer.extractall(dest, filter="fully_trusted")
    return dest


# The child of run_in_rootfs, in a mount namespace of its own: what a container runtime gives a
# pod with readOnlyRootFilesystem and an emptyDir at /tmp (minus cgroups and the network).
_IN_ROOTFS = """
import json, os, subprocess, sys
spec = json.loads(sys.argv[1])
root = spec["root"]
def mount(*args):
    subprocess.run(["mount", *args], check=True)
mount("--bind", root, root)
mount("-o", "remount,bind,ro", root)
mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", root + "/tmp")
mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", root + "/dev")
for name in ("null", "zero", "full", "random", "urandom"):
    open(root + "/dev/" + name, "w").close()
    mount("--bind", "/dev/" + name, root + "/dev/" + name)
mount("-t", "proc", "proc", root + "/proc")
os.chroot(root)
os.chdir(spec["workdir"] or "/")
os.setgroups([])
os.setgid(spec["gid"])
os.setuid(spec["uid"])
os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
"""


def run_in_rootfs(
    rootfs: Path,
    argv: Sequence[str],
    config: Mapping[str, Any],
    *,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`argv` in an unpacked image as its config says (Env, User, WorkingDir; the Entrypoint is
    not prepended), with the root filesystem read-only, /tmp an empty tmpfs, /proc and the usual
    /dev nodes: a container without a runtime. Needs root (mount namespaces, chroot)."""
    user, _, group = str(config.get("User") or "0").partition(":")
    spec = {
        "root": str(rootfs),
        "argv": list(argv),
        "env": dict(e.split("=", 1) for e in config.get("Env", [])),
        "workdir": config.get("WorkingDir", "/"),
        "uid": int(user),
        "gid": int(group or _primary_gid(rootfs, int(user))),
    }
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-I", "-c",
         _IN_ROOTFS, json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _primary_gid(rootfs: Path, uid: int) -> int:
    """The group /etc/passwd gives `uid` (runc's rule for a User without a group), else 0."""
    for line in (rootfs / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) > 3 and fields[2] == str(uid):
            return int(fields[3])
    return 0
