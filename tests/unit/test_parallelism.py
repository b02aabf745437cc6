import pytest

from multislice_operator.tpu import parallelism


def resolve(ici=None, dcn=None, chips=16, slices=2):
    return parallelism.resolve(ici or {}, dcn or {}, chips, slices, "v5litepod-16")


def test_defaults_fill_fsdp_and_dcn_data():
    par, errors = resolve()
    assert errors == []
    assert (par.ici_data, par.ici_fsdp, par.ici_tensor) == (1, 16, 1)
    assert (par.dcn_data, par.dcn_fsdp, par.dcn_pipeline, par.dcn_tensor) == (2, 1, 1, 1)


def test_fsdp_takes_what_remains():
    par, errors = resolve(ici={"tensor": 4})
    assert errors == []
    assert (par.ici_fsdp, par.ici_tensor) == (4, 4)


def test_dcn_data_takes_what_remains():
    par, errors = resolve(dcn={"pipeline": 2}, slices=4)
    assert errors == []
    assert (par.dcn_data, par.dcn_pipeline) == (2, 2)


def test_ici_product_error_names_field_and_fix():
    _, errors = parallelism.resolve({"data": 1, "fsdp": 2, "tensor": 1}, {}, 4, 1, "v4-8")
    assert len(errors) == 1
    assert errors[0].path == "spec.parallelism.ici"
    assert "= 2, but it must equal 4" in errors[0].message
    assert "v4-8 has 4 chips per slice" in errors[0].message
    assert "fsdp: 4" in errors[0].message


def test_dcn_product_error():
    _, errors = resolve(dcn={"data": 3})
    assert [e.path for e in errors] == ["spec.parallelism.dcn"]
    assert "spec.slices is 2" in errors[0].message


def test_dcn_tensor_must_be_one_and_says_why():
    _, errors = resolve(dcn={"data": 1, "tensor": 2})
    paths = [e.path for e in errors]
    assert "spec.parallelism.dcn.tensor" in paths
    msg = next(e.message for e in errors if e.path == "spec.parallelism.dcn.tensor")
    assert "DCN bandwidth" in msg


@pytest.mark.parametrize("slices", [2, 4])
def test_the_dcn_example_offered_is_itself_valid(slices):
    # Issue 21: dcn.tensor 2 was offered "e.g. data: 1, tensor: 2", then told tensor must be 1.
    _, errors = resolve(dcn={"data": slices, "tensor": 2}, slices=slices)
    product = next(e.message for e in errors if e.path == "spec.parallelism.dcn")
    example = product.split("e.g. ")[1]
    fixed = {k: int(v) for k, v in (kv.split(": ") for kv in example.split(", "))}
    assert fixed.get("tensor", 1) == 1 and "tensor" in fixed  # the user's axis, corrected
    _, again = resolve(dcn=fixed, slices=slices)
    assert again == []


def test_ironwood_splits_two_devices_per_chip_over_ici():
    # tpu7x: each chip is 2 JAX devices (2 TensorCores, no megacore), so a 64-chip slice is 128
    par, errors = parallelism.resolve({}, {}, 64, 2, "tpu7x-128", devices_per_chip=2)
    assert errors == [] and par.ici_fsdp == 128
    _, errors = parallelism.resolve({"fsdp": 64}, {}, 64, 2, "tpu7x-128", devices_per_chip=2)
    assert [e.path for e in errors] == ["spec.parallelism.ici"]
    assert "128 JAX devices per slice (64 chips x 2 TensorCores)" in errors[0].message


def test_the_plan_of_an_ironwood_job_counts_devices_not_chips():
    from tests.unit.jobs import spec_and_plan

    _, plan = spec_and_plan(accelerator="tpu7x-128", slices=2)
    assert plan.parallelism.ici_fsdp == 128
