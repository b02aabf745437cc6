"""`train` mode: a small MLP trained with optax over the multislice mesh; checkpointed, resumable.

Exact resume rests on three rules: the batch of step s is a pure function of (seed, s); the whole
state (step, params, optimizer state) is checkpointed; and a resumed process compiles the same
program with the same shardings as a fresh one. A run restored from step K then replays steps
K.. with bit-identical inputs, so its final parameters equal an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import signal
import time
from typing import Any

from multislice_workload import logs
from multislice_workload.checkpoint import Checkpointer
from multislice_workload.common import add_parallelism_flags, divisible, make_mesh, parallelism_from
from multislice_workload.env import ConfigError, WorkloadEnv
from multislice_workload.exitcodes import EXIT_INJECTED_FAILURE, EXIT_OK, EXIT_PREEMPTED
from multislice_workload.mesh import BATCH_AXES
from multislice_workload.runtime import Preemption


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    batch_size: int = 256  # global, examples per step
    features: int = 64
    hidden: int = 256
    num_layers: int = 3
    learning_rate: float = 1e-3
    seed: int = 0
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    log_every: int = 10
    checkpoint_dir: str | None = None
    final_params_out: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--batch_size", type=int, default=d.batch_size, help="global")
    parser.add_argument("--features", type=int, default=d.features)
    parser.add_argument("--hidden", type=int, default=d.hidden)
    parser.add_argument("--num_layers", type=int, default=d.num_layers)
    parser.add_argument("--learning_rate", type=float, default=d.learning_rate)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--checkpoint_every", type=int, default=d.checkpoint_every)
    parser.add_argument("--keep_checkpoints", type=int, default=d.keep_checkpoints)
    parser.add_argument("--log_every", type=int, default=d.log_every)
    parser.add_argument(
        "--checkpoint_dir",
        "--checkpoint-dir",
        default=None,
        help="default: $MULTISLICE_CHECKPOINT_DIR",
    )
    parser.add_argument("--final_params_out", "--final-params-out", default=None, help=".npz")
    add_parallelism_flags(parser)


def config_from(args: argparse.Namespace, env: WorkloadEnv) -> TrainConfig:
    cfg = TrainConfig(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)},
    )
    cfg = dataclasses.replace(cfg, checkpoint_dir=cfg.checkpoint_dir or env.checkpoint_dir)
    problems = [
        f"--{name} must be >= {low}, got {getattr(cfg, name)}"
        for name, low in (
            ("steps", 1),
            ("batch_size", 1),
            ("features", 1),
            ("hidden", 1),
            ("num_layers", 2),
            ("checkpoint_every", 1),
            ("keep_checkpoints", 1),
            ("log_every", 1),
        )
        if getattr(cfg, name) < low
    ]
    if problems:
        raise ConfigError("; ".join(problems))
    return cfg


# --- Model. ---------------------------------------------------------------------------------------


def layer_dims(cfg: TrainConfig) -> list[tuple[int, int]]:
    widths = [cfg.features] + [cfg.hidden] * (cfg.num_layers - 1) + [cfg.features]
    return list(itertools.pairwise(widths))


def weight_spec(index: int) -> tuple[str, str]:
    # Megatron-style alternation: column-parallel then row-parallel over `tensor`, so only every
    # second layer needs a reduction; the other weight dimension is sharded over `fsdp`.
    return ("fsdp", "tensor") if index % 2 == 0 else ("tensor", "fsdp")


def param_shardings(cfg: TrainConfig, mesh: Any) -> dict[str, Any]:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return {
        f"layer_{i}": {
            "w": NamedSharding(mesh, P(*weight_spec(i))),
            "b": NamedSharding(mesh, P()),
        }
        for i in range(len(layer_dims(cfg)))
    }


def init_params(cfg: TrainConfig) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(cfg.seed), cfg.num_layers)
    return {
        f"layer_{i}": {
            "w": jax.random.normal(k, (n_in, n_out), jnp.float32) / jnp.sqrt(n_in),
            "b": jnp.zeros((n_out,), jnp.float32),
        }
        for i, (k, (n_in, n_out)) in enumerate(zip(keys, layer_dims(cfg), strict=True))
    }


def forward(params: dict[str, Any], x: Any, mesh: Any) -> Any:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = len(params)
    for i in range(n):
        layer = params[f"layer_{i}"]
        x = x @ layer["w"] + layer["b"]
        if i < n - 1:
            x = jax.nn.gelu(x)
        feature_axis = "tensor" if weight_spec(i)[1] == "tensor" else None
        x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(BATCH_AXES, feature_axis)))
    return x


# Independent random streams derived from the seed (parameters use the seed's key directly).
_DATA_STREAM = 1
_TEACHER_STREAM = 2


def synthetic_batch(cfg: TrainConfig, step: Any, mesh: Any) -> tuple[Any, Any]:
    """The batch of `step`: depends on the seed and the step number only, never on history."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    base = jax.random.key(cfg.seed)
    key = jax.random.fold_in(jax.random.fold_in(base, _DATA_STREAM), step)
    x = jax.random.normal(key, (cfg.batch_size, cfg.features), jnp.float32)
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(BATCH_AXES, None)))
    # A fixed random "teacher" the MLP learns to imitate.
    teacher_key = jax.random.fold_in(base, _TEACHER_STREAM)
    teacher = jax.random.normal(teacher_key, (cfg.features, cfg.features)) / jnp.sqrt(cfg.features)
    return x, jnp.sin(x @ teacher)


def check_shapes(cfg: TrainConfig, mesh: Any) -> None:
    shape = dict(mesh.shape)
    problems = divisible(
        "batch_size", cfg.batch_size, shape["pipeline"] * shape["data"] * shape["fsdp"]
    )
    for name, size in (("features", cfg.features), ("hidden", cfg.hidden)):
        problems += divisible(name, size, shape["fsdp"]) + divisible(name, size, shape["tensor"])
    if problems:
        raise ConfigError("; ".join(dict.fromkeys(problems)))


# --- Training. ------------------------------------------------------------------------------------


class Trainer:
    def __init__(self, cfg: TrainConfig, mesh: Any) -> None:
        import jax
        import jax.numpy as jnp
        import optax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        self.cfg = cfg
        self.mesh = mesh
        self.optimizer = optax.adamw(cfg.learning_rate)
        replicated = NamedSharding(mesh, P())

        params = jax.jit(lambda: init_params(cfg), out_shardings=param_shardings(cfg, mesh))()
        state = {
            "step": jnp.zeros((), jnp.int32),
            "params": params,
            "opt_state": jax.jit(self.optimizer.init)(params),
        }

        # Moments inherit the parameters' shardings by propagation; scalars (step, Adam's count)
        # come back on one device and must be replicated over the mesh.
        def on_mesh(a: Any) -> Any:
            sharding = a.sharding
            return sharding if getattr(sharding, "mesh", None) == mesh else replicated

        # Shardings of the state, fixed once: fresh and restored states share them, so both runs
        # execute the same compiled program (a requirement of bit-exact resume).
        shardings = jax.tree.map(on_mesh, state)
        self.initial_state = jax.device_put(state, shardings)
        start = time.perf_counter()
        # Compiled ahead of the loop so step timings never include compilation.
        self._step = (
            jax.jit(
                self._train_step,
                in_shardings=(shardings,),
                out_shardings=(shardings, replicated),
                donate_argnums=0,
            )
            .lower(self.initial_state)
            .compile()
        )
        self.compile_seconds = time.perf_counter() - start

    def _train_step(self, state: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        import jax
        import jax.numpy as jnp
        import optax

        x, y = synthetic_batch(self.cfg, state["step"], self.mesh)

        def loss_fn(params: dict[str, Any]) -> Any:
            return jnp.mean((forward(params, x, self.mesh) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = self.optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, loss

    def step(self, state: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        return self._step(state)


def parameter_count(state: dict[str, Any]) -> int:
    import jax

    return sum(int(leaf.size) for leaf in jax.tree.leaves(state["params"]))


def run(env: WorkloadEnv, args: argparse.Namespace) -> int:
    import jax

    cfg = config_from(args, env)
    mesh = make_mesh(env, parallelism_from(args, env))
    check_shapes(cfg, mesh)
    trainer = Trainer(cfg, mesh)
    checkpointer = Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every, cfg.keep_checkpoints)
    preemption = Preemption(distributed=jax.process_count() > 1)
    logs.emit(
        "train_config",
        **{k: v for k, v in dataclasses.asdict(cfg).items() if v is not None},
        parameters=parameter_count(trainer.initial_state),
        compile_seconds=round(trainer.compile_seconds, 3),
    )
    state = restore_or_init(trainer, checkpointer)
    try:
        code = train_loop(env, trainer, checkpointer, preemption, state)
    finally:
        checkpointer.close()
    return code


def restore_or_init(trainer: Trainer, checkpointer: Checkpointer) -> dict[str, Any]:
    latest = checkpointer.latest_step()
    if latest is None:
        logs.emit("fresh_start", checkpoint_dir=checkpointer.directory)
        return trainer.initial_state
    start = time.perf_counter()
    state = checkpointer.restore(latest, trainer.initial_state)
    logs.emit(
        "restored",
        message=f"restored from step {latest}",
        step=latest,
        seconds=round(time.perf_counter() - start, 3),
        checkpoint_dir=checkpointer.directory,
    )
    return state


def train_loop(
    env: WorkloadEnv,
    trainer: Trainer,
    checkpointer: Checkpointer,
    preemption: Preemption,
    state: dict[str, Any],
) -> int:
    import jax

    cfg = trainer.cfg
    step = int(state["step"])
    window_start, window_steps = time.perf_counter(), 0
    while step < cfg.steps:
        state, loss = trainer.step(state)
        step += 1
        window_steps += 1
        inject_faults(env, step)
        if step % cfg.log_every == 0 or step == cfg.steps:
            loss_value = float(loss)  # blocks, so the window timing covers the real work
            elapsed = time.perf_counter() - window_start
            if jax.process_index() == 0:
                logs.emit(
                    "step",
                    step=step,
                    loss=loss_value,
                    steps_per_sec=round(window_steps / elapsed, 3),
                    examples_per_sec=round(window_steps * cfg.batch_size / elapsed, 1),
                )
            window_start, window_steps = time.perf_counter(), 0
        if preemption.reached(step):
            saved = checkpointer.save(step, state)
            logs.emit("preempted", step=step, checkpoint_saved=saved, exit_code=EXIT_PREEMPTED)
            return EXIT_PREEMPTED
        if checkpointer.due(step) and checkpointer.save(step, state):
            logs.emit("checkpoint_saved", step=step)
            window_start, window_steps = time.perf_counter(), 0  # throughput excludes saves
    if checkpointer.save(step, state):
        logs.emit("checkpoint_saved", step=step)
    write_final_params(cfg, state)
    logs.emit("finished", step=step)
    return EXIT_OK


_NOTICE_PROPAGATION_S = 2.5


def inject_faults(env: WorkloadEnv, step: int) -> None:
    """Test hooks (MULTISLICE_FAIL_AT_STEP / MULTISLICE_PREEMPT_AT_STEP), first attempt only."""
    if env.restart_attempt != 0:
        return
    if env.fail_at_step == step:
        logs.emit("injected_failure", step=step, exit_code=EXIT_INJECTED_FAILURE)
        os._exit(EXIT_INJECTED_FAILURE)  # a crash: no cleanup, no checkpoint
    if env.preempt_at_step == step:
        logs.emit("injected_preemption", step=step)
        # The real signal path: JAX's notifier (or our handler) sees it like a kubelet's SIGTERM.
        os.kill(os.getpid(), signal.SIGTERM)
        if env.distributed:
            # JAX's SIGTERM listener polls once a second. Holding this process (and so, through
            # the next collective, all of them) until the notice has spread makes the agreed
            # step K + 1 instead of "whenever it arrives", which a short test run could outlive.
            time.sleep(_NOTICE_PROPAGATION_S)


def write_final_params(cfg: TrainConfig, state: dict[str, Any]) -> None:
    """Gather the global parameters to every process; process 0 writes them (for tests)."""
    if not cfg.final_params_out:
        return
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(state["params"], tiled=True)
    if jax.process_index() != 0:
        return
    flat = {
        "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(gathered)[0]
    }
    np.savez(cfg.final_params_out, **flat)
    logs.emit("final_params_written", path=cfg.final_params_out, arrays=len(flat))
