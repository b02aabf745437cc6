import pytest

from multislice_operator import advisor, catalog, parallelism


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
