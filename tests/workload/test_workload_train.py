"""What a real run needs around the model: the LM learning the prepared corpus with its trained
tokenizer, the recipe (schedule, masked weight decay, Adam in bf16), the memory options (bf16
parameters with a float32 master, gradient accumulation, remat policies), the loop that does not
wait on every step, the persistent compilation cache and the profiler window."""

from __future__ import annotations

import dataclasses
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multislice_workload import model, optim, train
from multislice_workload.mesh import MESH_AXES
from tests.workload.test_workload_cli import TINY, run_workload

CFG = train.TrainConfig(
    steps=4,
    batch_size=8,
    seq_len=16,
    embed=32,
    heads=2,
    head_dim=16,
    mlp=64,
    num_layers=2,
    dtype="float32",
    data_threads=0,
    warmup_steps=0,
)
SMALL = [
    "--batch_size", "8", "--seq_len", "64", "--embed", "64", "--heads", "2", "--head_dim", "32",
    "--mlp", "256", "--num_layers", "2", "--data_threads", "1", "--peak_flops", "1e9",
]  # fmt: skip


def events_of(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    code, events, stderr = run_workload(["prepare", "--output", str(out), "--vocab_size", "1024"])
    assert code == 0, stderr
    assert events_of(events, "prepared")[0]["vocab_size"] == 1024
    return out


def test_the_lm_learns_the_prepared_corpus_with_its_tokenizer(corpus: Path) -> None:
    """The demo's run, smaller: training and held-out loss go down on real text."""
    args = ["train", *SMALL, "--dataset", str(corpus), "--steps", "20", "--log_every", "5"]
    code, events, stderr = run_workload(
        [*args, "--eval_every", "10", "--learning_rate", "3e-3"], timeout=600
    )
    assert code == 0, stderr[-3000:]
    config = events_of(events, "train_config")[0]
    assert config["vocab_size"] == 1024 and config["padded_vocab"] == 1024  # from the file
    assert config["tokenizer"] == str(corpus / "tokenizer.json")
    assert config["attention_impl"] == "blockwise"
    losses = [e["loss"] for e in events_of(events, "step")]
    held_out = [e["loss"] for e in events_of(events, "eval")]
    assert len(losses) == 4 and len(held_out) == 2
    assert losses[0] < np.log(1024) + 0.5  # it starts near uniform over the vocabulary
    assert losses[-1] < losses[0] - 0.5, losses
    assert held_out[-1] < held_out[0], held_out
    finished = events_of(events, "finished")[0]
    assert finished["steady_steps"] == 18 and finished["step_seconds_p50"] > 0


def test_raw_text_without_a_tokenizer_is_a_configuration_error(tmp_path: Path) -> None:
    data = tmp_path / "docs.jsonl"
    data.write_text('{"text": "hello"}\n')
    code, events, _ = run_workload(["train", *SMALL, "--dataset", str(data)])
    assert code == 78
    assert "raw text files need --tokenizer" in events_of(events, "config_error")[0]["message"]


def test_a_restart_loads_its_programs_from_the_compilation_cache(tmp_path: Path) -> None:
    """Under the checkpoint directory by default; the second start hits the cache. The first
    run also writes a profile of steps 2-3."""
    ckpt, profile = tmp_path / "ckpt", tmp_path / "profile"
    args = ["train", *TINY, "--steps", "3", "--checkpoint_dir", str(ckpt)]
    code, events, stderr = run_workload(
        [*args, "--profile_dir", str(profile), "--profile_start_step", "2", "--profile_steps", "2"],
        timeout=600,
    )
    assert code == 0, stderr[-3000:]
    assert events_of(events, "train_config")[0]["compilation_cache_hits"] == 0
    assert any((ckpt / "compilation-cache").iterdir())
    assert [e["step"] for e in events_of(events, "profile_written")] == [3]
    assert list(profile.rglob("*.xplane.pb"))
    code, events, stderr = run_workload([*args, "--steps", "4"], timeout=600)
    assert code == 0, stderr[-3000:]
    assert events_of(events, "train_config")[0]["compilation_cache_hits"] >= 2  # init + step


# --- The recipe. ------------------------------------------------------------------------------


def test_warmup_then_cosine_to_the_end_fraction() -> None:
    cfg = optim.OptimConfig(learning_rate=1.0, total_steps=110, warmup_steps=10)
    lr = optim.schedule(cfg)
    assert float(lr(0)) == pytest.approx(1 / 11)  # the first step already moves
    assert float(lr(9)) == pytest.approx(10 / 11)
    assert float(lr(10)) == pytest.approx(1.0)
    assert float(lr(60)) == pytest.approx(0.1 + 0.9 * 0.5)  # half way down the cosine
    assert float(lr(110)) == pytest.approx(0.1) == float(lr(500))


def test_weight_decay_spares_norms_and_the_embedding() -> None:
    import jax
    import jax.numpy as jnp

    cfg = train.model_config(CFG)
    params = model.init_params(cfg, 0)
    opt = optim.build(optim.OptimConfig(learning_rate=1.0, weight_decay=0.5, clip_norm=0.0))
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(opt.update)(zero, jax.jit(opt.init)(params), params)
    moved = {
        "/".join(str(getattr(k, "key", k)) for k in path): bool(jnp.any(u != 0))
        for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]
    }
    assert moved == {
        "embedding": False, "final_norm": False, "unembed": True,
        "layers/attn_norm": False, "layers/mlp_norm": False, "layers/wq": True,
        "layers/wk": True, "layers/wv": True, "layers/wo": True, "layers/wi": True,
        "layers/wo_mlp": True,
    }  # fmt: skip


def test_adam_matches_optax_and_keeps_bf16_moments_in_bf16() -> None:
    import jax
    import jax.numpy as jnp
    import optax

    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    grads = [{"w": jnp.sin(params["w"] + i)} for i in range(3)]
    ours, reference = (
        optim.scale_by_adam(0.9, 0.95, 1e-8, "float32"),
        optax.scale_by_adam(0.9, 0.95, 1e-8),
    )
    s1, s2 = ours.init(params), reference.init(params)
    for g in grads:
        u1, s1 = ours.update(g, s1)
        u2, s2 = reference.update(g, s2)
        np.testing.assert_allclose(u1["w"], u2["w"], rtol=1e-6)
    half = optim.scale_by_adam(0.9, 0.95, 1e-8, "bfloat16")
    state = half.init(params)
    for g in grads:
        _, state = half.update(g, state)
    assert {x.dtype for x in jax.tree.leaves((state.mu, state.nu))} == {jnp.dtype("bfloat16")}


# --- Memory options. --------------------------------------------------------------------------


def mesh(shape: tuple[int, int, int, int]) -> Any:
    import jax

    count = int(np.prod(shape))
    return jax.sharding.Mesh(np.array(jax.devices()[:count]).reshape(shape), MESH_AXES)


def trainer(cfg: train.TrainConfig, shape: tuple[int, int, int, int] = (1, 1, 2, 1)) -> Any:
    m = mesh(shape)
    return train.Trainer(cfg, m, train.check_shapes(cfg, m))


def tokens(t: Any, seed: int = 0) -> Any:
    import jax

    batch = np.random.default_rng(seed).integers(0, 257, (CFG.batch_size, CFG.seq_len + 1))
    return jax.device_put(batch.astype(np.int32), t.batch_sharding)


def test_gradient_accumulation_gives_the_same_update_as_one_batch() -> None:
    one = trainer(CFG)
    four = trainer(dataclasses.replace(CFG, grad_accum=4))
    state1, loss1 = one.step(one.initial_state, tokens(one))
    state4, loss4 = four.step(four.initial_state, tokens(four))
    assert float(loss4) == pytest.approx(float(loss1), rel=1e-5)
    for a, b in zip(
        *(
            np.asarray(x)
            for x in (state1["params"]["layers"]["wq"], state4["params"]["layers"]["wq"])
        ),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    with pytest.raises(train.ConfigError, match="batch_size=8 is not divisible by 16 shards"):
        train.check_shapes(dataclasses.replace(CFG, grad_accum=8), mesh((1, 1, 2, 1)))


def test_bf16_parameters_keep_a_float32_master_the_optimizer_updates() -> None:
    import jax
    import jax.numpy as jnp

    t = trainer(dataclasses.replace(CFG, param_dtype="bfloat16", opt_state_dtype="bfloat16"))
    state = t.initial_state
    assert {x.dtype for x in jax.tree.leaves(state["params"])} == {jnp.dtype("bfloat16")}
    assert {x.dtype for x in jax.tree.leaves(state["master"])} == {jnp.dtype("float32")}
    moments = [x for x in jax.tree.leaves(state["opt_state"]) if x.ndim]
    assert {x.dtype for x in moments} == {jnp.dtype("bfloat16")}
    for seed in range(2):
        state, _ = t.step(state, tokens(t, seed))
    for p, m in zip(
        jax.tree.leaves(state["params"]), jax.tree.leaves(state["master"]), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(p), np.asarray(m.astype(jnp.bfloat16)))
    # The master moved by less than bf16 can tell apart somewhere: it is not a bf16 copy.
    master = np.asarray(state["master"]["layers"]["wi"])
    assert not np.array_equal(master, master.astype(jnp.bfloat16).astype(np.float32))


@pytest.mark.parametrize(
    "policy, kept",
    [
        ("full", set()),
        ("save_qkv_proj", {"query_proj", "key_proj", "value_proj"}),
        ("save_out_proj", {"out_proj"}),
        ("save_dot_except_mlp", {"query_proj", "key_proj", "value_proj", "out_proj"}),
        # It names mlpwo too, but that output only enters the residual sum: no backward use.
        ("save_dot_except_mlpwi", {"query_proj", "key_proj", "value_proj", "out_proj"}),
        (
            "save_dot_with_context_except_mlp",
            {"query_proj", "key_proj", "value_proj", "out_proj", "context"},
        ),
    ],
)
def test_a_remat_policy_saves_the_projections_it_names(
    policy: str, kept: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import print_saved_residuals

    cfg = dataclasses.replace(train.model_config(CFG), remat=policy, layers=1)
    layer = jax.tree.map(lambda w: w[0], model.init_params(cfg, 0)["layers"])
    from jax.sharding import PartitionSpec as P

    x = jnp.ones((2, CFG.seq_len, CFG.embed), jnp.float32)
    block = model.remat(lambda h, w: model.decoder_layer(h, w, cfg), cfg)

    def body(h: Any, w: Any) -> Any:
        # The block runs inside `model.loss`'s shard_map (its collectives name mesh axes):
        # trace it there, and read what the rematerialized block saves.
        print_saved_residuals(block, h, w)
        return block(h, w)

    capsys.readouterr()
    jax.eval_shape(
        jax.shard_map(body, mesh=mesh((1, 1, 1, 1)), in_specs=P(), out_specs=P()), x, layer
    )
    lines = capsys.readouterr().out.splitlines()
    names = {line.split("named '")[1].split("'")[0] for line in lines if "named '" in line}
    assert names == kept


# --- The loop. --------------------------------------------------------------------------------


class _Loss:
    def __init__(self, step: int, log: list[str]) -> None:
        self.step, self.log = step, log

    def block_until_ready(self) -> _Loss:
        self.log.append(f"wait {self.step}")
        return self

    def __float__(self) -> float:
        self.log.append(f"read {self.step}")
        return 1.0


def test_the_loop_waits_for_the_step_before_not_the_one_it_dispatched(tmp_path: Path) -> None:
    from multislice_workload.checkpoint import Checkpointer
    from multislice_workload.env import from_environ
    from multislice_workload.podinfo import AnnotationWatcher, CheckpointRequests
    from multislice_workload.watchdog import Watchdog

    log: list[str] = []

    class FakeTrainer:
        cfg = dataclasses.replace(CFG, steps=5, log_every=4)

        def step(self, state: dict[str, Any], batch: Any) -> tuple[dict[str, Any], _Loss]:
            step = state["step"] + 1
            log.append(f"dispatch {step}")
            return {"step": step}, _Loss(step, log)

    class FakeData:
        fingerprint = "x"

        def __next__(self) -> int:
            return 0

    previous = signal.getsignal(signal.SIGTERM)
    try:
        loop = train.TrainLoop(
            from_environ({}, local_device_count=lambda: 1),
            FakeTrainer(),  # type: ignore[arg-type]
            FakeData(),  # type: ignore[arg-type]
            Checkpointer(None, 10, 1),
            CheckpointRequests(AnnotationWatcher(None), 1000),
            Watchdog(10.0, 3, 0.0, 30.0),
            train.Figures(8, 1.0, 1, None),
        )
        assert loop.run({"step": 0}) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert log == [
        "dispatch 1",
        "dispatch 2", "wait 1",
        "dispatch 3", "wait 2",
        "dispatch 4", "wait 3", "wait 4", "read 4",  # a logging step: waited for and read
        "dispatch 5", "wait 5", "read 5",  # the last step is logged too
    ]  # fmt: skip


# --- Emergency checkpointing. -------------------------------------------------------------------


def _slow_local_commit(site: Path, *, process: int, step: int, seconds: float) -> dict[str, str]:
    """Environment whose `sitecustomize` delays Orbax's commit of `step` on `process` (first
    attempt only): a slow node-local write, as a loaded machine makes it."""
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(
            f"""
            import os, time
            from orbax.checkpoint import checkpoint_manager as cm

            _finalize = cm.CheckpointManager._finalize

            def _slow(self, step, steps_to_remove):
                import jax
                first = os.environ.get("MULTISLICE_RESTART_ATTEMPT") == "0"
                if first and step == {step} and jax.process_index() == {process}:
                    time.sleep({seconds})
                return _finalize(self, step, steps_to_remove)

            cm.CheckpointManager._finalize = _slow
            """
        )
    )
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def test_after_a_pod_loss_the_run_restores_the_local_tier_newer_than_the_persistent_one(
    tmp_path: Path,
) -> None:
    """Two slices (one process each), data parallel over them: slice 1 saves to its local
    directory every 2 steps, slice 0 (the primary) to the persistent directory every 5. The
    primary's pod is lost after step 7 (a crash: it never saves again); on the restart the run
    resumes from step 6, which only slice 1's local tier holds, broadcast to the replaced slice
    0, and not from the persistent step 5. Step 6 is written before step 7 starts (the settle
    hook): slice 1's background write needs the coordinator on process 0, and a crash after step
    7 could otherwise land while that write is still committing, restoring step 5. The write is
    made slow here (`_slow_local_commit`), so without the hook this fails every time, not only
    under load. The final step, 8, is due for the local tier only, and still reaches the
    persistent one."""
    from multislice_workload import env as contract
    from multislice_workload.env import Parallelism
    from multislice_workload.local import launch

    local, persistent = tmp_path / "local", tmp_path / "persistent"
    slow = _slow_local_commit(tmp_path / "site", process=1, step=6, seconds=4.0)
    tiers = ["--local_checkpoint_dir", str(local), "--local_checkpoint_every", "2"]
    result = launch(
        2,
        1,
        1,
        args=[
            "train",
            *TINY,
            "--steps",
            "8",
            "--checkpoint_every",
            "5",
            "--log_every",
            "4",
            *tiers,
        ],
        parallelism=Parallelism(dcn_data=2),
        max_restarts=1,
        fail_process=0,
        fail_at_step=7,
        faults={p: {contract.SETTLE_SAVE_AT_STEP: "6"} for p in (0, 1)},
        extra_env=slow,
        checkpoint_dir=str(persistent),
        timeout_s=1500,
    )
    assert result.succeeded, result.format_timeline()
    persistent_steps = {int(p.name) for p in persistent.iterdir() if p.name.isdigit()}
    assert 5 in persistent_steps and 6 not in persistent_steps  # step 6: the local tier only
    assert 8 in persistent_steps  # the final save is forced into the persistent tier
    assert {p.name for p in (local / "process-1").iterdir()} == {"6", "8"}  # the 2 newest
    assert not any((local / "process-0").iterdir())  # the primary slice keeps no local tier
    restored = result.events_named("restored", attempt=1)
    assert sorted(e["launch_process"] for e in restored) == [0, 1]
    assert {e["step"] for e in restored} == {6}
    assert all(e["data_state"] == {"next_example": 6 * 4} for e in restored)


def _persistent_steps(directory: Path) -> set[int]:
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


@pytest.mark.parametrize(
    "layout", [[], ["--ici_data_parallelism", "2", "--ici_fsdp_parallelism", "1"]]
)
def test_emergency_checkpointing_runs_in_a_single_process_job(
    tmp_path: Path, layout: list[str]
) -> None:
    """One process (no jax.distributed): Orbax's process/device tables are trivial there, and
    with one replica (fsdp over the devices) or two (data over them) the run saves and ends 0,
    not exit 1, which the operator would retry until its budget is spent."""
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    tiers = ["--local_checkpoint_dir", str(local), "--local_checkpoint_every", "2"]
    args = ["train", *TINY, *layout, "--steps", "4", "--checkpoint_every", "4", *tiers]
    code, events, stderr = run_workload([*args, "--checkpoint_dir", str(persistent)], timeout=600)
    assert code == 0, stderr[-3000:]
    assert events_of(events, "emergency_checkpointing")[0]["replicas"] == (2 if layout else 1)
    assert 4 in _persistent_steps(persistent)


def test_with_one_replica_the_final_and_the_preemption_saves_reach_the_persistent_tier(
    tmp_path: Path,
) -> None:
    """One replica: Orbax's emergency manager is a plain persistent manager that saves every
    `--checkpoint_every` steps unless forced. Step 6 is due for the local tier (every 2) only:
    the preemption save there, and the final save at step 10, must still be written, and the
    restart resumes from step 6, not from the periodic step 4."""
    from multislice_workload import env as contract

    local, persistent = tmp_path / "local", tmp_path / "persistent"
    args = [
        "train", *TINY, "--steps", "10", "--checkpoint_every", "4", "--keep_checkpoints", "5",
        "--local_checkpoint_dir", str(local), "--local_checkpoint_every", "2",
        "--checkpoint_dir", str(persistent),
    ]  # fmt: skip
    code, events, stderr = run_workload(args, {contract.PREEMPT_AT_STEP: "6"}, timeout=600)
    assert code == 143, stderr[-3000:]
    assert events_of(events, "preempted")[0]["checkpoint_saved"] is True
    assert {4, 6} <= _persistent_steps(persistent)  # Orbax also keeps its first save, 2
    code, events, stderr = run_workload(args, {contract.RESTART_ATTEMPT: "1"}, timeout=600)
    assert code == 0, stderr[-3000:]
    assert events_of(events, "restored")[0]["step"] == 6
    assert {4, 6, 8, 10} <= _persistent_steps(persistent)
    assert events_of(events, "checkpoint_saved")[-1]["step"] == 10
