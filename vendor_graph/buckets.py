"""Batch bucketing policies: which batch sizes get a captured graph, and which graph a batch uses.

Pure functions over ints, no torch. Every policy returns a sorted, duplicate-free list whose last
element is exactly ``max_batches``: the scheduler can produce any batch up to ``max_batches``, and a
batch that finds no graph would run eager (vllm-ascend #16049 measured 7.5x slower for that).
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from itertools import islice, pairwise

__all__ = [
    "MAX_BATCHES_LIMIT",
    "BucketTypeError",
    "capture_sizes",
    "check_batch",
    "check_max_batches",
    "cuda_capture_sizes",
    "explicit_capture_sizes",
    "pad_to_bucket",
]

# lmdeploy sets no upper bound on max_batch_size; its own defaults are 128-1024 (1024 on H100/H200, 256 on
# Ascend, Camb and MACA). 64x the largest default is far beyond any deployment (each live sequence holds
# at least one KV-cache block) and keeps every plan to a few hundred graphs.
MAX_BATCHES_LIMIT = 65536


class BucketTypeError(TypeError, ValueError):
    """A batch size that is not an integer (a float, NaN, a bool, None). Also a ``ValueError``, which these
    functions raised for such values before."""


def _is_int(value: object) -> bool:
    """An int, or an integer with ``__index__`` (a numpy int); never a bool."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def check_batch(what: str, value: object) -> int:
    if not _is_int(value):
        raise BucketTypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")
    return operator.index(value)  # type: ignore[call-overload]


def check_max_batches(max_batches: object) -> int:
    value = check_batch("max_batches", max_batches)
    if value < 1:
        raise ValueError(f"max_batches must be a positive int, got {max_batches!r}")
    if value > MAX_BATCHES_LIMIT:
        raise ValueError(
            f"max_batches {value} is above {MAX_BATCHES_LIMIT}, vendor_graph's bound: lmdeploy's own "
            f"max_batch_size defaults are 128-1024 and every live sequence needs a KV-cache block"
        )
    return value


def cuda_capture_sizes(max_batches: int) -> list[int]:
    """The sizes lmdeploy's CUDA runner captures: powers of two up to 256, then steps of 256.

    The same rule as ``CUDAGraphRunner``'s default in lmdeploy 0.12-0.18; Camb and MACA take the
    runner's own ``get_capture_batch_sizes()`` at run time, this copy serves planning and tests.
    """
    max_batches = check_max_batches(max_batches)
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
    max_batches = check_max_batches(max_batches)
    given = list(islice(sizes, MAX_BATCHES_LIMIT + 1))
    if len(given) > MAX_BATCHES_LIMIT:
        raise ValueError(f"cudagraph_capture_batch_sizes has more than {MAX_BATCHES_LIMIT} sizes")
    not_ints = [s for s in given if not _is_int(s)]
    if not_ints:
        raise BucketTypeError(f"cudagraph_capture_batch_sizes must be positive ints, got {not_ints}")
    values = [operator.index(s) for s in given]
    if not values:
        raise ValueError("cudagraph_capture_batch_sizes is empty; leave it unset to use the default sizes")
    low = [s for s in values if s < 1]
    if low:
        raise ValueError(f"cudagraph_capture_batch_sizes must be positive ints, got {low}")
    kept = sorted({s for s in values if s <= max_batches})
    if not kept:
        raise ValueError(
            f"cudagraph_capture_batch_sizes {given} are all above max_batch_size {max_batches}; "
            f"give at least one size <= {max_batches} (lmdeploy refuses this too)"
        )
    if kept[-1] != max_batches:
        kept.append(max_batches)
    return kept


def capture_sizes(rule: Callable[[int], list[int]], max_batches: int,
                  explicit: Iterable[int] | None = None) -> list[int]:
    """Explicit sizes when given, else ``rule(max_batches)``: a vendor's default rule."""
    if explicit is not None:
        return explicit_capture_sizes(explicit, max_batches)
    return rule(max_batches)


def _check_capture_sizes(capture_sizes: Sequence[int]) -> None:
    if not capture_sizes:
        raise ValueError("no capture sizes: graph mode has nothing captured to pad to")
    bad = [s for s in capture_sizes if isinstance(s, bool) or not isinstance(s, int)]
    if bad:
        raise BucketTypeError(f"capture sizes must be ints, got {bad} in {list(capture_sizes)}")
    if capture_sizes[0] < 1 or any(a >= b for a, b in pairwise(capture_sizes)):
        raise ValueError(
            f"capture sizes {list(capture_sizes)} are not positive and strictly ascending; normalise them "
            f"with explicit_capture_sizes(), as lmdeploy does cudagraph_capture_batch_sizes"
        )


# The sizes pad_to_bucket() checked last and a copy of them: a runner passes the same list every step,
# so the check runs once per runner, not once per decode step.
_checked: tuple[object, object] = (None, None)


def pad_to_bucket(capture_sizes: Sequence[int], batch: int) -> int:
    """The smallest captured size that holds ``batch``.

    ``capture_sizes`` must be ints, sorted ascending without repeats (every policy here returns them so).
    Raises ``ValueError`` naming the sizes when ``batch`` is below 1 or above the largest size, and
    :class:`BucketTypeError` when ``batch`` is not an integer.
    """
    global _checked
    if type(batch) is not int:
        batch = check_batch("batch", batch)
    last, copy = _checked
    if capture_sizes is not last or capture_sizes != copy:
        _check_capture_sizes(capture_sizes)
        _checked = (capture_sizes, capture_sizes[:])
    if batch < 1 or batch > capture_sizes[-1]:
        raise ValueError(
            f"batch {batch} has no graph: captured sizes are {list(capture_sizes)} "
            f"(1 <= batch <= {capture_sizes[-1]}); raise max_batch_size or run this step eager"
        )
    return capture_sizes[bisect_left(capture_sizes, batch)]
