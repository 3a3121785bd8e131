import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vendor_graph import vendors
from vendor_graph.sizing.buckets import (
    MAX_BATCHES_LIMIT,
    BucketTypeError,
    ascend_bucket,
    ascend_capture_sizes,
    capture_sizes,
    cuda_capture_sizes,
    explicit_capture_sizes,
    pad_to_bucket,
)

ASCEND_TABLE = {
    1: [1],
    16: [1, 2, 4, 8, 16],
    17: [1, 2, 4, 8, 16, 17],
    48: [1, 2, 4, 8, 16, 32, 48],
    256: [1, 2, 4, 8, 16] + list(range(32, 257, 16)),
    257: [1, 2, 4, 8, 16] + list(range(32, 257, 16)) + [257],
    1000: [1, 2, 4, 8, 16] + list(range(32, 257, 16)) + [512, 768, 1000],
}

CUDA_TABLE = {
    1: [1],
    16: [1, 2, 4, 8, 16],
    17: [1, 2, 4, 8, 16, 17],
    48: [1, 2, 4, 8, 16, 32, 48],
    256: [1, 2, 4, 8, 16, 32, 64, 128, 256],
    257: [1, 2, 4, 8, 16, 32, 64, 128, 256, 257],
    1000: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1000],
}


@pytest.mark.parametrize("max_batches", sorted(ASCEND_TABLE))
def test_ascend_table(max_batches):
    assert ascend_capture_sizes(max_batches) == ASCEND_TABLE[max_batches]


@pytest.mark.parametrize("max_batches", sorted(CUDA_TABLE))
def test_cuda_table_matches_lmdeploy_rule(max_batches):
    assert cuda_capture_sizes(max_batches) == CUDA_TABLE[max_batches]


def test_cuda_rule_is_lmdeploys_own():
    runner_module = pytest.importorskip("lmdeploy.pytorch.backends.cuda.graph_runner")
    impl = getattr(runner_module, "_get_capture_batch_size_impl", None)
    if impl is None:  # 0.18: the package re-exports the runner; the rule lives in runner.py
        impl = pytest.importorskip("lmdeploy.pytorch.backends.cuda.graph_runner.runner")._get_capture_batch_size_impl
    for max_batches in [*CUDA_TABLE, 3, 100, 511, 512, 513, 2048]:
        assert cuda_capture_sizes(max_batches) == list(impl(max_batches))


@pytest.mark.parametrize(
    "batch,bucket",
    [(1, 1), (3, 4), (5, 8), (16, 16), (17, 32), (33, 48), (255, 256), (256, 256), (257, 512), (700, 768)],
)
def test_ascend_bucket_three_tiers(batch, bucket):
    assert ascend_bucket(batch) == bucket


def test_explicit_sizes_honoured_like_lmdeploy():
    assert explicit_capture_sizes([8, 1, 8, 300, 4], 64) == [1, 4, 8, 64]
    assert explicit_capture_sizes([64], 64) == [64]
    assert capture_sizes(ascend_capture_sizes, 64, explicit=[3, 5]) == [3, 5, 64]


def test_explicit_sizes_agree_with_lmdeploy_normalisation():
    config = pytest.importorskip("lmdeploy.pytorch.config")
    for sizes, max_batches in [([8, 1, 8, 300, 4], 64), ([2], 2), ([7, 3], 5), ([1000, 3], 16)]:
        assert explicit_capture_sizes(sizes, max_batches) == config.normalize_cudagraph_capture_batch_sizes(
            list(sizes), max_batches)


@pytest.mark.parametrize("bad", [[], [0], [-2, 4], [2.5], [True], [17, 32]])
def test_explicit_sizes_reject_bad_values(bad):
    with pytest.raises(ValueError, match="cudagraph_capture_batch_sizes"):
        explicit_capture_sizes(bad, 16)


@pytest.mark.parametrize("bad", [0, -1, 2.0, None, True])
def test_max_batches_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="max_batches"):
        ascend_capture_sizes(bad)


def test_pad_to_bucket_errors_name_the_sizes():
    sizes = ascend_capture_sizes(48)
    with pytest.raises(ValueError, match=r"batch 49 has no graph: captured sizes are \[1, 2, 4, 8, 16, 32, 48\]"):
        pad_to_bucket(sizes, 49)
    with pytest.raises(ValueError, match=r"batch 0 has no graph: captured sizes are \[1, 2"):
        pad_to_bucket(sizes, 0)
    with pytest.raises(ValueError, match="no capture sizes"):
        pad_to_bucket([], 1)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(max_batches=st.integers(1, 5000), data=st.data())
def test_policies_properties(max_batches, data):
    for sizes in (ascend_capture_sizes(max_batches), cuda_capture_sizes(max_batches)):
        assert sizes == sorted(set(sizes))
        assert sizes[-1] == max_batches and max(sizes) <= max_batches
        batch = data.draw(st.integers(1, max_batches))
        bucket = pad_to_bucket(sizes, batch)
        assert bucket in sizes and bucket >= batch
        # the smallest such size: nothing captured lies between the batch and its bucket
        assert not [s for s in sizes if batch <= s < bucket]
    ascend = ascend_capture_sizes(max_batches)
    assert ascend[:-1] == [s for s in ascend[:-1] if ascend_bucket(s) == s]
    assert pad_to_bucket(ascend, data.draw(st.integers(1, max_batches))) in ascend


@settings(max_examples=200, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(1, 600), min_size=1, max_size=12), max_batches=st.integers(1, 512))
def test_explicit_sizes_properties(sizes, max_batches):
    if min(sizes) > max_batches:
        with pytest.raises(ValueError, match="all above max_batch_size"):
            explicit_capture_sizes(sizes, max_batches)
        return
    got = explicit_capture_sizes(sizes, max_batches)
    assert got == sorted(set(got)) and got[-1] == max_batches
    assert set(got) == {s for s in sizes if s <= max_batches} | {max_batches}


class Index:
    """An integer that is not an int (as a numpy int is): usable through ``__index__``."""

    def __init__(self, value: int):
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.mark.parametrize("bad", [2.5, 4.0, float("nan"), float("inf"), True, False, None, "4"])
def test_batch_must_be_an_int(bad):
    sizes = ascend_capture_sizes(48)
    with pytest.raises(TypeError, match="batch must be an int"):
        pad_to_bucket(sizes, bad)
    with pytest.raises(TypeError, match="batch must be an int"):
        ascend_bucket(bad)


@pytest.mark.parametrize("bad", [2.5, float("nan"), True, None])
def test_max_batches_type_errors_are_type_errors(bad):
    for policy in (ascend_capture_sizes, cuda_capture_sizes):
        with pytest.raises(TypeError, match="max_batches must be an int"):
            policy(bad)
    with pytest.raises(TypeError, match="max_batches"):
        explicit_capture_sizes([4], bad)
    with pytest.raises(TypeError, match="max_batches"):
        capture_sizes(ascend_capture_sizes, bad)


def test_integers_with_index_are_accepted():
    assert pad_to_bucket([1, 2, 4], Index(3)) == 4
    assert ascend_bucket(Index(17)) == 32
    assert ascend_capture_sizes(Index(16)) == [1, 2, 4, 8, 16]
    assert explicit_capture_sizes([Index(8), 2], Index(8)) == [2, 8]


@pytest.mark.parametrize("bad", [[4, 2, 8], [1, 2, 2, 4], [0, 2], [-1, 4]])
def test_pad_to_bucket_refuses_sizes_not_strictly_ascending(bad):
    with pytest.raises(ValueError, match="not positive and strictly ascending"):
        pad_to_bucket(bad, 3)


@pytest.mark.parametrize("bad", [[1, 2.5, 4], [1, True, 4], [1, float("nan")], [1, None]])
def test_pad_to_bucket_refuses_sizes_that_are_not_ints(bad):
    with pytest.raises(TypeError, match="capture sizes must be ints"):
        pad_to_bucket(bad, 1)


def test_pad_to_bucket_checks_a_list_again_once_it_changed():
    sizes = [1, 2, 4, 8]
    assert pad_to_bucket(sizes, 3) == 4 and pad_to_bucket(sizes, 3) == 4
    sizes[1] = 16
    with pytest.raises(ValueError, match="strictly ascending"):
        pad_to_bucket(sizes, 3)
    sizes[1:] = [2, 4.5, 8]
    with pytest.raises(TypeError, match="capture sizes must be ints"):
        pad_to_bucket(sizes, 3)
    assert pad_to_bucket((1, 3, 9), 4) == 9


@pytest.mark.parametrize("bad", [[2.5], [4, 2.0], [True], [float("nan")], ["8"]])
def test_explicit_sizes_that_are_not_ints_are_type_errors(bad):
    with pytest.raises(TypeError, match="cudagraph_capture_batch_sizes must be positive ints"):
        explicit_capture_sizes(bad, 16)


def test_huge_max_batches_fails_fast_with_the_reason():
    start = time.perf_counter()
    for policy in (ascend_capture_sizes, cuda_capture_sizes, lambda m: explicit_capture_sizes([4], m),
                   lambda m: capture_sizes(cuda_capture_sizes, m)):
        for huge in (MAX_BATCHES_LIMIT + 1, 100_000_000, 10**18):
            with pytest.raises(ValueError, match=f"above {MAX_BATCHES_LIMIT}.*max_batch_size defaults"):
                policy(huge)
    with pytest.raises(ValueError, match=f"more than {MAX_BATCHES_LIMIT} sizes"):
        explicit_capture_sizes(range(1, 10**12), 16)
    assert time.perf_counter() - start < 5
    assert ascend_capture_sizes(MAX_BATCHES_LIMIT)[-1] == MAX_BATCHES_LIMIT
    assert len(cuda_capture_sizes(MAX_BATCHES_LIMIT)) < 300


def test_each_vendor_has_its_rule():

    profiles = {v: vendors.profile(v) for v in ("ascend", "camb", "maca", "cuda")}
    assert profiles["ascend"].capture_sizes(48) == ASCEND_TABLE[48]
    assert all(profiles[v].capture_sizes(1000) == CUDA_TABLE[1000] for v in ("camb", "maca", "cuda"))
    assert profiles["camb"].capture_sizes(16, [3, 5]) == [3, 5, 16]


def test_type_errors_are_still_value_errors_for_existing_callers():
    assert issubclass(BucketTypeError, TypeError) and issubclass(BucketTypeError, ValueError)
