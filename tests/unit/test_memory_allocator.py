"""controller/memory.py: `multislice-operator run` on glibc with no allocator chosen starts itself
again with every Python object in glibc's malloc on one arena (issue 56 part 3: the burst's
memory comes back without the image's jemalloc); an allocator it was started with is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from multislice_operator.controller import memory

TUNABLE = "glibc.malloc.arena_max=1"


def test_glibc_with_nothing_chosen_starts_again_on_malloc_and_one_arena() -> None:
    env = memory.restart_env({"PATH": "/bin", "HOME": "/h"}, glibc=True)
    assert env == {
        "PATH": "/bin",
        "HOME": "/h",
        "PYTHONMALLOC": "malloc",
        "GLIBC_TUNABLES": TUNABLE,
    }


def test_the_users_tunables_are_kept_and_the_arena_added_once() -> None:
    env = memory.restart_env({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}, glibc=True)
    assert env is not None
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.tcache_count=0:{TUNABLE}"
    again = memory.restart_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, glibc=True)
    assert again is not None and again["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=4"
    legacy = memory.restart_env({"MALLOC_ARENA_MAX": "2"}, glibc=True)
    assert legacy is not None and "GLIBC_TUNABLES" not in legacy


@pytest.mark.parametrize(
    "environ",
    [
        {"PYTHONMALLOC": "pymalloc"},  # the interpreter's allocator chosen
        {"LD_PRELOAD": "/usr/local/lib/libjemalloc.so.2"},  # the image's
        {memory.CHOICE_ENV: memory.AS_STARTED},
    ],
)
def test_an_allocator_chosen_or_asked_for_is_kept(environ: dict[str, str]) -> None:
    assert memory.restart_env(environ, glibc=True) is None


def test_nothing_changes_off_glibc() -> None:
    assert memory.restart_env({}, glibc=False) is None


_PROBE = (
    "import os, sys\n"
    "from multislice_operator.controller import memory\n"
    "memory.configure()\n"
    "sys._debugmallocstats()\n"  # pymalloc's arena table, on stderr, only where pymalloc runs
    "print(os.getpid(), os.environ.get('PYTHONMALLOC'), os.environ.get('GLIBC_TUNABLES'))\n"
)


def _probe(**extra: str) -> tuple[int, list[str], str]:
    env = {k: v for k, v in os.environ.items() if k not in (*memory.CHOSEN, "GLIBC_TUNABLES",
                                                            "MALLOC_ARENA_MAX")}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROBE],
        env={**env, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return proc.pid, out.split(), err


def test_the_process_is_started_again_in_place_on_malloc() -> None:
    pid, said, err = _probe()
    if not memory.on_glibc():  # musl, macOS: the process is kept as started
        assert said == [str(pid), "None", "None"] and "Small block threshold" in err
        return
    assert said == [str(pid), "malloc", TUNABLE]  # the same pid: exec'd, not a child
    assert "Small block threshold" not in err  # no pymalloc arenas: objects live in malloc
    pid, said, err = _probe(**{memory.CHOICE_ENV: memory.AS_STARTED})
    assert said == [str(pid), "None", "None"]
    assert "Small block threshold" in err
