"""The copy primitives both fills use: one ``torch._foreach_copy_`` per call (per-pair ``copy_`` where a
device's torch lacks that kernel), host buffers copied apart, host sources staged through pinned memory.
Why one call per step: docs/buffers.md."""

from __future__ import annotations

import functools
import logging
import sys

import torch

logger = logging.getLogger("vendor_graph")
# device types whose torch build has no _foreach_copy_ kernel (found at the first fill): copied per pair
_NO_FOREACH: set[str] = set()


def foreach_missing(device: str) -> bool:
    """Whether an earlier copy found ``device``'s torch without a ``_foreach_copy_`` kernel."""
    return device in _NO_FOREACH


def copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor], device: str, non_blocking: bool = False) -> None:
    """``torch._foreach_copy_``, or one ``copy_`` per pair where the ``device``'s torch lacks that kernel."""
    if device not in _NO_FOREACH:
        try:
            torch._foreach_copy_(dsts, srcs, non_blocking=non_blocking)
            return
        except NotImplementedError as exc:
            _NO_FOREACH.add(device)
            logger.warning("vendor_graph: torch._foreach_copy_ is not implemented for %r (%s); graph buffer "
                           "fills fall back to one copy per buffer (more device operations per step)",
                           device, str(exc).splitlines()[0])
    for dst, src in zip(dsts, srcs, strict=True):
        dst.copy_(src, non_blocking=non_blocking)


def copy_host(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """Host buffers (no device work): one pair is cheaper as a plain ``copy_`` than as a foreach."""
    if len(dsts) == 1:
        dsts[0].copy_(srcs[0])
    else:
        copy_all(dsts, srcs, "cpu")


@functools.lru_cache(maxsize=1)
def pinned_staging_available() -> bool:
    """Whether host sources can be staged through pinned (page-locked) memory on this platform.

    True where an accelerator runtime with pinned memory is present (``torch.cuda.is_available()``, or a
    loaded ``torch_npu`` / ``torch_mlu`` that says it is available) and a pinned allocation succeeds.
    False where a pinned allocation fails (CPU-only torch, the simulator): there host sources are copied
    from pageable memory, blocking. Cached for the process (``pinned_staging_available.cache_clear()``).
    """
    candidates = []
    if torch.cuda.is_available():
        candidates.append(torch.cuda)
    for name in ("npu", "mlu"):
        module = getattr(torch, name, None)
        if module is None:
            continue
        if f"torch_{name}" not in sys.modules:  # a vendor module only counts with its runtime loaded
            continue
        available = getattr(module, "is_available", None)
        if callable(available) and available():
            candidates.append(module)
    if not candidates:
        return False
    try:
        torch.empty(1, pin_memory=True)
    except Exception:  # noqa: BLE001 - no pinned allocator here: fall back to pageable copies
        return False
    return True


def stage(src: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
    """A host source bound for a device buffer: a pinned copy in the buffer's dtype where the platform
    has pinned memory (returns it and True), else the source itself (False)."""
    if pinned_staging_available():
        staged = torch.empty(src.shape, dtype=dtype, pin_memory=True)
        staged.copy_(src)
        return staged, True
    return src, False
