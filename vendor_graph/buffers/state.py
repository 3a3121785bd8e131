"""What one captured graph owns (its buffers, how far each was written, its binds, the cache of its steady
state), kept on lmdeploy's ``graph_meta`` between capture and every replay."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .declare import GraphDims

__all__ = ["FieldState", "FillCache", "GraphBuffers", "attach_graph_buffers", "graph_buffers"]


@dataclass
class FieldState:
    """One buffer of a graph and what the fills know about it: how far the last fill wrote, its padding."""

    tensor: torch.Tensor
    # The live extent written by the last fill, per dimension; everything beyond holds padding.
    high_water: tuple[int, ...] = ()
    # (extent, high water) -> the writes of a fill with that extent after one with that high water:
    # the live view, then (stale box, pad source) pairs. Built once per pair, reused every step.
    plans: dict = field(default_factory=dict)
    # One element holding the pad value (same dtype and device), expanded to each stale box; or, for a
    # field whose padding differs per element, the whole buffer's padding content, narrowed like the box.
    pad_one: torch.Tensor | None = None
    pad_full: torch.Tensor | None = None
    pad: int | float | bool = 0
    on_host: bool = False
    device: str = "cpu"  # the buffer's device type

    def padding(self) -> torch.Tensor:
        """The whole buffer as padding: what every element past the live extent holds."""
        return self.pad_full if self.pad_full is not None else torch.full_like(self.tensor, self.pad)

    @functools.cached_property
    def no_rows(self) -> torch.Tensor:
        """A source with no live rows (an absent field that is all padding), made once."""
        return self.tensor.new_empty([0] * self.tensor.dim())

    def plain(self, src: Any) -> bool:
        """Whether ``src`` is a tensor of exactly the buffer's own type: what a fresh tensor on its device is (a
        subclass, such as a Parameter, may not behave as one), so the cached plans and the fast fill may take it."""
        return type(src) is type(self.tensor)



class FillCache(Protocol):
    """What the checked fill tells a cache of its steady state (buffers/fast.py is the one there is)."""

    with_context: bool  # built for fills given the StepContext

    def settle(self) -> None:
        """Give each field the high water the cache's own fills left it (the checked fill plans from it)."""

    def extents(self) -> tuple:
        """The extents the buffers of the cached fields hold now."""

    def learn(self, writes: list, before: tuple) -> None:
        """The checked fill wrote ``writes`` after the buffers held ``before``."""

    def rebase(self) -> None:
        """The checked fill wrote outside a step the cache could learn (``bind_context``'s own copies)."""

    def bind_context(self, context: Any) -> None:
        """Point the ``StepContext`` at the buffers."""


@dataclass
class GraphBuffers:
    """What one captured graph owns: its buffers and the fill bookkeeping."""

    dims: GraphDims
    fields: dict[str, FieldState]
    held: dict[str, Any]
    sealed: bool = False
    # once sealed: per bind step, the (root kind, attribute or None, setter, buffer) of every target
    binds: dict[str, list] = field(default_factory=dict)
    # the cache of the steady state (built after sealing, per whether fill is given the StepContext)
    cache: FillCache | None = None
    # the StepContext whose sources this step's fill already wrote (bind_context then only binds)
    context_filled: Any = None


_STATE_ATTR = "_vendor_graph_buffers"


def graph_buffers(graph_meta: Any) -> GraphBuffers:
    """The buffers :meth:`CheckedBufferSpec.make` attached to ``graph_meta``."""
    state = getattr(graph_meta, _STATE_ATTR, None)
    if state is None:
        raise RuntimeError(
            "fill/bind called on a graph whose buffers vendor_graph did not make; another patch replaced "
            "make_buffers_cudagraph between capture and replay (see `vendor-graph doctor`)"
        )
    return state



def attach_graph_buffers(graph_meta: Any, state: GraphBuffers) -> None:
    """Keep ``state`` on ``graph_meta`` for the fills and binds of that graph."""
    setattr(graph_meta, _STATE_ATTR, state)
