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
