"""Ascend's capture sizes: the three-tier rule (powers of two to 16, multiples of 16 to 256, of 256 above)."""

from __future__ import annotations

from ...config import values as _values
from ...sizing.buckets import MAX_BATCHES_LIMIT, check_batch, check_max_batches

__all__ = ["ascend_bucket", "ascend_capture_sizes"]


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
    """Every Ascend three-tier size below ``max_batches``, then ``max_batches`` itself."""
    max_batches = check_max_batches(max_batches)
    sizes: list[int] = []
    size = 1
    while size < max_batches:
        sizes.append(size)
        size = ascend_bucket(size + 1)
    sizes.append(max_batches)
    return sizes
