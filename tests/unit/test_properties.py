"""Any spec either plans or fails with field-path errors; never another exception."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multislice_operator.common.errors import SpecError
from multislice_operator.planning.plan import load_job, plan_job

small = st.one_of(st.none(), st.integers(min_value=-2, max_value=300))
accelerators = st.one_of(
    st.sampled_from(
        ["v4-8", "v4-16", "v4-32", "v5litepod-16", "v5litepod-8", "v5p-128", "v6e-256"]
    ),
    st.from_regex(r"\A(v[3-7][a-z]*|tpu)-[0-9]{1,4}\Z"),
    st.text(max_size=12),
)
parallel = st.fixed_dictionaries(
    {},
    optional={"data": small, "fsdp": small, "tensor": small, "pipeline": small},
).map(lambda d: {k: v for k, v in d.items() if v is not None})
specs = st.fixed_dictionaries(
    {
        "accelerator": accelerators,
        "slices": st.one_of(st.integers(min_value=-1, max_value=300), st.text(max_size=3)),
        "template": st.one_of(
            st.just({"spec": {"containers": [{"name": "c", "image": "i"}]}}),
            st.just({}),
            st.just({"spec": {"containers": "x"}}),
        ),
    },
    optional={
        "topology": st.sampled_from(["4x4", "2x2x2", "1x1", "8x8", "bogus"]),
        "parallelism": st.fixed_dictionaries({"ici": parallel, "dcn": parallel}),
        "capacity": st.fixed_dictionaries(
            {"type": st.sampled_from(["OnDemand", "Spot", "Reserved", "Free"])},
            optional={"reservation": st.text(max_size=5)},
        ),
        "training": st.fixed_dictionaries({"globalBatchTokens": small}),
        "failurePolicy": st.fixed_dictionaries(
            {"nonRetryableExitCodes": st.lists(st.integers(-5, 300), max_size=3)}
        ),
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs)
def test_spec_plans_or_fails_with_field_paths(spec):
    obj = {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {"name": "j", "namespace": "n"},
        "spec": spec,
    }
    try:
        plan = plan_job(load_job(obj))
    except SpecError as exc:
        assert exc.errors
        for err in exc.errors:
            assert err.path.split(".")[0] in {"spec", "metadata"}, err
            assert err.message
        return
    assert plan.total_chips == plan.shape.chips * plan.slices
    par = plan.parallelism
    assert par.ici_data * par.ici_fsdp * par.ici_tensor == plan.shape.chips
    assert par.dcn_data * par.dcn_fsdp * par.dcn_pipeline * par.dcn_tensor == plan.slices
