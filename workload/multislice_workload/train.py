"""`train` mode: the transformer LM of `model.py` trained over the multislice mesh.

Data (`datasets.py`): `--dataset` names a directory `prepare` wrote (ArrayRecord shards and its
tokenizer), or JSONL / Parquet / ArrayRecord text files with `--tokenizer`; without it, the bytes
of the standard library's source. The vocabulary is the tokenizer's.

The recipe (`optim.py`): AdamW, warmup + cosine, clipping by global norm, weight decay off the
norms and the embedding; `--eval_every` evaluates the held-out split. Memory options:
`--param_dtype bfloat16` keeps bf16 parameters (bf16 gradients; the layers cast each weight to
the compute dtype before gathering it) with a float32 master copy the optimizer updates;
`--opt_state_dtype bfloat16` halves Adam's moments; `--grad_accum N` runs the global batch as N
microbatches per step (the same update, 1/N of the activations), and `--microbatch_size M`
derives N = batch_size / (M x data x fsdp) from each run's mesh, so the same command line keeps
the global batch on any slice count; `--remat` takes MaxText's policy names.

The loop dispatches step s + 1 before it waits for step s (it blocks on the loss only when it
logs), so the host loads the next batch while the devices compute; step times are the intervals
between completed steps, data loading included.

Exact resume rests on four rules: the data of step s depends only on (seed, s) and is read from
the global position saved with the checkpoint; the whole state (step, params, master copy,
optimizer state) is checkpointed; a resumed process compiles the same program with the same
shardings as a fresh one; and every reduction runs over a fixed set of devices in a fixed order.
A run restored from step K replays steps K.. with bit-identical inputs, so its final parameters
equal an uninterrupted run's.

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

from multislice_workload import attention as attn
from multislice_workload import hardware, logs, model, optim, runtime, tokenizer
from multislice_workload.checkpoint import Checkpointer
from multislice_workload.common import add_parallelism_flags, divisible, make_mesh, parallelism_from
from multislice_workload.datasets import DatasetSpec, GlobalBatches, open_windows, row_ranges
from multislice_workload.emergency import EmergencyCheckpointer
from multislice_workload.env import ConfigError, WorkloadEnv
from multislice_workload.exitcodes import (
    EXIT_INJECTED_FAILURE,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_RESTART_REQUESTED,
)
from multislice_workload.kube import Annotator
from multislice_workload.model import (
    MLP_ACTIVATIONS,
    REMAT_POLICIES,
    ModelConfig,
    init_params,
    param_axes,
)
from multislice_workload.partitioning import bytes_per_device, named, tree_shardings
from multislice_workload.pipeline import bubble_fraction, default_microbatches, measure_bubble
from multislice_workload.podinfo import (
    DEFAULT_POLL_S,
    SAVED_ANNOTATION,
    AnnotationWatcher,
    CheckpointRequests,
    gather_ids,
)
from multislice_workload.runtime import Preemption
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
    warmup_steps: int = -1  # -1: 10% of the steps (MaxText's warmup_steps_fraction)
    end_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    kv_heads: int = 0  # 0: multi-head attention
    mlp_activation: str = "gelu"
    attention: str = "auto"
    attention_block: int = attn.DEFAULT_BLOCK
    param_dtype: str = "float32"  # bfloat16: bf16 parameters + a float32 master copy
    opt_state_dtype: str = "float32"
    # Of the gradient collectives (FSDP's reduce-scatter, the all-reduce over data); MaxText's
    # grad_dtype defaults to float32 too (src/maxtext/configs/base.yml).
    grad_reduce_dtype: str = "float32"
    grad_accum: int = 1  # microbatches per optimizer step (the global batch is unchanged)
    # Sequences per data-parallel device (data x fsdp) per microbatch; 0: off. Sets grad_accum
    # per run from the mesh, so one command line keeps the same global batch at any slice count.
    microbatch_size: int = 0
    dataset: str | None = None  # comma-separated paths; None: the stdlib bytes
    text_field: str = "text"
    tokenizer: str | None = None  # default: the prepared dataset's tokenizer, else bytes
    vocab: int = 0  # set from the tokenizer
    eos_id: int | None = None  # set from the tokenizer (default: the bytes tokenizer's)
    eval_every: int = 0  # steps between evaluations of the held-out split; 0: never
    eval_batches: int = 4
    compilation_cache_dir: str | None = None  # default <checkpoint_dir>/compilation-cache
    profile_dir: str | None = None
    profile_start_step: int = 3
    profile_steps: int = 3
    local_checkpoint_dir: str | None = None  # Orbax emergency checkpointing's local tier
    local_checkpoint_every: int = 0
    steady_state_skip: int = 2  # first steps left out of the summary figures
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
        "data_threads", "hang_warmup_steps", "checkpoint_request_every", "warmup_steps",
        "kv_heads", "attention_block", "grad_accum", "microbatch_size", "eval_every",
        "eval_batches", "profile_start_step", "profile_steps", "local_checkpoint_every",
        "steady_state_skip",
    ):  # fmt: skip
        add(f"--{name}", type=int, default=getattr(d, name))
    for name in (
        "learning_rate", "hang_factor", "hang_timeout_s", "hang_min_s", "podinfo_poll_s",
        "end_lr_fraction", "weight_decay", "clip_norm",
    ):  # fmt: skip
        add(f"--{name}", type=float, default=getattr(d, name))
    add("--dtype", choices=("bfloat16", "float32"), default=None, help="of the matmuls")
    add("--param_dtype", choices=("float32", "bfloat16"), default=d.param_dtype)
    add("--opt_state_dtype", choices=optim.STATE_DTYPES, default=d.opt_state_dtype)
    add(
        "--grad_reduce_dtype",
        choices=("float32", "bfloat16"),
        default=d.grad_reduce_dtype,
        help="of the gradient reduce-scatters and all-reduces",
    )
    add("--remat", choices=REMAT_POLICIES, default=d.remat, help="MaxText's remat_policy names")
    add("--mlp_activation", choices=MLP_ACTIVATIONS, default=d.mlp_activation)
    add("--attention", choices=attn.IMPLEMENTATIONS, default=d.attention)
    add("--dataset", default=None, help="prepared dir, or .jsonl/.parquet/.array_record files")
    add("--text_field", default=d.text_field, help="JSONL field / Parquet column")
    add(
        "--tokenizer",
        default=None,
        help="tokenizer.json or SentencePiece .model (default: the prepared dataset's)",
    )
    add("--compilation_cache_dir", default=None, help="'off', default <checkpoint_dir>/...")
    add("--profile_dir", default=None, help="write a profiler trace of a window of steps")
    add("--local_checkpoint_dir", default=None, help="Orbax emergency checkpointing local tier")
    add("--peak_flops", type=float, default=None, help="per device; overrides the catalogue")
    add("--measure_bubble", action="store_true", help="time the pipeline stages at start-up")
    add("--checkpoint_dir", "--checkpoint-dir", default=None, help="$MULTISLICE_CHECKPOINT_DIR")
    add("--final_params_out", "--final-params-out", default=None, help=".npz (tests)")
    add_parallelism_flags(parser)


def config_from(args: argparse.Namespace, env: WorkloadEnv) -> TrainConfig:
    cfg = TrainConfig(
        **{
            f.name: getattr(args, f.name)
            for f in dataclasses.fields(TrainConfig)
            if f.name not in ("vocab", "eos_id")
        }
    )
    checkpoint_dir = cfg.checkpoint_dir or env.checkpoint_dir
    cache = cfg.compilation_cache_dir
    if cache is None and checkpoint_dir:
        cache = f"{checkpoint_dir.rstrip('/')}/compilation-cache"
    cfg = dataclasses.replace(
        cfg,
        checkpoint_dir=checkpoint_dir,
        dtype=cfg.dtype or ("bfloat16" if runtime.on_tpu() else "float32"),
        warmup_steps=cfg.warmup_steps if cfg.warmup_steps >= 0 else cfg.steps // 10,
        compilation_cache_dir=None if cache == "off" else cache,
    )
    minimums = {
        "steps": 1, "batch_size": 1, "seq_len": 2, "embed": 1, "heads": 1, "head_dim": 2,
        "mlp": 1, "num_layers": 1, "checkpoint_every": 1, "keep_checkpoints": 1,
        "log_every": 1, "data_threads": 0, "checkpoint_request_every": 1, "microbatches": 0,
        "kv_heads": 0, "attention_block": 1, "grad_accum": 1, "microbatch_size": 0,
        "eval_every": 0, "eval_batches": 1, "profile_steps": 1, "local_checkpoint_every": 0,
        "steady_state_skip": 0,
    }  # fmt: skip
    problems = [
        f"--{name} must be >= {low}, got {getattr(cfg, name)}"
        for name, low in minimums.items()
        if getattr(cfg, name) < low
    ]
    if cfg.head_dim % 2:
        problems.append(f"--head_dim must be even (rotary embedding), got {cfg.head_dim}")
    if cfg.kv_heads and cfg.heads % cfg.kv_heads:
        problems.append(f"--heads={cfg.heads} must be a multiple of --kv_heads={cfg.kv_heads}")
    if cfg.microbatch_size and cfg.grad_accum > 1:
        problems.append(
            f"--microbatch_size={cfg.microbatch_size} and --grad_accum={cfg.grad_accum} are "
            "mutually exclusive (--microbatch_size derives grad_accum at each layout): drop one"
        )
    if cfg.local_checkpoint_dir and not (cfg.checkpoint_dir and cfg.local_checkpoint_every):
        problems.append(
            "--local_checkpoint_dir needs --checkpoint_dir (the persistent tier) and "
            "--local_checkpoint_every > 0"
        )
    if problems:
        raise ConfigError("; ".join(problems))
    return cfg


def model_config(cfg: TrainConfig) -> ModelConfig:
    return ModelConfig(
        vocab=cfg.vocab or tokenizer.ByteTokenizer().vocab_size,
        eos_id=tokenizer.ByteTokenizer().eos_id if cfg.eos_id is None else cfg.eos_id,
        kv_heads=cfg.kv_heads,
        mlp_activation=cfg.mlp_activation,
        attention=cfg.attention,
        attention_block=cfg.attention_block,
        embed=cfg.embed,
        heads=cfg.heads,
        head_dim=cfg.head_dim,
        mlp=cfg.mlp,
        layers=cfg.num_layers,
        seq_len=cfg.seq_len,
        dtype=cfg.dtype or "float32",
        remat=cfg.remat,
        grad_reduce_dtype=cfg.grad_reduce_dtype,
    )


def derive_grad_accum(cfg: TrainConfig, mesh_shape: Any) -> TrainConfig:
    """`cfg` with `grad_accum` = batch_size / (microbatch_size x data x fsdp) of this mesh under
    --microbatch_size (unchanged without it): the global batch, and so the update, stays the same
    at every slice count; fewer slices (a smaller dcn.data) run more microbatches. ConfigError,
    naming the flags and a fix, when the batch does not split so at this layout."""
    if not cfg.microbatch_size:
        return cfg
    shape = dict(mesh_shape)
    replicas = shape["data"] * shape["fsdp"]
    rows = cfg.microbatch_size * replicas
    if cfg.batch_size % rows:
        larger = -(-cfg.batch_size // rows) * rows
        raise ConfigError(
            f"--batch_size={cfg.batch_size} is not divisible by --microbatch_size="
            f"{cfg.microbatch_size} x {replicas} data-parallel devices (data {shape['data']} x "
            f"fsdp {shape['fsdp']}) = {rows} sequences per microbatch at this layout: make "
            f"--batch_size a multiple of {rows} (e.g. {larger}) that is also one of every other "
            "slice count the job may run on, or choose a --microbatch_size that divides "
            "batch_size / data-parallel devices"
        )
    return dataclasses.replace(cfg, grad_accum=cfg.batch_size // rows)


def check_shapes(cfg: TrainConfig, mesh: Any) -> int:
    """ConfigError when the model or batch does not split over the mesh; the microbatches."""
    shape = dict(mesh.shape)
    stages, batch_shards = shape["pipeline"], shape["data"] * shape["fsdp"]
    # The pipeline splits each gradient-accumulation microbatch (batch_size / grad_accum rows).
    microbatches = cfg.microbatches or default_microbatches(
        stages, cfg.batch_size // cfg.grad_accum, batch_shards
    )
    if stages == 1:
        microbatches = 1
    problems = divisible("batch_size", cfg.batch_size, batch_shards * microbatches * cfg.grad_accum)
    problems += divisible("microbatches", microbatches, stages)
    problems += divisible("num_layers", cfg.num_layers, stages)
    problems += divisible("embed", cfg.embed, shape["fsdp"])
    for name in ("heads", "mlp"):
        problems += divisible(name, getattr(cfg, name), shape["tensor"])
    model = model_config(cfg)
    problems += divisible("kv_heads", model.groups_kv, shape["tensor"])
    problems += divisible("vocab (padded)", model.padded_vocab, shape["tensor"])
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
        self.optimizer = optim.build(optim_config(cfg))
        self.master = cfg.param_dtype != "float32"  # bf16 parameters: a float32 master copy
        replicated = NamedSharding(mesh, P())
        self.batch_sharding = named(mesh, ("batch", None))

        param_shardings = tree_shardings(mesh, param_axes(self.model))
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
        if self.master:
            self.shardings["master"] = param_shardings

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
        state = {"step": step, "params": params, "opt_state": self.optimizer.init(params)}
        if self.master:
            state["master"] = params
            state["params"] = self.to_param_dtype(params)
        return state

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

    def to_param_dtype(self, tree: Any) -> Any:
        import jax
        import jax.numpy as jnp

        return jax.tree.map(lambda x: x.astype(jnp.dtype(self.cfg.param_dtype)), tree)

    def gradients(self, params: dict[str, Any], tokens: Any) -> tuple[Any, Any]:
        """(mean loss, mean gradients) of the global batch, in `grad_accum` microbatches (row r
        in microbatch r % N, so each stays spread over every data-parallel device), sharded as
        the parameters: each device sums its microbatches' gradients (float32) before the one
        all-reduce over the batch axes (`model.local_loss_and_grads`)."""
        return model.loss_and_grads(
            params,
            tokens,
            self.model,
            self.mesh,
            self.stages,
            self.microbatches,
            self.cfg.grad_accum,
        )

    def _train_step(self, state: dict[str, Any], tokens: Any) -> tuple[dict[str, Any], Any]:
        import jax
        import optax

        loss, grads = self.gradients(state["params"], tokens)
        target = state["master"] if self.master else state["params"]
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, target)
        updates, opt_state = self.optimizer.update(grads, state["opt_state"], target)
        updated = optax.apply_updates(target, updates)
        out = {"step": state["step"] + 1, "params": updated, "opt_state": opt_state}
        if self.master:
            out["master"], out["params"] = updated, self.to_param_dtype(updated)
        return out, loss

    @functools.cached_property
    def compiled_eval(self) -> Any:
        """The loss of a batch under the current parameters (no gradients)."""
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        batch = jax.ShapeDtypeStruct(
            (self.cfg.batch_size, self.cfg.seq_len + 1), jnp.int32, sharding=self.batch_sharding
        )
        return (
            jax.jit(
                self.loss,
                in_shardings=(self.shardings["params"], self.batch_sharding),
                out_shardings=NamedSharding(self.mesh, P()),
            )
            .lower(self.abstract_state["params"], batch)
            .compile()
        )

    def step(self, state: dict[str, Any], tokens: Any) -> tuple[dict[str, Any], Any]:
        out: tuple[dict[str, Any], Any] = self.compiled(state, tokens)
        return out

    @property
    def bubble(self) -> float:
        return bubble_fraction(self.stages, self.microbatches)


def optim_config(cfg: TrainConfig) -> optim.OptimConfig:
    return optim.OptimConfig(
        learning_rate=cfg.learning_rate,
        total_steps=cfg.steps,
        warmup_steps=max(0, min(cfg.warmup_steps, cfg.steps - 1)),
        end_lr_fraction=cfg.end_lr_fraction,
        weight_decay=cfg.weight_decay,
        clip_norm=cfg.clip_norm,
        state_dtype=cfg.opt_state_dtype,
    )


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
    """Step times (completed-step intervals, data loading included) and what they make: the
    mean and median over each logging window, and over the steady state (all steps after the
    first `skip`) for the run's summary. MFU is from the mean."""

    tokens_per_step: int
    flops_per_token: float
    devices: int
    peak: float | None
    skip: int = 2
    window: list[float] = dataclasses.field(default_factory=list)
    steady: list[float] = dataclasses.field(default_factory=list)
    seen: int = 0

    def add(self, seconds: float) -> None:
        self.window.append(seconds)
        self.seen += 1
        if self.seen > self.skip:
            self.steady.append(seconds)

    def figures(self, times: list[float]) -> dict[str, Any]:
        import statistics

        mean = statistics.fmean(times) if times else 0.0
        tokens_per_s = self.tokens_per_step / mean if mean else 0.0
        achieved = tokens_per_s * self.flops_per_token / self.devices
        return {
            "step_seconds": round(mean, 6),
            "step_seconds_p50": round(statistics.median(times), 6) if times else 0.0,
            "tokens_per_sec": round(tokens_per_s, 1),
            "tokens_per_sec_per_device": round(tokens_per_s / self.devices, 1),
            "tflops_per_device": achieved / 1e12,
            "mfu": None if self.peak is None else achieved / self.peak,
        }

    def report(self) -> dict[str, Any]:
        out = self.figures(self.window)
        self.window = []
        return out

    def summary(self) -> dict[str, Any]:
        return {"steady_steps": len(self.steady), **self.figures(self.steady)}


class Profiler:
    """A trace of steps [start, start + steps) into `directory` (TensorBoard's profile plugin
    reads it), or nothing without a directory."""

    def __init__(self, directory: str | None, start: int, steps: int) -> None:
        self.directory, self.start, self.stop = directory, start, start + steps - 1
        self.active = False

    def before(self, step: int) -> None:
        if self.directory and step == self.start:
            import jax

            jax.profiler.start_trace(self.directory)
            self.active = True
            logs.emit("profile_started", step=step, directory=self.directory)

    def ends_at(self, step: int) -> bool:
        return self.active and step >= self.stop

    def finish(self, step: int) -> None:
        if self.active:
            import jax

            jax.profiler.stop_trace()
            self.active = False
            logs.emit("profile_written", step=step, directory=self.directory)


class TrainLoop:
    def __init__(
        self,
        env: WorkloadEnv,
        trainer: Trainer,
        data: GlobalBatches,
        checkpointer: Checkpointer | EmergencyCheckpointer,
        requests: CheckpointRequests,
        watchdog: Watchdog,
        figures: Figures,
        eval_data: GlobalBatches | None = None,
    ) -> None:
        import jax

        self.eval_data = eval_data
        self.profiler = Profiler(
            trainer.cfg.profile_dir, trainer.cfg.profile_start_step, trainer.cfg.profile_steps
        )
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
        self.pending: tuple[int, Any] | None = None  # the step dispatched, not seen complete
        self.last_done = time.perf_counter()
        while step < self.cfg.steps:
            self.profiler.before(step + 1)
            batch = next(self.data)  # the host reads while the devices run the step before
            state, loss = self.trainer.step(state, batch)
            step += 1
            self.complete()  # waits for the step before this one only
            self.pending = (step, loss)
            if self.logs_at(step) or self.profiler.ends_at(step):
                self.complete()
            self.profiler.finish(step) if self.profiler.ends_at(step) else None
            code = self.after_step(step, state, loss)
            if code is not None:
                self.complete()  # the step the exit reports is done
                return code
        self.complete()
        self.save(step, state, wait=True)
        write_final_params(self.cfg, state)
        logs.emit("finished", step=step, **self.figures.summary())
        return EXIT_OK

    def logs_at(self, step: int) -> bool:
        return step % self.cfg.log_every == 0 or step == self.cfg.steps

    def complete(self) -> None:
        """Wait for the pending step; its time is the interval since the step before it was
        seen complete (so data loading and dispatch are inside it)."""
        if self.pending is None:
            return
        import jax

        step, loss = self.pending
        jax.block_until_ready(loss)
        now = time.perf_counter()
        self.finished_step(step, now - self.last_done)
        self.last_done, self.pending = now, None

    def evaluate(self, step: int, state: dict[str, Any]) -> None:
        """Mean loss over the first `eval_batches` global batches of the held-out split."""
        import jax

        if self.eval_data is None:
            return
        start = time.perf_counter()
        self.eval_data.set_state({"next_example": 0})
        batches = max(
            1, min(self.cfg.eval_batches, len(self.eval_data.source) // self.cfg.batch_size)
        )
        losses = [
            self.trainer.compiled_eval(state["params"], next(self.eval_data))
            for _ in range(batches)
        ]
        loss = sum(float(x) for x in jax.device_get(losses)) / batches
        if jax.process_index() == 0:
            logs.emit(
                "eval",
                step=step,
                loss=loss,
                batches=batches,
                seconds=round(time.perf_counter() - start, 3),
            )
        # The evaluation's time is not a training step's.
        self.last_done += time.perf_counter() - start

    def finished_step(self, step: int, seconds: float) -> None:
        STATUS.step = step
        self.watchdog.step_done(step, seconds)
        self.figures.add(seconds)
        saved = self.checkpointer.poll_finished()
        if saved is not None:
            self.on_durable(*saved)

    def after_step(self, step: int, state: dict[str, Any], loss: Any) -> int | None:
        """Everything due at this step boundary; an exit code ends the run."""
        if fault_at(self.env, step):
            self.complete()  # a test hook acts after its step, as a real fault would be seen
        inject_faults(self.env, step)
        if self.logs_at(step):
            self.log_step(step, float(loss))
        if self.cfg.eval_every and (step % self.cfg.eval_every == 0 or step == self.cfg.steps):
            self.evaluate(step, state)
        if self.preemption.reached(step):
            saved = self.save(step, state, wait=True)
            logs.emit("preempted", step=step, checkpoint_saved=saved, exit_code=EXIT_PREEMPTED)
            return EXIT_PREEMPTED
        if self.requests.due(step):
            request = self.requests.agree()
            if request is not None:
                self.serve_request(step, state, request)
        # A step with a forced save (preemption, request above; restart, final below) takes
        # no periodic one first: under emergency checkpointing that could put the step in the
        # local tier only, and the forced save of a step already saved is refused.
        if self.env.restart_attempt == 0 and self.env.restart_at_step == step:
            saved = self.save(step, state, wait=True)
            logs.emit("restart_requested", step=step, checkpoint_saved=saved)
            return EXIT_RESTART_REQUESTED
        if self.checkpointer.due(step) and step < self.cfg.steps:
            self.save(step, state, wait=settles_save(self.env, step), forced=False)
        return None

    def log_step(self, step: int, loss: float) -> None:
        import jax

        if jax.process_index() == 0:
            logs.emit("step", step=step, loss=loss, **self.figures.report())

    def meta(self) -> dict[str, Any]:
        return {
            "checkpoint_request": STATUS.checkpoint_request,
            "corpus": self.data.fingerprint,
        }

    def save(
        self, step: int, state: dict[str, Any], wait: bool = False, forced: bool = True
    ) -> bool:
        """Collective. True when a checkpoint of `step` exists (or is being written) after it.
        `forced`: every tier writes it (`EmergencyCheckpointer.save`); periodic saves are not."""
        if not self.checkpointer.enabled:
            return False
        with self.watchdog.long_phase():
            if self.checkpointer.saving:
                self.finish_save()  # Orbax would wait inside save(); this also reports it
            dies = kills_in_save(self.env, step)
            if dies:  # said before the save: between it and the kill nothing may yield the GIL
                logs.emit("injected_kill_in_save", step=step)
            blocked = self.checkpointer.save(
                step, state, self.data.get_state(), self.meta(), forced=forced
            )
            if blocked is not None:
                if dies:
                    os.kill(os.getpid(), signal.SIGKILL)
                logs.emit("checkpoint_started", step=step, blocking_seconds=round(blocked, 3))
            if wait:
                self.finish_save()
        return self.checkpointer.last_saved == step

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
    spec = DatasetSpec(tuple(p for p in (cfg.dataset or "").split(",") if p), cfg.text_field)
    tok = load_tokenizer(cfg, spec)
    cfg = dataclasses.replace(cfg, vocab=tok.vocab_size, eos_id=tok.eos_id)
    cache_hits = enable_compilation_cache(cfg.compilation_cache_dir)
    mesh = make_mesh(env, parallelism_from(args, env), args.allow_split_physical_axes)
    cfg = derive_grad_accum(cfg, mesh.shape)
    trainer = Trainer(cfg, mesh, check_shapes(cfg, mesh))
    # Before compiling: a flag the corpus cannot serve (--seq_len) fails fast (78).
    data, eval_data = open_data(cfg, spec, tok, trainer)
    delay_start(env, "compile")
    trainer.compiled  # noqa: B018 (compile now, before the clock of the first step starts)
    trainer.compiled_init  # noqa: B018 (likewise: the watchdog's cap covers the restore phase)
    if eval_data is not None:
        trainer.compiled_eval  # noqa: B018
    delay_start(env, "setup")
    # This process's own work (on CPU a timed matmul) before the meeting, not between it and the
    # first collective.
    peak, peak_source = hardware.device_peak(cfg.peak_flops, env.accelerator, trainer.model.dtype)
    # Compile times differ by tens of seconds on a busy machine; the first collective over each
    # group of devices waits 30 s (`runtime.wait_for_peers`): the checkpoint manager's, next.
    runtime.wait_for_peers(runtime.SETUP_BARRIER, args.init_timeout)
    if cfg.measure_bubble and trainer.stages > 1:
        logs.emit(
            "pipeline_bubble",
            **measure_bubble(trainer.model, mesh, trainer.microbatches, cfg.batch_size),
        )
    log_config(cfg, trainer, data, peak, peak_source, tok, cache_hits)
    figures = Figures(
        cfg.batch_size * cfg.seq_len,
        trainer.model.flops_per_token(),
        jax.device_count(),
        peak,
        skip=cfg.steady_state_skip,
    )
    watcher = AnnotationWatcher(env.podinfo_dir, cfg.podinfo_poll_s)
    requests = CheckpointRequests(
        watcher, cfg.checkpoint_request_every, gather_ids if jax.process_count() > 1 else None
    )
    watchdog = Watchdog(cfg.hang_factor, cfg.hang_warmup_steps, cfg.hang_timeout_s, cfg.hang_min_s)
    checkpointer = make_checkpointer(cfg, trainer)
    loop = TrainLoop(env, trainer, data, checkpointer, requests, watchdog, figures, eval_data)
    watchdog.start()
    failing = True
    try:
        with watchdog.long_phase():
            state = restore_or_init(trainer, checkpointer, data, requests)
            delay_start(env, "first_step")
            # Building the state (a fresh init, or a restore's reads) takes each process its own
            # time; the first step connects the training's groups of devices.
            runtime.wait_for_peers(runtime.FIRST_STEP_BARRIER, args.init_timeout)
        code = loop.run(state)
        failing = code != EXIT_OK
        return code
    finally:
        loop.close(failing)
        checkpointer.close()


def make_checkpointer(cfg: TrainConfig, trainer: Trainer) -> Checkpointer | EmergencyCheckpointer:
    """Orbax's emergency (local + persistent) manager with --local_checkpoint_dir, else the
    persistent one."""
    if cfg.local_checkpoint_dir and cfg.checkpoint_dir:
        return EmergencyCheckpointer(
            cfg.checkpoint_dir,
            cfg.local_checkpoint_dir,
            cfg.checkpoint_every,
            cfg.local_checkpoint_every,
            cfg.keep_checkpoints,
            trainer.mesh,
            trainer.abstract_state,
        )
    return Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every, cfg.keep_checkpoints)


def load_tokenizer(cfg: TrainConfig, spec: DatasetSpec) -> tokenizer.Tokenizer:
    """--tokenizer, else the prepared dataset's, else bytes; ConfigError when unreadable."""
    path: Any = cfg.tokenizer or spec.prepared
    if path is None and spec.paths:
        raise ConfigError(
            f"--dataset {cfg.dataset}: raw text files need --tokenizer (a tokenizer.json or "
            "a SentencePiece .model)"
        )
    try:
        return tokenizer.load(path)
    except (OSError, ValueError, RuntimeError) as err:  # SentencePiece raises RuntimeError
        raise ConfigError(f"--tokenizer: {err}") from err


def open_data(
    cfg: TrainConfig, spec: DatasetSpec, tok: tokenizer.Tokenizer, trainer: Trainer
) -> tuple[GlobalBatches, GlobalBatches | None]:
    """The training batches and, with --eval_every, the held-out batches (in order)."""
    window = cfg.seq_len + 1
    try:
        train = open_windows(spec, tok, window, "train")
        held_out = open_windows(spec, tok, window, "eval") if cfg.eval_every else None
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"--dataset {cfg.dataset}: {err}") from err
    sharding = trainer.batch_sharding
    data = GlobalBatches(train, cfg.batch_size, sharding, cfg.seed, threads=cfg.data_threads)
    if held_out is None:
        return data, None
    return data, GlobalBatches(
        held_out, cfg.batch_size, sharding, cfg.seed, shuffle=False, threads=0
    )


def enable_compilation_cache(directory: str | None) -> Any:
    """Point JAX's persistent compilation cache at `directory` (every program, however fast it
    compiled) so a restarted run loads its programs instead of compiling them; a counter of the
    cache hits seen in this process."""
    import jax

    hits = [0]
    if not directory:
        return hits
    if "://" not in directory:
        os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    def listen(event: str, **_: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            hits[0] += 1

    jax.monitoring.register_event_listener(listen)
    return hits


def log_config(
    cfg: TrainConfig,
    trainer: Trainer,
    data: GlobalBatches,
    peak: float | None,
    source: str,
    tok: tokenizer.Tokenizer,
    cache_hits: Any,
) -> None:
    state = trainer.abstract_state
    logs.emit(
        "train_config",
        **{
            k: v
            for k, v in dataclasses.asdict(cfg).items()
            if v is not None and k not in ("microbatches", "tokenizer")  # tokenizer: below
        },
        parameters=trainer.model.parameter_count(),
        flops_per_token=trainer.model.flops_per_token(),
        attention_flops_per_token=trainer.model.attention_flops_per_token(),
        attention_impl=attn.resolve(
            cfg.attention, trainer.mesh.devices.flat[0].platform, trainer.model.dtype
        ),
        tokenizer=tok.name,
        vocab_size=tok.vocab_size,
        padded_vocab=trainer.model.padded_vocab,
        compilation_cache_hits=cache_hits[0],
        stages=trainer.stages,
        microbatches=trainer.microbatches,
        bubble_bound=round(trainer.bubble, 4),  # the schedule's (S - 1) / (M + S - 1)
        param_bytes_per_device=max_device_bytes(state["params"]),
        master_bytes_per_device=max_device_bytes(state.get("master", {})),
        opt_state_bytes_per_device=max_device_bytes(state["opt_state"]),
        data_rows=row_ranges(data.rows),  # [lo, hi) runs: on TPU hosts rarely one block
        data_rows_count=len(data.rows),
        corpus_windows=len(data.source),
        corpus_fingerprint=data.fingerprint,
        peak_flops_per_device=peak,
        peak_source=source,
        compile_seconds=round(trainer.compile_seconds, 3),
        coordinator_address=coordinator_address(),
    )


def coordinator_address() -> str | None:
    """The address `jax.distributed` joined in this process (None: one process, not started).
    Read back from JAX, not the environment: on TPU it comes from JAX's cluster detection."""
    from jax._src import distributed

    address = distributed.global_state.coordinator_address
    return str(address) if address else None


def restore_or_init(
    trainer: Trainer,
    checkpointer: Checkpointer | EmergencyCheckpointer,
    data: GlobalBatches,
    requests: CheckpointRequests,
) -> dict[str, Any]:
    latest = checkpointer.latest_step()
    if latest is None:
        logs.emit(
            "fresh_start",
            checkpoint_dir=checkpointer.directory,
            grad_accum=trainer.cfg.grad_accum,
            next_example=data.get_state()["next_example"],
        )
        return trainer.init_state()
    start = time.perf_counter()
    state: dict[str, Any]
    state, meta = checkpointer.restore(latest, trainer.abstract_state, data)
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
        grad_accum=trainer.cfg.grad_accum,  # this layout's (derived under --microbatch_size)
    )
    return state


# --- Test hooks. ------------------------------------------------------------------------------

_NOTICE_PROPAGATION_S = 2.5


def fault_at(env: WorkloadEnv, step: int) -> bool:
    hooks = (env.fail_at_step, env.hang_at_step, env.preempt_at_step, env.kill_in_save_at_step)
    return env.restart_attempt == 0 and step in hooks


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


def delay_start(env: WorkloadEnv, phase: str) -> None:
    """Test hook (MULTISLICE_DELAY_START_SECONDS at MULTISLICE_DELAY_PHASE), first attempt only:
    this process falls that far behind its peers at that point of the start-up, as one does on a
    busy machine."""
    if env.restart_attempt == 0 and env.delay_start_seconds and env.delay_phase == phase:
        logs.emit("injected_delay", seconds=env.delay_start_seconds, phase=phase)
        time.sleep(env.delay_start_seconds)


def settles_save(env: WorkloadEnv, step: int) -> bool:
    """Test hook: this step's checkpoint is written before the next step starts. The next step's
    collectives then hold every peer until it is, so a crash injected after it cannot race the
    background write (which needs the coordinator, on process 0, to finish)."""
    return env.restart_attempt == 0 and env.settle_save_at_step == step


def _injected_hang() -> None:
    """Stands in for a collective that never returns: only the watchdog ends this."""
    while True:
        time.sleep(3600)


def kills_in_save(env: WorkloadEnv, step: int) -> bool:
    """Test hook: die (SIGKILL, no cleanup) while this step's checkpoint is being written, right
    after `save()` returns. No I/O comes between the two (a log line written there released the
    GIL, and under load the background commit, which needs every process's signal, completed
    first: the test then restored step 10 instead of 5)."""
    return env.restart_attempt == 0 and env.kill_in_save_at_step == step


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
