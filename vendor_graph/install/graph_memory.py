"""Graph memory kept out of lmdeploy's KV cache: lmdeploy's executor sizes the cache from each rank's free
memory before any graph exists (``ExecutorBase._reserve_runtime_mem``, 0.16-0.18), so the wrapper here takes
:func:`~vendor_graph.sizing.capacity.reservation` out of that memory first and records it on the cache config
the workers get (:data:`~vendor_graph.sizing.capacity.RESERVED_ATTR`). How much: ``docs/capacity.md``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from ..sizing import capacity
from ..sizing.capacity import CapturePlanError
from . import patching

logger = logging.getLogger("vendor_graph")

EXECUTOR_MODULE = "lmdeploy.pytorch.engine.executor.base"
EXECUTOR_CLASS = "ExecutorBase"


def _spec(profile: Any) -> Any:
    """The vendor's buffer spec on this lmdeploy, None where it cannot be had."""
    try:
        return profile.spec
    except Exception:  # noqa: BLE001 - the estimate then goes without the buffer model
        return None


def wrap_reserve_runtime_mem(original: Callable, profile: Any) -> Callable:
    """lmdeploy's ``ExecutorBase._reserve_runtime_mem``, then the reservation for the graphs ``profile``'s runners
    will capture taken from every rank's free memory before the KV cache is sized from it."""
    if getattr(original, "_vendor_graph_capacity", False):
        return original

    @functools.wraps(original)
    def _reserve_runtime_mem(self, free_mems, cache_plan, *args, **kwargs):
        free = original(self, free_mems, cache_plan, *args, **kwargs)
        cache_config = self.cache_config
        if getattr(getattr(self, "backend_config", None), "eager_mode", False):
            setattr(cache_config, capacity.RESERVED_ATTR, 0)
            return free
        default = profile.capture_sizes(cache_config.max_batches)
        try:
            sizes = capacity.resolve_capture_plan(profile.name, cache_config.max_batches, default,
                                                  getattr(cache_config, capacity.LMDEPLOY_SIZES, None),
                                                  quiet=True).sizes
        except CapturePlanError:
            sizes = None  # the runner raises it where it is built
        res = capacity.reservation(cache_config.max_batches, spec=_spec(profile), sizes=sizes,
                                   num_blocks=capacity.planned_blocks(cache_config, free, cache_plan))
        setattr(cache_config, capacity.RESERVED_ATTR, res.bytes)
        if not res.bytes:
            logger.info("vendor_graph: %s", res.detail)
            return free
        if min(free) - res.bytes <= 0:
            raise CapturePlanError(
                f"the graphs' reservation of {res.bytes / 2**20:.1f} MiB ({res.detail}) is more than the "
                f"{min(free) / 2**20:.1f} MiB left for the KV cache; lower {capacity.MEMORY_ENV}, max_batch_size or "
                f"the number of capture sizes")
        logger.warning("vendor_graph: %s, taken from the memory the KV cache is sized from", res.detail)
        return [f - res.bytes for f in free]

    _reserve_runtime_mem._vendor_graph_capacity = True
    _reserve_runtime_mem.__module__ = __name__
    return _reserve_runtime_mem


def install(activation: patching.Activation, profile: Any) -> None:
    """Wrap lmdeploy's ``ExecutorBase._reserve_runtime_mem`` for ``profile`` (the vendor's ``VendorProfile``), now or
    when its module is imported."""

    def patch(module: Any) -> None:
        executor = getattr(module, EXECUTOR_CLASS, None)
        original = getattr(executor, "_reserve_runtime_mem", None) if executor is not None else None
        if original is None:
            logger.warning("vendor_graph: this lmdeploy's %s has no _reserve_runtime_mem: no graph memory is kept "
                           "out of the KV cache; lower cache_max_entry_count to leave room for the graphs",
                           EXECUTOR_CLASS)
            return
        if getattr(original, "_vendor_graph_capacity", False):
            return
        activation.add(patching.Patch(executor, "_reserve_runtime_mem", wrap_reserve_runtime_mem(original, profile)))

    patching.when_imported(EXECUTOR_MODULE, patch)


__all__ = ["EXECUTOR_CLASS", "EXECUTOR_MODULE", "install", "wrap_reserve_runtime_mem"]
