import pytest

from multislice_operator.tpu import catalog


@pytest.mark.parametrize(
    ("accelerator", "chips", "hosts", "chips_per_host", "machine", "topology"),
    [
        ("v4-8", 4, 1, 4, "ct4p-hightpu-4t", "2x2x1"),
        ("v4-16", 8, 2, 4, "ct4p-hightpu-4t", "2x2x2"),
        ("v4-32", 16, 4, 4, "ct4p-hightpu-4t", "2x2x4"),
        ("v4-4096", 2048, 512, 4, "ct4p-hightpu-4t", "8x16x16"),
        ("v5litepod-1", 1, 1, 1, "ct5lp-hightpu-1t", "1x1"),
        ("v5litepod-4", 4, 1, 4, "ct5lp-hightpu-4t", "2x2"),
        # Two 4-chip VMs, as xpk runs it, so that it can be multisliced (issue 12, defect 5).
        ("v5litepod-8", 8, 2, 4, "ct5lp-hightpu-4t", "2x4"),
        ("v5litepod-16", 16, 4, 4, "ct5lp-hightpu-4t", "4x4"),
        ("v5litepod-256", 256, 64, 4, "ct5lp-hightpu-4t", "16x16"),
        ("v5p-8", 4, 1, 4, "ct5p-hightpu-4t", "2x2x1"),
        ("v5p-64", 32, 8, 4, "ct5p-hightpu-4t", "2x4x4"),
        ("v5p-128", 64, 16, 4, "ct5p-hightpu-4t", "4x4x4"),
        ("v5p-384", 192, 48, 4, "ct5p-hightpu-4t", "4x4x12"),
        ("v5p-12288", 6144, 1536, 4, "ct5p-hightpu-4t", "16x16x24"),  # the largest v5p slice
        ("v4-384", 192, 48, 4, "ct4p-hightpu-4t", "4x4x12"),
        ("v6e-1", 1, 1, 1, "ct6e-standard-1t", "1x1"),
        ("v6e-4", 4, 1, 4, "ct6e-standard-4t", "2x2"),
        ("v6e-8", 8, 2, 4, "ct6e-standard-4t", "2x4"),
        ("v6e-16", 16, 4, 4, "ct6e-standard-4t", "4x4"),
        ("v6e-256", 256, 64, 4, "ct6e-standard-4t", "16x16"),
    ],
)
def test_slice_shapes(accelerator, chips, hosts, chips_per_host, machine, topology):
    shape = catalog.slice_shape(accelerator)
    assert (shape.chips, shape.hosts, shape.chips_per_host) == (chips, hosts, chips_per_host)
    assert shape.machine_type == machine
    assert shape.topology == topology
    assert shape.multi_host == (hosts > 1)


@pytest.mark.parametrize(
    ("accelerator", "gke", "peak", "dcn_per_chip"),
    [
        ("v4-8", "tpu-v4-podslice", 275e12, 12.5e9),
        ("v5litepod-16", "tpu-v5-lite-podslice", 197e12, 25e9),
        ("v5p-8", "tpu-v5p-slice", 459e12, 50e9),
        ("v6e-4", "tpu-v6e-slice", 918e12, 100e9),
    ],
)
def test_generation_facts(accelerator, gke, peak, dcn_per_chip):
    gen = catalog.slice_shape(accelerator).generation
    assert gen.gke_accelerator == gke
    assert gen.peak_bf16_flops == peak
    assert gen.dcn_bits_per_chip == dcn_per_chip


def test_v4_host_dcn_matches_seed():
    # The seed: each v4 host has four chips and 50 Gbit/s of DCN.
    assert catalog.slice_shape("v4-16").dcn_bits_per_host == 50e9


def test_explicit_topology_validated():
    assert catalog.slice_shape("v4-32", "2x2x4").topology == "2x2x4"
    with pytest.raises(catalog.TopologyError, match=r"valid: 2x2x4"):
        catalog.slice_shape("v4-32", "4x4")


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("v3-8", r"unknown TPU family 'v3'.*v4-N"),
        ("v5e-16", r"did you mean v5litepod-16"),
        ("v4-7", r"must be even"),
        ("v4-12", r"not a v4 slice size; valid: v4-8, v4-16"),
        ("v5litepod-3", r"not a v5e slice size"),
        ("tpu", r"not a Cloud TPU accelerator type"),
        ("", r"not a Cloud TPU accelerator type"),
        ("v6e-0", r"not a v6e slice size"),
    ],
)
def test_invalid_names(name, match):
    with pytest.raises(catalog.CatalogError, match=match):
        catalog.parse_accelerator(name)


def test_every_listed_topology_resolves():
    for gen in catalog.GENERATIONS.values():
        for size in catalog.valid_sizes(gen):
            shape = catalog.slice_shape(f"{gen.prefix}-{size}")
            assert shape.chips * gen.cores_per_chip == size
            assert shape.hosts * shape.chips_per_host == shape.chips


# Issue 12, defect 10: v4 and v5p accept every topology GKE and Cloud TPU accept, as xpk generates
# them (system_characteristics.py generate_tpu_topologies), not a hand-picked subset.
@pytest.mark.parametrize(
    ("accelerator", "topology"),
    [
        ("v5p-384", "4x4x12"),
        ("v5p-768", "4x8x12"),
        ("v5p-768", "4x4x24"),
        ("v5p-1152", "4x12x12"),
        ("v5p-6912", "12x12x24"),
        ("v5p-12288", "16x16x24"),
        ("v4-384", "4x4x12"),
        ("v4-256", "8x4x4"),  # v4 shapes may list their axes in any order
        ("v4-8192", "4x4x256"),
    ],
)
def test_v4_v5p_accept_generated_topologies(accelerator, topology):
    shape = catalog.slice_shape(accelerator, topology)
    assert shape.topology == topology
    assert shape.hosts == shape.chips // 4


def test_generated_sets_match_xpk_bounds():
    v5p, v4 = catalog.GENERATIONS["v5p"], catalog.GENERATIONS["v4"]
    # v5p: A <= B <= C, at most 96 4x4x4 cubes (Cloud TPU's v5p page; xpk generates up to 140,
    # the pod); v4: any order, at most 64 cubes.
    assert "8x4x4" not in v5p.topologies and "8x4x4" in v4.topologies
    assert "16x20x32" not in v5p.topologies  # 160 cubes
    assert "4x4x260" not in v4.topologies  # sides stop at 256
    assert catalog.valid_sizes(v5p)[-1] == 2 * 6144
    with pytest.raises(catalog.TopologyError, match="valid: 4x4x12"):
        catalog.slice_shape("v5p-384", "2x8x12")


@pytest.mark.parametrize("accelerator", ["v5p-12800", "v5p-17920"])
def test_v5p_is_refused_above_its_largest_slice(accelerator):
    """Cloud TPU "TPU v5p": "The maximum v5p shape is 16x16x24 (6144 chips, 96 cubes)"; the pod
    has 8960 chips, but no larger slice can be scheduled (issue 54, point 4)."""
    with pytest.raises(catalog.CatalogError) as err:
        catalog.parse_accelerator(accelerator)
    message = str(err.value)
    assert "largest v5p slice is 16x16x24 (6144 chips, 96 cubes)" in message
    assert "https://cloud.google.com/tpu/docs/v5p" in message and "v5p-12288" in message
    with pytest.raises(catalog.CatalogError, match="largest v5p slice"):
        catalog.slice_shape("v5p-12800", "16x20x20")  # 100 cubes, whatever the shape


@pytest.mark.parametrize(
    ("generation", "smallest"),
    [("v4", "v4-16"), ("v5p", "v5p-16"), ("v5litepod", "v5litepod-8"), ("v6e", "v6e-8")],
)
def test_smallest_multi_host_shape(generation, smallest):
    shape = catalog.smallest_multi_host(catalog.GENERATIONS[generation])
    assert shape.accelerator == smallest and shape.multi_host
