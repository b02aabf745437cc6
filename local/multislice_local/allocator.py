"""The operator image's memory allocator, for every local run of the operator as a process.

The image preloads jemalloc and puts every Python object in it (the Dockerfile's ENV of
LD_PRELOAD, PYTHONMALLOC and MALLOC_CONF). The local stack runs the operator the same way
(`harness.OperatorProcess`, so `make demo`, the tests and the benchmarks alike): `image_env()`
reads those variables from the Dockerfile (their one home) and points LD_PRELOAD at this
machine's copy of the library: MULTISLICE_JEMALLOC, an installed libjemalloc2, or Debian's
package fetched once into the cache (`apt-get download`, no root). `operator_env()` is the
harness's best effort: where no library can be had it says why, once, and the operator runs on
the interpreter's defaults (as a pip-installed operator does).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import logging
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
VARIABLES = ("LD_PRELOAD", "PYTHONMALLOC", "MALLOC_CONF")
LIBRARY = "libjemalloc.so.2"
PACKAGE = "libjemalloc2"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "multislice-operator"
# MULTISLICE_OPERATOR_ALLOCATOR=default runs every local operator on the interpreter's defaults.
CHOICE_ENV = "MULTISLICE_OPERATOR_ALLOCATOR"

log = logging.getLogger(__name__)


def dockerfile_env(text: str) -> dict[str, str]:
    """Every `ENV K=V ...` of a Dockerfile (continuation lines joined), the last one winning."""
    joined = re.sub(r"\\\n", " ", text)
    env: dict[str, str] = {}
    for line in joined.splitlines():
        if line.strip().startswith("ENV "):
            for word in shlex.split(line.strip()[4:]):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def image_env(dockerfile: Path = DOCKERFILE) -> dict[str, str]:
    """The image's allocator variables, LD_PRELOAD pointing at a local jemalloc; raises
    FileNotFoundError saying how to supply what is missing."""
    if not dockerfile.is_file():
        raise FileNotFoundError(
            f"{dockerfile}: no Dockerfile (the allocator's settings live there)"
        )
    env = {k: v for k, v in dockerfile_env(dockerfile.read_text()).items() if k in VARIABLES}
    if "LD_PRELOAD" in env:
        env["LD_PRELOAD"] = str(local_library())
    return env


@functools.cache
def operator_env() -> dict[str, str]:
    """What a local operator process adds to its environment to run as the image does; {} (said
    once, with the reason) where it cannot, or where CHOICE_ENV asks for the defaults."""
    if os.environ.get(CHOICE_ENV, "image") == "default":
        return {}
    try:
        return image_env()
    except (FileNotFoundError, OSError, subprocess.SubprocessError) as exc:
        log.warning(
            "the operator runs on the interpreter's default allocator, not the image's "
            "jemalloc: %s",
            exc,
        )
        return {}


def local_library() -> Path:
    """This machine's jemalloc; raises FileNotFoundError saying how to supply one."""
    given = os.environ.get("MULTISLICE_JEMALLOC")
    if given:
        if not Path(given).is_file():
            raise FileNotFoundError(f"MULTISLICE_JEMALLOC={given}: no such file")
        return Path(given)
    installed = sorted(glob.glob(f"/usr/lib/*-linux-gnu/{LIBRARY}")) + sorted(
        glob.glob(f"/usr/local/lib/{LIBRARY}")
    )
    if installed:
        return Path(installed[0])
    return fetched_library()


def fetched_library(cache: Path = CACHE) -> Path:
    """Debian's libjemalloc2 unpacked under the cache (fetched once). Unpacked beside and renamed
    into place, so concurrent first runs (test workers) never see half a package."""
    home = cache / "jemalloc"
    found = sorted(home.glob(f"**/{LIBRARY}"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="jemalloc-") as tmp:
        got = subprocess.run(
            ["apt-get", "download", PACKAGE],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        debs = list(Path(tmp).glob(f"{PACKAGE}_*.deb"))
        if got.returncode or not debs:
            raise FileNotFoundError(
                f"no {LIBRARY} here and `apt-get download {PACKAGE}` failed "
                f"({got.stderr.strip()[-200:]}): install {PACKAGE} or set MULTISLICE_JEMALLOC"
            )
        unpacked = Path(tmp) / "unpacked"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True, timeout=120)
        with contextlib.suppress(OSError):  # another process put it there first
            unpacked.rename(home)
    return sorted(home.glob(f"**/{LIBRARY}"))[0]
