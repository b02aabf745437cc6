"""`train` mode: the transformer LM of `model.py` trained over the multislice mesh.

Exact resume rests on four rules: the data of step s depends only on (seed, s) and is read from
where the checkpointed Grain iterator stood; the whole state (step, params, optimizer state) is
checkpointed; a resumed process compiles the same program with the same shardings as a fresh one;
and every reduction runs over a fixed set of devices in a fixed order. A run restored from step K
replays steps K.. with bit-identical inputs, so its final parameters equal an uninterrupted run's.

Parameters carry the PartitionSpecs of their logical axes (`sharding.LOGICAL_RULES`); the
optimizer state is created with the same shardings (`optax.tree_map_params`), so FSDP shards the
Adam moments as well as the weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import time
from typing import Any

from multislice_workload import hardware, logs, model, runtime
from multislice_workload.checkpoint import Checkpointer
from multislice_workload.common import add_parallelism_flags, divisible, make_mesh, parallelism_from
from multislice_workload.data import DataConfig, DataPipeline, row_ranges
from multislice_workload.env import ConfigError, WorkloadEnv
from multislice_workload.exitcodes import (
    EXIT_INJECTED_FAILURE,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_RESTART_REQUESTED,
)
from multislice_workload.kube import Annotator
from multislice_workload.model import PARAM_AXES, REMAT_POLICIES, ModelConfig, init_params
from multislice_workload.pipeline import bubble_fraction, default_microbatches, measure_bubble
from multislice_workload.podinfo import (
    DEFAULT_POLL_S,
    SAVED_ANNOTATION,
    AnnotationWatcher,
    CheckpointRequests,
    gather_ids,
)
from multislice_workload.runtime import Preemption
from multislice_workload.sharding import bytes_per_device, named, tree_shardings
from multislice_workload.termination import STATUS
from multislice_workload.watchdog import Watchdog

# Bounded wait for a save in flight when the run is failing anyway: a dead peer never commits.
_FAILING_WAIT_S = 30.0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    # Defaults sized for a CPU demo (about 0.9M parameters); a TPU run passes real sizes.
    batch_size: int = 16  # global, sequences per step
    seq_len: int = 128
    embed: int = 128
    heads: int = 4
    head_dim: int = 32
    mlp: int = 512
    num_layers: int = 4
    dtype: str | None = None  # None: bfloat16 on TPU, float32 elsewhere
    remat: str = "full"
    microbatches: int = 0  # pipeline microbatches; 0: up to 4 per stage
    learning_rate: float = 1e-3
    seed: int = 0
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    log_every: int = 10
    checkpoint_dir: str | None = None
    final_params_out: str | None = None
    data_threads: int = 2
    peak_flops: float | None = None
    hang_factor: float = 10.0
    hang_warmup_steps: int = 3
    hang_timeout_s: float = 1800.0
    hang_min_s: float = 30.0
    checkpoint_request_every: int = 10
    podinfo_poll_s: float = DEFAULT_POLL_S
    measure_bubble: bool = False  # time each pipeline stage alone at start-up (two compiles)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    add = parser.add_argument
    for name in (
        "steps", "batch_size", "seq_len", "embed", "heads", "head_dim", "mlp", "num_layers",
        "microbatches", "seed", "checkpoint_every", "keep_checkpoints", "log_every",
        "data_threads", "hang_warmup_steps", "checkpoint_request_every",
    ):  # fmt: skip
        add(f"--{name}", type=int, default=getattr(d, name))
    for name in (
        "learning_rate", "hang_factor", "hang_timeout_s", "hang_min_s", "podinfo_poll_s",
    ):  # fmt: skip
        add(f"--{name}", type=float, default=getattr(d, name))
    add("--dtype", choices=("bfloat16", "float32"), default=None)
    add("--remat", choices=REMAT_POLICIES, default=d.remat)
    add("--peak_flops", type=float, default=None, help="per device; overrides the catalogue")
    add("--measure_bubble", action="store_true", help="time the pipeline stages at start-up")
    add("--checkpoint_dir", "--checkpoint-dir", default=None, help="$MULTISLICE_CHECKPOINT_DIR")
    add("--final_params_out", "--final-params-out", default=None, help=".npz (tests)")
    add_parallelism_flags(parser)


def config_from(args: argparse.Namespace, env: WorkloadEnv) -> TrainConfig:
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    cfg = dataclasses.replace(
        cfg,
        checkpoint_dir=cfg.checkpoint_dir or env.checkpoint_dir,
        dtype=cfg.dtype or ("bfloat16" if runtime.on_tpu() else "float32"),
    )
    minimums = {
        "steps": 1, "batch_size": 1, "seq_len": 2, "embed": 1, "heads": 1, "head_dim": 2,
        "mlp": 1, "num_layers": 1, "checkpoint_every": 1, "keep_checkpoints": 1,
        "log_every": 1, "data_threads": 0, "checkpoint_request_every": 1, "microbatches": 0,
    }  # fmt: skip
    problems = [
        f"--{name} must be >= {low}, got {getattr(cfg, name)}"
        for name, low in minimums.items()
        if getattr(cfg, name) < low
    ]
    if cfg.head_dim % 2:
        problems.append(f"--head_dim must be even (rotary embedding), got {cfg.head_dim}")
    if problems:
        raise ConfigError("; ".join(problems))
    return cfg


def model_config(cfg: TrainConfig) -> ModelConfig:
    return ModelConfig(
        embed=cfg.embed,
        heads=cfg.heads,
        head_dim=cfg.head_dim,
        mlp=cfg.mlp,
        layers=cfg.num_layers,
        seq_len=cfg.seq_len,
        dtype=cfg.dtype or "float32",
        remat=cfg.remat,
    )


def check_shapes(cfg: TrainConfig, mesh: Any) -> int:
    """ConfigError when the model or batch does not split over the mesh; the microbatches."""
    shape = dict(mesh.shape)
    stages, batch_shards = shape["pipeline"], shape["data"] * shape["fsdp"]
    microbatches = cfg.microbatches or default_microbatches(stages, cfg.batch_size, batch_shards)
    if stages == 1:
        microbatches = 1
    problems = divisible("batch_size", cfg.batch_size, batch_shards * microbatches)
    problems += divisible("microbatches", microbatches, stages)
    problems += divisible("num_layers", cfg.num_layers, stages)
    problems += divisible("embed", cfg.embed, shape["fsdp"])
    for name in ("heads", "mlp"):
        problems += divisible(name, getattr(cfg, name), shape["tensor"])
    problems += divisible("vocab", ModelConfig().vocab, shape["tensor"])
    if problems:
        raise ConfigError("; ".join(dict.fromkeys(problems)))
    return microbatches


# --- The compiled step. -----------------------------------------------------------------------


class Trainer:
    def __init__(self, cfg: TrainConfig, mesh: Any, microbatches: int) -> None:
        import jax
        import optax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        self.cfg = cfg
        self.model = model_config(cfg)
        self.mesh = mesh
        self.stages = int(mesh.shape["pipeline"])
        self.microbatches = microbatches
        self.optimizer = optax.adamw(cfg.learning_rate)
        replicated = NamedSharding(mesh, P())
        self.batch_sharding = named(mesh, ("batch", None))

        param_shardings = tree_shardings(mesh, PARAM_AXES)
        abstract_params = jax.eval_shape(lambda: init_params(self.model, cfg.seed))
        # Adam's moments mirror the parameters and take their shardings; scalars replicate.
        opt_shardings = optax.tree_map_params(
            self.optimizer,
            lambda _, sharding: sharding,
            jax.eval_shape(self.optimizer.init, abstract_params),
            param_shardings,
            transform_non_params=lambda _: replicated,
        )
        self.shardings = {"step": replicated, "params": param_shardings, "opt_state": opt_shardings}

        # Shapes, dtypes and shardings only: the compiled step and a restore need no arrays, so
        # a resumed run never builds (and holds) a random init next to the restored state.
        self.abstract_state = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            jax.eval_shape(self._fresh),
            self.shardings,
        )
        self.compile_seconds = 0.0

    def _fresh(self) -> dict[str, Any]:
        import jax.numpy as jnp

        params = init_params(self.model, self.cfg.seed)
        step = jnp.zeros((), jnp.int32)
        return {"step": step, "params": params, "opt_state": self.optimizer.init(params)}

    @functools.cached_property
    def compiled_init(self) -> Any:
        """The initializer, compiled (no arrays: a restore compiles it, never runs it)."""
        import jax

        init = jax.jit(self._fresh, out_shardings=self.shardings).lower()
        # It runs once: on CPU, skip LLVM's expensive passes (same numbers, a quarter of the
        # compile time, which the random initializers dominate).
        cpu = self.mesh.devices.flat[0].platform == "cpu"
        options: dict[str, str | bool] | None = (
            {"xla_llvm_disable_expensive_passes": True} if cpu else None
        )
        return init.compile(compiler_options=options)

    def init_state(self) -> dict[str, Any]:
        """A fresh state (random parameters of the seed, zero moments), built sharded."""
        state: dict[str, Any] = self.compiled_init()
        return state

    @functools.cached_property
    def initial_state(self) -> dict[str, Any]:
        """`init_state()`, built once (tests; the loop calls `init_state` on a fresh start)."""
        return self.init_state()

    @functools.cached_property
    def compiled(self) -> Any:
        """The train step, compiled ahead of the loop so step timings never include it."""
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        batch = jax.ShapeDtypeStruct(
            (self.cfg.batch_size, self.cfg.seq_len + 1), jnp.int32, sharding=self.batch_sharding
        )
        start = time.perf_counter()
        compiled = (
            jax.jit(
                self._train_step,
                in_shardings=(self.shardings, self.batch_sharding),
                out_shardings=(self.shardings, NamedSharding(self.mesh, P())),
                donate_argnums=0,
            )
            .lower(self.abstract_state, batch)
            .compile()
        )
        self.compile_seconds = time.perf_counter() - start
        return compiled

    def loss(self, params: dict[str, Any], tokens: Any) -> Any:
        return model.loss(params, tokens, self.model, self.mesh, self.stages, self.microbatches)

    def _train_step(self, state: dict[str, Any], tokens: Any) -> tuple[dict[str, Any], Any]:
        import jax
        import optax

        loss, grads = jax.value_and_grad(self.loss)(state["params"], tokens)
        updates, opt_state = self.optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, loss

    def step(self, state: dict[str, Any], tokens: Any) -> tuple[dict[str, Any], Any]:
        out: tuple[dict[str, Any], Any] = self.compiled(state, tokens)
        return out

    @property
    def bubble(self) -> float:
        return bubble_fraction(self.stages, self.microbatches)


def max_device_bytes(tree: Any) -> int:
    """Largest bytes held by one device, for arrays or their abstract (sharded) shapes."""
    import math

    import jax

    leaves = jax.tree.leaves(tree)
    if all(isinstance(leaf, jax.Array) for leaf in leaves):
        return max(bytes_per_device(tree).values(), default=0)
    return sum(
        math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize for leaf in leaves
    )


# --- The loop. ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Figures:
    """Throughput over the current logging window, and what one token costs."""

    tokens_per_step: int
    flops_per_token: float
    devices: int
    peak: float | None
    seconds: float = 0.0
    steps: int = 0

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.steps += 1

    def report(self) -> dict[str, Any]:
        step_s = self.seconds / max(self.steps, 1)
        tokens_per_s = self.tokens_per_step / step_s if step_s else 0.0
        achieved = tokens_per_s * self.flops_per_token / self.devices
        self.seconds, self.steps = 0.0, 0
        return {
            "step_seconds": round(step_s, 6),
            "tokens_per_sec": round(tokens_per_s, 1),
            "tokens_per_sec_per_device": round(tokens_per_s / self.devices, 1),
            "tflops_per_device": achieved / 1e12,
            "mfu": None if self.peak is None else achieved / self.peak,
        }


class TrainLoop:
    def __init__(
        self,
        env: WorkloadEnv,
        trainer: Trainer,
        data: DataPipeline,
        checkpointer: Checkpointer,
        requests: CheckpointRequests,
        watchdog: Watchdog,
        figures: Figures,
    ) -> None:
        import jax

        self.env = env
        self.cfg = trainer.cfg
        self.trainer = trainer
        self.data = data
        self.checkpointer = checkpointer
        self.requests = requests
        self.watchdog = watchdog
        self.figures = figures
        self.preemption = Preemption(distributed=jax.process_count() > 1)
        self.annotator = Annotator.from_environ() if jax.process_index() == 0 else None

    def run(self, state: dict[str, Any]) -> int:
        step = int(state["step"])
        while step < self.cfg.steps:
            batch = next(self.data)
            start = time.perf_counter()
            state, loss = self.trainer.step(state, batch)
            loss_value = float(loss)  # blocks: the step is done when this returns
            step += 1
            self.finished_step(step, time.perf_counter() - start)
            code = self.after_step(step, state, loss_value)
            if code is not None:
                return code
        self.save(step, state, wait=True)
        write_final_params(self.cfg, state)
        logs.emit("finished", step=step)
        return EXIT_OK

    def finished_step(self, step: int, seconds: float) -> None:
        STATUS.step = step
        self.watchdog.step_done(step, seconds)
        self.figures.add(seconds)
        saved = self.checkpointer.poll_finished()
        if saved is not None:
            self.on_durable(*saved)

    def after_step(self, step: int, state: dict[str, Any], loss: float) -> int | None:
        """Everything due at this step boundary; an exit code ends the run."""
        inject_faults(self.env, step)
        if step % self.cfg.log_every == 0 or step == self.cfg.steps:
            self.log_step(step, loss)
        if self.preemption.reached(step):
            saved = self.save(step, state, wait=True)
            logs.emit("preempted", step=step, checkpoint_saved=saved, exit_code=EXIT_PREEMPTED)
            return EXIT_PREEMPTED
        if self.requests.due(step):
            request = self.requests.agree()
            if request is not None:
                self.serve_request(step, state, request)
        if self.checkpointer.due(step):
            self.save(step, state)
        if self.env.restart_attempt == 0 and self.env.restart_at_step == step:
            saved = self.save(step, state, wait=True)
            logs.emit("restart_requested", step=step, checkpoint_saved=saved)
            return EXIT_RESTART_REQUESTED
        return None

    def log_step(self, step: int, loss: float) -> None:
        import jax

        if jax.process_index() == 0:
            logs.emit("step", step=step, loss=loss, **self.figures.report())

    def meta(self) -> dict[str, Any]:
        return {
            "checkpoint_request": STATUS.checkpoint_request,
            "corpus": self.data.source.fingerprint,
        }

    def save(self, step: int, state: dict[str, Any], wait: bool = False) -> bool:
        """Collective. True when a checkpoint of `step` exists (or is being written) after it."""
        if not self.checkpointer.enabled:
            return False
        with self.watchdog.long_phase():
            if self.checkpointer.saving:
                self.finish_save()  # Orbax would wait inside save(); this also reports it
            blocked = self.checkpointer.save(step, state, self.data.iterator, self.meta())
            if blocked is not None:
                logs.emit("checkpoint_started", step=step, blocking_seconds=round(blocked, 3))
                kill_in_save(self.env, step)
            if wait:
                self.finish_save()
        return True

    def finish_save(self, timeout_s: float | None = None) -> None:
        if not self.checkpointer.wait(timeout_s):
            logs.emit("warning", message="checkpoint in flight abandoned (a peer is gone?)")
        saved = self.checkpointer.poll_finished()
        if saved is not None:
            self.on_durable(*saved)

    def on_durable(self, step: int, seconds: float) -> None:
        STATUS.checkpoint_step = step
        logs.emit("checkpoint_saved", step=step, seconds=round(seconds, 3))

    def serve_request(self, step: int, state: dict[str, Any], request: str) -> None:
        """Every process saves this step (the agreement made it the same everywhere)."""
        self.requests.served = request
        if not self.checkpointer.enabled:
            logs.emit("warning", message=f"checkpoint request {request!r}: no checkpoint_dir")
            return
        STATUS.checkpoint_request = {"id": request, "step": step}
        self.save(step, state, wait=True)
        logs.emit("checkpoint_request_saved", id=request, step=step)
        if self.annotator is not None:
            self.annotator.annotate({SAVED_ANNOTATION: json.dumps({"id": request, "step": step})})

    def close(self, failing: bool) -> None:
        """Wait for the save in flight (bounded when the run is failing anyway)."""
        self.finish_save(_FAILING_WAIT_S if failing else None)
        if self.annotator is not None:
            self.annotator.join()
        self.watchdog.stop()


def run(env: WorkloadEnv, args: argparse.Namespace) -> int:
    import jax

    cfg = config_from(args, env)
    mesh = make_mesh(env, parallelism_from(args, env), args.allow_split_physical_axes)
    trainer = Trainer(cfg, mesh, check_shapes(cfg, mesh))
    data = DataPipeline(  # before compiling: a flag the corpus cannot serve fails fast (78)
        DataConfig(cfg.batch_size, cfg.seq_len, cfg.seed, cfg.steps, cfg.data_threads),
        trainer.batch_sharding,
    )
    trainer.compiled  # noqa: B018 (compile now, before the clock of the first step starts)
    trainer.compiled_init  # noqa: B018 (likewise: the watchdog's cap covers the restore phase)
    if cfg.measure_bubble and trainer.stages > 1:
        logs.emit(
            "pipeline_bubble",
            **measure_bubble(trainer.model, mesh, trainer.microbatches, cfg.batch_size),
        )
    peak, peak_source = hardware.device_peak(cfg.peak_flops, env.accelerator, trainer.model.dtype)
    log_config(cfg, trainer, data, peak, peak_source)
    figures = Figures(
        cfg.batch_size * cfg.seq_len, trainer.model.flops_per_token(), jax.device_count(), peak
    )
    watcher = AnnotationWatcher(env.podinfo_dir, cfg.podinfo_poll_s)
    requests = CheckpointRequests(
        watcher, cfg.checkpoint_request_every, gather_ids if jax.process_count() > 1 else None
    )
    watchdog = Watchdog(cfg.hang_factor, cfg.hang_warmup_steps, cfg.hang_timeout_s, cfg.hang_min_s)
    checkpointer = Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every, cfg.keep_checkpoints)
    loop = TrainLoop(env, trainer, data, checkpointer, requests, watchdog, figures)
    watchdog.start()
    failing = True
    try:
        with watchdog.long_phase():
            state = restore_or_init(trainer, checkpointer, data, requests)
        code = loop.run(state)
        failing = code != EXIT_OK
        return code
    finally:
        loop.close(failing)
        checkpointer.close()


def log_config(
    cfg: TrainConfig, trainer: Trainer, data: DataPipeline, peak: float | None, source: str
) -> None:
    state = trainer.abstract_state
    logs.emit(
        "train_config",
        **{
            k: v
            for k, v in dataclasses.asdict(cfg).items()
            if v is not None and k != "microbatches"
        },
        parameters=trainer.model.parameter_count(),
        flops_per_token=trainer.model.flops_per_token(),
        stages=trainer.stages,
        microbatches=trainer.microbatches,
        bubble_bound=round(trainer.bubble, 4),  # the schedule's (S - 1) / (M + S - 1)
        param_bytes_per_device=max_device_bytes(state["params"]),
        opt_state_bytes_per_device=max_device_bytes(state["opt_state"]),
        data_rows=row_ranges(data.rows),
        corpus_windows=len(data.source),
        corpus_fingerprint=data.source.fingerprint,
        peak_flops_per_device=peak,
        peak_source=source,
        compile_seconds=round(trainer.compile_seconds, 3),
    )


def restore_or_init(
    trainer: Trainer, checkpointer: Checkpointer, data: DataPipeline, requests: CheckpointRequests
) -> dict[str, Any]:
    latest = checkpointer.latest_step()
    if latest is None:
        logs.emit("fresh_start", checkpoint_dir=checkpointer.directory)
        return trainer.init_state()
    start = time.perf_counter()
    state: dict[str, Any]
    state, meta = checkpointer.restore(
        latest, trainer.abstract_state, data.iterator, data.state_at_step
    )
    STATUS.step = STATUS.checkpoint_step = latest
    served = meta.get("checkpoint_request")
    if served:
        STATUS.checkpoint_request = served
        requests.served = served.get("id")
    logs.emit(
        "restored",
        message=f"restored from step {latest}",
        step=latest,
        seconds=round(time.perf_counter() - start, 3),
        data_state=data.get_state(),
        checkpoint_dir=checkpointer.directory,
    )
    return state


# --- Test hooks. ------------------------------------------------------------------------------

_NOTICE_PROPAGATION_S = 2.5


def inject_faults(env: WorkloadEnv, step: int) -> None:
    """Test hooks (MULTISLICE_*_AT_STEP), first attempt only."""
    if env.restart_attempt != 0:
        return
    if env.fail_at_step == step:
        from multislice_workload import termination

        logs.emit("injected_failure", step=step, exit_code=EXIT_INJECTED_FAILURE)
        termination.write(EXIT_INJECTED_FAILURE, f"injected failure after step {step}")
        os._exit(EXIT_INJECTED_FAILURE)  # a crash: no cleanup, no checkpoint
    if env.hang_at_step == step:
        logs.emit("injected_hang", step=step)
        _injected_hang()
    if env.preempt_at_step == step:
        logs.emit("injected_preemption", step=step)
        # The real signal path: JAX's notifier (or our handler) sees it like a kubelet's SIGTERM.
        os.kill(os.getpid(), signal.SIGTERM)
        if env.distributed:
            # JAX's SIGTERM listener polls once a second. Holding this process (and so, through
            # the next collective, all of them) until the notice has spread makes the agreed
            # step K + 1 instead of "whenever it arrives", which a short test run could outlive.
            time.sleep(_NOTICE_PROPAGATION_S)


def _injected_hang() -> None:
    """Stands in for a collective that never returns: only the watchdog ends this."""
    while True:
        time.sleep(3600)


def kill_in_save(env: WorkloadEnv, step: int) -> None:
    """Test hook: die (SIGKILL, no cleanup) while this step's checkpoint is being written. The
    main thread holds the GIL from `save()` returning to here, so the background commit, which
    needs every process's signal, cannot complete first."""
    if env.restart_attempt == 0 and env.kill_in_save_at_step == step:
        logs.emit("injected_kill_in_save", step=step)
        os.kill(os.getpid(), signal.SIGKILL)


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
    flat: dict[str, Any] = {
        "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(gathered)[0]
    }
    np.savez(cfg.final_params_out, **flat)
    logs.emit("final_params_written", path=cfg.final_params_out, arrays=len(flat))
