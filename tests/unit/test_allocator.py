"""Every local operator process runs with the image's allocator, read from the Dockerfile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from multislice_local import allocator


def test_dockerfile_env_joins_continuations_and_the_last_wins() -> None:
    text = 'FROM x\nENV A=1 \\\n    B="two words" \\\n    C=3\nRUN true\nENV A=4\n'
    assert allocator.dockerfile_env(text) == {"A": "4", "B": "two words", "C": "3"}


def test_the_image_preloads_jemalloc_and_puts_every_object_in_it() -> None:
    env = allocator.dockerfile_env(allocator.DOCKERFILE.read_text())
    assert env["LD_PRELOAD"] == "/usr/local/lib/libjemalloc.so.2"
    assert env["PYTHONMALLOC"] == "malloc"  # pymalloc's arenas would bypass jemalloc
    assert "background_thread:true" in env["MALLOC_CONF"]
    # The runtime stage gets the library from the builder, where it was installed.
    assert "COPY --from=builder /opt/jemalloc/libjemalloc.so.2 /usr/local/lib/" in (
        allocator.DOCKERFILE.read_text()
    )


def test_image_env_points_ld_preload_at_the_given_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / allocator.LIBRARY
    lib.write_bytes(b"")
    monkeypatch.setenv("MULTISLICE_JEMALLOC", str(lib))
    env = allocator.image_env()
    assert env == {
        "LD_PRELOAD": str(lib),
        "PYTHONMALLOC": "malloc",
        "MALLOC_CONF": allocator.dockerfile_env(allocator.DOCKERFILE.read_text())["MALLOC_CONF"],
    }


def test_a_missing_given_library_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MULTISLICE_JEMALLOC", "/nonexistent/libjemalloc.so.2")
    with pytest.raises(FileNotFoundError, match="MULTISLICE_JEMALLOC=/nonexistent"):
        allocator.image_env()


def test_a_local_operator_process_runs_with_the_images_allocator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 56: the local stack started the operator on the venv's Python without the image's
    allocator (the memory a load leaves was +59 MiB that way, +24 with the image's)."""
    from multislice_local.harness import OperatorProcess

    lib = tmp_path / allocator.LIBRARY
    lib.write_bytes(b"")
    monkeypatch.setenv("MULTISLICE_JEMALLOC", str(lib))
    monkeypatch.delenv(allocator.CHOICE_ENV, raising=False)
    allocator.operator_env.cache_clear()
    try:
        op = OperatorProcess(tmp_path / "kubeconfig", log_path=tmp_path / "op.log")
        env = op.environment()
        assert env["LD_PRELOAD"] == str(lib) and env["PYTHONMALLOC"] == "malloc"
        assert env["MALLOC_CONF"] == allocator.image_env()["MALLOC_CONF"]
        # The caller's environment wins; image_allocator=False is the interpreter's defaults.
        mine = OperatorProcess(tmp_path / "k", env={"PYTHONMALLOC": "pymalloc"}).environment()
        assert mine["PYTHONMALLOC"] == "pymalloc"
        plain = OperatorProcess(tmp_path / "k", image_allocator=False).environment()
        assert plain == {**os.environ, "KUBECONFIG": str(tmp_path / "k")}
        # Asked for the defaults by the environment: none of it.
        monkeypatch.setenv(allocator.CHOICE_ENV, "default")
        allocator.operator_env.cache_clear()
        assert allocator.operator_env() == {}
    finally:
        allocator.operator_env.cache_clear()


def test_no_library_to_be_had_is_said_and_the_operator_still_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MULTISLICE_JEMALLOC", str(tmp_path / "missing.so"))
    allocator.operator_env.cache_clear()
    try:
        assert allocator.operator_env() == {}
        assert "MULTISLICE_JEMALLOC=" in caplog.text and "default allocator" in caplog.text
    finally:
        allocator.operator_env.cache_clear()
