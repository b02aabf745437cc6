"""The operator image's memory allocator, for benchmarks that run the operator as a local process.

The image preloads jemalloc and puts every Python object in it (the Dockerfile's ENV of
LD_PRELOAD, PYTHONMALLOC and MALLOC_CONF). A benchmark of the operator's memory must run it the
same way: `image_env()` reads those variables from the Dockerfile (their one home) and points
LD_PRELOAD at this machine's copy of the library: MULTISLICE_JEMALLOC, an installed
libjemalloc2, or Debian's package fetched once into the cache (`apt-get download`, no root).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
VARIABLES = ("LD_PRELOAD", "PYTHONMALLOC", "MALLOC_CONF")
LIBRARY = "libjemalloc.so.2"
PACKAGE = "libjemalloc2"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "multislice-operator"


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
    """The image's allocator variables, LD_PRELOAD pointing at a local jemalloc."""
    env = {k: v for k, v in dockerfile_env(dockerfile.read_text()).items() if k in VARIABLES}
    if "LD_PRELOAD" in env:
        env["LD_PRELOAD"] = str(local_library())
    return env


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
    """Debian's libjemalloc2 unpacked under the cache (fetched once)."""
    found = sorted((cache / "jemalloc").glob(f"**/{LIBRARY}"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run(
            ["apt-get", "download", PACKAGE], cwd=tmp, capture_output=True, text=True, check=False
        )
        debs = list(Path(tmp).glob(f"{PACKAGE}_*.deb"))
        if got.returncode or not debs:
            raise FileNotFoundError(
                f"no {LIBRARY} here and `apt-get download {PACKAGE}` failed "
                f"({got.stderr.strip()[-200:]}): install {PACKAGE} or set MULTISLICE_JEMALLOC"
            )
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(cache / "jemalloc")], check=True)
    return sorted((cache / "jemalloc").glob(f"**/{LIBRARY}"))[0]
