"""Batch bucketing policies: which batch sizes get a captured graph, and which graph a batch uses.

Pure functions over ints, no torch. Every policy returns a sorted, duplicate-free list whose last
element is exactly ``max_batches``: the scheduler can produce any batch up to ``max_batches``, and a
batch that finds no graph would run eager (vllm-ascend #16049 measured 7.5x slower for that).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

__all__ = [
    "ascend_bucket",
    "ascend_capture_sizes",
    "capture_sizes",
    "cuda_capture_sizes",
    "explicit_capture_sizes",
    "pad_to_bucket",
]


def _check_max_batches(max_batches: int) -> None:
    if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1:
        raise ValueError(f"max_batches must be a positive int, got {max_batches!r}")


def ascend_bucket(batch: int) -> int:
    """The Ascend three-tier bucket of ``batch``, not capped by ``max_batches``.

    Power of two up to 16, a multiple of 16 up to 256, a multiple of 256 above.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if batch <= 16:
        return 1 << (batch - 1).bit_length()
    if batch <= 256:
        return -(-batch // 16) * 16
    return -(-batch // 256) * 256


def ascend_capture_sizes(max_batches: int) -> list[int]:
    """Every Ascend three-tier size below ``max_batches``, then ``max_batches`` itself."""
    _check_max_batches(max_batches)
    sizes: list[int] = []
    size = 1
    while size < max_batches:
        sizes.append(size)
        size = ascend_bucket(size + 1)
    sizes.append(max_batches)
    return sizes


def cuda_capture_sizes(max_batches: int) -> list[int]:
    """The sizes lmdeploy's CUDA runner captures: powers of two up to 256, then steps of 256.

    The same rule as ``CUDAGraphRunner``'s default in lmdeploy 0.12-0.18; Camb and MACA take the
    runner's own ``get_capture_batch_sizes()`` at run time, this copy serves planning and tests.
    """
    _check_max_batches(max_batches)
    sizes: list[int] = []
    size = 1
    while size <= min(256, max_batches):
        sizes.append(size)
        size *= 2
    sizes.extend(range(size, max_batches + 1, 256))
    if sizes[-1] != max_batches:
        sizes.append(max_batches)
    return sizes


def explicit_capture_sizes(sizes: Iterable[int], max_batches: int) -> list[int]:
    """User-chosen sizes (lmdeploy's ``cudagraph_capture_batch_sizes``), normalised as lmdeploy does.

    Sorted and deduplicated, sizes above ``max_batches`` dropped, ``max_batches`` appended.
    """
    _check_max_batches(max_batches)
    sizes = list(sizes)
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad:
        raise ValueError(f"cudagraph_capture_batch_sizes must be positive ints, got {bad}")
    if not sizes:
        raise ValueError("cudagraph_capture_batch_sizes is empty; leave it unset to use the default sizes")
    kept = sorted({s for s in sizes if s <= max_batches})
    if not kept:
        raise ValueError(
            f"cudagraph_capture_batch_sizes {sizes} are all above max_batch_size {max_batches}; "
            f"give at least one size <= {max_batches} (lmdeploy refuses this too)"
        )
    if kept[-1] != max_batches:
        kept.append(max_batches)
    return kept


def capture_sizes(vendor: str, max_batches: int, explicit: Iterable[int] | None = None) -> list[int]:
    """The capture sizes for ``vendor``: explicit sizes when given, else the vendor's default rule."""
    if explicit is not None:
        return explicit_capture_sizes(explicit, max_batches)
    if vendor == "ascend":
        return ascend_capture_sizes(max_batches)
    return cuda_capture_sizes(max_batches)


def pad_to_bucket(capture_sizes: Sequence[int], batch: int) -> int:
    """The smallest captured size that holds ``batch``.

    ``capture_sizes`` must be sorted ascending (every policy here returns them so). Raises
    ``ValueError`` naming the sizes when ``batch`` is below 1 or above the largest size.
    """
    if not capture_sizes:
        raise ValueError("no capture sizes: graph mode has nothing captured to pad to")
    if batch < 1 or batch > capture_sizes[-1]:
        raise ValueError(
            f"batch {batch} has no graph: captured sizes are {list(capture_sizes)} "
            f"(1 <= batch <= {capture_sizes[-1]}); raise max_batch_size or run this step eager"
        )
    return capture_sizes[bisect_left(capture_sizes, batch)]
