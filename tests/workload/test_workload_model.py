"""The LM's shardings, FSDP's reduce-scatter and the pipeline's equivalence, in this process on
8 CPU devices (conftest.py), with a tiny model."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from multislice_workload import datasets, hlo, train
from multislice_workload.mesh import MESH_AXES
from multislice_workload.partitioning import bytes_per_device
from tests.workload.compiled import cached_trainer

CFG = train.TrainConfig(
    steps=3,
    batch_size=8,
    seq_len=16,
    embed=32,
    heads=2,
    head_dim=16,
    mlp=64,
    num_layers=4,
    dtype="float32",
    data_threads=0,
)


def mesh(pipeline: int, data_: int, fsdp: int, tensor: int) -> Any:
    import jax

    count = pipeline * data_ * fsdp * tensor
    devices = np.array(jax.devices()[:count]).reshape(pipeline, data_, fsdp, tensor)
    return jax.sharding.Mesh(devices, MESH_AXES)


def trainer(shape: tuple[int, int, int, int], cfg: train.TrainConfig = CFG) -> train.Trainer:
    t: train.Trainer = cached_trainer(shape, cfg)  # type: ignore[assignment]
    return t


def spec(array: Any) -> tuple[Any, ...]:
    return tuple(array.sharding.spec)


# What each parameter's PartitionSpec must be, written out (not derived from the rules).
EXPECTED = {
    "embedding": ("tensor", "fsdp"),
    "final_norm": (None,),
    "unembed": ("fsdp", "tensor"),
    "layers/attn_norm": ("pipeline", None),
    "layers/mlp_norm": ("pipeline", None),
    "layers/wq": ("pipeline", "fsdp", "tensor", None),
    "layers/wk": ("pipeline", "fsdp", "tensor", None),
    "layers/wv": ("pipeline", "fsdp", "tensor", None),
    "layers/wo": ("pipeline", "tensor", None, "fsdp"),
    "layers/wi": ("pipeline", "fsdp", "tensor"),
    "layers/wo_mlp": ("pipeline", "tensor", "fsdp"),
}


def flat(tree: Any) -> dict[str, Any]:
    import jax

    return {
        "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


@pytest.fixture(scope="module")
def fsdp_tensor() -> train.Trainer:
    return trainer((1, 1, 4, 2))


def test_parameters_carry_their_partition_specs(fsdp_tensor: train.Trainer) -> None:
    params = flat(fsdp_tensor.initial_state["params"])
    assert sorted(params) == sorted(EXPECTED)
    for name, array in params.items():
        assert spec(array) == EXPECTED[name], name


def test_optimizer_state_mirrors_the_parameter_specs(fsdp_tensor: train.Trainer) -> None:
    opt = flat(fsdp_tensor.initial_state["opt_state"])
    moments = {k: v for k, v in opt.items() if "/mu/" in k or "/nu/" in k}
    assert len(moments) == 2 * len(EXPECTED)  # Adam's mu and nu, one per parameter
    for name, array in moments.items():
        param = name.split("/mu/")[-1].split("/nu/")[-1]
        assert spec(array) == EXPECTED[param], name
    for name, array in opt.items():
        if name not in moments:  # step counts
            assert array.ndim == 0 and array.sharding.is_fully_replicated, name
    assert fsdp_tensor.initial_state["step"].sharding.is_fully_replicated


def test_fsdp_4_holds_about_a_quarter_of_the_optimizer_state_per_device() -> None:
    one = max(bytes_per_device(trainer((1, 1, 1, 1)).initial_state["opt_state"]).values())
    four = max(bytes_per_device(trainer((1, 1, 4, 1)).initial_state["opt_state"]).values())
    # Norm scales (replicated) keep it a little above 1/4.
    assert 0.25 <= four / one < 0.27


def collectives(t: train.Trainer) -> set[str]:
    """The collectives of the compiled step that move data (groups of one left out)."""
    return {c.op for c in hlo.collectives(t.compiled.as_text(), t.mesh.size)}


def test_compiled_step_reduce_scatters_gradients_under_fsdp(fsdp_tensor: train.Trainer) -> None:
    assert {"all-gather", "reduce-scatter"} <= collectives(fsdp_tensor)
    # Pure data parallelism: one all-reduce of the gradients, nothing gathered or scattered
    # (test_workload_traffic.py checks the bytes of every layout).
    assert collectives(trainer((1, 4, 1, 1))) == {"all-reduce"}


def run_steps(t: train.Trainer, steps: int) -> tuple[list[float], dict[str, np.ndarray]]:
    windows = datasets.stdlib_windows(CFG.seq_len + 1, "train")
    pipeline = datasets.GlobalBatches(
        windows, CFG.batch_size, t.batch_sharding, CFG.seed, threads=0
    )
    state, losses = t.init_state(), []
    for _ in range(steps):
        state, loss = t.step(state, next(pipeline))
        losses.append(float(loss))
    return losses, {k: np.asarray(v) for k, v in flat(state["params"]).items()}


@pytest.fixture(scope="module")
def staged() -> train.Trainer:
    return trainer((2, 1, 2, 1))  # dcn.pipeline = 2: 2 layers per stage, fsdp 2 in each


def test_pipeline_over_two_stages_matches_no_pipeline_and_one_device(
    staged: train.Trainer,
) -> None:
    plain = trainer((1, 2, 2, 1))  # dcn.data = 2 instead, same devices
    assert (staged.stages, staged.microbatches) == (2, 4)
    assert staged.bubble == pytest.approx(1 / 5)
    assert "collective-permute" in collectives(staged)
    assert "collective-permute" not in collectives(plain)
    staged_losses, staged_params = run_steps(staged, 3)
    plain_losses, plain_params = run_steps(plain, 3)
    single_losses, _ = run_steps(trainer((1, 1, 1, 1)), 3)  # no sharding at all
    np.testing.assert_allclose(staged_losses, plain_losses, rtol=1e-5)
    np.testing.assert_allclose(staged_losses, single_losses, rtol=1e-5)
    assert staged_losses[-1] < staged_losses[0]  # it trains
    for name, value in plain_params.items():
        np.testing.assert_allclose(staged_params[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_layers_must_split_over_the_stages() -> None:
    from multislice_workload.env import ConfigError

    cfg = dataclasses.replace(CFG, num_layers=3)
    with pytest.raises(ConfigError, match="num_layers=3 is not divisible by 2 shards"):
        train.check_shapes(cfg, mesh(2, 1, 2, 1))


def test_flops_per_token_is_6n_plus_causal_attention() -> None:
    model = train.model_config(CFG)
    assert model.padded_vocab == 384  # 257 byte tokens, rounded up to a multiple of 128
    n = 4 * (4 * 32 * 2 * 16 + 2 * 32 * 64) + 32 * 384
    assert model.matmul_parameters() == n
    # Causal: half of PaLM's 12 x L x H x Q x T (MaxText's causal_attention_flops).
    assert model.flops_per_token() == 6 * n + 6 * 4 * 2 * 16 * 16


def test_flops_count_grouped_query_attention_and_swiglu() -> None:
    cfg = dataclasses.replace(CFG, kv_heads=1, mlp_activation="swiglu")
    model = train.model_config(cfg)
    # wq, wo: 32 x 2 x 16 each; wk, wv: 32 x 1 x 16 each; wi, wi_gate, wo_mlp: 32 x 64 each.
    n = 4 * (2 * 32 * 2 * 16 + 2 * 32 * 1 * 16 + 3 * 32 * 64) + 32 * 384
    assert model.matmul_parameters() == n
    assert model.parameter_count() == n + 384 * 32 + 4 * 2 * 32 + 32


# --- Packed rows: documents do not see each other. ---------------------------------------------


def hidden(cfg: Any, params: dict[str, Any], inputs: np.ndarray) -> np.ndarray:
    """The blocks' output [rows, T, embed] for input rows, through the loss's own path
    (embedding, segments from end-of-text, `run_layers`), on one device."""
    import jax
    from jax.sharding import PartitionSpec as P

    from multislice_workload import model

    def body(params: dict[str, Any], inputs: Any) -> Any:
        x = model.embed(params["embedding"], inputs, cfg)
        packed = None if cfg.eos_id is None else model.segments(inputs, cfg.eos_id)
        return model.run_layers(params["layers"], x, cfg, packed)

    mapped = jax.shard_map(body, mesh=mesh(1, 1, 1, 1), in_specs=P(), out_specs=P())
    return np.asarray(jax.jit(mapped)(params, inputs))


@pytest.mark.parametrize("attention", ["blockwise", "xla"])
def test_a_tokens_output_does_not_depend_on_another_document_in_its_row(attention: str) -> None:
    """Rows [doc A, end-of-text, doc B]: B's outputs (from the end-of-text on, which opens B)
    are the same whatever A holds, and equal those of B at the start of a row (positions
    restart at the end-of-text). Without segments (eos_id None, how rows were packed before)
    they depend on A."""
    from multislice_workload import model

    cfg = dataclasses.replace(
        train.model_config(CFG), attention=attention, attention_block=8, layers=2
    )
    eos = cfg.eos_id
    params = model.init_params(cfg, 0)
    rng = np.random.default_rng(0)
    a1, a2 = (rng.integers(0, 256, 5) for _ in range(2))
    b = rng.integers(0, 256, CFG.seq_len - 6)
    rows = np.stack(
        [
            np.concatenate([a1, [eos], b]),
            np.concatenate([a2, [eos], b]),
            np.concatenate([[eos], b, rng.integers(0, 256, 5)]),
        ]
    ).astype(np.int32)
    out = hidden(cfg, params, rows)
    np.testing.assert_array_equal(out[0, 5:], out[1, 5:])
    np.testing.assert_allclose(out[0, 5:], out[2, : CFG.seq_len - 5], atol=1e-5, rtol=1e-5)
    unpacked = hidden(dataclasses.replace(cfg, eos_id=None), params, rows)
    assert not np.allclose(unpacked[0, 5:], unpacked[1, 5:])


def test_the_pipeline_gives_each_microbatch_its_own_segments() -> None:
    """Rows full of end-of-text tokens (many documents per row): 2 pipeline stages give the
    loss and gradients of the same devices without a pipeline, so every stage applied each
    microbatch's segments, not another's (the stages all-gather them once per step)."""
    import jax

    staged, plain = trainer((2, 1, 2, 1)), trainer((1, 2, 2, 1))
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 256, (CFG.batch_size, CFG.seq_len + 1)).astype(np.int32)
    tokens[rng.random(tokens.shape) < 0.15] = staged.model.eos_id
    params = staged.init_state()["params"]
    results = []
    for t in (staged, plain):
        batch = jax.device_put(tokens, t.batch_sharding)
        placed = jax.device_put(params, t.shardings["params"])
        loss, grads = jax.jit(t.gradients)(placed, batch)
        results.append((float(loss), flat(grads)))
    (loss_s, grads_s), (loss_p, grads_p) = results
    assert loss_s == pytest.approx(loss_p, rel=1e-5)
    for name in grads_p:
        np.testing.assert_allclose(grads_s[name], grads_p[name], atol=1e-5, rtol=1e-4)
    # The same batch without segments gives another loss: the check above can fail.
    # An end-of-text id no token has: one segment per row, as before packing was masked.
    unpacked = trainer((1, 2, 2, 1), dataclasses.replace(CFG, eos_id=-1))
    loss_u, _ = jax.jit(unpacked.gradients)(
        jax.device_put(params, unpacked.shardings["params"]),
        jax.device_put(tokens, unpacked.batch_sharding),
    )
    assert float(loss_u) != pytest.approx(loss_p, rel=1e-5)
