"""Batch bucketing policies: which batch sizes get a captured graph, and which graph a batch uses.

Pure functions over ints, no torch. Every policy returns a sorted, duplicate-free list whose last
element is exactly ``max_batches``: the scheduler can produce any batch up to ``max_batches``, and a
batch that finds no graph would run eager, several times slower (docs/ascend.md).
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice, pairwise

from ..config import values as _values

__all__ = [
    "MAX_BATCHES_LIMIT",
    "BucketTypeError",
    "ascend_bucket",
    "ascend_capture_sizes",
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
        raise BucketTypeError(f"{what} must be an int, got {_values.show(value)}")
    return operator.index(value)  # type: ignore[call-overload]


def check_max_batches(max_batches: object) -> int:
    value = check_batch("max_batches", max_batches)
    if value < 1:
        raise ValueError(f"max_batches must be a positive int, got {value}")
    if value > MAX_BATCHES_LIMIT:
        raise ValueError(
            f"max_batches {_values.show(value)} is above {MAX_BATCHES_LIMIT}, vendor_graph's bound: lmdeploy's own "
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


def ascend_bucket(batch: int) -> int:
    """The Ascend three-tier bucket of ``batch``, not capped by ``max_batches``.

    Power of two up to 16, a multiple of 16 up to 256, a multiple of 256 above.
    """
    if type(batch) is not int:
        batch = check_batch("batch", batch)
    if batch < 1 or batch > MAX_BATCHES_LIMIT:
        raise ValueError(f"batch must be from 1 to {MAX_BATCHES_LIMIT} (vendor_graph's bound on max_batches), got "
                         f"{batch if batch < 1 else _values.show(batch)}")
    if batch <= 16:
        return 1 << (batch - 1).bit_length()
    if batch <= 256:
        return -(-batch // 16) * 16
    return -(-batch // 256) * 256


def ascend_capture_sizes(max_batches: int) -> list[int]:
    """Ascend's capture sizes: every three-tier size (:func:`ascend_bucket`) below ``max_batches``, then
    ``max_batches`` itself."""
    max_batches = check_max_batches(max_batches)
    sizes: list[int] = []
    size = 1
    while size < max_batches:
        sizes.append(size)
        size = ascend_bucket(size + 1)
    sizes.append(max_batches)
    return sizes


def _listed_text(sizes: list) -> str:
    """``sizes`` for a message: at most 64 of them, an int too long to print as its size."""
    shown = [str(s) if -(2**64) < s < 2**64 else _values.brief(s) for s in sizes[:64]]
    return "[" + ", ".join(shown) + (", ...]" if len(sizes) > 64 else "]")


def _listed(name: str, sizes: object) -> list:
    """The first ``MAX_BATCHES_LIMIT + 1`` items of ``sizes``, any iterable but a str, bytes or a mapping."""
    if isinstance(sizes, (str, bytes, bytearray, Mapping)) or not isinstance(sizes, Iterable):
        raise BucketTypeError(f"{name} must be a sequence of ints (a list, tuple, range or 1-d integer array), "
                              f"got {_values.show(sizes)}")
    try:
        return list(islice(sizes, MAX_BATCHES_LIMIT + 1))
    except TypeError:  # a 0-d array: Iterable, but not iterable
        raise BucketTypeError(f"{name} must be a sequence of ints, got {_values.show(sizes)}") from None


def explicit_capture_sizes(sizes: Iterable[int], max_batches: int) -> list[int]:
    """User-chosen sizes (lmdeploy's ``cudagraph_capture_batch_sizes``), normalised as lmdeploy does.

    Sorted and deduplicated, sizes above ``max_batches`` dropped, ``max_batches`` appended.
    """
    max_batches = check_max_batches(max_batches)
    given = _listed("cudagraph_capture_batch_sizes", sizes)
    if len(given) > MAX_BATCHES_LIMIT:
        raise ValueError(f"cudagraph_capture_batch_sizes has more than {MAX_BATCHES_LIMIT} sizes")
    not_ints = [_values.show(s) for s in given if not _is_int(s)]
    if not_ints:
        raise BucketTypeError(f"cudagraph_capture_batch_sizes must be positive ints, got {', '.join(not_ints[:3])}")
    values = [operator.index(s) for s in given]
    if not values:
        raise ValueError("cudagraph_capture_batch_sizes is empty; leave it unset to use the default sizes")
    low = [s for s in values if s < 1]
    if low:
        raise ValueError(f"cudagraph_capture_batch_sizes must be positive ints, got {_listed_text(low)}")
    kept = sorted({s for s in values if s <= max_batches})
    if not kept:
        raise ValueError(
            f"cudagraph_capture_batch_sizes {_listed_text(values)} are all above max_batch_size {max_batches}; "
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


def _check_capture_sizes(capture_sizes: object) -> list[int]:
    """``capture_sizes`` as a list of ints, checked: positive and strictly ascending."""
    given = _listed("capture_sizes", capture_sizes)
    if not given:
        raise ValueError("no capture sizes: graph mode has nothing captured to pad to")
    bad = [_values.show(s) for s in given if not _is_int(s)]
    if bad:
        raise BucketTypeError(f"capture sizes must be ints (argument capture_sizes), got {', '.join(bad[:3])}")
    sizes = [operator.index(s) for s in given]
    if sizes[0] < 1 or any(a >= b for a, b in pairwise(sizes)):
        raise ValueError(
            f"capture sizes {_listed_text(sizes)} are not positive and strictly "
            f"ascending; normalise them with explicit_capture_sizes(), as lmdeploy does cudagraph_capture_batch_sizes"
        )
    return sizes


# The sizes pad_to_bucket() checked last, a copy of them and the checked list of ints: a runner passes the same
# list every step, so the check runs once per runner, not once per decode step.
_checked: tuple[object, object, list[int]] = (None, None, [])


def pad_to_bucket(capture_sizes: Sequence[int], batch: int) -> int:
    """The smallest captured size that holds ``batch``.

    ``capture_sizes`` must be ints (numpy integers too: any sequence of them, an integer array included), sorted
    ascending without repeats (every policy here returns them so). Raises ``ValueError`` naming the sizes when
    ``batch`` is below 1 or above the largest size, and :class:`BucketTypeError` when ``batch`` or a size is not an
    integer or ``capture_sizes`` is not a sequence.
    """
    global _checked
    if type(batch) is not int:
        batch = check_batch("batch", batch)
    last, copy, sizes = _checked
    if capture_sizes is not last or type(capture_sizes) not in (list, tuple) or capture_sizes != copy:
        sizes = _check_capture_sizes(capture_sizes)
        copy = capture_sizes[:] if type(capture_sizes) in (list, tuple) else None  # type: ignore[index]
        _checked = (capture_sizes, copy, sizes)
    if batch < 1 or batch > sizes[-1]:
        raise ValueError(
            f"batch {_values.brief(batch)} has no graph: captured sizes are {_listed_text(sizes)} (1 <= batch <= "
            f"{_values.brief(sizes[-1])}); raise max_batch_size or run this step eager"
        )
    return sizes[bisect_left(sizes, batch)]
