import pytest

from multislice_operator.planning import advisor
from multislice_operator.tpu import catalog, parallelism


def par_for(slices, data=None, fsdp=None, pipeline=None):
    dcn = {"data": data, "fsdp": fsdp, "pipeline": pipeline}
    par, errors = parallelism.resolve({}, dcn, 8, slices, "v4-16")
    assert errors == []
    return par


def test_seed_v4_hardware_intensity():
    # The seed: 4 x 275e12 FLOP/s / 50 Gbit/s = 22,000 FLOPs per bit.
    assert advisor.hardware_intensity(catalog.slice_shape("v4-16")) == pytest.approx(22_000)


def test_seed_v4_minimum_batches():
    intensity = advisor.hardware_intensity(catalog.slice_shape("v4-16"))
    assert advisor.min_tokens_per_slice(intensity, advisor.bits_per_parameter(2)) == 176_000
    assert advisor.min_tokens_per_slice(intensity, advisor.bits_per_parameter(4)) == 352_000


def test_seed_margin_is_about_350k_and_700k():
    shape = catalog.slice_shape("v4-16")
    two = advisor.advise(shape, 2, par_for(2), None)
    four = advisor.advise(shape, 4, par_for(4), None)
    assert two.recommended_tokens_per_slice == pytest.approx(350_000, rel=0.01)
    assert four.recommended_tokens_per_slice == pytest.approx(700_000, rel=0.01)


def test_verdicts():
    shape = catalog.slice_shape("v4-16")
    assert advisor.advise(shape, 2, par_for(2), None).verdict == "unknown"
    bound = advisor.advise(shape, 2, par_for(2), 2 * 100_000)
    assert bound.verdict == "dcn-bound"
    assert bound.tokens_per_slice == 100_000
    assert "352,000" in bound.message  # the global batch that would clear the bound
    ok = advisor.advise(shape, 2, par_for(2), 2 * 400_000)
    assert ok.verdict == "ok"
    assert ok.tokens_per_slice == 400_000


def test_single_slice_and_pipeline_only_have_no_gradient_traffic():
    shape = catalog.slice_shape("v4-16")
    assert advisor.advise(shape, 1, par_for(1), None).verdict == "ok"
    pipe = advisor.advise(shape, 4, par_for(4, data=1, pipeline=4), None)
    assert pipe.verdict == "ok"
    assert pipe.bits_per_parameter == 0


def test_other_generations_use_their_own_numbers():
    v6e = advisor.hardware_intensity(catalog.slice_shape("v6e-16"))
    v5e = advisor.hardware_intensity(catalog.slice_shape("v5litepod-16"))
    assert v6e == pytest.approx(918e12 / 100e9)
    assert v5e == pytest.approx(197e12 / 25e9)


def test_fsdp_over_dcn_sends_two_gathers_and_a_reduce_scatter():
    # The workload gathers each weight twice (forward, recomputed forward) after casting it to
    # bf16, and reduce-scatters its gradient in --grad_reduce_dtype (float32 by default):
    # (2 x 16 + 32) x (n - 1) / n bits per parameter.
    assert advisor.fsdp_bits_per_parameter(1) == 0
    assert advisor.fsdp_bits_per_parameter(2) == 32
    assert advisor.fsdp_bits_per_parameter(4) == 64
    assert advisor.fsdp_bits_per_parameter(2, reduce_bits=16) == 24  # --grad_reduce_dtype bf16
    assert advisor.fsdp_bits_per_parameter(2, compute_bits=32) == 48  # float32 matmuls
    shape = catalog.slice_shape("v4-16")
    fsdp = advisor.advise(shape, 2, par_for(2, data=1, fsdp=2), 2 * 400_000)
    assert fsdp.bits_per_parameter == 32
    assert fsdp.min_tokens_per_slice == 176_000  # 22,000 x 32 / 4: as data's, with memory saved
    assert fsdp.verdict == "ok"
    assert "all-gathered twice" in fsdp.traffic and "32 bits per parameter" in fsdp.traffic


def test_exact_traffic_is_the_ring_model_and_the_verdict_rounds_it_up():
    four = advisor.dcn_traffic(par_for(4, data=4))
    assert [(t.axis, t.bits_per_parameter) for t in four] == [("data", 48.0)]  # 64 x 3/4
    assert advisor.dcn_bits_per_parameter(par_for(4, data=4)) == 64  # the seed's figure
    both = advisor.dcn_traffic(par_for(4, data=2, fsdp=2))
    assert [(t.axis, t.bits_per_parameter, t.of) for t in both] == [
        ("data", 16.0, advisor.ALL),
        ("fsdp", 32.0, advisor.BLOCKS),  # 2 bf16 gathers (remat), 1 f32 reduce-scatter
        ("fsdp", 24.0, advisor.VOCAB),  # gathered once
    ]
    assert advisor.dcn_bits_per_parameter(par_for(4, data=2, fsdp=2)) == 16 + 32
    pipe = advisor.dcn_traffic(par_for(2, data=1, pipeline=2))
    assert [(t.axis, t.bits_per_parameter, t.of) for t in pipe] == [
        ("pipeline", 32.0, advisor.VOCAB)
    ]


def test_data_with_fsdp_over_dcn_reduces_each_slices_share():
    par = par_for(4, data=2, fsdp=2)
    assert advisor.dcn_bits_per_parameter(par) == 32 / 2 + 32


def test_pipeline_only_sends_activations_not_gradients():
    shape = catalog.slice_shape("v4-16")
    pipe = advisor.advise(shape, 2, par_for(2, data=1, pipeline=2), 2 * 100_000)
    assert pipe.verdict == "ok" and pipe.bits_per_parameter == 0
    # 22,000 FLOPs/bit x 4 transfers x 16 bits / (6 x 12 d^2 per layer): layers x d_model.
    assert advisor.pipeline_min_layers_x_width(22_000) == 19_556
    assert "activations cross every stage boundary" in pipe.message
    assert "no gradient or weight traffic for the staged layers" in pipe.message
    assert "19,556" in pipe.message
    assert "pipeline x2" in pipe.traffic and "data" not in pipe.traffic


def test_data_and_pipeline_traffic_add_up():
    shape = catalog.slice_shape("v4-16")
    both = advisor.advise(shape, 4, par_for(4, data=2, pipeline=2), 4 * 400_000)
    assert both.bits_per_parameter == 32
    assert both.traffic.startswith("data x2: an all-reduce") and "pipeline x2" in both.traffic
    assert advisor.advise(shape, 1, par_for(1), None).traffic == "nothing: one slice"
