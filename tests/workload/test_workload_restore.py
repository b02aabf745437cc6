"""Resume: one train state in memory after a restore, and a restore onto another layout (the
elastic case: another number of slices, another dcn.data), in this process on 8 CPU devices."""

from __future__ import annotations

import gc
import math
from pathlib import Path
from typing import Any

import numpy as np

from multislice_workload import datasets, train
from multislice_workload.checkpoint import Checkpointer
from multislice_workload.podinfo import AnnotationWatcher, CheckpointRequests
from tests.workload.compiled import cached_trainer
from tests.workload.test_workload_model import CFG, flat

SAVED_LAYOUT = (1, 2, 4, 1)  # "2 slices": dcn.data = 2, fsdp 4 in each


def pipeline_for(t: train.Trainer) -> datasets.GlobalBatches:
    windows = datasets.stdlib_windows(CFG.seq_len + 1, "train")
    return datasets.GlobalBatches(windows, CFG.batch_size, t.batch_sharding, CFG.seed, threads=0)


def requests() -> CheckpointRequests:
    return CheckpointRequests(AnnotationWatcher(None), every_steps=10)


def saved_run(directory: Path, steps: int = 2) -> dict[str, np.ndarray]:
    """Train `steps` steps on SAVED_LAYOUT and checkpoint; the saved parameters and moments."""
    t = cached_trainer(SAVED_LAYOUT, CFG)
    feed = pipeline_for(t)
    state = t.init_state()
    for _ in range(steps):
        state, _ = t.step(state, next(feed))
    saver = Checkpointer(str(directory), every=1, keep=1)
    saver.save(steps, state, feed.get_state(), {"checkpoint_request": None})
    saver.wait()
    saver.close()
    return {k: np.asarray(v) for k, v in flat(state).items()}


def device_bytes(a: Any) -> int:
    """Bytes the array holds on this process's devices (from its sharding: reading
    `addressable_shards[i].data` would itself make new live arrays)."""
    per_device = math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
    return int(per_device * len(a.sharding.addressable_devices))


def live_bytes(exclude: set[int]) -> int:
    import jax

    return sum(device_bytes(a) for a in jax.live_arrays() if id(a) not in exclude)


def state_bytes(state: Any) -> int:
    import jax

    return sum(device_bytes(leaf) for leaf in jax.tree.leaves(state))


def test_a_restore_holds_one_train_state_and_builds_no_random_init(tmp_path: Path) -> None:
    import jax

    saved_run(tmp_path)
    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    mesh = cached_trainer(SAVED_LAYOUT, CFG).mesh
    t = train.Trainer(CFG, mesh, train.check_shapes(CFG, mesh))  # a restarted process's
    feed = pipeline_for(t)
    state = train.restore_or_init(t, Checkpointer(str(tmp_path), 1, 1), feed, requests())
    gc.collect()
    one_state = state_bytes(state)
    # Everything that came alive since: the restored state, nothing else (the old Trainer built
    # a fresh random init as the restore's template and kept it: 2 states after a restore).
    assert live_bytes(before) == one_state
    assert int(state["step"]) == 2
    assert "initial_state" not in vars(t)


def test_restore_onto_another_layout_gives_identical_values(tmp_path: Path) -> None:
    """Saved with dcn.data = 2 (fsdp 4), restored with dcn.data = 8 (no FSDP) and with
    fsdp 8: every leaf equal, bit for bit, and the data iterator at the saved step."""
    saved = saved_run(tmp_path)
    for layout in ((1, 8, 1, 1), (1, 1, 8, 1)):
        t = cached_trainer(layout, CFG)
        feed = pipeline_for(t)
        state = train.restore_or_init(t, Checkpointer(str(tmp_path), 1, 1), feed, requests())
        got = flat(state)
        assert sorted(got) == sorted(saved)
        for name, value in saved.items():
            np.testing.assert_array_equal(np.asarray(got[name]), value, err_msg=name)
        for name, leaf in flat(state["params"]).items():
            assert leaf.sharding == flat(t.abstract_state["params"])[name].sharding, name
        assert feed.get_state() == {"next_example": 2 * CFG.batch_size}
        # It trains on from there, on the new layout.
        state, loss = t.step(state, next(feed))
        assert np.isfinite(float(loss)) and int(state["step"]) == 3


def test_restore_onto_another_device_count_gives_identical_values(tmp_path: Path) -> None:
    """A Fallback move to another shape (issue 55): the checkpoint written on 8 devices (2 slices,
    fsdp 4 each) is read by a job of another shape on 4 devices (one slice, fsdp 4): every leaf
    equal, bit for bit, each on the 4 devices of the new mesh, and training goes on there."""
    saved = saved_run(tmp_path)
    t = cached_trainer((1, 1, 4, 1), CFG)
    feed = pipeline_for(t)
    state = train.restore_or_init(t, Checkpointer(str(tmp_path), 1, 1), feed, requests())
    got = flat(state)
    assert sorted(got) == sorted(saved)
    for name, value in saved.items():
        np.testing.assert_array_equal(np.asarray(got[name]), value, err_msg=name)
    for name, leaf in flat(state["params"]).items():
        assert len(leaf.sharding.device_set) == 4, name
        assert leaf.sharding == flat(t.abstract_state["params"])[name].sharding, name
    assert feed.get_state() == {"next_example": 2 * CFG.batch_size}
    state, loss = t.step(state, next(feed))
    assert np.isfinite(float(loss)) and int(state["step"]) == 3
