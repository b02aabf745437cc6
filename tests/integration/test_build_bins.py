"""hack/build-bins.sh on a machine that has built nothing: every module it reads files from is
downloaded before its directory is read, and a lookup that cannot succeed stops the build with the
module's name instead of carrying on with an empty path (issue 21: a cold machine read
`/cmd/kueue` because `go list -m -f {{.Dir}}` prints an empty line for a module not downloaded).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "build-bins.sh"
# What the build reads from each module (the CRDs, webhook manifests, Kueue's main.go), by tools
# module: the current versions and the compatibility lane's (hack/README.md).
JOBSET_CRD = "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
EXPECTED = {
    "jobset": JOBSET_CRD,
    "kueue": "cmd/kueue/main.go",
    "jobset-compat": JOBSET_CRD,
    "kueue-compat": "cmd/kueue/main.go",
}


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    cache = tmp_path / "gomodcache"
    cache.mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", str(SCRIPT), "--module-dirs"],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "GOMODCACHE": str(cache),
            "GOCACHE": str(tmp_path / "gocache"),
            "MULTISLICE_BIN_CACHE": str(tmp_path / "bin"),
            **env,
        },
    )


def test_every_module_lookup_works_on_an_empty_module_cache(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    dirs = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert set(dirs) == set(EXPECTED)
    for module, path in EXPECTED.items():
        found = Path(dirs[module])
        assert found.is_relative_to(tmp_path / "gomodcache"), found  # downloaded, not pre-cached
        assert (found / path).is_file(), (module, path)
    # The compatibility lane builds older releases, not the current ones a second time.
    assert dirs["jobset"] != dirs["jobset-compat"] and dirs["kueue"] != dirs["kueue-compat"]


def test_a_lookup_that_cannot_succeed_stops_the_build_naming_the_module(tmp_path: Path) -> None:
    done = _run(tmp_path, GOPROXY="off", GOFLAGS="-mod=mod")
    assert done.returncode != 0
    assert "sigs.k8s.io/jobset" in done.stderr and "FAILED" in done.stderr
    assert done.stdout == ""  # nothing printed as if it had worked


def _only(tmp_path: Path, component: str) -> subprocess.CompletedProcess[str]:
    """`--only COMPONENT` into a binary cache of its own (the module and Go build caches are the
    machine's: after the JobSet controller's build, the agent links in seconds)."""
    return subprocess.run(
        ["bash", str(SCRIPT), "--only", component],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MULTISLICE_BIN_CACHE": str(tmp_path / "bin")},
    )


def test_only_builds_the_in_place_restart_agent_and_nothing_else(tmp_path: Path) -> None:
    done = _only(tmp_path, "in-place-restart-agent")
    assert done.returncode == 0, done.stderr
    assert "[1/1] in-place-restart-agent built in" in done.stdout
    (out,) = (tmp_path / "bin").iterdir()
    assert {p.name for p in out.iterdir()} == {"in-place-restart-agent", "logs"}
    # JobSet's agent (sigs.k8s.io/jobset/cmd/in-place-restart-agent), static: it runs, and
    # outside a pod stops at once on the service account file it reads.
    ran = subprocess.run(
        [str(out / "in-place-restart-agent")], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 1 and "unable to read namespace file" in ran.stderr
    again = _only(tmp_path, "in-place-restart-agent")
    assert "[1/1] in-place-restart-agent up to date" in again.stdout


def test_only_names_the_components_it_knows(tmp_path: Path) -> None:
    done = _only(tmp_path, "no-such-thing")
    assert done.returncode == 2
    assert "no component no-such-thing" in done.stderr and "in-place-restart-agent" in done.stderr


def test_the_newest_lane_is_cached_by_its_version_beside_the_main_lane(tmp_path: Path) -> None:
    """`--print-next-dir`: a dir of its own, keyed by the version hack/tools/kube-next pins; the
    main lane's key does not change with it (hack/README.md, "The newest Kubernetes lane")."""
    env = {**os.environ, "MULTISLICE_BIN_CACHE": str(tmp_path)}

    def printed(flag: str) -> Path:
        out = subprocess.run(
            ["bash", str(SCRIPT), flag], capture_output=True, text=True, timeout=60, env=env
        )
        assert out.returncode == 0, out.stderr
        return Path(out.stdout.strip())

    pinned = re.search(
        r"^require k8s\.io/kubernetes (v\S+)$",
        (ROOT / "hack/tools/kube-next/go.mod").read_text(),
        re.M,
    )
    assert pinned, "hack/tools/kube-next/go.mod pins no k8s.io/kubernetes"
    assert printed("--print-next-dir") == tmp_path / f"next_k8s-{pinned[1]}"
    main = printed("--print-dir")
    assert main.parent == tmp_path and pinned[1] not in main.name
