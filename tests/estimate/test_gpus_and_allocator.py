"""The GPU catalogue and the caching-allocator model: pure, no torch."""

import pytest

from oom_lsp.estimate.allocator import MIB, simulate
from oom_lsp.estimate.gpus import CATALOGUE, UnknownGpuError, custom_gpu, find_gpu
from oom_lsp.units import format_bytes

GIB = 2**30


@pytest.mark.parametrize(
    ("name", "expected", "gib"),
    [
        ("RTX 3090", "GeForce RTX 3090", 24),
        ("3090", "GeForce RTX 3090", 24),
        ("nvidia geforce rtx-4090", "GeForce RTX 4090", 24),
        ("A100 80GB", "A100 80GB", 80),
        ("a100", "A100 40GB", 40),
        ("H100 SXM", "H100 SXM", 80),
        ("L4", "L4", 24),
        ("t4", "T4", 16),
        ("V100 16GB", "V100 16GB", 16),
        ("V100 32GB", "V100 32GB", 32),
        ("A10G", "A10G", 24),
        ("RTX 4060 Ti 16GB", "GeForce RTX 4060 Ti 16GB", 16),
        ("MI300X", "Instinct MI300X", 192),
        ("Apple M2 Max 96GB", "Apple M2 Max 96GB", 96),
    ],
)
def test_lookup_ignores_case_spaces_and_vendor_words(name, expected, gib):
    gpu = find_gpu(name)
    assert (gpu.name, gpu.memory) == (expected, gib * GIB)


def test_catalogue_covers_consumer_workstation_and_datacenter_cards():
    assert len(CATALOGUE) >= 25
    assert {gpu.vendor for gpu in CATALOGUE} >= {"nvidia", "amd", "apple"}
    names = {gpu.name for gpu in CATALOGUE}
    assert {"GeForce RTX 3090", "RTX A6000", "H100 SXM"} <= names


def test_unknown_gpu_suggests_the_closest_names():
    with pytest.raises(UnknownGpuError, match="did you mean 'GeForce RTX 3090'"):
        find_gpu("RTX 3909")


def test_memory_sizes_reuse_the_config_parser():
    assert custom_gpu("24GiB").memory == 24 * GIB
    assert custom_gpu("24 GB").memory == 24 * 10**9
    with pytest.raises(ValueError):
        custom_gpu("lots")
    assert format_bytes(1536 * MIB) == "1.50 GiB"


def test_small_allocations_share_one_2mib_segment():
    model = simulate([[i, 100 * 1024] for i in range(10)])
    assert model.peak_reserved == 2 * MIB
    assert model.peak_allocated == 10 * 100 * 1024


def test_mid_sized_requests_get_20mib_segments_and_large_ones_are_rounded_to_2mib():
    assert simulate([[0, 3 * MIB]]).peak_reserved == 20 * MIB
    assert simulate([[0, 11 * MIB + 1]]).peak_reserved == 12 * MIB


def test_freed_blocks_merge_and_are_reused_without_new_segments():
    events = [[0, 6 * MIB], [1, 6 * MIB], [0, -6 * MIB], [1, -6 * MIB], [2, 12 * MIB]]
    model = simulate(events)
    assert model.peak_reserved == 20 * MIB  # the 12 MiB request reuses the merged 20 MiB segment
    assert model.allocated == 12 * MIB


def test_blocks_of_different_segments_do_not_merge():
    # Two 12 MiB segments, both freed: a 20 MiB request fits neither and needs a third.
    events = [[0, 12 * MIB], [1, 12 * MIB], [0, -12 * MIB], [1, -12 * MIB], [2, 20 * MIB]]
    assert simulate(events).peak_reserved == 44 * MIB
