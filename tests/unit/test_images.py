"""The offline image builder without building (multislice_local.images, .dockerfile, .debian):
the builder stays true to the Dockerfiles, and its pieces (the Dockerfile reader, the users,
the locks, the keys, pip check, the progress lines) do what they say. The builds themselves:
tests/integration/test_image_build.py."""

from __future__ import annotations

import io
import re
import tomllib
from pathlib import Path

import pytest

from multislice_local import dockerfile, images
from multislice_operator.render import inplace

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "Dockerfile"
WORKLOAD = ROOT / "workload" / "Dockerfile"


# ------------------------------------------------------------------ true to the Dockerfiles


@pytest.mark.parametrize(
    ("path", "steps"),
    [(OPERATOR, images.OPERATOR_STEPS), (WORKLOAD, images.WORKLOAD_STEPS)],
    ids=["operator", "workload"],
)
def test_every_run_and_copy_of_the_dockerfile_is_reproduced(
    path: Path, steps: dict[str, str]
) -> None:
    """A RUN or COPY the builder does not list (a new step, or a changed one) fails here with
    its fingerprint: reproduce it in images.py and list it, or say there why it needs nothing."""
    found = {
        images.instruction_id(text): text
        for stage in dockerfile.parse(path).stages
        for text in stage.texts("RUN", "COPY")
    }
    unknown = {i: t[:120] for i, t in found.items() if i not in steps}
    assert unknown == {}, "Dockerfile steps the image builder does not reproduce"
    assert steps.keys() - found.keys() == set(), "listed steps the Dockerfile no longer has"


def test_operator_config_is_the_dockerfiles() -> None:
    config = images._config(OPERATOR, {"VERSION": "9.9.9", "PYTHON_IMAGE": ""})
    assert config["Entrypoint"] == ["multislice-operator", "run"]
    assert "Cmd" not in config
    assert config["User"] == "65532:65532"
    assert config["WorkingDir"] == "/tmp"
    assert config["ExposedPorts"] == {"8000/tcp": {}, "8080/tcp": {}}
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PATH"].startswith("/opt/multislice-operator/bin:")
    assert env["LD_PRELOAD"] == images.JEMALLOC
    assert env["PYTHONMALLOC"] == "malloc"
    assert env["MALLOC_CONF"] == "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["LANG"] == "C.UTF-8"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == "9.9.9"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["dev.multislice.sbom"] == images.SBOM
    # No base image: no base.name label (the Dockerfile would name python:3.11-slim).
    assert "org.opencontainers.image.base.name" not in labels


def test_workload_config_is_the_dockerfiles() -> None:
    config = images._config(WORKLOAD, {"JAX_EXTRA": ""})
    assert config["Entrypoint"] == ["python", "-m", "multislice_workload"]
    assert config["Cmd"] == ["train"]
    assert config["User"] == "10001"
    assert config["WorkingDir"] == "/app"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PYTHONUNBUFFERED"] == "1" and env["PATH"] == images.BASE_ENV["PATH"]


def test_the_users_come_from_the_dockerfiles_own_arguments() -> None:
    assert images._users(OPERATOR) == (
        ["multislice:x:65532:65532::/nonexistent:/usr/sbin/nologin"],
        ["multislice:x:65532:"],
    )
    # useradd without --gid: its own group, numbered as the user (Debian's USERGROUPS_ENAB).
    assert images._users(WORKLOAD) == (
        ["workload:x:10001:10001::/home/workload:/usr/sbin/nologin"],
        ["workload:x:10001:"],
    )


def test_the_workload_lock_installs_the_dockerfiles_pins() -> None:
    text = WORKLOAD.read_text()
    pins = {
        name.lower().replace("_", "-"): version
        for name, version in re.findall(r"^ARG ([A-Z0-9_]+)_VERSION=(\S+)$", text, re.MULTILINE)
    }
    pins.pop("libtpu")  # the TPU variant's (JAX_EXTRA="[tpu]"); the builder makes the CPU one
    lock = images.lock_entries(ROOT / "image" / "workload-requirements.lock")
    assert {name: lock[name][0] for name in pins} == pins, "make lock"
    assert all(hashes for _, hashes in lock.values())
    # What the Dockerfile's pip install resolves beside the pins (numpy, unpinned) is locked too.
    assert "numpy" in lock and "jaxlib" in lock and lock["jaxlib"][0] == pins["jax"]


def test_lock_entries_drop_what_the_target_does_not_install(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text(
        "a==1.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
        "colorama==0.4.6 ; sys_platform == 'win32' \\\n    --hash=sha256:" + "b" * 64 + "\n"
        "numpy==2.4.6 ; python_full_version < '3.12' \\\n    --hash=sha256:" + "c" * 64 + "\n"
        "numpy==2.5.5 ; python_full_version >= '3.12' \\\n    --hash=sha256:" + "d" * 64 + "\n"
    )
    assert images.lock_entries(lock) == {"a": ("1.0", {"a" * 64}), "numpy": ("2.4.6", {"c" * 64})}


# ------------------------------------------------------------------ the Dockerfile reader


def test_dockerfile_reader_substitutes_args_and_joins_continuations(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(
        "# comment\nARG BASE=x\nARG V=1\nFROM ${BASE} AS one\nRUN true\n"
        "FROM scratch\nARG V\nARG W=${V}-w\n"
        'ENV A=1 \\\n    B="two words" \\\n    C=$W\n'
        'LABEL v="${V}" empty=""\n'
        "USER 7:8\nWORKDIR /w\nEXPOSE 80 53/udp\n"
        'ENTRYPOINT ["a", "b"]\nCMD ["c"]\n'
    )
    parsed = dockerfile.parse(path)
    assert parsed.global_args == {"BASE": "x", "V": "1"}
    assert [(s.base, s.name) for s in parsed.stages] == [("${BASE}", "one"), ("scratch", "")]
    config = dockerfile.runtime_config(parsed, {}, {"PATH": "/bin", "A": "0"})
    assert config["Env"] == ["PATH=/bin", "A=1", "B=two words", "C=1-w"]
    assert config["Labels"] == {"v": "1", "empty": ""}
    assert config["User"] == "7:8" and config["WorkingDir"] == "/w"
    assert config["ExposedPorts"] == {"80/tcp": {}, "53/udp": {}}
    assert config["Entrypoint"] == ["a", "b"] and config["Cmd"] == ["c"]
    overridden = dockerfile.runtime_config(parsed, {"V": "2"}, {})
    assert "C=2-w" in overridden["Env"] and overridden["Labels"]["v"] == "2"


def test_dockerfile_reader_refuses_what_it_does_not_understand(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text("FROM x\nENV A 1\n")
    with pytest.raises(ValueError, match="key=value"):
        dockerfile.runtime_config(dockerfile.parse(path), {}, {})
    path.write_text("ENV A=1\nFROM x\n")
    with pytest.raises(ValueError, match="before the first FROM"):
        dockerfile.parse(path)


# ------------------------------------------------------------------ keys, pip check, progress


def test_tree_hash_follows_content_and_mode_not_caches(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    first = images.tree_hash(tmp_path, ["pkg"])
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert images.tree_hash(tmp_path, ["pkg"]) == first
    (tmp_path / "pkg" / "a.py").chmod(0o755)
    moded = images.tree_hash(tmp_path, ["pkg"])
    assert moded != first
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert images.tree_hash(tmp_path, ["pkg"]) not in (first, moded)


def _dist(site: Path, name: str, version: str, *requires: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_pip_check_finds_missing_and_wrong_versions(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _dist(site, "app", "1.0", "lib>=2", "winonly; sys_platform == 'win32'", "kopf; extra == 'op'")
    _dist(site, "lib", "2.1")
    images._check_requires([site], {})  # kopf only with the extra, winonly not on Linux
    with pytest.raises(images.ImageBuildError, match='app requires kopf; extra == "op", which'):
        images._check_requires([site], {"app": ["op"]})
    _dist(tmp_path / "other", "kopf", "1.0")
    images._check_requires([site, tmp_path / "other"], {"app": ["op"]})  # two sites, one env
    old = tmp_path / "old"
    _dist(old, "app", "1.0", "lib>=2")
    _dist(old, "lib", "1.5")
    with pytest.raises(
        images.ImageBuildError, match=re.escape("requires lib>=2, but 1.5 is installed")
    ):
        images._check_requires([old], {})


def test_platforms_name_every_older_manylinux() -> None:
    tags = images._platforms(36)
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_37_x86_64" not in tags


def test_progress_says_how_far_along_the_expected_total_is() -> None:
    out = io.StringIO()
    progress = images.Progress("operator", out)
    with progress.step("debian packages"):
        pass
    progress.expect(["base layer"])  # cached: not in the expected total
    progress.cached("base layer")
    with progress.step("operator dependencies layer"):
        pass
    lines = out.getvalue().splitlines()
    total = sum(
        images.COLD_SECONDS[s]
        for s in ("debian packages", "operator dependencies layer", "operator layer", "archive")
    )
    assert lines[0].startswith("image operator: [1/5] debian packages building, about 0 of ")
    assert lines[2] == "image operator: [2/5] base layer up to date"
    assert lines[3] == (
        "image operator: [3/5] operator dependencies layer building, about "
        f"{images._minutes(images.COLD_SECONDS['debian packages'])} of {images._minutes(total)} "
        "min done ..."
    )
    assert re.fullmatch(
        r"image operator: \[3/5\] operator dependencies layer built in \d+s", lines[4]
    )


def test_host_python_must_be_the_images_minor_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images.sys, "version_info", (3, 12, 0))
    with pytest.raises(images.ImageBuildError, match=re.escape("runs on Python 3.11")):
        images._check_host_python()


def test_the_agent_sits_where_jobsets_agent_image_has_it() -> None:
    """JobSet v0.12.0's cmd/in-place-restart-agent/Dockerfile: `COPY --from=builder
    /workspace/bin/in-place-restart-agent .` into WORKDIR /, ENTRYPOINT ["/in-place-restart-agent"]:
    a pod's `command: ["/in-place-restart-agent"]` works with either image."""
    assert images.AGENT_PATH == "/in-place-restart-agent"
    assert images.AGENT_PATH == inplace.AGENT_COMMAND  # what the pods' agent sidecar runs
    assert f"--from=agent {images.AGENT_PATH} {images.AGENT_PATH}" in OPERATOR.read_text()
    go_mod = (ROOT / "hack" / "tools" / "jobset" / "go.mod").read_text()
    assert re.search(r"^require sigs\.k8s\.io/jobset v0\.12\.0$", go_mod, re.MULTILINE)


def test_version_is_pyprojects() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert images._version(ROOT) == project["version"]
