"""Graphs sized to the workload and to the memory: which batch sizes a runner captures, and the device
memory kept out of lmdeploy's KV cache for the graphs.

Capture sizes, in order of precedence (:func:`resolve_capture_plan`, run where a runner is built):

1. Explicit sizes: lmdeploy's ``cudagraph_capture_batch_sizes`` and ``VENDOR_GRAPH_CAPTURE_SIZES``. Both
   given: they must be the same sizes once normalised as lmdeploy does (sorted, repeats removed, sizes
   above ``max_batch_size`` dropped, ``max_batch_size`` added), else :class:`CapturePlanError`.
2. ``VENDOR_GRAPH_PLAN=auto``: the sizes that minimise padded tokens for the batch histogram the previous
   run wrote to ``VENDOR_GRAPH_STATS_FILE`` (every rank's file merged, so every rank fits the same plan),
   at most ``VENDOR_GRAPH_PLAN_MAX_GRAPHS`` graphs (default: as many as the vendor's default sizes).
   With explicit sizes as well it is a :class:`CapturePlanError`. No file yet (a first run): the
   default sizes, said in the log; this run's histogram is then written for the next.
3. The vendor's default sizes.

Graph memory (:func:`reservation`, run by lmdeploy's executor, which sizes the KV cache before any graph
exists: :mod:`vendor_graph.install.graph_memory` wraps its ``_reserve_runtime_mem``): ``VENDOR_GRAPH_GRAPH_MEMORY``
bytes, or with ``auto`` (the default) what the previous run's graphs took (``graph_memory_bytes`` of its
stats file: the most the graphs alive at one time took to capture, measured as the allocator's growth around
each capture; graphs captured again after a reset or by a rebuilt runner do not add to it) scaled to this
``max_batch_size`` and given :data:`MARGIN`; nothing without a stats file.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import settings
from ..config import values as _values
from . import buckets

logger = logging.getLogger("vendor_graph")

SIZES_ENV = settings.variable("capture_sizes")
PLAN_ENV = settings.variable("plan")
MAX_GRAPHS_ENV = settings.variable("plan_max_graphs")
STATS_ENV = settings.variable("stats_file")
MEMORY_ENV = settings.variable("graph_memory")
LMDEPLOY_SIZES = "cudagraph_capture_batch_sizes"

DEFAULT, EXPLICIT_LMDEPLOY, EXPLICIT_ENV, AUTO = "default", LMDEPLOY_SIZES, SIZES_ENV, f"{PLAN_ENV}=auto"
# Kept on top of what the previous run's captures took: allocator block rounding, a pool's fragmentation
# and a workload whose largest graph was captured with shorter sequences.
MARGIN = 1.25


class _Quiet:
    def info(self, *args: Any) -> None:
        pass

    warning = info


class CapturePlanError(ValueError):
    """Capture-size settings that contradict each other, or a stats file a plan cannot be made from."""


@dataclass(frozen=True)
class CapturePlan:
    """The sizes a runner captures and where they came from (the stats file records both)."""

    sizes: tuple[int, ...]
    source: str  # DEFAULT, EXPLICIT_LMDEPLOY, EXPLICIT_ENV or AUTO
    max_batches: int
    num_layers: int = 0
    num_blocks: int = 0  # KV-cache blocks: the block table columns of every graph
    # (batch, query length) -> steps read from the previous run's stats file: written again with this run's.
    carried: dict[tuple[int, int], int] = field(default_factory=dict)
    reserved_bytes: int | None = None
    note: str | None = None


def _check_current(current: Any) -> None:
    if current is not None and not isinstance(current, settings.Settings):
        raise TypeError(f"current must be a vendor_graph.config.settings.Settings (settings.parse() gives one) or "
                        f"None, got {_values.show(current)}")


def _normalised(sizes: Sequence[int], max_batches: int, where: str) -> tuple[int, ...]:
    try:
        return tuple(buckets.explicit_capture_sizes(sizes, max_batches))
    except ValueError as exc:
        raise CapturePlanError(f"{where}: {exc}") from None


def resolve_capture_plan(vendor: str, max_batches: int, default_sizes: Sequence[int],
                         lmdeploy_sizes: Sequence[int] | None, *, num_layers: int = 0, num_blocks: int = 0,
                         reserved_bytes: int | None = None, current: settings.Settings | None = None,
                         quiet: bool = False) -> CapturePlan:
    """The capture plan of a runner of ``vendor`` (see the module docstring for the precedence);
    ``quiet``: log nothing (the executor's look ahead at what its runners will capture)."""
    _check_current(current)
    if not isinstance(vendor, str):
        raise TypeError(f"vendor must be a vendor name (a str such as 'ascend'), got {_values.show(vendor)}")
    current = current or settings.current()
    max_batches = buckets.check_max_batches(max_batches)
    default_sizes = _values.whole_sequence("default_sizes", default_sizes, limit=buckets.MAX_BATCHES_LIMIT)
    num_layers = _values.whole("num_layers", num_layers)
    num_blocks = _values.whole("num_blocks", num_blocks)
    if reserved_bytes is not None:
        reserved_bytes = _values.whole("reserved_bytes", reserved_bytes)
    reserved = reserved_bytes
    explicit: list[tuple[str, tuple[int, ...]]] = []
    if lmdeploy_sizes is not None:
        explicit.append((EXPLICIT_LMDEPLOY, _normalised(lmdeploy_sizes, max_batches, LMDEPLOY_SIZES)))
    if current.capture_sizes is not None:
        explicit.append((EXPLICIT_ENV, _normalised(current.capture_sizes, max_batches, SIZES_ENV)))
    if current.plan == "auto" and explicit:
        raise CapturePlanError(
            f"{PLAN_ENV}=auto fits the capture sizes to the stats file, but {explicit[0][0]} also gives them "
            f"({list(explicit[0][1])}); unset one. To keep some sizes in a fitted plan, run vendor-graph plan "
            f"--from-stats FILE --capture-sizes ... --json > plan.json and set {SIZES_ENV}=plan.json")
    if len(explicit) == 2 and explicit[0][1] != explicit[1][1]:
        raise CapturePlanError(
            f"{LMDEPLOY_SIZES} {list(explicit[0][1])} and {SIZES_ENV} {list(explicit[1][1])} (both normalised to "
            f"max_batch_size {max_batches}) differ; give the sizes in one place, or the same sizes in both")
    if explicit:
        source, sizes = explicit[0]  # two are the same sizes by now
        return CapturePlan(sizes, source, max_batches, num_layers=num_layers, num_blocks=num_blocks,
                           reserved_bytes=reserved)
    default = tuple(default_sizes)
    if current.plan != "auto":
        return CapturePlan(default, DEFAULT, max_batches, num_layers=num_layers, num_blocks=num_blocks,
                           reserved_bytes=reserved)
    plan = _auto_plan(vendor, max_batches, default, num_layers, reserved, current, quiet)
    return dataclasses.replace(plan, num_blocks=num_blocks)


def _auto_plan(vendor: str, max_batches: int, default: tuple[int, ...], num_layers: int, reserved: int | None,
               current: settings.Settings, quiet: bool) -> CapturePlan:
    from . import planning
    from .workload import stats_files

    label = f"vendor_graph.{vendor}"
    log = _Quiet() if quiet else logger
    if not current.stats_file:
        raise CapturePlanError(f"{PLAN_ENV}=auto needs {STATS_ENV}=PATH: the file the previous run wrote its batch "
                               f"histogram to (and this run writes to)")
    files = stats_files(current.stats_file)
    if not files:
        note = (f"{PLAN_ENV}=auto: no stats file at {current.stats_file} yet (a first run): capturing the default "
                f"sizes {list(default)}; this run's batch histogram is written there for the next")
        log.info("%s: %s", label, note)
        return CapturePlan(default, DEFAULT, max_batches, num_layers=num_layers, reserved_bytes=reserved, note=note)
    try:
        workload = planning.load_workload(files)
    except planning.PlanError as exc:
        raise CapturePlanError(f"{PLAN_ENV}=auto: {exc}") from None
    if workload.vendor != vendor or workload.max_batches != max_batches:
        note = (f"{PLAN_ENV}=auto: {', '.join(map(str, files))} was recorded for vendor {workload.vendor} with "
                f"max_batch_size {workload.max_batches}, not {vendor} with {max_batches}: capturing the default "
                f"sizes; this run's histogram replaces it")
        log.warning("%s: %s", label, note)
        return CapturePlan(default, DEFAULT, max_batches, num_layers=num_layers, reserved_bytes=reserved, note=note)
    if not workload.decode_steps:
        note = (f"{PLAN_ENV}=auto: {', '.join(map(str, files))} records no decode steps: capturing the default "
                f"sizes {list(default)}")
        log.warning("%s: %s", label, note)
        return CapturePlan(default, DEFAULT, max_batches, num_layers=num_layers, reserved_bytes=reserved, note=note)
    max_graphs = current.plan_max_graphs or len(default)
    try:
        plan = planning.plan_for(workload, max_graphs)
    except planning.PlanError as exc:
        raise CapturePlanError(f"{PLAN_ENV}=auto: {exc}") from None
    note = (f"{PLAN_ENV}=auto: capture sizes {plan.capture_sizes} fitted to {workload.decode_steps} decode steps in "
            f"{', '.join(map(str, files))} (at most {plan.max_graphs} graphs): padded tokens "
            f"{plan.padded_fraction_before:.1%} with the recorded sizes {list(workload.capture_sizes)} -> "
            f"{plan.padded_fraction_after:.1%}")
    log.warning("%s: %s", label, note)
    return CapturePlan(tuple(plan.capture_sizes), AUTO, max_batches, num_layers=num_layers or workload.num_layers,
                       carried=dict(workload.histogram), reserved_bytes=reserved, note=note)


# -- graph memory kept out of the KV cache ----------------------------------------------------------------

# Set by the executor on lmdeploy's CacheConfig, which it sends to every worker: what it kept out of the cache.
RESERVED_ATTR = "vendor_graph_reserved_bytes"


@dataclass(frozen=True)
class Reservation:
    bytes: int
    source: str  # "off", "VENDOR_GRAPH_GRAPH_MEMORY", "stats file", "none"
    detail: str


def _buffer_bytes(spec: Any, sizes: Sequence[int], num_blocks: int, query_len: int) -> int:
    from ..buffers import GraphDims

    return sum(spec.device_bytes(GraphDims(s, s * query_len, num_blocks, query_len)) for s in sizes)


def reservation(max_batches: int, current: settings.Settings | None = None, *, spec: Any = None,
                sizes: Sequence[int] | None = None, num_blocks: int | None = None) -> Reservation:
    """The device memory to keep out of the KV cache for the graphs of a runner of ``max_batches``.

    ``auto`` takes the previous run's ``graph_memory_bytes`` apart: the graph buffers its captured sizes
    held (``spec``, the vendor's :class:`~vendor_graph.buffers.BufferSpec`, at its ``num_gpu_blocks``; the
    block table grows with the cache) and the rest (the pool's activations), scaled up with ``max_batches``.
    It then adds the buffers of ``sizes`` at ``num_blocks`` (this run's plan and cache), and :data:`MARGIN` on
    the whole. Without ``spec`` the measured memory is scaled as one."""
    _check_current(current)
    max_batches = buckets.check_max_batches(max_batches)
    if sizes is not None:
        sizes = _values.whole_sequence("sizes", sizes, limit=buckets.MAX_BATCHES_LIMIT)
    if num_blocks is not None:
        num_blocks = _values.whole("num_blocks", num_blocks)
    current = current or settings.current()
    value = current.graph_memory
    if value == "off":
        return Reservation(0, "off", f"{MEMORY_ENV}=off: nothing reserved for the graphs")
    if isinstance(value, int):
        return Reservation(value, MEMORY_ENV, f"{MEMORY_ENV}={value} ({value / 2**20:.1f} MiB)")
    if not current.stats_file:
        return Reservation(0, "none", f"nothing reserved for the graphs: no {STATS_ENV} to learn their size from "
                                      f"(set it, or {MEMORY_ENV}=BYTES)")
    from . import planning
    from .workload import stats_files

    files = stats_files(current.stats_file)
    recorded = []
    for path in files:
        try:
            doc = planning.read_stats(path)
        except planning.PlanError as exc:
            raise CapturePlanError(f"{MEMORY_ENV}=auto: {exc}") from None
        if doc.get("graph_memory_bytes"):
            recorded.append((int(doc["graph_memory_bytes"]), str(path), doc))
    if not recorded:
        where = ", ".join(map(str, files)) or f"{current.stats_file} (not written yet)"
        return Reservation(0, "none", f"nothing reserved for the graphs: {where} records no graph memory (a first "
                                      f"run, or captures whose memory could not be measured)")
    measured, path, doc = max(recorded, key=lambda r: r[0])
    query_len = max((int(q) for q in doc.get("query_len_histogram") or {"1": 0}), default=1)
    captured = [int(b) for b, st in (doc.get("buckets") or {}).items() if st.get("captures")] or doc["capture_sizes"]
    then_blocks = int(doc.get("num_gpu_blocks") or 0)
    buffers_then = _buffer_bytes(spec, captured, then_blocks, query_len) if spec is not None and then_blocks else 0
    other = max(0, measured - buffers_then)
    scale = max(1.0, max_batches / int(doc["max_batches"]))
    if spec is not None and sizes and num_blocks:
        buffers_now = _buffer_bytes(spec, sizes, num_blocks, query_len)
        how = (f"{other / 2**20:.1f} MiB of pool measured in {path}"
               + (f" x{scale:.2f} for max_batch_size {max_batches}" if scale > 1 else "")
               + f", plus {buffers_now / 2**20:.1f} MiB of buffers for {len(sizes)} graphs at {num_blocks} KV blocks")
    else:
        buffers_now = int(buffers_then * scale)
        how = f"{measured / 2**20:.1f} MiB measured in {path}" + (
            f", x{scale:.2f} for max_batch_size {max_batches}" if scale > 1 else "")
    total = int((other * scale + buffers_now) * MARGIN)
    return Reservation(total, "stats file", f"{total / 2**20:.1f} MiB reserved for the graphs: {how}, x{MARGIN} "
                                            f"margin")


def _block_bytes(cache_plan: Any) -> int:
    """Bytes of one KV block from ``_reserve_runtime_mem``'s second argument (0.16/0.17: one size with
    ``total``; 0.18: a list of them, one per rank)."""
    plans = cache_plan if isinstance(cache_plan, (list, tuple)) and not hasattr(cache_plan, "total") else [cache_plan]
    return max(int(getattr(p, "total", p) or 0) for p in plans) if plans else 0


def planned_blocks(cache_config: Any, free: Sequence[int], cache_plan: Any) -> int:
    """The KV blocks lmdeploy will make from ``free`` (at most: the reservation only lowers it)."""
    if getattr(cache_config, "num_gpu_blocks", 0):
        return int(cache_config.num_gpu_blocks)
    if isinstance(free, (str, bytes)) or not isinstance(free, Sequence) or not len(free):
        raise TypeError(f"free must be a non-empty sequence of each rank's free memory in bytes, got "
                        f"{_values.show(free)}")
    block = _block_bytes(cache_plan)
    return max(0, int(max(free) * cache_config.cache_max_entry_count) // block) if block else 0


__all__ = ["AUTO", "DEFAULT", "EXPLICIT_ENV", "EXPLICIT_LMDEPLOY", "MARGIN", "RESERVED_ATTR", "CapturePlan",
           "CapturePlanError", "Reservation", "planned_blocks", "reservation", "resolve_capture_plan"]
