"""The memory benchmark runs the operator with the image's allocator, read from the Dockerfile."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks import allocator


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
