"""Capture failures and the agreement of every rank on them.

A failed capture leaves nothing half-made and marks its key eager with :func:`capture_failure_reason`
(the remedy included). With tensor parallelism a capture or a shadow check can fail on one rank only, while
the collectives inside a graph must match on every rank (a rank running its real batch eagerly while another
replays the padded bucket all-reduces tensors of another size): :func:`peers_failed` agrees on the outcome
with one gather on the engine's CPU group, at each capture and each shadow-checked replay, never on a plain
replay; when any rank failed, every rank runs that key eagerly. Keys, capture sizes and a fitted plan agree by
construction (every rank derives them from inputs all ranks share); the stale-graph guard's verdict is not
agreed, since its causes (a wake-up, a weight update, new KV caches) reach every rank at once.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch

logger = logging.getLogger("vendor_graph")

OOM_REMEDY = ("out of device memory while capturing: capture fewer or smaller sizes "
              "(cudagraph_capture_batch_sizes, max_batch_size) or leave more memory outside the KV cache "
              "(a lower cache_max_entry_count)")


def is_oom(exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None)
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if oom_type is not None and isinstance(exc, oom_type):
            return True
        if isinstance(exc, (RuntimeError, MemoryError)) and "out of memory" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def capture_failure_reason(exc: BaseException, hint: str | None = None) -> str:
    reason = f"capture failed: {type(exc).__name__}: {exc}"
    if is_oom(exc):
        reason += f"; {OOM_REMEDY}"
    if hint:
        reason += f"; {hint}"
    return reason


def agreement_group() -> Any:
    """The CPU (gloo) process group every rank of this engine belongs to, or None in a single-rank process:
    lmdeploy's world CPU group when its distributed context has one, else the default group if it is gloo."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    lmdeploy_dist = sys.modules.get("lmdeploy.pytorch.distributed")
    if lmdeploy_dist is not None:
        try:
            group = getattr(lmdeploy_dist.get_dist_manager().current_context(), "cpu_group", None)
        except Exception:  # noqa: BLE001 - no context yet: fall back to the default group
            group = None
        if group is not None:
            return group
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return None


_warned_no_group = False


def peers_failed(ok: bool) -> list[int]:
    """Share this rank's outcome (``ok``) of what every rank just did for the same key (a capture, a shadow
    check); the other ranks of the agreement group for which it failed. One gather on the CPU group;
    nothing in a single-rank process."""
    global _warned_no_group
    group = agreement_group()
    if group is None:
        dist = sys.modules.get("torch.distributed")
        if not _warned_no_group and dist is not None and dist.is_available() and dist.is_initialized() \
                and dist.get_world_size() > 1:
            _warned_no_group = True
            logger.warning("vendor_graph: %d ranks but no CPU (gloo) process group: a capture that fails on one "
                           "rank only is not agreed with the others", dist.get_world_size())
        return []
    import torch.distributed as dist

    flags = [torch.zeros(1, dtype=torch.int32) for _ in range(dist.get_world_size(group))]
    dist.all_gather(flags, torch.tensor([0 if ok else 1], dtype=torch.int32), group=group)
    me = dist.get_rank(group)
    return [rank for rank, flag in enumerate(flags) if rank != me and int(flag.item())]


__all__ = ["OOM_REMEDY", "agreement_group", "capture_failure_reason", "is_oom", "peers_failed"]
