"""Shadow check: every Nth replayed decode step (``VENDOR_GRAPH_SHADOW=N``, off by default) also runs eagerly
on the same inputs, and the two outputs are compared.

"The same inputs" are the graph's own filled buffers, so the eager forward reads exactly what the replay read
and writes the same K/V values to the same slots the replay just wrote (padding rows write none): running both
is safe for the cache. It checks the graph mechanism (a buffer the graph no longer reads, a host value not
refreshed, a corrupted capture), not padding policy. The tolerance is relative and per dtype: on hardware a
graph and an eager run may legitimately differ in the last bits (padding changes kernel tiling).

Cost: one integer increment and compare per replay; only a checked step runs the eager forward and syncs with
the device.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from ..config import settings

logger = logging.getLogger("vendor_graph")

SHADOW_ENV = settings.variable("shadow")
ACTION_ENV = settings.variable("shadow_action")
TOL_ENV = settings.variable("shadow_tol")
ACTIONS = ("eager", "log")
DEFAULT_TOL = {torch.float32: 1e-5, torch.float64: 1e-9, torch.float16: 1e-2, torch.bfloat16: 2e-2}


class ShadowCheck:
    """Every ``every``-th call of :meth:`due` is a checked step (0: never)."""

    def __init__(self, every: int | None = None, action: str | None = None, tolerance: float | None = None):
        if every is None or action is None or tolerance is None:
            config = settings.current()
            every = config.shadow if every is None else every
            action = config.shadow_action if action is None else action
            tolerance = config.shadow_tol if tolerance is None else tolerance
        if action not in ACTIONS:
            raise ValueError(f"{ACTION_ENV}={action!r}: expected one of {', '.join(ACTIONS)}")
        self.every = max(0, every)
        self.action = action
        self.tolerance = tolerance
        self._count = 0

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def due(self) -> bool:
        """Count a replayed step; True when this one is to be checked."""
        if not self.every:
            return False
        self._count += 1
        if self._count >= self.every:
            self._count = 0
            return True
        return False

    def compare(self, graph_out: Any, eager_out: Any) -> str | None:
        """None when every tensor of ``graph_out`` matches ``eager_out`` within tolerance."""
        pairs = _pairs(graph_out, eager_out)
        if not pairs:
            return "no output tensors to compare"
        for name, g, e in pairs:
            if g.shape != e.shape:
                return f"{name}: shape {tuple(g.shape)} from the graph, {tuple(e.shape)} eager"
            g_host, e_host = g.detach().cpu(), e.detach().cpu()
            if torch.equal(g_host, e_host):
                continue
            if not g_host.is_floating_point():
                bad = int((g_host != e_host).sum())
                return f"{name}: {bad} of {g_host.numel()} elements differ"
            g64, e64 = g_host.double(), e_host.double()
            finite_g, finite_e = torch.isfinite(g64), torch.isfinite(e64)
            if not torch.equal(finite_g, finite_e):
                count = int((finite_g != finite_e).sum())
                return f"{name}: non-finite values in {count} places where the other has finite ones"
            diff = (g64 - e64).abs().masked_fill(~finite_e, 0)
            scale = e64.abs().masked_fill(~finite_e, 0).max().clamp_min(1e-12)
            rel = float(diff.max() / scale)
            tol = self.tolerance if self.tolerance is not None else DEFAULT_TOL.get(g.dtype, 1e-5)
            if rel > tol:
                return (f"{name}: max abs difference {float(diff.max()):.3g} ({rel:.3g} of the largest value; "
                        f"tolerance {tol:g})")
        return None

    def diverged(self, label: str, key: Any, batch: int, padded_batch: int, problem: str) -> bool:
        """Log a divergence; True when the key is to run eager from now on."""
        to_eager = self.action == "eager"
        logger.warning("%s: shadow check: graph %s (live batch %d, padded %d) differs from eager: %s; %s",
                       label, key, batch, padded_batch, problem,
                       "that key runs eager from now on" if to_eager else
                       f"keeping the graph ({ACTION_ENV}=log)")
        return to_eager


def _pairs(graph_out: Any, eager_out: Any) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    if isinstance(graph_out, torch.Tensor) and isinstance(eager_out, torch.Tensor):
        return [("output", graph_out, eager_out)]
    if isinstance(graph_out, Mapping) and isinstance(eager_out, Mapping):
        return [(k, v, eager_out[k]) for k, v in graph_out.items()
                if isinstance(v, torch.Tensor) and isinstance(eager_out.get(k), torch.Tensor)]
    if isinstance(graph_out, (list, tuple)) and isinstance(eager_out, (list, tuple)):
        return [(f"output[{i}]", g, e) for i, (g, e) in enumerate(zip(graph_out, eager_out, strict=False))
                if isinstance(g, torch.Tensor) and isinstance(e, torch.Tensor)]
    return []


__all__ = ["ACTIONS", "ACTION_ENV", "SHADOW_ENV", "TOL_ENV", "ShadowCheck"]
