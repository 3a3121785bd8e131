"""Rank agreement: decisions every rank of one engine shares.

With tensor parallelism every rank replays its own graph of the same key, and the collectives inside
must match: a rank running a step eagerly (its real batch) while another replays a graph (the padded
bucket) all-reduce tensors of different sizes, which hangs or corrupts the step. Keys and capture sizes
agree by construction (derived from inputs every rank shares), and so does a fitted size plan (every rank
reads the same stats files). A capture can fail, and a shadow check can diverge, on one rank only, so
their outcome is agreed by one collective on the engine's CPU process group, held at each capture and at
each shadow-checked replay (the same steps on every rank) and never on a plain replay step: when any rank
failed, every rank runs that key eagerly. Not agreed: the stale-graph guard's verdict, whose causes (a
wake-up, a weight update, new KV caches) reach every rank at once.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

logger = logging.getLogger("vendor_graph")


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
    import torch
    import torch.distributed as dist

    flags = [torch.zeros(1, dtype=torch.int32) for _ in range(dist.get_world_size(group))]
    dist.all_gather(flags, torch.tensor([0 if ok else 1], dtype=torch.int32), group=group)
    me = dist.get_rank(group)
    return [rank for rank, flag in enumerate(flags) if rank != me and int(flag.item())]


__all__ = ["agreement_group", "peers_failed"]
