"""Graphs dropped after lmdeploy's IPC weight update, which resets the graph runner in none of lmdeploy
0.16-0.18 (sleep, wake-up and the distributed update do reset it): :func:`install` wraps
``BaseModelAgent.update_params`` so a finished update also calls ``reset_graph_runner()``. The stale-graph guard's
weight check stays a second line. What lmdeploy does at each lifecycle step: docs/upstream.md.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from . import patching

logger = logging.getLogger("vendor_graph")

AGENT_MODULE = "lmdeploy.pytorch.engine.model_agent.agent"
AGENT_CLASS = "BaseModelAgent"


def wrap_update_params(original: Any) -> Any:
    """``update_params`` that resets the graph runner once a weight update is finished."""
    if getattr(original, "_vendor_graph_lifecycle", False):
        return original

    @functools.wraps(original)
    def update_params(self, request, *args, **kwargs):
        finished = bool(getattr(request, "finished", True))
        try:
            return original(self, request, *args, **kwargs)
        finally:
            reset = getattr(self, "reset_graph_runner", None)
            if finished and reset is not None:
                logger.info("vendor_graph: weight update finished: dropping captured graphs (they may read "
                            "replaced parameters); the next decode steps capture afresh")
                reset()

    update_params._vendor_graph_lifecycle = True
    update_params.__module__ = "vendor_graph.install.lifecycle"
    return update_params


def install(activation: patching.Activation | None = None) -> bool:
    """Patch lmdeploy's ``BaseModelAgent.update_params`` (now, or when the agent module is imported).
    False when no vendor is active."""
    activation = activation or patching.active()
    if activation is None:
        return False

    def patch(module) -> None:
        agent = getattr(module, AGENT_CLASS, None)
        original = getattr(agent, "update_params", None) if agent is not None else None
        if original is None or getattr(original, "_vendor_graph_lifecycle", False):
            return
        activation.add(patching.Patch(agent, "update_params", wrap_update_params(original)))

    patching.when_imported(AGENT_MODULE, patch)
    return True


__all__ = ["AGENT_MODULE", "install", "wrap_update_params"]
